"""The copies around a windowed contraction's GEMMs at sizes that reach their C kernels
(backends/c/window_pack.py: patches packed from the unpadded array, col2im as one walk)
and torch's BLAS (backends/c/windowed_torch.py): values against NumPy formulations and
tests/oracle.py, the col2im's bits against np.add.at, gradients against torch autograd."""

from __future__ import annotations

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.backends.c.window_pack import MIN_ELEMENTS, add_window, pack_window
from einfuse.runtime import gradients
from einfuse.runtime.gradient_reference import resolve_options
from einfuse.runtime.window_scatter import add_by_offsets

from fresh_runs import fresh_runs
from oracle import brute_force

needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
rng = np.random.default_rng(31)


def ranges_of(statement, arrays, **options):
    kernel = ef.compile(statement, backend="c", **options)
    return dict(kernel.bind(**arrays).bounds.range_map)


def _reference_pack(array, shape, coefficients, origin, fill):
    """The same view, point by point."""
    out = np.empty(shape, array.dtype)
    for point in np.ndindex(*shape):
        at = np.array(origin) + sum(t * np.array(c) for t, c in zip(point, coefficients))
        inside = all(0 <= a < n for a, n in zip(at, array.shape))
        out[point] = array[tuple(at)] if inside else fill
    return out


@needs_c
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xshape, shape, coefficients, origin", [
    # conv2d patches (b, c, p, q, i, j) of x[b, c, 2i+p-1, 2j+q-1]
    ((2, 3, 17, 17), (2, 3, 3, 3, 9, 9), [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1],
                          [0, 0, 2, 0], [0, 0, 0, 2]], (0, 0, -1, -1)),
    # the weight gradient's order (c, p, q, b, i, j), dilation 2, a wide pad
    ((2, 3, 17, 17), (3, 3, 3, 2, 10, 10), [[0, 1, 0, 0], [0, 0, 2, 0], [0, 0, 0, 2], [1, 0, 0, 0],
                            [0, 0, 1, 0], [0, 0, 0, 1]], (0, 0, -3, -3)),
    # a transposed convolution's reversed reads, and a last axis sharing an array axis
    ((4, 3, 400), (4, 3, 4, 400), [[1, 0, 0], [0, 1, 0], [0, 0, -1], [0, 0, 1]], (0, 0, 2)),
    # reads that fall outside on every axis
    ((3, 40, 33), (4, 30, 40), [[1, 0, 0], [0, 0, 1], [0, 1, 0]], (-1, -5, 30)),
])
def test_pack_window_matches_the_view_point_by_point(xshape, shape, coefficients, origin,
                                                     dtype):
    x = rng.standard_normal(xshape).astype(dtype)
    assert np.prod(shape) >= MIN_ELEMENTS
    got = pack_window(x, shape, coefficients, origin, -2.5)
    assert got is not None and got.flags.c_contiguous
    np.testing.assert_array_equal(got, _reference_pack(x, shape, coefficients, origin, -2.5))


@needs_c
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("step", [1, 2, 3])
@pytest.mark.parametrize("length, start, width", [
    (n, s, w) for n in (1, 3, 4, 5, 7, 8, 9, 12, 16, 17, 31, 32, 33)
    for s, w in ((0, 200), (-1, 200), (-2, 40), (1, 2 * n - 1), (0, 2 * n))])
