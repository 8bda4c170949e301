"""A gradient's scatter-add through affine subscripts whose points do collide -- a
convolution's input gradient ``dx[b, c, 2*i + p - 1, 2*j + q - 1] += v[b, i, j, c, p,
q]`` with a window wider than its stride (col2im) -- as one strided view add per value
of its window indices: with the window offset fixed, each subscript is one index times
its coefficient plus a constant, the points of one offset never collide, and the
positions a padded read left outside the target are cut off the view's ranges, not
masked point by point.  runtime/strided_scatter.py adds the scatters that need no loop
(their points never collide); this is the next form, tried after it.

Decided from the index expressions and ranges alone, as there: every subscript affine
with no gathers, at most one index of each subscript kept (the one of largest
coefficient times extent, the others looped over), the kept indices' views
collision-free by the same mixed-radix test, and few enough offsets."""

from __future__ import annotations

import itertools
from typing import Mapping, Optional, Sequence, Tuple

# One view add per offset costs a NumPy call or two: past this many the scatter's
# general path (one compiled loop over all points) is the better form.
MAX_OFFSETS = 256


def offset_plan(scatter, indices: Sequence[str], ranges: Mapping[str, range],
                target_shape: Sequence[int]):
    """(looped indices, kept indices, the offsets in the order they are added) for a
    scatter of values over ``indices``, or None where it is not such a scatter.

    The order keeps the bits of the general path (np.add.at's, the values' order): each
    target position receives its points in the order of the values' axes.  In a
    subscript ``c*k + d*l + e`` with ``k`` kept and ``l`` looped, a position's points
    have ``k`` falling as ``l`` rises (``c``, ``d`` of one sign) or rising with it; the
    values order them by whichever of the two comes first among the values' axes, so
    ``l`` is looped over in the direction that puts those first, and the looped indices
    by the place of their pairs."""
    order = _offset_order(scatter, indices, ranges, target_shape)
    if order is None:
        return None
    names, kept, falling = order
    axes = [reversed(ranges[n]) if down else ranges[n] for n, down in zip(names, falling)]
    return names, kept, tuple(itertools.product(*axes))


def _offset_order(scatter, indices, ranges, target_shape):
    """(looped indices in the order they nest, kept indices, per looped index whether
    it is walked downwards) for offset_plan."""
    if len(scatter) != len(target_shape):
        return None
    kept, looped, keys = [], [], []
    for sub in scatter:
        if sub.gathers or getattr(sub, "quasi", ()):
            return None
        terms = list(sub.terms)
        if any(n not in ranges or ranges[n].step != 1 for n, _ in terms):
            return None
        if not terms:
            continue
        keep = max(terms, key=lambda t: (abs(t[1]) * len(ranges[t[0]]), -terms.index(t)))
        others = [t for t in terms if t[0] != keep[0]]
        if keep[0] in kept or keep[0] in looped or len(others) > 1 or \
                any(n in looped or n in kept for n, _ in others):
            return None
        kept.append(keep[0])
        for name, c in others:
            k_at, l_at = indices.index(keep[0]), indices.index(name)
            falling = l_at > k_at and (c > 0) == (keep[1] > 0)
            looped.append(name)
            keys.append((min(k_at, l_at), falling))
    if not looped:
        return None
    offsets = 1
    for name in looped:
        offsets *= len(ranges[name])
    if offsets > MAX_OFFSETS:
        return None
    ordered = sorted(range(len(looped)), key=lambda a: keys[a][0])
    return (tuple(looped[a] for a in ordered), tuple(kept),
            tuple(keys[a][1] for a in ordered))


