"""cdist forward + backward (issue 11): the pairwise forward packed for lanes
(backends/c/lane_layout.py), the gradients' costly (i, j) factor computed once
(rewrite/factors.py) and the forward's result read instead of recomputed
(autodiff/reuse.py).  Every result is checked against torch.cdist's autograd in float64,
numpy, the brute-force oracle or gradcheck."""

import numpy as np
import pytest

import einfuse as ef
from einfuse import derive, run_reference
from einfuse.autodiff.reuse import with_output
from einfuse.backends.c import backend as c_backend
from oracle import brute_force

torch = pytest.importorskip("torch")

CDIST = "D[i,j] := sqrt(sum[d]((x[i,d] - y[j,d])**2))"
GAUSS = "o[i] := sum[j](exp(-sum[d]((x[i,d] - y[j,d])**2)) * b[j])"

rng = np.random.default_rng(11)


def fwd_bwd(kernel, x, y, weights):
    x = x.detach().clone().requires_grad_()
    y = y.detach().clone().requires_grad_()
    out = kernel(x, y)
    out.backward(weights)
    return out.detach(), x.grad, y.grad


def torch_reference(x, y, weights):
    """torch.cdist's own forward and backward, in float64."""
    return fwd_bwd(lambda a, b: torch.cdist(a, b), x.double(), y.double(), weights.double())


