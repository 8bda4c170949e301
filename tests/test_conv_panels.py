"""The panel form of 2-D (and 3-D) convolutions (plan/windowed_panels.py,
backends/c/conv_panels.py): one panel an image, one GEMM per value of the outer window
index over shifted column windows of it.  Values against tests/oracle.py (the rule
forced at small sizes), NaN where a pad meets an infinity, gradients against torch
autograd at the sizes the schedule's rule chooses it for."""

from __future__ import annotations

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.plan.windowed_contraction import WindowMethod, windowed_contraction
from einfuse.plan.windowed_panels import panel_form
from einfuse.schedule.choose import choose

from oracle import brute_force

needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
rng = np.random.default_rng(43)


@pytest.fixture
def forced(monkeypatch):
    """The panel form at any size (the rule's work and depth and the pack's size
    floor at 1);
    the list of panel runners made."""
    from einfuse.backends.c import conv_panels
    from einfuse.schedule import choose as choose_module
    monkeypatch.setattr(choose_module, "PANEL_WORK", 1)
    monkeypatch.setattr(choose_module, "PANEL_DEPTH", 1)
    monkeypatch.setattr(choose_module, "PANEL_DEPTH_UNFOLDED", 1)
    monkeypatch.setattr(choose_module, "PANEL_GEMM_WORK", 1)
    monkeypatch.setattr("einfuse.backends.c.window_pack.MIN_ELEMENTS", 1)
    made = []
    real = conv_panels.panel_runner

    def counted(*args, **kwargs):
        runner = real(*args, **kwargs)
        made.append(runner)
        return runner
    monkeypatch.setattr(conv_panels, "panel_runner", counted)
    return made


def _oracle(statement, arrays, params=None, **options):
    kernel = ef.compile(statement, backend="c", **options)
    ranges = dict(kernel.bind(**arrays, **(params or {})).bounds.range_map)
    return brute_force(statement, ranges, arrays, params or {}, pad=options.get("pad"))


