"""EINFUSE_CPU picks the instruction set C kernels are built for (analysis/machine.py):
one machine can build and run the AVX2 code an AVX2-only CPU runs, results agree with
the default build to rounding, and a target the host cannot run is a BackendError
naming the variable."""

import os
import subprocess
import sys

import numpy as np
import pytest

from einfuse.analysis import machine as machine_module
from einfuse.backends.c import build as c_build
from einfuse.errors import BackendError

HOST_FLAGS = machine_module._cpu_flags()


def test_default_target_is_native():
    found = machine_module.machine()
    if os.environ.get(machine_module.TARGET_VARIABLE, "native") == "native":
        assert found.target == "native" and found.march[0] == "-march=native"
        # the compiler is told to use the vector width the blocks are sized for
        wide = machine_module.WIDE_VECTORS
        assert (found.march == ("-march=native",) + wide) == (found.vector_bytes == 64)
    assert (found.vector_bytes == 64) == all(flag in found.march
                                             for flag in machine_module.WIDE_VECTORS)
    assert found.vector_bytes in (16, 32, 64) and found.vector_registers in (16, 32)


@pytest.mark.parametrize("target", ["sse9", "AVX2 please"])
def test_unknown_target_is_named(target):
    with pytest.raises(BackendError, match="EINFUSE_CPU"):
        machine_module._machine_for(target)


def test_target_the_host_cannot_run_is_refused(monkeypatch):
    monkeypatch.setattr(machine_module, "_cpu_flags", lambda: frozenset({"sse2", "avx"}))
    machine_module._machine_for.cache_clear()
    try:
        with pytest.raises(BackendError, match="lacks avx2"):
            machine_module._machine_for("avx2")
    finally:
        machine_module._machine_for.cache_clear()


SCRIPT = """
import numpy as np, einfuse as ef
from einfuse.analysis.machine import machine
rng = np.random.default_rng(0)
w, x = rng.standard_normal((37, 50)), rng.standard_normal((37, 41))
D = ef.ein("D[i,j] := (w[k,i] - x[k,j])**2", w=w, x=x, backend="c")
X = rng.standard_normal((64, 300)).astype(np.float32)
P = ef.ein("P[i,j] := exp(X[i,j] - max[k](X[i,k])) / sum[k](exp(X[i,k] - max[l](X[i,l])))",
           X=X, backend="c")
np.savez(OUT, D=D, P=P, bytes=machine().vector_bytes)
"""


@pytest.mark.skipif(c_build.find_compiler() is None, reason="builds C kernels")
@pytest.mark.skipif(not {"avx2", "fma", "bmi2"} <= HOST_FLAGS, reason="the host runs no AVX2")
def test_avx2_build_agrees_with_the_default(tmp_path):
    results = {}
    for target in ("native", "avx2"):
        out = tmp_path / f"{target}.npz"
        env = dict(os.environ, EINFUSE_CPU=target)
        subprocess.run([sys.executable, "-c", f"OUT = {str(out)!r}\n" + SCRIPT], env=env,
                       check=True, timeout=600)
        results[target] = np.load(out)
    assert int(results["avx2"]["bytes"]) == 32
    for name in ("D", "P"):
        np.testing.assert_allclose(results["avx2"][name], results["native"][name],
                                   rtol=1e-5 if name == "P" else 1e-12)
