"""The logistic function (jax.nn.sigmoid) of ef.jit kernels, whose whole-buffer
statements run as explicit vector code (backends/c/loops_vmath.py) where the compiler
allows: against jax.jit of the same function and against the exact value (NumPy's
long double), special values included, float64 and float32, vmapped (the flat
statements of a block) and not, with an argument that is a buffer or an expression,
and lengths that leave a remainder after the whole vectors."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.backends.c import build as c_build  # noqa: E402

from jit_support import x64  # noqa: E402,F401  (x64: an autouse fixture)

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="needs a C compiler")

SPECIAL = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 708.0, 710.0, -707.9, -708.0,
           -708.1, -709.5, -710.0, -800.0, 36.0, 37.0, -36.0, -40.0, 1e-310, -1e-310, 87.0,
           88.0, -86.9, -87.0, -87.1, -88.5, -89.0, 17.0, -17.0, 1e-40, 5.5, -5.5]


def _inputs(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape))
    values = np.concatenate([np.array(SPECIAL), rng.standard_normal(count) * 30,
                             rng.uniform(-800, 800, count)])[:count]
    with np.errstate(over="ignore"):
        return values.astype(dtype).reshape(shape)


def _check(ours, theirs, x):
    """NaN where JAX has NaN; elsewhere within 4 ulp of JAX's value and of the exact
    one, except below 16 x the smallest normal number, where both are tiny (the vector
    code gives 0 for logistic values below 2^-1021, 2^-125 in float32)."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    info = np.finfo(ours.dtype)
    with np.errstate(over="ignore"):
        exact = 1 / (1 + np.exp(-np.asarray(x, np.longdouble)))
    number = ~np.isnan(theirs)
    small = number & (exact < info.tiny * 16)
    assert np.all((ours[small] >= 0) & (ours[small] < info.tiny * 32))
    normal = number & ~small
    for reference in (theirs[normal], exact[normal]):
        error = np.abs(ours[normal] - reference) / np.abs(reference)
        assert float(error.max(initial=0)) <= 4 * info.eps, x[normal][np.argmax(error)]
    # the ends exactly
    x = np.asarray(x)
    assert np.all(ours[x == np.inf] == 1) and np.all(ours[x == -np.inf] == 0)
    assert np.all(ours[x == 0] == 0.5)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(21, 24), (9, 17)])
def test_vmapped_logistic_of_a_buffer_and_of_an_expression(dtype, shape):
    x = _inputs(dtype, shape)
    y = _inputs(dtype, shape, seed=1) * dtype(0.01)

    def f(a, b):
        return jax.nn.sigmoid(a), jax.nn.sigmoid(a * 0.5 - b)
    ours = jax.vmap(ef.jit(f))(x, y)
    theirs = jax.jit(jax.vmap(f))(x, y)
    _check(ours[0], theirs[0], x)
    with np.errstate(invalid="ignore", over="ignore"):
        argument = np.asarray(jax.jit(lambda a, b: a * 0.5 - b)(x, y))
    _check(ours[1], theirs[1], argument)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_logistic_unbatched_and_of_a_carry_in_a_loop_with_a_remainder(dtype):
    x = _inputs(dtype, (83,))     # float32 on AVX-512: 5 vectors and 3 left

    def f(a):
        def body(carry, _):
            return jax.nn.sigmoid(carry * 3.0), None     # the carry updated in place
        return jax.nn.sigmoid(a), jax.lax.scan(body, a, None, length=3)[0]
    ours, theirs = ef.jit(f)(x), jax.jit(f)(x)
    _check(ours[0], theirs[0], x)
    # the loop's value against JAX's, step by step through the same rounding
    np.testing.assert_array_equal(np.isnan(ours[1]), np.isnan(theirs[1]))
    info = np.finfo(dtype)
    number = ~np.isnan(np.asarray(theirs[1]))
    np.testing.assert_allclose(np.asarray(ours[1])[number], np.asarray(theirs[1])[number],
                               rtol=16 * info.eps, atol=info.tiny * 32)


def test_vmapped_sigmoid_gradient_against_jax():
    x = _inputs(np.float64, (19, 20), seed=2) * 0.05

    def loss(a):
        return (jax.nn.sigmoid(a) ** 2).sum()
    grad = jax.vmap(jax.grad(ef.jit(loss)))(x)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(jax.jit(jax.vmap(jax.grad(loss)))(x)),
                               rtol=1e-13, atol=1e-300)


def test_float32_and_float64_sigmoids_and_a_layer_in_one_kernel():
    rng = np.random.default_rng(3)
    a, w = rng.standard_normal((9, 40)), rng.standard_normal((40, 40))

    def f(a, b, w):
        return jax.nn.sigmoid(a), jax.nn.sigmoid(b), jax.nn.sigmoid(a @ w)
    ours = jax.vmap(ef.jit(f), in_axes=(0, 0, None))(a, a.astype(np.float32), w)
    theirs = jax.jit(jax.vmap(f, in_axes=(0, 0, None)))(a, a.astype(np.float32), w)
    _check(ours[0], theirs[0], a)
    _check(ours[1], theirs[1], a.astype(np.float32))
    np.testing.assert_allclose(np.asarray(ours[2]), np.asarray(theirs[2]), rtol=1e-13)