PANELLED = [
    # (statement, options, shapes by name)
    ("y[b,o,i,j] := x[b,c,i+p-1,j+q-1] * w[o,c,p,q]", {"pad": 0, "ranges": {"i": 7, "j": 6}},
     {"x": (2, 3, 7, 6), "w": (4, 3, 3, 3)}),
    ("y[b,o,i,j] := x[b,c,i+2*p-2,j+2*q-2] * w[o,c,p,q]",       # dilation 2
     {"pad": 0, "ranges": {"i": 6, "j": 6}}, {"x": (2, 3, 6, 6), "w": (4, 3, 3, 3)}),
    ("y[b,o,i,j] := x[b,c,i+p,2*j+q] * w[o,c,p,q]", {},          # a stride on the columns
     {"x": (2, 3, 8, 11), "w": (4, 3, 3, 2)}),
    ("dx[b,c,k,l] := dy[b,o,k-p+1,l-q+1] * w[o,c,p,q]",          # falling windows
     {"pad": 0, "ranges": {"k": 7, "l": 5}}, {"dy": (2, 4, 7, 5), "w": (4, 3, 3, 2)}),
    ("y[o,b,j,i] := w[o,c,q,p] * x[b,c,j+q,i+p]", {},             # other axis orders
     {"x": (2, 3, 8, 9), "w": (4, 3, 2, 3)}),
    ("y[o,i,j] := x[c,i+p,j+q] * w[o,c,p,q]", {},                 # no image index
     {"x": (3, 8, 7), "w": (5, 3, 3, 3)}),
    ("y[b,o,i,j] := x[b,c,i+p-1,j+q-1] * w[o,c,p,q]",            # a pad read as itself
     {"pad": 1.5, "ranges": {"i": 5, "j": 6}}, {"x": (2, 3, 5, 6), "w": (4, 3, 3, 3)}),
    ("y[b,o,i,j,k] := x[b,c,i+p,j+q,k+r-1] * w[o,c,p,q,r]",      # 3-D: two axes folded
     {"pad": 0, "ranges": {"i": 4, "j": 3, "k": 5}}, {"x": (2, 2, 5, 4, 5), "w": (3, 2, 2, 2, 3)}),
    ("dw[o,c,p,q] := dy[n,o,i,j] * x[n,c,i+p-1,j+q-1]",          # a weight gradient
     {"pad": 0, "ranges": {"p": 3, "q": 3}}, {"dy": (3, 4, 6, 5), "x": (3, 2, 6, 5)}),
    ("dw[o,c,p,q] := dy[n,i,j,o] * x[n,i+2*p-2,j+2*q-2,c]",      # channels last, dilated
     {"pad": 0, "ranges": {"p": 3, "q": 3}}, {"dy": (2, 6, 6, 4), "x": (2, 6, 6, 3)}),
    ("dw[o,c,p,q] := dy[o,i,j] * x[c,i+p,j+q]", {"ranges": {"p": 3, "q": 2}},
     {"dy": (4, 5, 6), "x": (2, 7, 7)}),
    ("y[b,o,i] := x[b,c,i+2*p-2] * w[o,c,p]",                    # 1-D: nothing folded
     {"pad": 0, "ranges": {"i": 9}}, {"x": (2, 3, 9), "w": (4, 3, 3)}),
    ("dx[b,c,k] := dy[b,o,k-p+1] * w[o,c,p]", {"pad": 0, "ranges": {"k": 8}},
     {"dy": (2, 4, 8), "w": (4, 3, 3)}),
    ("dw[o,c,p] := dy[n,o,i] * x[n,c,i+p-1]", {"pad": 0, "ranges": {"p": 3}},
     {"dy": (3, 4, 8), "x": (3, 2, 8)}),
    # a strided row, read as a weight gradient's form (a GEMM per value of i)
    ("y[b,o,i] := x[b,c,2*i+p] * w[o,c,p]", {}, {"x": (2, 3, 11), "w": (4, 3, 3)}),
    ("y[b,o,i,j] := x[b,c,2*i+p,j+q] * w[o,c,p,q]", {}, {"x": (2, 3, 9, 7), "w": (4, 3, 3, 2)}),
    # the window index written first: the same computations as above
    ("y[b,o,i,j] := x[b,c,p+i-1,q+j-1] * w[o,c,p,q]", {"pad": 0, "ranges": {"i": 7, "j": 6}},
     {"x": (2, 3, 7, 6), "w": (4, 3, 3, 3)}),
    ("y[b,o,i] := x[b,c,2*p+i-2] * w[o,c,p]", {"pad": 0, "ranges": {"i": 9}},
     {"x": (2, 3, 9), "w": (4, 3, 3)}),
    ("dw[o,c,p] := dy[n,o,i] * x[n,c,p+i-1]", {"pad": 0, "ranges": {"p": 3}},
     {"dy": (3, 4, 8), "x": (3, 2, 8)}),
]


@needs_c
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("statement, options, shapes", PANELLED)
def test_panel_form_against_the_oracle(statement, options, shapes, dtype, forced):
    arrays = {n: rng.standard_normal(s).astype(dtype) for n, s in shapes.items()}
    kernel = ef.compile(statement, backend="c", **options)
    schedule = choose(kernel, kernel.bind(**arrays))
    assert schedule.blas.panels is not None and schedule.blas.method is WindowMethod.PATCHES
    got = kernel(**arrays)
    assert [r for r in forced if r is not None], "the panel form did not run"
    want = _oracle(statement, {n: a.astype(np.float64) for n, a in arrays.items()},
                   **options)
    tolerance = 1e-4 if dtype == np.float32 else 1e-12
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


@needs_c
def test_panel_form_scales_by_numbers_and_parameters(forced):
    statement = "y[b,o,i,j] := 0.5 * x[b,c,i+p-1,j+q-1] * alpha * w[o,c,p,q]"
    options = {"pad": 0, "ranges": {"i": 6, "j": 6}}
    arrays = {"x": rng.standard_normal((2, 3, 6, 6)), "w": rng.standard_normal((4, 3, 3, 3))}
    got = ef.ein(statement, backend="c", alpha=1.25, **options, **arrays)
    assert [r for r in forced if r is not None]
    want = _oracle(statement, arrays, {"alpha": 1.25}, **options)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@needs_c
