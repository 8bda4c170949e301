"""A contraction plus a broadcast term (a Linear layer, plan/contraction_addend.py) runs
as one BLAS matmul and an add (backends/c/blas.py); on CPU torch tensors from
TORCH_BLAS_WORK multiply-adds on, forward and gradient products run on torch's BLAS.
Results are checked against np.einsum and torch autograd of the same formula, on the
first call (the full path) and on repeated ones (the prepared path)."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.analysis.spec import analyse
from einfuse.backends.c import blas as c_blas, build as c_build
from einfuse.lang import parse
from einfuse.plan.contraction_addend import match_contraction_addend

needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
LINEAR = "y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o]"


def match(statement):
    return match_contraction_addend(analyse(parse(statement)))


@pytest.mark.parametrize("statement, addend", [
    (LINEAR, ("bias", ("o",))),
    ("y[b,o] := c[b] + sum[i](x[b,i]*W[i,o])", ("c", ("b",))),
    ("y[o,b] := sum[i](x[b,i]*W[i,o]) + C[b,o]", ("C", ("b", "o"))),
    ("y[b,o] := sum[i](2 * x[b,i]*W[i,o]) + c[]", ("c", ())),
    ("y[i,j] := u[i]*v[j] + w[j]", ("w", ("j",))),
])
def test_recognised(statement, addend):
    found = match(statement)
    assert found is not None and (found.addend, found.addend_indices) == addend


@pytest.mark.parametrize("statement", [
    "y[b,o] := x[b,i]*W[i,o] + bias[o]",            # implicit sum: bias added per i
    "y[b,o] := sum[i](x[b,i]*W[i,o]) - bias[o]",     # not a +
    "y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o+1]",   # not a plain subscript
    "y[b,o] := sum[i](x[b,i]*W[i,o]) + z[b,b]",       # repeated index
    "y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o] + c[b]",   # two terms
    "y[b,o] := 2 * (sum[i](x[b,i]*W[i,o]) + bias[o])",    # a factor on the whole
    "y[b,o] := max[i](x[b,i]*W[i,o]) + bias[o]",     # not a sum
])
def test_not_recognised(statement):
    assert match(statement) is None


def _normal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


# statement, shapes, options, the same with np.einsum
NUMPY_CASES = [
    (LINEAR, {"x": (9, 7), "W": (7, 5), "bias": (5,)}, {},
     lambda x, W, bias: np.einsum("bi,io->bo", x, W) + bias),
    ("y[b,o] := c[b] + sum[i](x[b,i]*W[i,o])", {"x": (9, 7), "W": (7, 5), "c": (9,)}, {},
     lambda x, W, c: np.einsum("bi,io->bo", x, W) + c[:, None]),
    ("y[o,b] := sum[i](x[b,i]*W[i,o]) + C[b,o]", {"x": (9, 7), "W": (7, 5), "C": (9, 5)},
     {}, lambda x, W, C: (np.einsum("bi,io->bo", x, W) + C).T),
    ("y[o,b] := sum[i](x[b,i]*W[i,o]) + C[o,b]", {"x": (9, 7), "W": (7, 5), "C": (5, 9)},
     {}, lambda x, W, C: np.einsum("bi,io->ob", x, W) + C),
    ("y[b,o] := sum[i](x[b,i]*s*W[i,o]) + bias[o]", {"x": (9, 7), "W": (7, 5),
                                                    "bias": (5,)}, {"s": 0.5},
     lambda x, W, bias, s: s * np.einsum("bi,io->bo", x, W) + bias),
    ("y[n,b,o] := sum[i](x[n,b,i]*W[n,i,o]) + bias[n,o]",
     {"x": (3, 4, 6), "W": (3, 6, 5), "bias": (3, 5)}, {},
     lambda x, W, bias: np.einsum("nbi,nio->nbo", x, W) + bias[:, None, :]),
    ("y[b,t,o] := sum[i](x[b,t,i]*W[i,o]) + bias[t]",
     {"x": (3, 4, 6), "W": (6, 5), "bias": (4,)}, {},
     lambda x, W, bias: np.einsum("bti,io->bto", x, W) + bias[None, :, None]),
    ("y[i,j] := u[i]*v[j] + w[j]", {"u": (6,), "v": (4,), "w": (4,)}, {},
     lambda u, v, w: np.outer(u, v) + w),
    ("y[b,o] := sum[i](x[b,i]*W[i,o]) + c[]", {"x": (9, 7), "W": (7, 5), "c": ()}, {},
     lambda x, W, c: x @ W + c),
]


@needs_c
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("statement, shapes, params, formula", NUMPY_CASES)
def test_numpy_results(statement, shapes, params, formula, dtype):
    rng = np.random.default_rng(5)
    arrays = {name: _normal(rng, shape, dtype) for name, shape in shapes.items()}
    kernel = ef.compile(statement, backend="c")
    want = formula(**arrays, **params)
    for _ in range(3):        # the full path, then the prepared one
        got = kernel(**arrays, **params)
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=2e-5 if dtype == np.float32 else 1e-12,
                                   atol=1e-5)


@needs_c
def test_windows_mixed_dtypes_and_views():
    rng = np.random.default_rng(6)
    x = _normal(rng, (8, 6), np.float32)
    W = _normal(rng, (6, 10), np.float32)
    bias = rng.integers(-5, 5, 10)                    # int64: the result is float64
    kernel = ef.compile(LINEAR, backend="c", ranges={"o": range(2, 7), "i": range(1, 5)})
    want = x[:, 1:5].astype(np.float64) @ W[1:5, 2:7] + bias[2:7]
    for _ in range(2):
        got = kernel(x=x, W=W, bias=bias)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-6)
    # transposed and strided views as inputs
    xt, Wt = _normal(rng, (6, 8), np.float64), _normal(rng, (20, 6), np.float64)[::2]
    b = _normal(rng, (20,), np.float64)[::2]
    for _ in range(2):
        np.testing.assert_allclose(ef.ein(LINEAR, x=xt.T, W=Wt.T, bias=b, backend="c"),
                                   xt.T @ Wt.T + b, rtol=1e-12)


@needs_c
def test_explain_says_blas():
    text = str(ef.explain(LINEAR, shapes={"x": (4, 3), "W": (3, 5), "bias": (5,)},
                          backend="c"))
    assert "one BLAS matmul" in text and "bias[o] added" in text


torch = pytest.importorskip("torch")

# statement, shapes, the same formula in torch
TORCH_CASES = [
    (LINEAR, {"x": (64, 80), "W": (80, 72), "bias": (72,)},
     lambda x, W, bias: x @ W + bias),
    (LINEAR, {"x": (5, 7), "W": (7, 6), "bias": (6,)},        # NumPy's BLAS: small
     lambda x, W, bias: x @ W + bias),
    ("y[o,b] := c[b] + sum[i](x[b,i]*W[i,o])", {"x": (64, 80), "W": (80, 72), "c": (64,)},
     lambda x, W, c: (x @ W + c[:, None]).T),
    ("y[n,b,o] := sum[i](x[n,b,i]*W[n,i,o]) + bias[n,o]",
     {"x": (4, 32, 48), "W": (4, 48, 40), "bias": (4, 40)},
     lambda x, W, bias: x @ W + bias[:, None, :]),
]


@needs_c
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("statement, shapes, formula", TORCH_CASES)
def test_torch_forward_and_backward(statement, shapes, formula, dtype):
    gen = torch.Generator().manual_seed(7)
    ours = {name: torch.randn(shape, dtype=dtype, generator=gen).requires_grad_(True)
            for name, shape in shapes.items()}
    theirs = {name: value.detach().clone().requires_grad_(True)
              for name, value in ours.items()}
    kernel = ef.compile(statement, backend="c")
    want = formula(**theirs)
    seed = torch.randn(want.shape, dtype=dtype, generator=gen)
    want.backward(seed)
    tolerance = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else \
        {"rtol": 1e-10, "atol": 1e-10}
    for _ in range(3):       # full path, then prepared forward and backward
        for value in ours.values():
            value.grad = None
        got = kernel(**ours)
        assert got.dtype == dtype
        torch.testing.assert_close(got, want.detach(), **tolerance)
        got.backward(seed)
        for name in ours:
            torch.testing.assert_close(ours[name].grad, theirs[name].grad, **tolerance)
        with torch.no_grad():
            torch.testing.assert_close(kernel(**ours), want.detach(), **tolerance)


@needs_c
def test_torch_tensors_take_torchs_blas(monkeypatch):
    """A Linear on tensors large enough runs its forward as torch.addmm and its two
    gradient products as torch.matmul; NumPy arrays of the same shapes do not."""
    calls = []
    for name in ("addmm", "matmul"):
        original = getattr(torch, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)
        monkeypatch.setattr(torch, name, counted)
    n = 64       # 64**3 multiply-adds: TORCH_BLAS_WORK
    assert n ** 3 >= c_blas.TORCH_BLAS_WORK
    kernel = ef.compile(LINEAR, backend="c")
    arrays = {"x": np.ones((n, n), np.float32), "W": np.ones((n, n), np.float32),
              "bias": np.ones(n, np.float32)}
    for _ in range(2):
        kernel(**arrays)
    assert calls == []
    tensors = {k: torch.from_numpy(v).requires_grad_(True) for k, v in arrays.items()}
    for _ in range(3):     # the full path (NumPy's BLAS), preparing, prepared
        calls.clear()
        for value in tensors.values():
            value.grad = None
        kernel(**tensors).sum().backward()
    assert sorted(calls) == ["addmm", "matmul", "matmul"]
    assert torch.equal(tensors["bias"].grad, torch.full((n,), float(n)))
    assert torch.equal(tensors["W"].grad, torch.full((n, n), float(n)))
