"""Windowed contractions (plan/windowed_contraction.py, run by backends/c/windowed.py):
convolutions and correlations written as statements reach BLAS through strided views of
their operands, whatever the spelling, with the values of the loop nest (tests/oracle.py,
torch's convolutions), gradients as torch's, and the loop nest, said why, where the form
does not apply."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.analysis.spec import analyse
from einfuse.lang import parse
from einfuse.plan import windowed_contraction as wc
from einfuse.plan.windowed_contraction import (WindowMethod, windowed_contraction,
                                               windowed_refusal)
from einfuse.schedule.choose import choose
from einfuse.schedule.schedule import Route

from einfuse.backends.c import build as c_build
from oracle import brute_force

needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")

torch = pytest.importorskip("torch")
F = torch.nn.functional
rng = np.random.default_rng(31)


def spec_of(statement):
    return analyse(parse(statement))


def schedule_of(statement, **kwargs):
    options = {k: kwargs.pop(k) for k in ("pad", "ranges") if k in kwargs}
    kernel = ef.compile(statement, backend="c", **options)
    return choose(kernel, kernel.bind(**kwargs))


def ranges_of(statement, arrays, **options):
    kernel = ef.compile(statement, backend="c", **options)
    return dict(kernel.bind(**arrays).bounds.range_map)


# (statement, options, torch's result from (x, w) as tensors)
CONV2D = [
    ("y[b,o,i,j] := x[b,c,i+p,j+q] * w[o,c,p,q]", {}, lambda x, w: F.conv2d(x, w)),
    ("y[b,o,i,j] := x[b,c,2*i+p,2*j+q] * w[o,c,p,q]", {},
     lambda x, w: F.conv2d(x, w, stride=2)),
    ("y[b,o,i,j] := x[b,c,i+2*p,j+2*q] * w[o,c,p,q]", {},
     lambda x, w: F.conv2d(x, w, dilation=2)),
    ("y[b,o,i,j] := x[b,c,2*i+p-1,2*j+q-1] * w[o,c,p,q]",
     {"pad": 0, "ranges": {"i": 5, "j": 5}},
     lambda x, w: F.conv2d(x, w, stride=2, padding=1)),
    ("y[b,o,i,j] := x[b,c,i+2*p-2,3*j+q-1] * w[o,c,p,q]",
     {"pad": 0, "ranges": {"i": 9, "j": 4}},
     lambda x, w: F.conv2d(x, w, stride=(1, 3), padding=(2, 1), dilation=(2, 1))),
    # other names, other orders, operands swapped, an explicit sum
    ("out[n,f,v,u] := sum[g,s,r](k[f,g,s,r] * img[n,g,v+s,u+r])", {},
     lambda x, w: F.conv2d(x, w)),
    ("y[o,b,j,i] := w[o,c,q,p] * x[b,c,j+q,i+p]", {},
     lambda x, w: F.conv2d(x, w).permute(1, 0, 2, 3)),
    ("y[b,i,j,o] := x[b,c,2*i+p,2*j+q] * w[o,c,p,q]", {},
     lambda x, w: F.conv2d(x, w, stride=2).permute(0, 2, 3, 1)),
]


def _names(statement):
    return ("img", "k") if "img" in statement else ("x", "w")


@needs_c
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("statement, options, expected", CONV2D)
def test_conv2d_values_and_route(statement, options, expected, dtype):
    x = rng.standard_normal((2, 3, 9, 10)).astype(dtype)
    w = rng.standard_normal((4, 3, 3, 3)).astype(dtype)
    names = _names(statement)
    arrays = dict(zip(names, (x, w)))
    schedule = schedule_of(statement, **options, **arrays)
    assert schedule.route is Route.BLAS_WINDOWED
    assert schedule.blas.method is WindowMethod.PATCHES
    y = ef.ein(statement, backend="c", **options, **arrays)
    want = expected(torch.from_numpy(x), torch.from_numpy(w)).numpy()
    tolerance = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, want, rtol=tolerance, atol=tolerance)
    assert y.dtype == dtype


@needs_c
@pytest.mark.parametrize("statement, options", [
    ("y[b,o,i] := x[b,c,2*i+p-1] * w[o,c,p]", {"pad": 0, "ranges": {"i": 6}}),
    ("y[o,i] := x[c,i+3*p] * w[o,c,p]", {}),
    ("y[i,o] := x[c,2*i-p+4] * w[o,c,p]", {}),            # a negative step
    ("y[b,o,i] := x[b,c,i+p-1] * w[o,c,p]", {"pad": 1.5, "ranges": {"i": 11}}),
    ("y[b,o,i] := 0.5 * x[b,c,i+p] * alpha * w[o,c,p]", {}),
])
@pytest.mark.parametrize("method", list(WindowMethod))
def test_1d_values_against_the_oracle(statement, options, method, monkeypatch):
    if method is WindowMethod.PER_OFFSET:       # no room for a patch matrix
        monkeypatch.setattr(wc, "PATCH_BYTES", 0)
    if method is WindowMethod.SCATTER:          # col2im wherever there is a scatter form
        monkeypatch.setattr(wc, "SCATTER_RATIO", float("inf"))
        monkeypatch.setattr("einfuse.backends.c.window_pack.MIN_ELEMENTS", 1)
        if wc.scatter_form(windowed_contraction(spec_of(statement))) is None:
            method = WindowMethod.PATCHES       # (a stride: no scatter form)
    batched = "b," in statement
    x = rng.standard_normal((2, 3, 11) if batched else (3, 11))
    w = rng.standard_normal((4, 3, 3))
    arrays = {"x": x, "w": w}
    params = {"alpha": 1.25} if "alpha" in statement else {}
    schedule = schedule_of(statement, **options, **arrays, **params)
    assert schedule.route is Route.BLAS_WINDOWED and schedule.blas.method is method
    got = ef.ein(statement, backend="c", **options, **arrays, **params)
    ranges = ranges_of(statement, {**arrays, **params}, **options)
    want = brute_force(statement, ranges, arrays, params, pad=options.get("pad"))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@needs_c
def test_torch_conv1d_and_odd_shapes():
    x = rng.standard_normal((3, 5, 17))
    w = rng.standard_normal((7, 5, 4))
    y = ef.ein("y[b,o,i] := x[b,c,3*i+2*p-2] * w[o,c,p]", x=x, w=w, pad=0,
               ranges={"i": 5})
    want = F.conv1d(torch.from_numpy(x), torch.from_numpy(w), stride=3, padding=2,
                    dilation=2)
    np.testing.assert_allclose(y, want.numpy(), rtol=1e-12, atol=1e-12)


@needs_c
def test_equal_spellings_get_the_same_schedule():
    x = rng.standard_normal((2, 3, 8, 8))
    w = rng.standard_normal((4, 3, 3, 3))
    one = schedule_of("y[b,o,i,j] := x[b,c,2*i+p,2*j+q] * w[o,c,p,q]", x=x, w=w)
    two = schedule_of("y[b,o,i,j] := w[o,c,p,q] * x[b,c,2*i+p,2*j+q]", x=x, w=w)
    three = schedule_of("y[b,o,i,j] := sum[c,p,q](x[b,c,2*i+p,2*j+q] * w[o,c,p,q])",
                        x=x, w=w)
    renamed = schedule_of("z[n,f,u,v] := img[n,g,2*u+s,2*v+r] * k[f,g,s,r]", img=x, k=w)
    for schedule in (one, two, three, renamed):
        assert schedule.route is Route.BLAS_WINDOWED
    gemm = one.blas.gemm
    for other in (two, three, renamed):
        g = other.blas.gemm
        # the same GEMM: batch, rows, columns and summed extents, the output in order
        assert (len(g.pre), len(g.rows), len(g.cols), len(g.k), g.order) == \
            (len(gemm.pre), len(gemm.rows), len(gemm.cols), len(gemm.k), gemm.order)
        assert other.blas.method is one.blas.method
    assert one == schedule_of("y[b,o,i,j] := x[b,c,2*i+p,2*j+q]*w[o,c,p,q]", x=x, w=w)


@pytest.mark.parametrize("statement, reason", [
    ("y[b,o,i] := x[b,c,idx[i]+p] * w[o,c,p]", "gathers"),
    ("y[b,o,i] := x[b,c,i//2+p] * w[o,c,p]", "//"),
    ("y[b,c,i] := max[p](x[b,c,2*i+p])", "max"),
    ("y[b,c,i] := x[b,c,i+p] * w[c,p]", "matrix-vector"),     # depthwise
    ("y[o,i] := x[c,i+p] * w[o,c,p] * v[p]", "3 array factors"),
    ("y[o,i] := exp(x[c,i+p]) * w[o,c,p]", "product"),
])
def test_the_fallback_says_why(statement, reason):
    spec = spec_of(statement)
    assert windowed_contraction(spec, True) is None
    assert reason in windowed_refusal(spec)


def test_plain_statements_are_not_refused():
    assert windowed_refusal(spec_of("y[i] := exp(x[i])")) is None
    assert windowed_contraction(spec_of("C[i,j] := A[i,k] * B[k,j]")) is None   # BLAS's


@needs_c
def test_explain_prints_the_route_and_the_fallback():
    x = rng.standard_normal((2, 3, 8, 8))
    w = rng.standard_normal((4, 3, 3, 3))
    text = str(ef.explain("y[b,o,i,j] := x[b,c,2*i+p,2*j+q] * w[o,c,p,q]", x=x, w=w,
                          backend="c"))
    assert "windowed contraction" in text and "im2col" in text
    text = str(ef.explain("y[b,c,i,j] := max[p,q](x[b,c,2*i+p,2*j+q])", x=x,
                          ranges={"p": 2, "q": 2}, backend="c"))
    assert "not a windowed contraction for BLAS (the reduction is max" in text


def _torch_pair(statement, options, x, w):
    kernel = ef.compile(statement, backend="c", **options)
    return lambda a, b: kernel(x=a, w=b)


@needs_c
@pytest.mark.parametrize("statement, options, conv", [
    ("y[b,o,i,j] := x[b,c,2*i+p-1,2*j+q-1] * w[o,c,p,q]",
     {"pad": 0, "ranges": {"i": 4, "j": 4}}, dict(stride=2, padding=1)),
    ("y[b,o,i,j] := x[b,c,i+p,j+q] * w[o,c,p,q]", {}, {}),
    ("y[b,o,i,j] := x[b,c,2*i+p,2*j+2*q] * w[o,c,p,q]", {},
     dict(stride=2, dilation=(1, 2))),
])
def test_gradients_match_torch_autograd(statement, options, conv):
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    run = _torch_pair(statement, options, x, w)
    y = run(x, w)
    ref = F.conv2d(x, w, **conv)
    torch.testing.assert_close(y, ref)
    seed = torch.randn_like(ref)
    got = torch.autograd.grad(y, (x, w), seed)
    want = torch.autograd.grad(ref, (x, w), seed)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r)


@needs_c
def test_gradcheck_float64_small():
    x = torch.randn(1, 2, 6, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 2, 2, 3, dtype=torch.float64, requires_grad=True)
    kernel = ef.compile("y[b,o,i,j] := x[b,c,2*i+p-1,j+2*q-1] * w[o,c,p,q]",
                        backend="c", pad=0, ranges={"i": 3, "j": 4})
    assert torch.autograd.gradcheck(lambda a, b: kernel(x=a, w=b), (x, w))


@needs_c
def test_gradient_statements_reach_the_windowed_route():
    x = rng.standard_normal((2, 3, 9, 9))
    dy = rng.standard_normal((2, 4, 4, 4))
    dw = "dw[o,c,p,q] := dy[b,o,i,j] * x[b,c,2*i+p-1,2*j+q-1]"
    schedule = schedule_of(dw, pad=0, ranges={"p": 3, "q": 3}, dy=dy, x=x)
    assert schedule.route is Route.BLAS_WINDOWED
    got = ef.ein(dw, dy=dy, x=x, pad=0, ranges={"p": 3, "q": 3}, backend="c")
    want = brute_force(dw, ranges_of(dw, {"dy": dy, "x": x}, pad=0,
                                     ranges={"p": 3, "q": 3}), {"dy": dy, "x": x}, pad=0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # the stride-1 input gradient: a transposed convolution (negative steps, padded)
    dx = "dx[b,c,k,l] := dy[b,o,k-p,l-q] * w[o,c,p,q]"
    w = rng.standard_normal((4, 3, 3, 3))
    options = {"pad": 0, "ranges": {"k": 6, "l": 6}}
    assert schedule_of(dx, **options, dy=dy, w=w).route is Route.BLAS_WINDOWED
    got = ef.ein(dx, dy=dy, w=w, backend="c", **options)
    want = brute_force(dx, ranges_of(dx, {"dy": dy, "w": w}, **options),
                       {"dy": dy, "w": w}, pad=0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@needs_c
def test_non_finite_values_and_empty_windows():
    x = rng.standard_normal((1, 2, 7))
    x[0, 1, 3] = np.inf
    x[0, 0, 5] = np.nan
    w = rng.standard_normal((3, 2, 2))
    w[1, 0, 0] = 0.0
    statement = "y[b,o,i] := x[b,c,i+p] * w[o,c,p]"
    got = ef.ein(statement, x=x, w=w, backend="c")
    want = brute_force(statement, ranges_of(statement, {"x": x, "w": w}), {"x": x, "w": w})
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-12)
    # a window longer than the input: an empty output, not an error
    short = rng.standard_normal((1, 2, 1))
    assert ef.ein(statement, x=short, w=w, backend="c").shape == (1, 3, 0)