def test_panel_form_reads_non_contiguous_arrays(forced):
    statement, options, shapes = PANELLED[0]
    x = rng.standard_normal((2, 7, 6, 3)).transpose(0, 3, 1, 2)      # channels last
    w = rng.standard_normal((3, 3, 4, 3)).transpose(2, 3, 0, 1)
    got = ef.ein(statement, backend="c", x=x, w=w, **options)
    assert [r for r in forced if r is not None]
    np.testing.assert_allclose(got, _oracle(statement, {"x": x, "w": w}, **options),
                               rtol=1e-12, atol=1e-12)


@needs_c
def test_panel_form_keeps_nan_where_a_pad_meets_an_infinity(forced):
    # the pad's reads are products of the statement: 0 * inf is NaN there
    statement, options, _ = PANELLED[0]
    x, w = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((4, 3, 3, 3))
    w[1, 2, 0, 0] = np.inf
    x[1, 0, 3, 3] = np.nan
    got = ef.ein(statement, backend="c", x=x, w=w, **options)
    want = _oracle(statement, {"x": x, "w": w}, **options)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-12, atol=1e-12)


@needs_c
@pytest.mark.parametrize("statement, shapes, panelled", [
    ("y[b,o,i] := x[b,c,i+p-1] * w[o,c,p]", {"x": (4, 64, 512), "w": (64, 64, 3)}, True),
    # a 1-D panel's GEMMs have K = the channels alone: below 64 channels im2col's one
    # GEMM of K = channels x taps was the faster
    ("y[b,o,i] := x[b,c,i+p-1] * w[o,c,p]", {"x": (4, 32, 8192), "w": (32, 32, 5)}, False),
    ("y[b,o,i] := x[b,c,p+i-1] * w[o,c,p]", {"x": (4, 64, 512), "w": (64, 64, 3)}, True),
    # a strided row read as a weight gradient's form: a GEMM per output position, each
    # 64 x 64 x 5 multiply-adds, is not the way however deep the batch
    ("y[b,o,i] := x[b,c,2*i+p] * w[o,c,p]", {"x": (64, 64, 1024), "w": (64, 64, 5)}, False),
    # GEMMs of K = 3 (the channels): the patches' one GEMM of K = 9 instead
    ("y[b,o,i] := x[b,c,i+p-1] * w[o,c,p]", {"x": (4, 3, 8192), "w": (64, 3, 3)}, False),
    # too little work an image for one BLAS call per window row
    ("y[b,o,i,j] := x[b,c,i+p-1,j+q-1] * w[o,c,p,q]", {"x": (2, 8, 8, 8), "w": (8, 8, 3, 3)},
     False),
])
def test_the_rule_takes_panels_from_work_and_depth(statement, shapes, panelled):
    arrays = {n: np.zeros(s) for n, s in shapes.items()}
    extent = shapes["x"][2]
    ranges = {"i": extent} if "j" not in statement else {"i": extent, "j": extent}
    kernel = ef.compile(statement, backend="c", pad=0, ranges=ranges)
    assert (choose(kernel, kernel.bind(**arrays)).blas.panels is not None) is panelled


