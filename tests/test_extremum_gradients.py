"""Gradients of max/min reductions: the whole seed goes to the first extremum in index
order (row-major over several reduced indices), on every backend; the rule runs in
linear time (rewrite/hoist.py computes each position once per output point)."""

import numpy as np
import pytest

from einfuse import derive, run_reference
from einfuse.errors import EinfuseError


def first_extremum_grad(x, axes, op, seed):
    """The oracle: seed at np.argmax/np.argmin's position over ``axes`` (trailing)."""
    lead = x.shape[:x.ndim - axes]
    flat = x.reshape(lead + (-1,))
    pick = (np.argmax if op == "max" else np.argmin)(flat, axis=-1)
    grad = np.zeros_like(flat)
    for position in np.ndindex(*lead):
        grad[position + (pick[position],)] = seed[position]
    return grad.reshape(x.shape)


def tied(shape, seed=0):
    """Small integers as floats: many ties, the extremum often repeated."""
    return np.random.default_rng(seed).integers(0, 3, size=shape).astype(np.float64)


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("statement,shape,axes", [
    ("m[i] := {op}[j](x[i,j])", (5, 7), 1),
    ("m := {op}[i,j](x[i,j])", (4, 6), 2),
    ("m[i] := {op}[j,k](x[i,j,k])", (3, 4, 5), 2),
])
def test_gradient_goes_to_the_first_extremum(backend, op, statement, shape, axes):
    x = tied(shape)
    out_shape = shape[:len(shape) - axes]
    seed = np.random.default_rng(1).standard_normal(out_shape)
    grads = derive(statement.format(op=op), "x")
    got = run_reference(grads, {"x": x, "dm": seed}, backend=backend)["dx"]
    np.testing.assert_allclose(got, first_extremum_grad(x, axes, op, seed), atol=1e-12)


def test_gradient_of_a_weighted_maximum(backend):
    x, w = tied((6, 5)), tied((5,), seed=2) - 1.0
    seed = np.arange(1.0, 7.0)
    grads = derive("m[i] := max[j](x[i,j] * w[j])", "w")
    got = run_reference(grads, {"x": x, "w": w, "dm": seed}, backend=backend)["dw"]
    pick = np.argmax(x * w, axis=1)
    expected = np.zeros(5)
    for i, j in enumerate(pick):
        expected[j] += seed[i] * x[i, j]
    np.testing.assert_allclose(got, expected, atol=1e-12)


def test_all_nan_row_gets_no_gradient():
    x = tied((3, 4))
    x[1] = np.nan
    got = run_reference(derive("m[i] := max[j](x[i,j])", "x"),
                        {"x": x, "dm": np.ones(3)})["dx"]
    assert np.all(got[1] == 0) and got.sum() == 2


def test_float32_positions_beyond_exact_integers_are_refused():
    """float32 cannot tell positions above 2**24 apart: loud, not a gradient split
    between neighbours."""
    n = 2**24 + 8
    x = np.zeros((1, n), dtype=np.float32)
    grads = derive("m[i] := max[j](x[i,j])", "x")
    with pytest.raises(EinfuseError, match="float64"):
        run_reference(grads, {"x": x, "dm": np.ones(1, dtype=np.float32)}, backend="c")


@pytest.mark.parametrize("zeros", [0, 1, 2])
def test_product_gradient_with_zeros(backend, zeros):
    """d prod / d x_k is the product of the other factors, also where factors are 0."""
    x = np.random.default_rng(3).uniform(0.5, 1.5, size=(3, 6))
    x[1, :zeros] = 0.0
    x[2, 5 - zeros + 1:] = 0.0
    seed = np.array([1.0, -2.0, 0.5])
    got = run_reference(derive("p[i] := prod[j](x[i,j])", "x"),
                        {"x": x, "dp": seed}, backend=backend)["dx"]
    expected = np.array([[seed[i] * np.prod(np.delete(x[i], j)) for j in range(6)]
                         for i in range(3)])
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)