def test_pack_window_rows_of_every_length_and_cut(length, start, width, step, dtype):
    """Rows of a view (a stride-1, -2 or -3 row of patches) of each length around the
    vector widths, cut by the pad on the left, the right or both (the C copies a row by
    whole vectors, the last overlapping the one before): every point is the array's
    element or the pad, NaN and infinities copied as they are."""
    x = rng.standard_normal((4096 // length + 8, width)).astype(dtype)
    x[1, ::3], x[2, ::5], x[3, 1::4] = np.nan, np.inf, -np.inf
    shape, coefficients = (x.shape[0] - 4, length), [[1, 0], [0, step]]
    got = pack_window(x, shape, coefficients, (2, start), 7.0)
    columns = start + step * np.arange(length)
    inside = (columns >= 0) & (columns < width)
    want = np.full(shape, 7.0, dtype)
    want[:, inside] = x[2:2 + shape[0], columns[inside]]
    np.testing.assert_array_equal(got, want)


@needs_c
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [(32, 32), (16, 32), (32, 33)])
def test_prepared_pack_pads_rows_that_would_alias(rows, dtype):
    """A pack read as a matrix whose rows (the view's last two axes) lie a multiple of
    4096 bytes apart is written with a cache line after each row (padded_row): the
    values are the view's, NaN and the pad included; only the steps differ."""
    from einfuse.backends.c.window_pack import PAD_BYTES, prepared_pack
    x = rng.standard_normal((3, 2 * rows[0] + 1, 2 * rows[1] + 1)).astype(dtype)
    x[1, 4, ::3] = np.nan
    shape = (3, 3, 3) + rows                      # patches (c, p, q) x (i, j), stride 2
    coefficients, origin = [[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 2, 0], [0, 0, 2]], (0, -1, -1)
    row = rows[0] * rows[1]
    got = prepared_pack(x, shape, coefficients, origin, -1.5, row=row)(x)
    np.testing.assert_array_equal(got, _reference_pack(x, shape, coefficients, origin, -1.5))
    aliased = row * x.itemsize % 4096 == 0
    assert aliased == (rows == (32, 32) or (dtype == np.float64 and rows == (16, 32)))
    step = got.reshape(-1, row).strides[0] // x.itemsize
    assert step == (row + PAD_BYTES // x.itemsize if aliased else row)
    # (read as another matrix, the pack is not padded)
    assert prepared_pack(x, shape, coefficients, origin, -1.5)(x).flags.c_contiguous


STRIDED = "y[b,o,i,j] := x[b,c,2*i+p-1,2*j+q-1] * w[o,c,p,q]"


@needs_c
def test_strided_conv_with_padded_patches_matches_the_oracle():
    """32x32 outputs: im2col rows of 4 KiB, padded; NaN where the oracle has it."""
    x = rng.standard_normal((1, 2, 64, 64))
    w = rng.standard_normal((2, 2, 3, 3))
    x[0, 1, 10, 11] = np.nan
    options = {"pad": 0, "ranges": {"i": 32, "j": 32}}
    for dtype in (np.float32, np.float64):
        arrays = {"x": x.astype(dtype), "w": w.astype(dtype)}
        got = ef.ein(STRIDED, backend="c", **options, **arrays)
        want = brute_force(STRIDED, ranges_of(STRIDED, arrays, **options), arrays, pad=0)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        finite = np.isfinite(want)
        tolerance = 1e-4 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(got[finite], want[finite], rtol=tolerance, atol=tolerance)


@needs_c
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_strided_conv_with_padded_patches_matches_torch(dtype):
    """A stride-2 conv2d whose 32x32 outputs make im2col rows of 4 KiB (float32) or 8 KiB
    (float64), padded: the forward and both gradients as torch's."""
    torch = pytest.importorskip("torch")
    kind = getattr(torch, dtype)
    x = torch.randn(2, 8, 64, 64, dtype=kind, requires_grad=True)
    w = torch.randn(16, 8, 3, 3, dtype=kind, requires_grad=True)
    kernel = ef.compile(STRIDED, backend="c", pad=0, ranges={"i": 32, "j": 32})
    tolerance = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else {}
    want = torch.nn.functional.conv2d(x, w, stride=2, padding=1)
    seed = torch.randn_like(want)
    for _ in range(2):          # the first call and the prepared repeat
        got = kernel(x=x, w=w)
        torch.testing.assert_close(got, want, **tolerance)
        for a, b in zip(torch.autograd.grad(got, (x, w), seed),
                        torch.autograd.grad(want, (x, w), seed, retain_graph=True)):
            torch.testing.assert_close(a, b, **tolerance)
    if dtype == "float64":
        assert torch.autograd.gradcheck(
            lambda a, b: kernel(x=a, w=b).sum(), (x[:1, :2].detach().requires_grad_(),
                                                  w[:2, :2].detach().requires_grad_()))


@needs_c
def test_pack_window_reads_a_non_contiguous_array():
    x = rng.standard_normal((20, 40, 30)).astype(np.float32).transpose(2, 0, 1)[:, ::2]
    shape, coefficients, origin = (30, 3, 10, 20), [[1, 0, 0], [0, 1, 0], [0, 2, 0],
                                                    [0, 0, 2]], (0, -1, -3)
    got = pack_window(x, shape, coefficients, origin, 0.0)
    np.testing.assert_array_equal(got, _reference_pack(x, shape, coefficients, origin, 0.0))


@needs_c
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_add_window_adds_each_point_once_and_drops_the_outside(dtype):
    target = rng.standard_normal((4, 8, 20, 21)).astype(dtype)
    values = rng.standard_normal((4, 8, 12, 12)).astype(dtype)
    coefficients, origin = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 2, 0], [0, 0, 0, 2]], \
        (0, 0, -1, -2)
    want = target.copy()
    for point in np.ndindex(*values.shape):
        at = np.array(origin) + sum(t * np.array(c) for t, c in zip(point, coefficients))
        if all(0 <= a < n for a, n in zip(at, target.shape)):
            want[tuple(at)] += values[point]
    # the values with steps of their own (a GEMM's product as it lies)
    strided = np.ascontiguousarray(values.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    assert add_window(target, strided, coefficients, origin)
    np.testing.assert_array_equal(target, want)



@needs_c
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_add_window_at_stride_two_touches_only_its_points(dtype):
    """Rows of a stride-2 view of every length from 1 to 40 (the vector path, its
    masked tail and the scalar loop): each point gets one IEEE addition, and the
    elements between the points -- NaN, -0.0, inf here -- keep their bits."""
    for width in range(1, 41):
        rows = max(1, MIN_ELEMENTS // width + 1)
        target = rng.standard_normal((rows, 2 * width + 1)).astype(dtype)
        target[:, 1::2] = np.array([np.nan, -0.0, np.inf], dtype)[np.arange(width) % 3]
        target[::3, 0] = -0.0
        values = rng.standard_normal((rows, width)).astype(dtype)
        values[1::3, 0] = -0.0
        want = target.copy()
        want[:, 0:2 * width:2] += values
        assert add_window(target, values, [[1, 0], [0, 2]], (0, 0))
        np.testing.assert_array_equal(target.view(f"u{target.itemsize}"),
                                      want.view(f"u{want.itemsize}"))

def _scatter_of(statement, options, xshape, wshape):
    kernel = ef.compile(statement, **options)
    key = gradients.options_key(kernel.options)
    scatter, = [g for g in gradients.gradient_statements(kernel.statement, "x", key)
                if g.kind == "scatter"]
    x, w = rng.standard_normal(xshape), rng.standard_normal(wshape)
    y = kernel(x=x, w=w)
    values = {"x": x, "w": w, scatter.output_grad: rng.standard_normal(y.shape)}
    ranges = resolve_options(scatter, values)["ranges"]
    return scatter, {n: ranges[n] for n in scatter.spec.output_indices}


@needs_c
@pytest.mark.parametrize("statement, options, xshape, wshape", [
    ("y[b,o,i,j] := x[b,c,2*i+p-1,2*j+q-1] * w[o,c,p,q]",
     {"pad": 0, "ranges": {"i": 16, "j": 16}}, (2, 3, 32, 32), (4, 3, 3, 3)),
    ("y[b,o,i,j] := x[b,c,2*i+p-1,3*j+q-2] * w[o,c,p,q]",
     {"pad": 0, "ranges": {"i": 17, "j": 14}}, (2, 3, 33, 40), (4, 3, 3, 4)),
    ("y[b,o,i] := x[b,c,2*i+p] * w[o,c,p]", {}, (2, 8, 301), (4, 8, 5)),
    ("y[b,o,i] := x[b,c,2*i-p+4] * w[o,c,p]",       # a falling window: walked downwards
     {"pad": 0, "ranges": {"i": 300}}, (2, 8, 600), (4, 8, 5)),
    ("y[o,i,b] := x[2*i+p-1,c,b] * w[o,c,p]",       # the channels and images innermost
     {"pad": 0, "ranges": {"i": 100}}, (200, 6, 5), (4, 6, 3)),
])
def test_col2im_in_one_walk_has_the_bits_of_np_add_at(statement, options, xshape, wshape):
    scatter, ranges = _scatter_of(statement, options, xshape, wshape)
    values = rng.standard_normal(tuple(len(ranges[n]) for n in scatter.spec.output_indices))
    assert values.size >= MIN_ELEMENTS
    base = rng.standard_normal(xshape)
    got = base.copy()
    assert add_by_offsets(got, scatter, values, ranges)
    grid = dict(zip(scatter.spec.output_indices, np.meshgrid(
        *[np.arange(ranges[n].start, ranges[n].stop) for n in scatter.spec.output_indices],
        indexing="ij")))
    keep = np.ones(values.shape, bool)
    positions = []
    for axis, sub in enumerate(scatter.scatter):
        where = np.broadcast_to(sub.constant + sum(c * grid[n] for n, c in sub.terms),
                                values.shape)
        keep &= (where >= 0) & (where < xshape[axis])
        positions.append(where)
    want = base.copy()
    np.add.at(want, tuple(p[keep] for p in positions), values[keep])
    np.testing.assert_array_equal(got, want)


CONVS = [
    ("y[b,o,i,j] := x[b,c,2*i+p-1,2*j+q-1] * w[o,c,p,q]",
     {"pad": 0, "ranges": {"i": 12, "j": 12}}, (4, 8, 24, 24), (16, 8, 3, 3),
     dict(stride=2, padding=1)),
    ("y[b,o,i,j] := x[b,c,i+p-1,j+q-1] * w[o,c,p,q]",
     {"pad": 0, "ranges": {"i": 20, "j": 18}}, (2, 6, 20, 18), (8, 6, 3, 3),
     dict(padding=1)),
    ("y[b,o,i,j] := x[b,c,i+2*p-2,j+2*q-2] * w[o,c,p,q]",
     {"pad": 0, "ranges": {"i": 20, "j": 20}}, (2, 6, 20, 20), (8, 6, 3, 3),
     dict(padding=2, dilation=2)),
    ("y[b,o,i] := x[b,c,2*i+p] * w[o,c,p]", {}, (4, 16, 201), (16, 16, 5),
     dict(stride=2)),
    ("y[b,o,i] := x[b,c,i+p-1] * w[o,c,p]", {"pad": 0, "ranges": {"i": 300}},
     (4, 16, 300), (16, 16, 3), dict(padding=1)),
]


@needs_c
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("statement, options, xshape, wshape, conv", CONVS)
def test_conv_forward_and_gradients_match_torch(statement, options, xshape, wshape, conv,
                                                dtype):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    kind = getattr(torch, dtype)
    x = torch.randn(*xshape, dtype=kind, requires_grad=True)
    w = torch.randn(*wshape, dtype=kind, requires_grad=True)
    kernel = ef.compile(statement, backend="c", **options)
    convolve = F.conv2d if len(xshape) == 4 else F.conv1d
    tolerance = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else {}
    for _ in range(2):          # the first call and the prepared repeat
        want = convolve(x, w, **conv)
        got = kernel(x=x, w=w)
        torch.testing.assert_close(got, want, **tolerance)
        seed = torch.randn_like(want)
        mine = torch.autograd.grad(got, (x, w), seed)
        theirs = torch.autograd.grad(want, (x, w), seed)
        for a, b in zip(mine, theirs):
            torch.testing.assert_close(a, b, **tolerance)


@needs_c
def test_conv_on_numpy_arrays_against_the_oracle():
    statement = "y[b,o,i,j] := x[b,c,2*i+p-1,2*j+q-1] * w[o,c,p,q]"
    x, w = rng.standard_normal((2, 3, 20, 20)), rng.standard_normal((4, 3, 3, 3))
    options = {"pad": 0, "ranges": {"i": 10, "j": 10}}
    got = ef.ein(statement, x=x, w=w, backend="c", **options)
    want = brute_force(statement, ranges_of(statement, {"x": x, "w": w}, **options),
                       {"x": x, "w": w}, pad=0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


TRANSPOSED = [
    ("dx[b,c,k,l] := dy[b,o,k-p+1,l-q+1] * w[o,c,p,q]", {"pad": 0, "ranges": {"k": 20, "l": 20}},
     (4, 32, 20, 20), (32, 8, 3, 3), dict(padding=1)),
    ("dx[b,c,k] := dy[b,o,k-2*p+2] * w[o,c,p]", {"pad": 0, "ranges": {"k": 500}},
     (3, 40, 500), (40, 6, 3), dict(padding=2, dilation=2)),
    ("dx[b,c,k] := dy[b,o,k-p] * w[o,c,p]", {"pad": 0, "ranges": {"k": 503}},
     (3, 40, 500), (40, 6, 4), {}),
]


@needs_c
@pytest.mark.parametrize("statement, options, dyshape, wshape, conv", TRANSPOSED)
def test_transposed_convs_take_the_scatter_form(statement, options, dyshape, wshape, conv):
    torch = pytest.importorskip("torch")
    from einfuse.plan.windowed_contraction import WindowMethod
    from einfuse.schedule.choose import choose
    dy, w = rng.standard_normal(dyshape), rng.standard_normal(wshape)
    kernel = ef.compile(statement, backend="c", **options)
    assert choose(kernel, kernel.bind(dy=dy, w=w)).blas.method is WindowMethod.SCATTER
    got = kernel(dy=dy, w=w)
    transpose = torch.nn.functional.conv_transpose2d if dy.ndim == 4 else \
        torch.nn.functional.conv_transpose1d
    want = transpose(torch.from_numpy(dy), torch.from_numpy(w), **conv).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@needs_c
def test_the_scatter_form_gathers_where_pads_meet_infinities():
    # a padded read times inf is NaN in the semantics; the scatter form has no such
    # product, so the call gathers: NaN exactly where the oracle has it
    statement, options = TRANSPOSED[0][0], {"pad": 0, "ranges": {"k": 12, "l": 12}}
    dy, w = rng.standard_normal((2, 8, 12, 12)), rng.standard_normal((8, 4, 3, 3))
    w[3, 2, 0, 1] = np.inf
    dy[1, 5, 7, 7] = np.nan
    got = ef.ein(statement, dy=dy, w=w, backend="c", **options)
    want = brute_force(statement, ranges_of(statement, {"dy": dy, "w": w}, **options),
                       {"dy": dy, "w": w}, pad=0)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-12, atol=1e-12)
    # a non-zero pad is read as itself: gathered too
    arrays = {"dy": rng.standard_normal((2, 8, 12, 12)), "w": np.ones_like(w)}
    got = ef.ein(statement, **arrays, backend="c", pad=2.0, ranges={"k": 10, "l": 10})
    want = brute_force(statement, ranges_of(statement, arrays, pad=2.0,
                                            ranges={"k": 10, "l": 10}), arrays, pad=2.0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@needs_c
@pytest.mark.parametrize("statement, options, xshape, wshape, conv", CONVS[:1] + CONVS[3:4])
def test_image_at_a_time_runs_match_torch(statement, options, xshape, wshape, conv,
                                          monkeypatch):
    # the forward packs and multiplies an image at a time (chunked_patches), the weight
    # gradient adds one product per image (chunked_sum): forced at these sizes
    torch = pytest.importorskip("torch")
    from einfuse.plan import windowed_contraction as wc
    monkeypatch.setattr(wc, "CHUNK_WORK", 1)
    monkeypatch.setattr(wc, "CHUNK_SUM_WORK", 1)
    x = torch.randn(*xshape, dtype=torch.float64, requires_grad=True)
    w = torch.randn(*wshape, dtype=torch.float64, requires_grad=True)
    kernel = ef.compile(statement.replace("b", "n"), backend="c", **options)
    convolve = torch.nn.functional.conv2d if len(xshape) == 4 else \
        torch.nn.functional.conv1d
    want = convolve(x, w, **conv)
    got = kernel(x=x, w=w)
    torch.testing.assert_close(got, want)
    seed = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, (x, w), seed),
                    torch.autograd.grad(want, (x, w), seed)):
        torch.testing.assert_close(a, b)


@needs_c
def test_weight_gradient_by_image_against_the_oracle(monkeypatch):
    from einfuse.plan import windowed_contraction as wc
    monkeypatch.setattr(wc, "CHUNK_SUM_WORK", 1)
    dw = "dw[o,c,p,q] := dy[n,o,i,j] * x[n,c,2*i+p-1,2*j+q-1]"
    x, dy = rng.standard_normal((3, 2, 9, 9)), rng.standard_normal((3, 4, 4, 4))
    options = {"pad": 0, "ranges": {"p": 3, "q": 3}}
    kernel = ef.compile(dw, backend="c", **options)
    from einfuse.schedule.choose import choose
    found = choose(kernel, kernel.bind(dy=dy, x=x)).blas
    assert wc.chunked_sum(found, kernel.bind(dy=dy, x=x).bounds.range_map) == "n"
    got = kernel(dy=dy, x=x)
    want = brute_force(dw, ranges_of(dw, {"dy": dy, "x": x}, **options),
                       {"dy": dy, "x": x}, pad=0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@needs_c
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_strided_input_gradient_runs_on_torch_blas_with_torch_values(dtype, monkeypatch):
    """A stride-2 conv's input gradient is a scatter (its values dy W, then added in at
    the windows): for torch callers where BLAS may take more than one thread its product
    runs on torch's BLAS, as the gathers' do, with torch's values for every layout of
    the incoming gradient (at one thread NumPy's: tests/test_conv_blas_route.py)."""
    torch = pytest.importorskip("torch")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    kind = getattr(torch, dtype)
    x = torch.randn(4, 8, 24, 24, dtype=kind, requires_grad=True)
    w = torch.randn(16, 8, 3, 3, dtype=kind)      # (dx alone: the scatter's product)
    kernel = ef.compile("y[b,o,i,j] := x[b,c,2*i+p-1,2*j+q-1] * w[o,c,p,q]", backend="c",
                        pad=0, ranges={"i": 12, "j": 12})
    tolerance = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else {}
    want = torch.nn.functional.conv2d(x, w, stride=2, padding=1)
    seeds = [torch.randn_like(want), torch.randn(4, 16, 12, 12, dtype=kind).transpose(2, 3),
             torch.randn_like(want)]
    for seed in seeds:     # the first backward, another layout of dy, the prepared repeat
        got = kernel(x=x, w=w)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            mine = torch.autograd.grad(got, (x,), seed)[0]
        theirs = torch.autograd.grad(want, (x,), seed, retain_graph=True)[0]
        torch.testing.assert_close(mine, theirs, **tolerance)
        assert any(event.key in ("aten::bmm", "aten::mm") for event in prof.key_averages())


# (shapes whose forward packs patches an image at a time: plan.chunked_patches)
KEPT_PATCHES = [
    ("y[b,o,i,j] := x[b,c,i+p-1,j+q-1] * w[o,c,p,q]",
     {"pad": 0, "ranges": {"i": 32, "j": 32}}, (4, 32, 32, 32), (64, 32, 3, 3),
     dict(padding=1)),
    ("y[b,o,i,j] := x[b,c,2*i+p-1,2*j+q-1] * w[o,c,p,q]",
     {"pad": 0, "ranges": {"i": 32, "j": 32}}, (3, 16, 64, 64), (32, 16, 3, 3),
     dict(stride=2, padding=1)),
]


def _counting_packs(monkeypatch, source):
    """The number of patch matrices packed from tensor ``source`` (not taken from a
    kept pack), as a list."""
    from einfuse.backends.c import window_pack
    count = [0]
    pack = window_pack.WindowPack._pack
    low = source.data_ptr()
    high = low + source.numel() * source.element_size()

    def counted(self, array):
        count[0] += low <= array.ctypes.data < high
        return pack(self, array)
    monkeypatch.setattr(window_pack.WindowPack, "_pack", counted)
    return count


@pytest.fixture
def keeping_packs(monkeypatch):
    """Nodes that keep their forward's packs (runtime/torch_prepared.KEEP_FORWARD_PACKS:
    off by default, where packing again measured faster), on kernels made anew (each
    keeps the prepared node of its first call)."""
    from einfuse.runtime import torch_prepared
    monkeypatch.setattr(torch_prepared, "KEEP_FORWARD_PACKS", True)
    fresh_runs(monkeypatch)


@needs_c
@pytest.mark.parametrize("statement, options, xshape, wshape, conv", KEPT_PATCHES)
def test_by_default_the_weight_gradient_packs_again(statement, options, xshape, wshape,
                                                    conv, monkeypatch):
    """Without kept packs the weight gradient packs x again, with torch's values."""
    torch = pytest.importorskip("torch")
    from einfuse.backends.c import window_pack
    kept = []
    keep = window_pack.PackMemo.keep
    monkeypatch.setattr(window_pack.PackMemo, "keep",
                        lambda self, key, source, packed: (kept.append(key),
                                                           keep(self, key, source, packed)))
    fresh_runs(monkeypatch)      # (kernels keep the prepared node of their first call)
    x = torch.randn(*xshape, dtype=torch.float64, requires_grad=True)
    count = _counting_packs(monkeypatch, x)
    w = torch.randn(*wshape, dtype=torch.float64, requires_grad=True)
    kernel = ef.compile(statement, backend="c", **options)
    want = torch.nn.functional.conv2d(x, w, **conv)
    for _ in range(3):       # the first call, then the prepared repeats
        seed = torch.randn_like(want)
        theirs = torch.autograd.grad(want, (x, w), seed, retain_graph=True)
        got = kernel(x=x, w=w)
        packed = count[0]
        mine = torch.autograd.grad(got, (x, w), seed)
        for a, b in zip(mine, theirs):
            torch.testing.assert_close(a, b)
    assert kept == [] and count[0] > packed > 0


@needs_c
@pytest.mark.parametrize("statement, options, xshape, wshape, conv", KEPT_PATCHES)
def test_weight_gradient_takes_the_forwards_patches(statement, options, xshape, wshape,
                                                    conv, monkeypatch, keeping_packs):
    """An autograd node keeps the patches its forward packed for its backward: the
    weight gradient packs none of x again, with torch's values; a second backward of a
    retained graph packs again, with the same values."""
    torch = pytest.importorskip("torch")
    x = torch.randn(*xshape, dtype=torch.float64, requires_grad=True)
    count = _counting_packs(monkeypatch, x)
    w = torch.randn(*wshape, dtype=torch.float64, requires_grad=True)
    kernel = ef.compile(statement, backend="c", **options)
    want = torch.nn.functional.conv2d(x, w, **conv)
    for _ in range(3):       # the first call, then the prepared repeats
        seed = torch.randn_like(want)
        theirs = torch.autograd.grad(want, (x, w), seed, retain_graph=True)
        got = kernel(x=x, w=w)
        packed = count[0]
        mine = torch.autograd.grad(got, (x, w), seed, retain_graph=True)
        for a, b in zip(mine, theirs):
            torch.testing.assert_close(a, b)
    assert packed > 0 and count[0] == packed     # (the last backward packed no x)
    again = torch.autograd.grad(got, (x, w), seed)
    for a, b in zip(again, theirs):
        torch.testing.assert_close(a, b)


@needs_c
@pytest.mark.parametrize("statement, options, xshape, wshape, conv", KEPT_PATCHES)
def test_kept_patches_never_outlive_an_in_place_change(statement, options, xshape, wshape,
                                                       conv, keeping_packs):
    """A change of x in place between forward and backward is refused (torch's version
    check on the node's saved tensors); the next node packs the changed x afresh."""
    torch = pytest.importorskip("torch")
    x = torch.randn(*xshape, dtype=torch.float64)
    w = torch.randn(*wshape, dtype=torch.float64, requires_grad=True)
    kernel = ef.compile(statement, backend="c", **options)
    for _ in range(2):
        kernel(x=x, w=w).sum().backward()       # prepared, patches kept
    got = kernel(x=x, w=w)
    with torch.no_grad():
        x.mul_(-2.0).add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        got.sum().backward()
    w.grad = None
    seed = torch.randn_like(got)
    mine = torch.autograd.grad(kernel(x=x, w=w), (w,), seed)[0]
    theirs = torch.autograd.grad(torch.nn.functional.conv2d(x, w, **conv), (w,), seed)[0]
    torch.testing.assert_close(mine, theirs)


@needs_c
def test_no_patches_kept_where_no_weight_gradient_reads_them(monkeypatch, keeping_packs):
    """With only x requiring a gradient (its gradient reads dy and w, not x's patches)
    the forward keeps no patches."""
    torch = pytest.importorskip("torch")
    from einfuse.backends.c import window_pack
    kept = []
    keep = window_pack.PackMemo.keep
    monkeypatch.setattr(window_pack.PackMemo, "keep",
                        lambda self, key, source, packed: (kept.append(key),
                                                           keep(self, key, source, packed)))
    statement, options, xshape, wshape, conv = KEPT_PATCHES[1]
    x = torch.randn(*xshape, dtype=torch.float64, requires_grad=True)
    w = torch.randn(*wshape, dtype=torch.float64)
    kernel = ef.compile(statement, backend="c", **options)
    for _ in range(2):
        got = kernel(x=x, w=w)
        seed = torch.randn_like(got)
        mine = torch.autograd.grad(got, (x,), seed)[0]
        want = torch.nn.functional.conv2d(x, w, **conv)
        torch.testing.assert_close(mine, torch.autograd.grad(want, (x,), seed)[0])
    assert kept == []
    w.requires_grad_(True)
    kernel(x=x, w=w).sum().backward()
    assert kept