@pytest.mark.parametrize("written, swapped, shapes, looped", [
    ("y[b,o,i,j] := x[b,c,i+p,j+q] * w[o,c,p,q]", "y[b,o,i,j] := x[b,c,p+i,q+j] * w[o,c,p,q]",
     {"x": (2, 3, 9, 9), "w": (4, 3, 3, 3)}, "p"),
    ("y[b,o,i] := x[b,c,i+2*p-2] * w[o,c,p]", "y[b,o,i] := x[b,c,2*p+i-2] * w[o,c,p]",
     {"x": (2, 3, 20), "w": (4, 3, 3)}, "p"),
    ("y[o,i] := x[c,i+a] * w[o,c,a]", "y[o,i] := x[c,a+i] * w[o,c,a]",
     {"x": (3, 40), "w": (4, 3, 5)}, "a"),
    ("dw[o,c,p] := dy[n,o,i] * x[n,c,i+p]", "dw[o,c,p] := dy[n,o,i] * x[n,c,p+i]",
     {"dy": (2, 4, 30), "x": (2, 3, 32)}, "p"),
])
def test_panel_form_does_not_depend_on_the_order_of_a_subscripts_terms(
        written, swapped, shapes, looped):
    """``x[c, a+i]`` is ``x[c, i+a]``: one form.  A forward's terms also fit a weight
    gradient's pattern read the other way round (and the reverse); the form with fewer
    GEMMs (one per value of the looped window index) is the one, whatever the order."""
    from einfuse.analysis.spec import spec_of
    arrays = {n: np.zeros(shape) for n, shape in shapes.items()}
    forms = []
    for statement in (written, swapped):
        ranges = dict(ef.compile(statement).bind(**arrays).bounds.range_map)
        forms.append(panel_form(windowed_contraction(spec_of(statement), False), ranges))
    assert forms[0] is not None and forms[0] == forms[1]
    assert forms[0].row[2] == looped


@needs_c
@pytest.mark.parametrize("channels", [16, 32, 64])
def test_a_conv1d_gets_one_schedule_whichever_way_its_window_is_written(channels):
    x = np.zeros((channels, 4096), np.float32)
    w = np.zeros((channels, channels, 5), np.float32)
    schedules = []
    for statement in ("y[o,i] := x[c,i+a] * w[o,c,a]", "y[o,i] := x[c,a+i] * w[o,c,a]"):
        kernel = ef.compile(statement, backend="c")
        schedules.append(choose(kernel, kernel.bind(x=x, w=w)).blas)
    assert schedules[0].method == schedules[1].method
    assert (schedules[0].panels is None) == (schedules[1].panels is None) == (channels < 64)


def test_panel_form_refuses_what_it_cannot_shift():
    def form(statement):
        from einfuse.analysis.spec import spec_of
        return panel_form(windowed_contraction(spec_of(statement), True))
    assert form("y[b,o,i,j] := x[b,c,i+p,j+q] * w[o,c,p,q]") is not None
    assert form("y[b,o,i] := x[b,c,i+p] * w[o,c,p]") is not None
    # a strided row has no forward reading; read the other way round (a GEMM per
    # output position i, the weights as the patches' partner) it has one, whichever
    # way its terms are written (the rule then declines it at real sizes: 1 channel
    # deep); PANELLED checks its values
    for strided in ("y[b,o,i] := x[b,c,2*i+p] * w[o,c,p]",
                    "y[b,o,i] := x[b,c,p+2*i] * w[o,c,p]",
                    "y[b,o,i,j] := x[b,c,2*i+p,j+q] * w[o,c,p,q]"):
        assert form(strided).gradient and form(strided).row[1:3] == ("p", "i")
    assert form("y[b,o,i,j] := x[b,c,i+p,j+q] * w[b,o,c,p,q]") is None  # per-image weights
    assert form("y[b,o,i,j] := x[b,c,i+p,j+p] * w[o,c,p]") is None      # a shared window


CONVS = [
    ("y[b,o,i,j] := x[b,c,i+p-1,j+q-1] * w[o,c,p,q]", {"pad": 0, "ranges": {"i": 24, "j": 24}},
     (3, 16, 24, 24), (32, 16, 3, 3), dict(padding=1)),
    ("y[b,o,i,j] := x[b,c,i+2*p-2,j+2*q-2] * w[o,c,p,q]",
     {"pad": 0, "ranges": {"i": 24, "j": 24}}, (3, 16, 24, 24), (32, 16, 3, 3),
     dict(padding=2, dilation=2)),
]