def add_by_offsets(target, g, values, ranges: Mapping[str, range]) -> bool:
    """``target`` (a C-contiguous NumPy array or a torch tensor) plus ``values`` at
    ``g``'s scatter positions, in place, one strided view per window offset; positions
    outside the target are dropped (they are padded reads).  False (nothing done) where
    the scatter is not of this form."""
    import numpy as np
    indices = tuple(g.spec.output_indices)
    numpy_target = isinstance(target, np.ndarray)
    found = _checked_plan(target, g, values, ranges)
    if found is None:
        return False
    looped, kept, offsets, steps = found
    if numpy_target and isinstance(values, np.ndarray) and \
            _add_in_one_pass(target, g, values, ranges, looped, kept, offsets, steps):
        return True
    if not numpy_target:
        if any(c < 0 for sub in g.scatter for _, c in sub.terms):
            return False            # (torch's views take no negative steps)
        values = values.to(target.dtype)
    for offset in offsets:
        fixed = dict(zip(looped, offset))
        window = _window(g.scatter, fixed, kept, ranges, target.shape, steps)
        if window is None:
            continue            # every point of this offset falls outside the target
        cuts, shape, view_steps, start = window
        part = values[tuple(cuts[n] if n in cuts else fixed[n] - ranges[n].start
                            for n in indices)]
        order = [n for n in indices if n in cuts]       # the part's axes
        # walked in the target's memory order (largest step first): in the values'
        # order a convolution's channel axis, innermost there, jumps a whole image
        walk = sorted(range(len(order)), key=lambda a: -abs(view_steps[order[a]]))
        part = part.transpose(walk) if numpy_target else part.permute(*walk)
        order = [order[a] for a in walk]
        view_strides = [view_steps[n] for n in order]
        view_shape = [shape[n] for n in order]
        if numpy_target:
            view = np.lib.stride_tricks.as_strided(
                target.reshape(-1)[start:], view_shape,
                [s * target.itemsize for s in view_strides], writeable=True)
            view += part.astype(target.dtype, copy=False)
        else:
            target.as_strided(view_shape, view_strides,
                              target.storage_offset() + start).add_(part)
    return True


