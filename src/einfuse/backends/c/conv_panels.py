"""The panel form's run (plan/windowed_panels.py): per image one panel packed by C
(window_pack.prepared_pack: the channels and the folded window indices as its rows, every
row the window's outer axis reaches times the inner positions as its columns, the pad
value where the reads leave the array), then one GEMM per value of the window's outer
index over a shifted column window of it, accumulated in place.

On a conv2d 8x32x32x32 by 64 filters of 3x3 (one thread, torch's MKL) the three GEMMs
of K = 96 over column windows ran in about the time of the one GEMM of K = 288 over
im2col's patches, and the panel is a third of their size: the pack and the reads of a
patch matrix three times the image are what is saved; for the input gradient the col2im
and its 2.4 M values (bmm then the C walk: 4.3 ms against 2.2 ms)."""

from __future__ import annotations

from typing import Callable, Mapping, Optional

import numpy as np

from .blas_route import BlasRoute
from .window_pack import prepared_pack
from ...plan.windowed_contraction import WindowedContraction
from ...plan.windowed_panels import PanelForm

Runner = Callable[[Mapping[str, np.ndarray]], np.ndarray]


def _gemm_functions(route: BlasRoute):
    """``(into, add)``: ``out[...] = a @ b`` and ``out += a @ b`` (2-D) by the route's
    library; ``add(a, b, out, scratch)`` writes the product into ``scratch`` (an array
    of ``out``'s shape) first where the library cannot add it in place (NumPy's matmul
    has no beta): a fresh temporary per GEMM cost more than the add itself."""
    if route.name == "torch":
        import torch
        wrap = torch.from_numpy

        def into(a, b, out):
            torch.mm(wrap(a), wrap(b), out=wrap(out))

        def add(a, b, out, scratch=None):
            o = wrap(out)
            torch.addmm(o, wrap(a), wrap(b), out=o)
        return into, add

    def add_numpy(a, b, out, scratch):
        np.matmul(a, b, out=scratch)
        np.add(out, scratch, out=out)
    return (lambda a, b, out: np.matmul(a, b, out=out)), add_numpy


