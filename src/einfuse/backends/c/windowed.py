"""The run of a windowed contraction (plan/windowed_contraction.py) for one signature of
its arguments: each operand as the strided view its subscripts read, then BLAS -- the
views packed into one patch matrix and one (broadcast) matmul (an image at a time where
plan/windowed_contraction.chunked_patches says so), one matmul per window offset added
into the result, or the scatter form (windowed_scatter.py) -- by NumPy's BLAS or
torch's (windowed_route says when whose).

The patches are packed by C straight from the array (window_pack.py: reads outside it
are the ``pad=`` value, no padded copy first); where no C compiler is found, NumPy pads
the array by the margins its reads leave and copies the strided view.

Memory safety rests on the ranges: every element a view addresses lies inside the
(padded) array (the margins are computed from each subscript's extremes over the
call's ranges); views whose windows overlap are read-only ``as_strided`` windows of it,
never wider, and the C pack tests each row's stretch against the array's bounds."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Tuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...analysis.machine import cpu_vendor
from ...analysis.numpy_blas import avx512_kernels
from ...analysis.ranges import points
from ...analysis.thread_policy import default_threads
from .blas import TORCH_BLAS_WORK, multiply_adds
from .blas_route import NUMPY_BLAS, BlasRoute
from .window_pack import active_memo
from ...plan.windowed_contraction import (WindowedContraction, WindowedOperand, WindowMethod,
                                          chunked_patches, chunked_sum)

Runner = Callable[[Mapping[str, np.ndarray]], np.ndarray]

# How each operand is made is found per layout (strides) of its array, a few kept.
LAYOUTS_KEPT = 8


@dataclass(frozen=True)
class _View:
    """How an operand's view is cut from its array for one call's ranges."""
    tensor: str
    axes: Tuple[str, ...]
    shape: Tuple[int, ...]                      # the extent of each axis
    margins: Optional[Tuple[Tuple[int, int], ...]]   # padding per array axis, or None
    origin: Tuple[int, ...]                     # the element at the ranges' first values
    coefficients: Tuple[Tuple[int, ...], ...]   # per view axis: its step on each array axis


def windowed_route(found: WindowedContraction, call, torch_route: bool) -> BlasRoute:
    """NumPy's BLAS, or torch's for a call on torch tensors with enough work (as
    backends/c/blas.route_for decides for a contraction) where BLAS may run on more
    than one thread: a torch program's products then share torch's pool of threads
    rather than compete with OpenBLAS's spinning ones (backends/c/blas.py).

    Where NumPy's OpenBLAS runs on the calling thread alone (:func:`blas_alone`) there
    is no pool to share, and it ran every product of these runs faster than torch's
    MKL on this machine (Zen 3, one thread, NumPy's OpenBLAS 0.3.31 against torch
    2.13's MKL; medians of interleaved runs): the batches of 8 x (32x144 by 144x1024)
    1.18 against 1.59 ms (float64 2.55 against 3.39), 8 x (64x288 by 288x1024) 4.0
    against 4.7, a strided conv1d's 8 x (32x160 by 160x254) 0.41 against 0.50; an
    image-at-a-time conv2d forward (stride 2: the pack, then 8 GEMMs) 1.74 against 2.06
    ms, torch's own convolution 1.60 at that load."""
    if torch_route and not openblas_alone_faster(found, call) and \
            call.dtypes.working in (np.float32, np.float64) and \
            multiply_adds(found, call) >= TORCH_BLAS_WORK:
        from .windowed_torch import TORCH_WINDOWED_BLAS
        return TORCH_WINDOWED_BLAS
    return NUMPY_BLAS


def openblas_alone_faster(found: WindowedContraction, call) -> bool:
    """Whether NumPy's OpenBLAS runs ``found``'s products for a torch caller: it runs on
    the calling thread alone (:func:`blas_alone`) on a CPU that is not Intel's.  MKL is
    tuned for Intel's cores: on the AVX-512 Xeon where this route was first measured,
    torch's MKL ran the same shapes about 1.7x faster than OpenBLAS at one thread (the
    conv2d's 8 x (32x144 by 144x1024): 0.49 against 0.85 ms); on the Zen 3 above, 15-30%
    slower.

    Where OpenBLAS runs its AVX-512 kernels (analysis/numpy_blas.py: a Zen 4 gets
    "SkylakeX") it keeps only the products whose summed extent is shorter than a kept
    one (im2col's forward: W @ patches): on a Zen 4 they ran the panel form's GEMMs
    10-25% slower than MKL (64x96 by 96x1024: 155 against 135 us in place; 32x48 by
    48x4096: 198 against 155 us; their own Haswell kernels 127, 148 us) and the weight
    gradients' long sums slower too, while the im2col forwards ran faster on them
    (interleaved, one thread: the stride-2 conv2d 1.54-1.66 against 1.57-1.74 ms, the
    strided conv1d 0.45-0.56 against 0.51-0.61; forward + backward with its weight
    gradient on MKL 5.10-5.72 against 5.62-6.19 ms).  OPENBLAS_CORETYPE=Haswell gives
    OpenBLAS back."""
    if not blas_alone() or cpu_vendor() == "GenuineIntel":
        return False
    if not avx512_kernels():
        return True
    return found.panels is None and not _long_sum(found, call)


def _long_sum(found: WindowedContraction, call) -> bool:
    """Whether the product sums over at least as many values as either side keeps (a
    weight gradient's images and positions)."""
    ranges = call.bounds.range_map
    return points(found.k, ranges) >= max(points(found.m, ranges), points(found.n, ranges))


def blas_alone() -> bool:
    """Whether NumPy's OpenBLAS runs on the calling thread alone: its thread count
    (OPENBLAS_NUM_THREADS, else OpenMP's: analysis/thread_policy.default_threads) is 1."""
    own = os.environ.get("OPENBLAS_NUM_THREADS", "").strip()
    if own:
        try:
            return int(own) <= 1
        except ValueError:
            pass
    return default_threads() == 1


def windowed_library(found: WindowedContraction, call) -> str:
    """Whose BLAS runs it for this call, in explain's words."""
    from ...analysis.frameworks import TORCH
    torch_call = call.framework == TORCH
    if windowed_route(found, call, torch_call) is not NUMPY_BLAS:
        return "torch.matmul"
    if torch_call and openblas_alone_faster(found, call):
        return "numpy.matmul (OpenBLAS on this one thread ran these products faster " \
            "than torch's MKL)"
    return "numpy.matmul"


def run_windowed(found: WindowedContraction, call) -> np.ndarray:
    """The full path's run (NumPy's BLAS)."""
    named = dict(call.arrays)
    named.update(call.params)
    return windowed_runner(found, call)(named)


def windowed_runner(found: WindowedContraction, call,
                    route: BlasRoute = NUMPY_BLAS) -> Runner:
    """The statement's result (working dtype) from arrays (and parameters) by name, of
    this call's signature."""
    shapes = {name: tuple(call.arrays.shapes[name])
              for name in {o.tensor for o in found.operands}}
    working = np.dtype(call.dtypes.working)
    if found.panels is not None:
        from dataclasses import replace
        from .conv_panels import panel_runner
        gathering = []

        def gather():
            if not gathering:
                gathering.append(runner_of(replace(found, panels=None), call.bounds.range_map,
                                           shapes, working, call.options.pad, route))
            return gathering[0]
        runner = panel_runner(found, found.panels, call.bounds.range_map, shapes, working,
                              call.options.pad, route, gather)
        if runner is not None:
            return runner
        found = replace(found, panels=None)
    if found.method is WindowMethod.SCATTER:
        from .windowed_scatter import scatter_runner
        return scatter_runner(found, call.bounds.range_map, shapes, working,
                              call.options.pad, route, runner_of)
    return runner_of(found, call.bounds.range_map, shapes, working, call.options.pad,
                     route)


def runner_of(found: WindowedContraction, ranges, shapes, working: np.dtype, pad,
              route: BlasRoute) -> Runner:
    """windowed_runner's gathering runs (patches, or one GEMM per offset) for these
    ranges, array shapes (by name), working dtype and pad value."""
    extents = {name: max(0, hi - lo) for name, (lo, hi) in ranges.items()}
    out_shape = tuple(extents[n] for n in found.output)
    if any(extents[n] == 0 for o in found.operands for n in o.axes) or \
            any(s == 0 for s in out_shape):
        return lambda named: np.zeros(out_shape, working)     # (a sum over nothing)
    views = tuple(_view(o, ranges, shapes[o.tensor]) for o in found.operands)
    if pad is None and any(v.margins is not None for v in views):
        from ...errors import BackendError
        raise BackendError("a windowed contraction's reads leave the array although "
                           "pad= is not given (the ranges should have prevented it)")
    fill = working.type(0 if pad is None else pad)
    gemm = found.gemm
    first, second = (0, 1) if gemm.rows_from == 0 else (1, 0)
    product_shape = tuple(extents[n] for n in gemm.pre + gemm.rows + gemm.cols)
    order = gemm.order
    in_order = order == tuple(range(len(order)))
    matmul = route.matmul
    factors = found.scale

    def operand_maker(view, side, summed, pre=gemm.pre):
        """One matmul operand from the arrays by name: the operand's view read in place
        where BLAS can, else packed from the array as it is by C (no padded copy), else
        by NumPy; which of them found once per layout of the array."""
        groups = (gemm.rows, summed) if side == first else (summed, gemm.cols)
        ways = {}

        def make(named):
            array = _working(named[view.tensor], working)
            how = ways.get(array.strides)
            if how is None:
                if len(ways) >= LAYOUTS_KEPT:
                    ways.clear()
                how = ways[array.strides] = _operand_way(array, view, pre, groups,
                                                         extents, working, fill)
            return how(array)
        return make

    def arranged(view_arrays, axes_of, summed):
        """The two matmul operands from the views (their axes ``axes_of``), summing
        ``summed``."""
        rows = _arrange(view_arrays[first], axes_of[first], gemm.pre, gemm.rows, summed,
                        extents)
        cols = _arrange(view_arrays[second], axes_of[second], gemm.pre, summed, gemm.cols,
                        extents)
        return rows, cols

    def finish(product, named):
        for factor in factors:
            value = factor.value if hasattr(factor, "value") else named[factor.name]
            product *= working.type(value)
        product = product.reshape(product_shape)
        return product if in_order else product.transpose(order)

    axes = tuple(v.axes for v in views)
    chunk = _chunk(views, gemm.pre, (first, second)) \
        if chunked_patches(found, ranges) else None
    if chunk is not None:
        side, sub_view, axis, start = chunk
        image = operand_maker(sub_view, side, gemm.k, pre=())
        whole = operand_maker(views[1 - side], 1 - side, gemm.k)
        into = _product_into(route)
        tensor, count = sub_view.tensor, extents[gemm.pre[0]]
        out_shape = (count, _size(gemm.rows, extents), _size(gemm.cols, extents))

        def run_by_image(named):
            other = whole(named)
            array = _working(named[tensor], working)
            out = np.empty(out_shape, working)
            lead = (slice(None),) * axis
            for b in range(count):
                part = image({tensor: array[lead + (start + b,)]})
                kept = other[b if other.shape[0] > 1 else 0]
                rows, cols = (part, kept) if side == first else (kept, part)
                into(rows, cols, out[b])
                # (dropped before the next image's pack: that one then takes the same
                # memory, still in cache, not a second buffer)
                part = rows = cols = None
            return finish(out, named)
        return run_by_image

    # (a summed index whose values' products are too small to chunk by themselves is
    # chunked still where a forward's patches of each value are kept: they then need
    # no packing, and one image's GEMM costs about what its share of the whole does)
    summed = chunked_sum(found, ranges)
    chunk_if_kept = summed is None
    if chunk_if_kept:
        summed = chunked_sum(found, ranges, work=0)
    parts = None if summed is None else [_sub_view(v, summed) for v in views]
    if parts is not None and all(part is not None for part in parts):
        makers = [operand_maker(part[0], side, tuple(n for n in gemm.k if n != summed),
                                pre=()) for side, part in enumerate(parts)]
        count = extents[summed]

        def run_by_value(named):
            arrays = [_working(named[v.tensor], working) for v in views]
            total = None
            for b in range(count):
                ops = [make({part[0].tensor: array[(slice(None),) * part[1] +
                                                   (part[2] + b,)]})
                       for make, part, array in zip(makers, parts, arrays)]
                product = matmul(ops[first], ops[second])
                if total is None:
                    total = np.array(product, copy=True)
                else:
                    total += product
                ops = product = None    # (the next value's packs reuse their memory)
            return finish(total, named)
        if not chunk_if_kept:
            return run_by_value
        whole = _whole_run(views, first, second, gemm, operand_maker, matmul, finish)
        # the operand packed per value: the one read through windows
        windowed = next((side for side, v in enumerate(views) if v.margins is not None or
                         any(sum(1 for c in column if c) > 1
                             for column in zip(*v.coefficients))), None)
        if windowed is None:
            return whole
        tensor, axis, start = parts[windowed][0].tensor, parts[windowed][1], \
            parts[windowed][2]

        def run_by_kept_value(named):
            memo = active_memo()
            if memo is not None:
                array = np.asarray(named[tensor])    # (another dtype: packed from a copy)
                if array.dtype == working and \
                        memo.packed_from(array[(slice(None),) * axis + (start,)]):
                    return run_by_value(named)
            return whole(named)
        return run_by_kept_value

    if found.method is not WindowMethod.PER_OFFSET:
        return _whole_run(views, first, second, gemm, operand_maker, matmul, finish)

    window = found.window
    kept = tuple(n for n in gemm.k if n not in window)
    offsets = tuple(itertools.product(*(range(extents[n]) for n in window)))
    reduced = tuple(tuple(n for n in a if n not in window) for a in axes)

    def run_per_offset(named):
        arrays = tuple(_cut(named[v.tensor], v, working, fill) for v in views)
        total = None
        for offset in offsets:
            at = dict(zip(window, offset))
            parts = tuple(array[tuple(at.get(n, slice(None)) for n in a)]
                          for array, a in zip(arrays, axes))
            rows, cols = arranged(parts, reduced, kept)
            product = matmul(rows, cols)
            if total is None:
                total = product
            else:
                np.add(total, product, out=total)
        return finish(total, named)
    return run_per_offset


def _whole_run(views, first, second, gemm, operand_maker, matmul, finish) -> Runner:
    """The PATCHES run in one product: both operands whole."""
    row_operand = operand_maker(views[first], first, gemm.k)
    col_operand = operand_maker(views[second], second, gemm.k)

    def run(named):
        return finish(matmul(row_operand(named), col_operand(named)), named)
    return run


def _chunk(views, pre, sides):
    """(side, the view of one value of the batch index ``pre[0]``, the array axis it
    indexes, its first value) for the operand to pack an image at a time: one read
    through windows whose batch index is a plain subscript of an axis of its own; None
    where there is none."""
    for side in sides:
        view = views[side]
        if pre[0] not in view.axes or (view.margins is None and all(
                sum(1 for c in column if c) <= 1 for column in zip(*view.coefficients))):
            continue        # (no batch index, or read in place: nothing to pack)
        found = _sub_view(view, pre[0])
        if found is not None:
            return (side,) + found
    return None


def _sub_view(view: _View, index: str):
    """(the view of one value of ``index``, the array axis it indexes, its first value),
    or None where ``index`` is not a plain subscript of an axis of its own."""
    if index not in view.axes:
        return None
    at = view.axes.index(index)
    moved = [axis for axis, c in enumerate(view.coefficients[at]) if c]
    if len(moved) != 1 or view.coefficients[at][moved[0]] != 1:
        return None
    axis = moved[0]
    if any(row[axis] for n, row in enumerate(view.coefficients) if n != at) or \
            (view.margins is not None and any(view.margins[axis])):
        return None
    keep = [n for n in range(len(view.axes)) if n != at]
    margins = None if view.margins is None else \
        tuple(m for a, m in enumerate(view.margins) if a != axis)
    sub = _View(view.tensor, tuple(view.axes[n] for n in keep),
                tuple(view.shape[n] for n in keep), margins,
                tuple(o for a, o in enumerate(view.origin) if a != axis),
                tuple(tuple(c for a, c in enumerate(view.coefficients[n]) if a != axis)
                      for n in keep))
    return sub, axis, view.origin[axis]


def _product_into(route: BlasRoute):
    """``into(a, b, out)``: the 2-D product ``a @ b`` written into ``out``, by the
    route's library."""
    if route.name == "torch":
        from .windowed_torch import product_into
        return product_into
    return lambda a, b, out: np.matmul(a, b, out=out)


def _view(operand: WindowedOperand, ranges, shape: Tuple[int, ...]) -> _View:
    """The view of ``operand`` for these ranges: each array axis's extremes over the
    ranges give the margins to pad, the first values the origin."""
    margins, origin = [], []
    for sub, size in zip(operand.subscripts, shape):
        low = high = start = sub.constant
        for name, c in sub.terms:
            lo, hi = ranges[name]
            low += c * (lo if c > 0 else hi - 1)
            high += c * (hi - 1 if c > 0 else lo)
            start += c * lo
        before, after = max(0, -low), max(0, high - (size - 1))
        margins.append((before, after))
        origin.append(start + before)
    coefficients = tuple(tuple(operand.stride_of(name, axis)
                               for axis in range(len(shape))) for name in operand.axes)
    padded = any(b or a for b, a in margins)
    return _View(operand.tensor, operand.axes,
                 tuple(max(0, ranges[n][1] - ranges[n][0]) for n in operand.axes),
                 tuple(margins) if padded else None, tuple(origin), coefficients)


def _working(array, working: np.dtype) -> np.ndarray:
    array = np.asarray(array)
    return array if array.dtype == working else array.astype(working)


def _cut(array, view: _View, working: np.dtype, fill) -> np.ndarray:
    """The strided view of ``array`` (converted to ``working``, padded with ``fill``
    where the view's reads leave it): read-only where its windows overlap, else as
    writeable as the array (torch's BLAS takes only writeable arrays; nothing writes
    through it)."""
    array = _working(array, working)
    if view.margins is not None:
        shape = tuple(n + b + a for n, (b, a) in zip(array.shape, view.margins))
        # (zeros: fresh zero pages from the system, no fill pass)
        padded = np.zeros(shape, working) if fill == 0 else np.full(shape, fill, working)
        padded[tuple(slice(b, b + n) for n, (b, _) in zip(array.shape, view.margins))] = array
        array = padded
    start = array[tuple(slice(o, o + 1) for o in view.origin)]
    strides = tuple(sum(c * s for c, s in zip(coefficients, array.strides))
                    for coefficients in view.coefficients)
    plain = all(sum(1 for c in column if c) <= 1 for column in zip(*view.coefficients)) and \
        view.margins is None
    return as_strided(start, view.shape, strides,
                      writeable=plain and array.flags.writeable)


def _order(array_shape, steps, axes, pre, rows, cols):
    """The axis order ``_arrange`` packs a view in (its axes ``axes``, each of
    ``array_shape`` extent and ``steps`` memory step): the ``pre`` axes it has, then
    the two groups, the one whose last axis is the longer innermost (copy) loop last
    (a weight gradient's patches (b, i, j) x (c, p, q) would copy runs of 3 (q), packed
    the other way round runs of 32 (j), 3x faster; BLAS reads either as it lies);
    whether the groups were swapped."""
    lead = [axes.index(n) for n in pre if n in axes]
    first, second = [axes.index(n) for n in rows], [axes.index(n) for n in cols]

    def inner(group):
        return (array_shape[group[-1]], -abs(steps[group[-1]])) if group else (0, 0)
    if inner(first) > inner(second):
        return lead + second + first, True
    return lead + first + second, False


def _operand_way(array: np.ndarray, view: _View, pre, groups, extents, working,
                 fill) -> Callable[[np.ndarray], np.ndarray]:
    """How a matmul operand comes from arrays laid out as ``array``: the view as it is
    (BLAS reads it), else packed by C, else by NumPy."""
    if view.margins is None and \
            _in_place(_cut(array, view, working, fill), view.axes, pre, *groups,
                      extents) is not None:
        return lambda a: _in_place(_cut(a, view, working, fill), view.axes, pre, *groups,
                                   extents)
    packer = _packer(array, view, pre, *groups, extents, fill)
    if packer is not None:
        return packer
    return lambda a: _arrange(_cut(a, view, working, fill), view.axes, pre, *groups,
                              extents)


def _packer(array: np.ndarray, view: _View, pre, rows, cols, extents,
            fill) -> Optional[Callable[[np.ndarray], np.ndarray]]:
    """The view of arrays laid out as ``array`` as a matmul operand (as ``_arrange``
    gives it), packed by C straight from the unpadded array (reads outside it are
    ``fill``); None where the C kernel does not take it."""
    from .window_pack import prepared_pack
    if view.margins is not None:
        origin = tuple(o - b for o, (b, _) in zip(view.origin, view.margins))
    else:
        origin = view.origin
    steps = [sum(c * s for c, s in zip(column, array.strides)) for column in view.coefficients]
    order, swapped = _order(view.shape, steps, view.axes, pre, rows, cols)
    m, k = _size(rows, extents), _size(cols, extents)
    # (rows of the packed matrix that would alias in the cache are padded: its rows are
    # k long, or m where swapped)
    pack = prepared_pack(array, [view.shape[a] for a in order],
                         [view.coefficients[a] for a in order], origin, fill,
                         row=m if swapped else k)
    if pack is None:
        return None
    batch = tuple(extents[n] if n in view.axes else 1 for n in pre)
    if swapped:
        shape = batch + (k, m)
        return lambda a: pack(a).reshape(shape).swapaxes(-1, -2)
    shape = batch + (m, k)
    return lambda a: pack(a).reshape(shape)


def _in_place(array: np.ndarray, axes, pre, rows, cols, extents) -> Optional[np.ndarray]:
    """``array`` (axes ``axes``) as a matmul operand without a copy (``_arrange``'s
    layout), or None where BLAS cannot read it so."""
    lead = [axes.index(n) for n in pre if n in axes]
    first, second = [axes.index(n) for n in rows], [axes.index(n) for n in cols]
    batch = tuple(extents[n] if n in axes else 1 for n in pre)
    shape = batch + (_size(rows, extents), _size(cols, extents))
    try:
        arranged = np.reshape(array.transpose(lead + first + second), shape, copy=False)
    except ValueError:
        return None
    return arranged if _blas_ready(arranged) else None


def _arrange(array: np.ndarray, axes: Tuple[str, ...], pre, rows, cols,
             extents) -> np.ndarray:
    """``array`` (axes ``axes``) as a matmul operand: the ``pre`` axes it has (unit axes
    for those it lacks, which broadcast), then ``rows`` flattened, then ``cols``
    flattened; packed (the copy is the patch matrix) unless already a layout BLAS reads.
    ``rows``/``cols`` are the operand's own (M, K) or (K, N) groups."""
    arranged = _in_place(array, axes, pre, rows, cols, extents)
    if arranged is not None:
        return arranged
    # a copy it is: the patch matrix
    lead = [axes.index(n) for n in pre if n in axes]
    first, second = [axes.index(n) for n in rows], [axes.index(n) for n in cols]
    batch = tuple(extents[n] if n in axes else 1 for n in pre)
    shape = batch + (_size(rows, extents), _size(cols, extents))
    # packed with the group whose last axis is the longer innermost (copy) loop: a
    # weight gradient's patches (b, i, j) x (c, p, q) would copy runs of 3 (q), packed
    # the other way round runs of 32 (j), 3x faster; BLAS reads either as it lies
    def inner(group):
        return (array.shape[group[-1]], -abs(array.strides[group[-1]])) if group else (0, 0)
    if inner(first) > inner(second):
        packed = array.transpose(lead + second + first).reshape(
            batch + (shape[-1], shape[-2]))
        return np.ascontiguousarray(packed).swapaxes(-1, -2)
    return np.ascontiguousarray(array.transpose(lead + first + second).reshape(shape))


def _blas_ready(array: np.ndarray) -> bool:
    """Whether BLAS reads the matrices of ``array`` in place: a unit step along one of
    the last two axes, and a leading dimension no smaller than the other's extent, on a
    writeable array (torch refuses read-only views)."""
    if not array.flags.writeable or array.ndim < 2:
        return array.flags.c_contiguous and array.flags.writeable
    item = array.itemsize
    rows, cols = array.shape[-2:]
    s_rows, s_cols = array.strides[-2:]
    if any(s < 0 for s in array.strides):
        return False
    return (s_cols == item and s_rows >= max(1, cols) * item) or \
        (s_rows == item and s_cols >= max(1, rows) * item)


def _size(names, extents) -> int:
    total = 1
    for name in names:
        total *= extents[name]
    return total