def _checked_plan(target, g, values, ranges):
    """(looped, kept, offsets, the target's element steps) of add_by_offsets for these
    arrays, or None where the scatter is not of its form."""
    import numpy as np
    indices = tuple(g.spec.output_indices)
    numpy_target = isinstance(target, np.ndarray)
    if numpy_target and (not target.flags.c_contiguous or not target.flags.writeable
                         or target.ndim == 0):
        return None
    if tuple(values.shape) != tuple(len(ranges[n]) for n in indices):
        return None
    plan = offset_plan(g.scatter, indices, ranges, target.shape)
    if plan is None:
        return None
    looped, kept, offsets = plan
    if numpy_target:
        steps = [s // target.itemsize for s in target.strides]
    else:
        steps = list(target.stride())
    # the kept indices' views must never repeat an address (the mixed-radix test)
    strides = {n: 0 for n in kept}
    for sub, step in zip(g.scatter, steps):
        for name, c in sub.terms:
            if name in strides:
                strides[name] += c * step
    covered = 0
    for stride, count in sorted((abs(strides[n]), len(ranges[n])) for n in kept
                                if len(ranges[n]) > 1):
        if stride <= covered:
            return None
        covered += stride * (count - 1)
    return looped, kept, offsets, steps


def prepared_add(target, g, values, ranges: Mapping[str, range]):
    """add_by_offsets's one C walk decided once for a NumPy target and values laid
    out like these: a callable ``add(target, values)`` doing what add_by_offsets does
    for such arrays (the same kernel, arguments, bits), False (nothing done) for
    arrays of another layout; None where add_by_offsets would not take the one walk."""
    import numpy as np
    if not isinstance(target, np.ndarray) or not isinstance(values, np.ndarray) or \
            values.dtype != target.dtype:
        return None
    found = _checked_plan(target, g, values, ranges)
    if found is None:
        return None
    looped, kept, offsets, steps = found
    order, flips, coefficients, origin, shared = _one_pass_walk(
        g, ranges, looped, kept, offsets, steps)
    from ..backends.c.window_pack import window_adder
    adder = window_adder(target, values.transpose(order)[flips], coefficients, origin,
                         shared)
    if adder is None:
        return None

    def add(target, values) -> bool:
        return type(values) is np.ndarray and adder(target, values.transpose(order)[flips])
    return add


def _add_in_one_pass(target, g, values, ranges, looped, kept, offsets, steps) -> bool:
    """The whole scatter as one C walk (backends/c/window_pack.add_window): the kept
    indices alone in their subscripts outermost (an image and channel of a conv), then
    the offsets in offset_plan's order, then the other kept indices (the output
    positions).  Each target block then receives every offset while it is in cache
    (nine passes over a whole conv gradient went to memory each time: 1.4 ms of
    NumPy adds against 0.3 ms), in the same order as the per-offset adds, so the same
    bits.  False where the kernel does not take the arrays."""
    from ..backends.c.window_pack import add_window
    order, flips, coefficients, origin, shared = _one_pass_walk(
        g, ranges, looped, kept, offsets, steps)
    part = values.transpose(order)[flips]
    if part.dtype != target.dtype:
        part = part.astype(target.dtype)
    return add_window(target, part, coefficients, origin, shared=shared)


def _one_pass_walk(g, ranges, looped, kept, offsets, steps):
    """(the values' axes in walk order, the flips of those walked downwards, the
    coefficients and origin of the walk in the target, its shared axes) for
    _add_in_one_pass."""
    indices = tuple(g.spec.output_indices)
    beside = {n for sub in g.scatter for n, _ in sub.terms if n in looped}
    paired = {n for sub in g.scatter if any(m in beside for m, _ in sub.terms)
              for n, _ in sub.terms if n in kept}
    alone = [n for n in kept if n not in paired]
    inner = [n for n in kept if n in paired]

    def target_step(name):
        return -abs(sum(c * step for sub, step in zip(g.scatter, steps)
                        for n, c in sub.terms if n == name))
    alone.sort(key=target_step)
    inner.sort(key=target_step)
    first = offsets[0] if offsets else ()
    down = {n: len(ranges[n]) > 1 and v == ranges[n].stop - 1
            for n, v in zip(looped, first)}
    order = alone + list(looped) + inner
    coefficients, origin = [], []
    for sub in g.scatter:
        origin.append(sub.constant + sum(
            c * (ranges[n].stop - 1 if down.get(n) else ranges[n].start)
            for n, c in sub.terms))
    for name in order:
        sign = -1 if down.get(name) else 1
        coefficients.append([sign * sum(c for n, c in sub.terms if n == name)
                             for sub in g.scatter])
    flips = tuple(slice(None, None, -1) if down.get(n) else slice(None) for n in order)
    return ([indices.index(n) for n in order], flips, coefficients, origin,
            len(looped) + len(inner) - 2)


def _window(scatter, fixed, kept, ranges, target_shape, steps):
    """For one offset: each kept index's slice of the values (``cuts``), its extent and
    step in the target, and the target element of the first point; None where some
    axis has no point inside the target."""
    lo = {n: ranges[n].start for n in kept}
    hi = {n: ranges[n].stop for n in kept}       # exclusive
    constants = []
    for sub, extent in zip(scatter, target_shape):
        constant = sub.constant + sum(c * fixed[n] for n, c in sub.terms if n in fixed)
        free = [(n, c) for n, c in sub.terms if n not in fixed]
        if not free:
            if not 0 <= constant < extent:
                return None
        else:
            (name, c), = free           # (offset_plan kept one index per subscript)
            # 0 <= c * v + constant <= extent - 1
            if c > 0:
                first, last = _ceil_div(-constant, c), (extent - 1 - constant) // c
            else:
                first, last = _ceil_div(extent - 1 - constant, c), constant // -c
            lo[name], hi[name] = max(lo[name], first), min(hi[name], last + 1)
            if lo[name] >= hi[name]:
                return None
        constants.append(constant)
    start = 0
    view_steps = {n: 0 for n in kept}
    for sub, constant, step in zip(scatter, constants, steps):
        value = constant
        for name, c in sub.terms:
            if name in view_steps:
                value += c * lo[name]
                view_steps[name] += c * step
        start += value * step
    cuts = {n: slice(lo[n] - ranges[n].start, hi[n] - ranges[n].start) for n in kept}
    shape = {n: hi[n] - lo[n] for n in kept}
    return cuts, shape, view_steps, start


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)
