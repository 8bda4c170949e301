"""A C call's adjacent indices read as one run of memory merge into one loop, and a
constant reduction (mean's count) becomes a parameter (backends/c/merge_axes.py): the
values stay those of NumPy and the oracle whatever the layout (contiguous, sliced,
transposed, broadcast), and a layout that is not one run is left as it is."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.backends.c.merge_axes import merged_call
from einfuse.lang.printer import format_statement
from oracle import brute_force

needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
rng = np.random.default_rng(33)
MEAN = "m[b,c] := mean[h,w](X[b,c,h,w])"


def _merged(statement, **arrays):
    found = merged_call(ef.compile(statement, backend="c").bind(**arrays))
    return None if found is None else (format_statement(found.call.spec.statement),
                                        found.call.params)


def test_what_merges():
    X = rng.standard_normal((2, 3, 4, 5))
    assert _merged(MEAN, X=X) == ("m[b] := sum[h](X[b, h]) / count_1", {"count_1": 20.0})
    # the last axis reversed, or cut: (h, w) is not one run; (b, c) still is
    text, _ = _merged("m[b,c] := sum[h,w](X[b,c,h,w])", X=X[:, :, :, ::-1])
    assert text == "m[b] := sum[h, w](X[b, h, w])"
    assert _merged("m[b,c] := sum[h,w](X[b,c,h,w])", X=X[:, :, :, :4])[0] == \
        "m[b] := sum[h, w](X[b, h, w])"
    # b, c stored swapped and written in the output's other order: only h, w merge
    assert _merged("m[c,b] := sum[h,w](X[b,c,h,w])", X=X.transpose(1, 0, 2, 3))[0] == \
        "m[c, b] := sum[h](X[b, c, h])"
    # h, w stored swapped: they stay two loops
    assert _merged("m[b,c] := sum[h,w](X[b,c,h,w])", X=X.transpose(0, 1, 3, 2))[0] == \
        "m[b] := sum[h, w](X[b, h, w])"
    assert _merged("m[c,b] := sum[h](X[b,c,h])", X=X[:, :, :, 0]) is None
    # one array read with the pair at two different axes: its view has one shape
    A = rng.standard_normal((4, 4, 4))
    assert _merged("y[k] := sum[h,w](A[h,w,k] * A[k,h,w])", A=A) is None
    # a position counts row-major over the indices as listed: no merge
    assert _merged("y[k] := argmax[i,j](A[i,j,k])", A=A) is None
    # integers, gathers and pad= run as written
    assert _merged(MEAN.replace("mean", "sum"), X=X.astype(np.int64)) is None
    assert merged_call(ef.compile(MEAN, backend="c", pad=0.0).bind(X=X)) is None


@needs_c
@pytest.mark.parametrize("dtype", [pytest.param(np.float32, marks=pytest.mark.slow),
                                   np.float64])
@pytest.mark.parametrize("layout", ["contiguous", "sliced", "transposed", "channels last"])
def test_values_whatever_the_layout(layout, dtype):
    base = rng.standard_normal((3, 4, 6, 5)).astype(dtype)
    X = {"contiguous": base, "sliced": base[:, 1:, :, ::2],
         "transposed": base.transpose(0, 1, 3, 2),
         "channels last": np.ascontiguousarray(base.transpose(0, 2, 3, 1))
         .transpose(0, 3, 1, 2)}[layout]
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12)
    for statement, expected in [(MEAN, X.mean((2, 3))), ("s[b,c] := sum[h,w](X[b,c,h,w])",
                                                         X.sum((2, 3)))]:
        kernel = ef.compile(statement, backend="c")
        for _ in range(2):       # the first call and the prepared repeat
            got = kernel(X=X)
            assert got.shape == expected.shape and got.dtype == dtype
            np.testing.assert_allclose(got, expected, **tol)


@needs_c
def test_broadcast_and_elementwise_statements_merge():
    X = rng.standard_normal((2, 3, 4, 5))
    g = rng.standard_normal(3)
    statement = "y[b,c,h,w] := X[b,c,h,w] * g[c] + 1"
    text, _ = _merged(statement, X=X, g=g)
    assert text == "y[b, c, h] := X[b, c, h] * g[c] + 1"
    kernel = ef.compile(statement, backend="c")
    for _ in range(2):
        np.testing.assert_allclose(kernel(X=X, g=g), X * g[None, :, None, None] + 1)
    statement = "v[b,c] := sum[h,w]((X[b,c,h,w] - 0.5)**2) / 20"
    call = ef.compile(statement, backend="c").bind(X=X)
    expected = brute_force(statement, {n: call.bounds.range_map[n]
                                       for n in call.spec.all_indices}, {"X": X})
    np.testing.assert_allclose(ef.compile(statement, backend="c")(X=X), expected,
                               rtol=1e-12)


@needs_c
def test_mean_on_torch_tensors_and_its_gradient():
    torch = pytest.importorskip("torch")
    kernel = ef.compile(MEAN, backend="c")
    X = torch.randn(3, 4, 5, 6, dtype=torch.float64, requires_grad=True)
    Y = X.detach().clone().requires_grad_()
    weight = torch.randn(3, 4, dtype=torch.float64)
    for _ in range(2):
        X.grad = Y.grad = None
        got = kernel(X=X)
        (got * weight).sum().backward()
        (Y.mean((2, 3)) * weight).sum().backward()
        np.testing.assert_allclose(got.detach().numpy(), Y.mean((2, 3)).detach().numpy(),
                                   rtol=1e-12)
        np.testing.assert_allclose(X.grad.numpy(), Y.grad.numpy(), rtol=1e-12)
