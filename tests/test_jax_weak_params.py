"""A Python number (or a weakly typed JAX scalar, as ``jax.jit`` traces one) passed as
a scalar parameter promotes weakly on JAX arrays, as it does on NumPy arrays and as in
jax.numpy: ``float32 * 2.5`` stays float32, ``int8 + 3`` stays int8."""

import numpy as np
import pytest

import einfuse as ef

jax = pytest.importorskip("jax")
jnp = jax.numpy


@pytest.fixture(params=[False, True], ids=["x32", "x64"])
def x64(request):
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", request.param)
    yield
    jax.config.update("jax_enable_x64", previous)


@pytest.mark.parametrize("statement, array, number", [
    ("C[i] := alpha * A[i]", np.array([1.5, -2.0], np.float32), 2.5),
    ("C[i] := A[i] + alpha", np.array([100, -7], np.int8), 3),
    ("C[i] := A[i] * alpha", np.array([1.5, -2.0], np.float32), 3),
])
def test_python_number_parameters_promote_weakly(x64, statement, array, number):
    kernel = ef.compile(statement)
    want = kernel(A=array, alpha=number)               # NumPy: NEP 50 promotion
    assert want.dtype == array.dtype
    eager = kernel(A=jnp.asarray(array), alpha=number)
    jitted = jax.jit(lambda a, s: kernel(A=a, alpha=s))(jnp.asarray(array), number)
    for got in (eager, jitted):
        assert got.dtype == array.dtype
        np.testing.assert_array_equal(np.asarray(got), want)
    grad = jax.grad(lambda s: kernel(A=jnp.asarray(array), alpha=s).sum())
    if array.dtype.kind == "f" and isinstance(number, float):
        np.testing.assert_allclose(grad(number), array.sum(), rtol=1e-6)


def test_a_python_int_that_does_not_fit_raises_as_on_numpy():
    kernel = ef.compile("C[i] := A[i] + alpha")
    with pytest.raises(ef.EinfuseError, match="does not fit int8"):
        kernel(A=jnp.asarray([1, 2], jnp.int8), alpha=300)