# the hidden-shape variants (issue 11) at test sizes: d short, d long, n != m
@pytest.mark.parametrize("n,m,d", [(24, 70, 3), pytest.param(70, 24, 33, marks=pytest.mark.slow),
                                   pytest.param(40, 40, 8, marks=pytest.mark.slow), (5, 9, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cdist_forward_backward_matches_torch(n, m, d, dtype):
    gen = torch.Generator().manual_seed(n * m + d)
    x, y = torch.randn(n, d, generator=gen, dtype=dtype), torch.randn(m, d, generator=gen,
                                                                       dtype=dtype)
    weights = torch.randn(n, m, generator=gen, dtype=dtype)
    kernel = ef.compile(CDIST)
    want = torch_reference(x, y, weights)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    for _ in range(3):      # the first call, then the prepared (repeated) path
        got = fwd_bwd(kernel, x, y, weights)
        for g, w in zip(got, want):
            assert g.dtype == dtype
            np.testing.assert_allclose(g.double().numpy(), w.numpy(), rtol=tol, atol=tol)


def test_cdist_gradcheck():
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: ef.ein(CDIST, x=a, y=b), (x, y))


def test_close_points_with_large_coordinates_keep_their_gradient():
    """x[i] a hair from y[j] far from the origin: the gradient is the unit vector
    (x - y) / |x - y|, which a form expanding |x|^2 - 2 x.y + |y|^2 would lose
    entirely (every bit cancels); the direct form keeps it in float32 too."""
    base = rng.uniform(-1, 1, (6, 4)) * 1e4
    offset = rng.standard_normal((6, 4)) * 1e-2
    for dtype in (torch.float32, torch.float64):
        y = torch.tensor(base, dtype=dtype)
        x = y + torch.tensor(offset, dtype=dtype)     # rounded to dtype: the inputs
        weights = torch.ones(6, 6, dtype=dtype)
        got = fwd_bwd(ef.compile(CDIST), x, y, weights)
        want = torch_reference(x, y, weights)      # float64, direct form
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.double().numpy(), w.numpy(), rtol=2e-5,
                                       atol=1e-6 * (1e4 if g is got[0] else 1))


def test_zero_distance_rows_are_nan_as_the_reference_says():
    """x[0] == y[2]: D = 0 and the derivative of sqrt at 0 is infinite; times the zero
    difference that is nan (inf * 0), which row 0 of dx and row 2 of dy carry, on
    every path: the NumPy reference statements, the C kernels, torch's first and
    repeated calls.  (torch.cdist returns 0 there, a subgradient.)  Every other row is
    finite and agrees with torch."""
    x = torch.randn(4, 3, dtype=torch.float64)
    y = torch.randn(5, 3, dtype=torch.float64)
    y[2] = x[0]
    weights = torch.rand(4, 5, dtype=torch.float64) + 0.5
    arrays = {"x": x.numpy(), "y": y.numpy(), "dD": weights.numpy()}
    reference = {w: run_reference(derive(CDIST, w), arrays)[f"d{w}"] for w in "xy"}
    assert np.isnan(reference["x"][0]).all() and np.isnan(reference["y"][2]).all()
    want = torch_reference(x, y, weights)
    kernel = ef.compile(CDIST)
    for _ in range(2):
        out, dx, dy = fwd_bwd(kernel, x, y, weights)
        assert out[0, 2] == 0
        for got, ref, row, torch_grad in ((dx, reference["x"], 0, want[1]),
                                          (dy, reference["y"], 2, want[2])):
            got = got.numpy()
            assert np.isnan(got[row]).all()
            np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
            keep = np.arange(len(got)) != row
            np.testing.assert_allclose(got[keep], ref[keep], rtol=1e-12)
            np.testing.assert_allclose(got[keep], torch_grad.numpy()[keep], rtol=1e-12)


def test_gradients_read_the_forward_result():
    """derive's cdist gradients recompute sqrt(sum[d](...)), the forward's right side:
    torch's node keeps the result and the statement run reads it."""
    for wrt in "xy":
        (g,) = derive(CDIST, wrt)
        read = with_output(g, CDIST)
        assert read is not None and "sqrt" not in read.text and "D[i, j]" in read.text
    (g,) = derive("z[i] := logsumexp[j](X[i,j])", "X")
    assert "z[i]" in with_output(g, "z[i] := logsumexp[j](X[i,j])").text
    # a gradient not containing the forward's right side is left alone
    (g,) = derive("C[i,j] := A[i,k] * B[k,j]", "A")
    assert with_output(g, "C[i,j] := A[i,k] * B[k,j]") is None


@pytest.mark.parametrize("statement,inputs,formula", [
    ("z[i] := logsumexp[j](X[i,j])", {"X": (5, 7)}, lambda X: torch.logsumexp(X, 1)),
    ("y[i,j] := exp(X[i,j] * 0.5)", {"X": (3, 4)}, lambda X: torch.exp(X * 0.5)),
    (CDIST, {"x": (6, 3), "y": (4, 3)}, torch.cdist),
])
def test_reading_the_result_matches_torch(statement, inputs, formula):
    gen = torch.Generator().manual_seed(5)
    leaves = {k: torch.randn(s, dtype=torch.float64, generator=gen).requires_grad_()
              for k, s in inputs.items()}
    kernel = ef.compile(statement)
    expected = torch.autograd.grad(formula(*leaves.values()).sin().sum(),
                                   list(leaves.values()))
    for _ in range(3):
        got = torch.autograd.grad(kernel(**leaves).sin().sum(), list(leaves.values()))
        for g, w in zip(got, expected):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_result_modified_in_place_is_refused_not_used():
    """The node keeps the forward's result: modified in place before the backward, it
    is torch's error (as for torch.cdist), never a gradient from the changed values."""
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    kernel = ef.compile(CDIST)
    for _ in range(2):      # the first call, then the prepared path
        out = kernel(x, y)
        out.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


@pytest.mark.parametrize("statement,wrt", [(CDIST, "x"), (CDIST, "y"), (GAUSS, "x"),
                                           (GAUSS, "y")])
def test_costly_factor_is_one_temporary(backend, statement, wrt):
    """The gradient's (i, j) factor (the division and square root, the exponential) is
    one temporary, its inner sum fused into it; the statement left multiplies and adds.
    Equal to the brute-force oracle."""
    (g,) = derive(statement, wrt)
    kernel = ef.compile(g.text, backend=backend)
    temporaries = kernel.hoisted_form.hoisted.temporaries
    # dD[i, j]'s layout where the factor reads dD; gauss's has no (i, j) array
    layout = ("i", "j") if statement == CDIST else (("i", "j") if wrt == "x" else ("j", "i"))
    assert len(temporaries) == 1 and temporaries[0].output_indices == layout
    main = kernel.hoisted_form.texts[-1]
    assert "sqrt" not in main and "exp" not in main
    n, m, d = 5, 6, 3
    arrays = {"x": rng.standard_normal((n, d)), "y": rng.standard_normal((m, d)),
              "b": rng.standard_normal(m), g.output_grad: rng.standard_normal(
                  (n, m) if statement == CDIST else (n,))}
    arrays = {k: v for k, v in arrays.items() if k in kernel.spec.arg_order}
    ranges = {"i": (0, n), "j": (0, m), "d": (0, d), "d2": (0, d)}
    expected = brute_force(g.text, ranges, arrays, {})
    np.testing.assert_allclose(kernel(**arrays), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("statement,hoisted", [
    # exp of an (i, j) product of vectors: its temporary would be larger than any input
    ("o[i,d] := sum[j](exp(u[i] * v[j]) * w[j,d])", 0),
    # cheap arithmetic is recomputed rather than loaded
    ("o[i,d] := sum[j](A[i,j] * 2 * w[j,d])", 0),
    # an (i, j) array's function is as large as the array: hoisted
    ("o[i,d] := sum[j](exp(A[i,j]) * w[j,d])", 1),
])
def test_factor_hoisting_stays_bounded(statement, hoisted):
    shapes = {"u": (4,), "v": (5,), "w": (5, 3), "A": (4, 5)}
    kernel = ef.compile(statement)
    form = kernel.hoisted_form
    assert (len(form.hoisted.temporaries) if form is not None else 0) == hoisted
    arrays = {k: rng.standard_normal(s) for k, s in shapes.items()
              if k in kernel.spec.arg_order}
    expected = brute_force(statement, {"i": (0, 4), "j": (0, 5), "d": (0, 3)}, arrays, {})
    np.testing.assert_allclose(kernel(**arrays), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n,m,d", [(300, 200, 64), (200, 600, 3)])
def test_pairwise_forward_tiles_lanes_over_j(n, m, d):
    """y[j, d] is read along j: the C backend packs it so that j runs over SIMD lanes
    (row blocks of i), and the result is numpy's, for strided inputs too."""
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = rng.standard_normal((m, d)).astype(np.float32)
    call = ef.compile(CDIST).bind(x=x, y=y)
    buffers = c_backend._buffers(call) + [np.empty(call.output_shape, np.float32)]
    plan = c_backend._plan(call, c_backend._run_layouts(call, buffers))
    assert plan.mode == "tiled" and plan.inner == "j"
    want = np.sqrt(((x[:, None].astype(np.float64) - y[None]) ** 2).sum(-1))
    for xs, ys in ((x, y), (np.asfortranarray(x), y[::-1].copy()[::-1])):
        np.testing.assert_allclose(ef.ein(CDIST, x=xs, y=ys), want, rtol=2e-5, atol=2e-5)