def panel_runner(found: WindowedContraction, form: PanelForm, ranges, shapes,
                 working: np.dtype, pad, route: BlasRoute,
                 gather: Callable[[], Runner]) -> Optional[Runner]:
    """The statement's result from arrays by name in the panel form for these ranges,
    or None where the C pack does not take arrays of these shapes; ``gather()``: the
    gathering runner, for a call whose array layout the pack refuses."""
    extents = {n: max(0, hi - lo) for n, (lo, hi) in ranges.items()}
    lo = {n: r[0] for n, r in ranges.items()}
    x_op, y_op = found.operands[form.windowed], found.operands[1 - form.windowed]
    x_shape = tuple(shapes[x_op.tensor])
    if any(extents[n] == 0 for n in x_op.axes + y_op.axes):
        return None
    row_axis, row_pos, row_win, step = form.row
    rows_reached = extents[row_pos] + abs(step) * (extents[row_win] - 1)
    low = min(0, step * (extents[row_win] - 1))
    shifts = [step * v - low for v in range(extents[row_win])]
    folded_wins = tuple(f[2] for f in form.folded)
    folded_pos = tuple(f[1] for f in form.folded)
    inner = _size(folded_pos, extents)
    depth = _size(form.channels + folded_wins, extents)
    positions = extents[row_pos] * inner

    # the panel's view of X (an image's slice where there is an image index)
    image_axis = None
    if form.images:
        image_axis = next(a for a, sub in enumerate(x_op.subscripts)
                          if sub.plain and sub.terms[0][0] == form.images[0])
    kept_axes = [a for a in range(len(x_shape)) if a != image_axis]
    view_names = form.channels + folded_wins + ("\0row",) + folded_pos
    coefficients = []
    for name in view_names:
        if name == "\0row":
            coefficients.append([1 if a == row_axis else 0 for a in kept_axes])
        else:
            coefficients.append([x_op.stride_of(name, a) for a in kept_axes])
    origin = []
    for a in kept_axes:
        sub = x_op.subscripts[a]
        value = sub.constant + sum(c * lo[n] for n, c in sub.terms)
        origin.append(value + (low if a == row_axis else 0))
    view_shape = [extents[n] for n in form.channels + folded_wins] + [rows_reached] + \
        [extents[n] for n in folded_pos]
    fill = working.type(0 if pad is None else pad)
    image_count = extents[form.images[0]] if form.images else 1
    image_start = lo[form.images[0]] if form.images else 0
    packs = {}

    def pack_of(image):
        """The pack for images laid out as ``image`` (found once per layout, a few
        kept), or None where the kernel refuses it."""
        key = image.strides
        if key not in packs:
            if len(packs) >= 8:
                packs.clear()
            packs[key] = prepared_pack(image, view_shape, coefficients, origin, fill,
                                       row=rows_reached * inner)
        return packs[key]

    like = np.empty(x_shape, working)
    if image_axis is not None:
        like = like[(slice(None),) * image_axis + (0,)]
    if pack_of(like) is None:
        return None
    into, add = _gemm_functions(route)
    factors = found.scale
    y_cut = tuple(slice(lo[sub.terms[0][0]], lo[sub.terms[0][0]] + extents[sub.terms[0][0]])
                  for sub in y_op.subscripts)

    def y_array(named, order):
        """Y cut to the ranges, its axes in ``order``."""
        array = np.asarray(named[y_op.tensor])
        if array.dtype != working:
            array = array.astype(working)
        array = array[y_cut]
        return array.transpose([y_op.axes.index(n) for n in order])

    def x_array(named):
        """X as the working dtype, or None where the pack refuses its layout."""
        array = np.asarray(named[x_op.tensor])
        if array.dtype != working:
            array = array.astype(working)
        first = array if image_axis is None else \
            array[(slice(None),) * image_axis + (image_start,)]
        return array if pack_of(first) is not None else None

    def panels(array):
        for b in range(image_count):
            image = array if image_axis is None else \
                array[(slice(None),) * image_axis + (image_start + b,)]
            yield b, pack_of(image)(image).reshape(depth, rows_reached * inner)

    def scaled(result, named):
        for factor in factors:
            value = factor.value if hasattr(factor, "value") else named[factor.name]
            result *= working.type(value)
        return result

    own = _size(form.own, extents)
    if not form.gradient:
        canonical = form.images + form.own + form.positions
        order = tuple(canonical.index(n) for n in found.output)
        out_shape = tuple(extents[n] for n in canonical)

        def run_forward(named):
            array = x_array(named)
            if array is None:
                return gather()(named)
            weights = np.ascontiguousarray(y_array(named, (row_win,) + form.own +
                                                   form.channels + folded_wins))
            weights = weights.reshape(len(shifts), own, depth)
            out = np.empty((image_count, own, positions), working)
            scratch = np.empty((own, positions), working)
            for b, panel in panels(array):
                for v, shift in enumerate(shifts):
                    columns = panel[:, shift * inner:shift * inner + positions]
                    if v:
                        add(weights[v], columns, out[b], scratch)
                    else:
                        into(weights[v], columns, out[b])
                del panel, columns      # (the next pack then reuses their memory, in cache)
            return scaled(out.reshape(out_shape), named).transpose(order)
        return run_forward

    canonical = (row_win,) + form.own + form.channels + folded_wins
    order = tuple(canonical.index(n) for n in found.output)
    out_shape = tuple(extents[n] for n in canonical)

    def run_gradient(named):
        array = x_array(named)
        if array is None:
            return gather()(named)
        grads = y_array(named, form.images + form.own + form.positions)
        grads = grads.reshape(image_count, own, positions)
        # dW_v = dy_b @ columns^T, both operands as they lie (the positions, a long K,
        # contiguous in each: BLAS's transposed-operand form, no copy).  Measured on a
        # Zen 4 (one thread, per weight gradient): conv2d 8x32x32^2 by 64x32x3^2 5.1 ->
        # 4.0 ms on torch's MKL, 5.8 -> 3.8 on OpenBLAS's Haswell kernels, against
        # dW_v^T = columns @ (dy_b^T copied as positions x own), the form an earlier MKL
        # ran 3x faster; a conv1d 8x64x1024 by 64x64x3 4.0 -> 2.7 ms
        out = np.empty((len(shifts), own, depth), working)
        scratch = np.empty((own, depth), working)
        for b, panel in panels(array):
            for v, shift in enumerate(shifts):
                columns = panel[:, shift * inner:shift * inner + positions].T
                if b:
                    add(grads[b], columns, out[v], scratch)
                else:
                    into(grads[b], columns, out[v])
            del panel, columns
        return scaled(out.reshape(out_shape), named).transpose(order)
    return run_gradient


def _size(names, extents) -> int:
    total = 1
    for name in names:
        total *= extents[name]
    return total
