"""The register blocks of ef.jit contractions (backends/c/loops_dot.py, shaped by
plan/jit_vectors.py from the machine): rows of whole vectors and of vectors plus a
rest, single rows summed as interleaved partial sums (reduced extents even and odd),
batches of rows (vmapped) with a remainder block, float64 and float32, on the AVX2
build (EINFUSE_CPU=avx2, in a child process) and on the default one, against NumPy
loops in float64."""

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("jax")

from einfuse.analysis import machine as machine_module  # noqa: E402
from einfuse.backends.c import build as c_build  # noqa: E402

HOST_FLAGS = machine_module._cpu_flags()
# (hidden, inputs): rows of 3, 8 and 12 AVX2 vectors of doubles, 12 + a rest of 2 floats
SHAPES = [(12, 5), (32, 13), (48, 12), (50, 7), (64, 16)]
CHAINS = 11

SCRIPT = """
import numpy as np, jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
import einfuse as ef
from einfuse.plan.jit_vectors import jit_vectors

def cell(params, xs):
    w_in, w_h, b = params
    def step(h, x):
        return jnp.tanh(h @ w_h + x @ w_in + b), h.sum()
    return jax.lax.scan(step, jnp.zeros(w_h.shape[0], xs.dtype), xs)

data = np.load(IN)
out = {"bytes": jit_vectors().vector_bytes}
for key in sorted({k.rsplit("_", 1)[0] for k in data.files}):
    for dtype in ("float64", "float32"):
        params = [jnp.asarray(data[f"{key}_{n}"].astype(dtype)) for n in ("win", "wh", "b")]
        xs = jnp.asarray(data[f"{key}_xs"].astype(dtype))
        h, sums = ef.jit(cell)(params, xs)
        out[f"{key}_{dtype}_h"], out[f"{key}_{dtype}_sums"] = np.asarray(h), np.asarray(sums)
        chains = jnp.stack([xs * (1 + 0.1 * c) for c in range(CHAINS)])
        hb, _ = jax.vmap(ef.jit(cell), in_axes=(None, 0))(params, chains)
        out[f"{key}_{dtype}_batch"] = np.asarray(hb)
np.savez(OUT, **out)
"""


def _data():
    rng = np.random.default_rng(4)
    data = {}
    for hidden, inputs in SHAPES:
        key = f"s{hidden}x{inputs}"
        data[f"{key}_win"] = rng.standard_normal((inputs, hidden)) / np.sqrt(inputs)
        data[f"{key}_wh"] = rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)
        data[f"{key}_b"] = rng.standard_normal(hidden) * 0.1
        data[f"{key}_xs"] = rng.standard_normal((6, inputs))
    return data


def _reference(data, key, scale=1.0):
    """The cell in float64 by NumPy, one step at a time: the last h and h.sum() per step
    (the inputs times ``scale``)."""
    w_in, w_h, b, xs = (data[f"{key}_{n}"] for n in ("win", "wh", "b", "xs"))
    xs = xs * scale
    h, sums = np.zeros(w_h.shape[0]), []
    for x in xs:
        sums.append(h.sum())
        h = np.tanh(h @ w_h + x @ w_in + b)
    return h, np.array(sums)


def _run(target, tmp_path):
    source, out = tmp_path / "data.npz", tmp_path / f"{target}.npz"
    np.savez(source, **_data())
    env = dict(os.environ, EINFUSE_CPU=target)
    subprocess.run([sys.executable, "-c", f"IN = {str(source)!r}\nOUT = {str(out)!r}\n"
                    f"CHAINS = {CHAINS}\n" + SCRIPT], env=env, check=True, timeout=900)
    return np.load(out)


@pytest.mark.skipif(c_build.find_compiler() is None, reason="builds C kernels")
# (each target a child process compiling its kernels cold; the native build is what every
# other test runs: the slow step builds it again here, the default run keeps the AVX2
# one, DEVELOPERS.md's target)
@pytest.mark.parametrize("target", [
    pytest.param("avx2", marks=pytest.mark.skipif(not {"avx2", "fma", "bmi2"} <= HOST_FLAGS,
                                                  reason="the host runs no AVX2")),
    pytest.param("native", marks=pytest.mark.slow)])
def test_recurrent_layers_of_every_block_shape_against_numpy(target, tmp_path):
    found = _run(target, tmp_path)
    if target == "avx2":
        assert int(found["bytes"]) == 32
    data = _data()
    for hidden, inputs in SHAPES:
        key = f"s{hidden}x{inputs}"
        h, sums = _reference(data, key)
        for dtype, tol in (("float64", 1e-12), ("float32", 2e-5)):
            np.testing.assert_allclose(found[f"{key}_{dtype}_h"], h, rtol=tol, atol=tol)
            np.testing.assert_allclose(found[f"{key}_{dtype}_sums"], sums, rtol=tol,
                                       atol=tol * hidden)
        # every chain its own inputs: a block mixing up rows would show
        chains = np.stack([_reference(data, key, 1 + 0.1 * c)[0] for c in range(CHAINS)])
        for dtype, tol in (("float64", 1e-12), ("float32", 2e-5)):
            np.testing.assert_allclose(found[f"{key}_{dtype}_batch"], chains, rtol=tol, atol=tol)