@needs_c
@pytest.mark.parametrize("library", ["openblas", "mkl"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("statement, options, xshape, wshape, conv", CONVS)
def test_panel_convs_and_gradients_match_torch(statement, options, xshape, wshape, conv,
                                               dtype, library, monkeypatch):
    """At these sizes the rule chooses panels for the forward and both gradients (the
    input gradient gathered over panels of dy instead of scattered), on NumPy's
    OpenBLAS (one thread, an AMD core, its kernels not AVX-512's) or torch's MKL (its
    AVX-512 kernels: backends/c/windowed.openblas_alone_faster)."""
    torch = pytest.importorskip("torch")
    from einfuse.backends.c import windowed
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(windowed, "cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(windowed, "avx512_kernels", lambda: library == "mkl")
    # (a channel more for one library: the kernels and their gradients' are kept per
    # process with each signature's runner, and so its route)
    more = int(library == "mkl")
    xshape = (xshape[0], xshape[1] + more) + tuple(xshape[2:])
    wshape = (wshape[0], wshape[1] + more) + tuple(wshape[2:])
    kind = getattr(torch, dtype)
    x = torch.randn(*xshape, dtype=kind, requires_grad=True)
    w = torch.randn(*wshape, dtype=kind, requires_grad=True)
    kernel = ef.compile(statement, backend="c", **options)
    assert choose(kernel, kernel.bind(x=x.detach().numpy(), w=w.detach().numpy())) \
        .blas.panels is not None
    library_named = "torch.matmul" if library == "mkl" else "numpy.matmul"
    assert library_named in str(ef.explain(statement, x=x.detach(), w=w.detach(),
                                           backend="c", **options))

    def close(mine, theirs, exact):
        # float32: as near the float64 values as torch's own float32 ones are (a weight
        # gradient sums 1728 products: two float32 orders of summation differ by up to
        # ~1e-4, which a fixed atol of 1e-4 flagged now and then)
        if dtype == "float64":
            torch.testing.assert_close(mine, theirs)
            return
        mine, theirs, exact = mine.detach(), theirs.detach(), exact.detach()
        error = float((mine.double() - exact).abs().max())
        assert error <= 2 * float((theirs.double() - exact).abs().max()) + 1e-5
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    for _ in range(3):          # the first call and the prepared repeats
        want = torch.nn.functional.conv2d(x, w, **conv)
        exact = torch.nn.functional.conv2d(x64, w64, **conv)
        got = kernel(x=x, w=w)
        close(got, want, exact)
        seed = torch.randn_like(want)
        for a, b, c in zip(torch.autograd.grad(got, (x, w), seed),
                           torch.autograd.grad(want, (x, w), seed),
                           torch.autograd.grad(exact, (x64, w64), seed.double())):
            close(a, b, c)


@needs_c
def test_explain_names_the_panel_form():
    x, w = np.zeros((4, 32, 32, 32), np.float32), np.zeros((64, 32, 3, 3), np.float32)
    text = str(ef.explain("y[b,o,i,j] := x[b,c,i+p-1,j+q-1] * w[o,c,p,q]", x=x, w=w, pad=0,
                          ranges={"i": 32, "j": 32}))
    assert "panels: one GEMM per value of p" in text and "q packed beside c" in text


@needs_c
@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_panel_weight_gradient_reads_any_layout_and_keeps_nan(library, forced):
    """The weight gradient multiplies the panel's columns by a transposed copy of dy:
    a read-only dy of negative strides, channels last, is read as it is, and the pad's
    products with an infinity stay NaN."""
    statement = "dw[o,c,p,q] := dy[n,o,i,j] * x[n,c,i+2*p-2,j+2*q-2]"
    options = {"pad": 0, "ranges": {"p": 3, "q": 3}}
    dy = rng.standard_normal((2, 6, 7, 4))[:, ::-1, :, ::-1].transpose(0, 3, 1, 2)
    x = rng.standard_normal((2, 3, 6, 7))
    dy[1, 2, 0, 1] = np.inf          # (row 0 meets the pad for p = 0)
    x[0, 1, 4, 4] = np.nan
    dy.flags.writeable = False
    want = _oracle(statement, {"dy": np.array(dy), "x": x}, **options)
    if library == "torch":
        torch = pytest.importorskip("torch")
        got = ef.ein(statement, backend="c", dy=torch.from_numpy(np.array(dy)),
                     x=torch.from_numpy(x), **options).numpy()
    else:
        got = ef.ein(statement, backend="c", dy=dy, x=x, **options)
    assert [r for r in forced if r is not None], "the panel form did not run"
    assert np.isnan(want).any() and np.isfinite(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-12, atol=1e-12)
