"""The vector exp, tanh and logistic of ef.jit kernels (backends/c/vmath_source.py) on
each vector width the machine can run: the AVX2 build (EINFUSE_CPU=avx2, 32-byte
vectors: the table-free polynomial forms) and the AVX-512 one (64 bytes, where the
logistic uses its table), each in a child process (the target is read once per
process).  Against the exact value (NumPy's long double) to the documented ulp bounds
(exp 2, tanh and logistic 4), special values included: NaN, +-inf, +-0.0, subnormal
arguments and results, overflow, the ends of each clamp, and lengths that leave a
remainder after the whole vectors."""

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("jax")

from einfuse.analysis import machine as machine_module  # noqa: E402
from einfuse.backends.c import build as c_build  # noqa: E402

HOST_FLAGS = machine_module._cpu_flags()
ULPS = {"exp": 2, "tanh": 4, "logistic": 4}

SPECIAL = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-310, -1e-310, 5e-324, 1e-40, -1e-40,
           1e-20, -1e-20, 0.1733, -0.1733, 0.3466, 0.5, -0.5, 5.5, -5.5, 9.0, 9.5, 10.0, 10.5,
           -10.5, 17.0, 19.5, 20.0, 20.5, -20.5, 36.0, -40.0, 86.9, 87.0, -87.0, -87.1, 88.5,
           88.72, 88.73, 89.0, 90.0, -100.0, -103.0, -103.9, -104.0, -105.0, -120.0, 700.0,
           -707.9, -708.0, -708.1, -709.5, 709.7, 709.78, 709.79, 710.0, 711.0, -740.0,
           -745.0, -745.1, -745.2, -746.0, -800.0]

SCRIPT = """
import numpy as np, jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
import einfuse as ef
from einfuse.plan.jit_vectors import jit_vectors
x = np.load(IN)
out = {"bytes": jit_vectors().vector_bytes}
def f(a):
    return jnp.exp(a), jnp.tanh(a), jax.nn.sigmoid(a), jnp.tanh(a * 0.5 - 1.0)
for dtype in ("float64", "float32"):
    a = x.astype(dtype)
    for name, value in zip(("exp", "tanh", "logistic", "tanh_expr"), ef.jit(f)(a)):
        out[f"{name}_{dtype}"] = np.asarray(value)
    # a vmapped batch (the flat statements of a block), rows that are not whole vectors
    rows = a[:9 * 37].reshape(9, 37)
    for name, value in zip(("exp", "tanh", "logistic", "tanh_expr"), jax.vmap(ef.jit(f))(rows)):
        out[f"v{name}_{dtype}"] = np.asarray(value)
np.savez(OUT, **out)
"""


def _inputs():
    rng = np.random.default_rng(0)
    count = 2001
    values = np.concatenate([np.array(SPECIAL), rng.standard_normal(600),
                             rng.standard_normal(600) * 30, rng.uniform(-800, 800, count)])
    return values[:count]


def _exact(name, x):
    x = np.asarray(x, np.longdouble)
    with np.errstate(over="ignore", invalid="ignore"):
        if name == "exp":
            return np.exp(x)
        if name == "tanh":
            return np.tanh(x)
        return 1 / (1 + np.exp(-x))


def _check(name, ours, x, dtype):
    """NaN exactly where the argument is NaN; elsewhere within
    ULPS[name] units in the last place of the exact value rounded to ``dtype``."""
    info = np.finfo(dtype)
    assert ours.dtype == dtype and ours.shape == x.shape
    x = x.astype(dtype)
    nan = np.isnan(x)
    np.testing.assert_array_equal(np.isnan(ours), nan)
    exact = _exact(name, x)
    number = ~nan
    if name == "exp":
        over = number & (exact > np.longdouble(info.max) * (1 + np.longdouble(info.eps) / 4))
        assert np.all(ours[over] == np.inf), x[over & (ours != np.inf)]
        number &= ~over
    rounded = exact[number].astype(dtype)
    ulp = np.spacing(np.abs(rounded)).astype(np.longdouble)
    error = np.abs(ours[number].astype(np.longdouble) - exact[number]) / ulp
    if name == "logistic":
        # results below 2^-1021 (float: 2^-125) are 0 by design: only their size is checked
        small = exact[number] < np.longdouble(info.tiny) * 16
        assert np.all(ours[number][small] < info.tiny * 32)
        error[small] = 0
    worst = int(np.argmax(error)) if error.size else 0
    assert float(error.max(initial=0)) <= ULPS[name], \
        (name, dtype.__name__, x[number][worst], ours[number][worst], float(error[worst]))
    # the ends and the signed zeros exactly
    if name == "tanh":
        assert np.all(ours[x == np.inf] == 1) and np.all(ours[x == -np.inf] == -1)
        zero = x == 0
        np.testing.assert_array_equal(np.signbit(ours[zero]), np.signbit(x[zero]))
        assert np.all(ours[zero] == 0)
    elif name == "logistic":
        assert np.all(ours[x == np.inf] == 1) and np.all(ours[x == -np.inf] == 0)
        assert np.all(ours[x == 0] == 0.5)
    else:
        assert np.all(ours[x == np.inf] == np.inf) and np.all(ours[x == -np.inf] == 0)
        assert np.all(ours[x == 0] == 1)


def _run(target, tmp_path):
    source, out = tmp_path / "x.npy", tmp_path / f"{target}.npz"
    np.save(source, _inputs())
    env = dict(os.environ, EINFUSE_CPU=target)
    subprocess.run([sys.executable, "-c", f"IN = {str(source)!r}\nOUT = {str(out)!r}\n" + SCRIPT],
                   env=env, check=True, timeout=900)
    return np.load(out)


TARGETS = [pytest.param("avx2", 32, marks=pytest.mark.skipif(
               not {"avx2", "fma", "bmi2"} <= HOST_FLAGS, reason="the host runs no AVX2")),
           pytest.param("avx512", 64, marks=pytest.mark.skipif(
               not {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= HOST_FLAGS,
               reason="the host runs no AVX-512"))]


@pytest.mark.skipif(c_build.find_compiler() is None, reason="builds C kernels")
@pytest.mark.parametrize("target, width", TARGETS)
def test_vector_exp_tanh_logistic_within_their_ulp_bounds(target, width, tmp_path):
    found = _run(target, tmp_path)
    assert int(found["bytes"]) == width
    x = _inputs()
    for dtype in (np.float64, np.float32):
        suffix = dtype.__name__
        for name in ("exp", "tanh", "logistic"):
            _check(name, found[f"{name}_{suffix}"], x, dtype)
            _check(name, found[f"v{name}_{suffix}"], x[:9 * 37].reshape(9, 37), dtype)
        # tanh of an expression: its argument rounded as the kernel rounds it
        with np.errstate(over="ignore", invalid="ignore"):
            argument = x.astype(dtype) * dtype(0.5) - dtype(1.0)
        _check("tanh", found[f"tanh_expr_{suffix}"], argument, dtype)
