"""A gradient's scatter-add through affine subscripts whose points do collide -- a
convolution's input gradient ``dx[b, c, 2*i + p - 1, 2*j + q - 1] += v[b, i, j, c, p,
q]`` with a window wider than its stride (col2im) -- as one strided view add per value
of its window indices: with the window offset fixed, each subscript is one index times
its coefficient plus a constant, the points of one offset never collide, and the
positions a padded read left outside the target are cut off the view's ranges, not
masked point by point.  runtime/strided_scatter.py adds the scatters that need no loop
(their points never collide); this is the next form, tried after it.

Whether a scatter is of this form, and its route (one C walk, or view adds), is the
schedule's decision (schedule/window_scatter.py: from the index expressions, ranges and
the arrays' signature); this module adds what it decided."""

from __future__ import annotations

from typing import Mapping, Optional

from ..schedule.window_scatter import (MAX_OFFSETS, OffsetPlan,  # noqa: F401
                                       WindowScatterDecision, WindowScatterRoute,
                                       offset_plan, window_scatter_decision, window_target)

def add_by_offsets(target, g, values, ranges: Mapping[str, range],
                   decision: Optional[WindowScatterDecision] = None) -> bool:
    """``target`` (a C-contiguous NumPy array or a torch tensor) plus ``values`` at
    ``g``'s scatter positions, in place, by the route the schedule decided
    (``decision``, else :func:`scatter_decision`'s): one C walk, or one strided view
    per window offset; positions outside the target are dropped (they are padded
    reads).  False (nothing done) where the scatter is not of this form."""
    if decision is None:
        decision = scatter_decision(target, g, values, ranges)
    if decision.route is WindowScatterRoute.NOT_THIS_FORM:
        return False
    plan = decision.plan
    if decision.route is WindowScatterRoute.ONE_PASS and \
            _add_in_one_pass(target, g, values, ranges, plan):
        return True
    # (VIEW_ADDS, or a one-pass walk whose kernel declined the dtype or layout)
    return _add_by_views(target, g, values, ranges, plan)


def _add_by_views(target, g, values, ranges, plan: OffsetPlan) -> bool:
    import numpy as np
    indices = tuple(g.spec.output_indices)
    numpy_target = isinstance(target, np.ndarray)
    looped, kept, offsets, steps = plan.looped, plan.kept, plan.offsets, plan.steps
    if not numpy_target:
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


def scatter_decision(target, g, values, ranges: Mapping[str, range]) -> \
        WindowScatterDecision:
    """The schedule's route (schedule/window_scatter.window_scatter_decision) for a
    scatter of ``g`` into ``target`` of these values."""
    return window_scatter_decision(g.scatter, tuple(g.spec.output_indices), ranges,
                                   window_target(target, values))


def prepared_add(target, g, values, ranges: Mapping[str, range]):
    """add_by_offsets's one C walk decided once for a NumPy target and values laid
    out like these: a callable ``add(target, values)`` doing what add_by_offsets does
    for such arrays (the same kernel, arguments, bits), False (nothing done) for
    arrays of another layout; None where add_by_offsets would not take the one walk."""
    import numpy as np
    if not isinstance(target, np.ndarray) or not isinstance(values, np.ndarray) or \
            values.dtype != target.dtype:
        return None
    decision = scatter_decision(target, g, values, ranges)
    if decision.route is not WindowScatterRoute.ONE_PASS:
        return None
    order, flips, coefficients, origin, shared = _one_pass_walk(g, ranges, decision.plan)
    from ..backends.c.window_pack import window_adder
    adder = window_adder(target, values.transpose(order)[flips], coefficients, origin,
                         shared)
    if adder is None:
        return None

    def add(target, values) -> bool:
        return type(values) is np.ndarray and adder(target, values.transpose(order)[flips])
    return add


def _add_in_one_pass(target, g, values, ranges, plan: OffsetPlan) -> bool:
    """The whole scatter as one C walk (backends/c/window_pack.add_window): the kept
    indices alone in their subscripts outermost (an image and channel of a conv), then
    the offsets in offset_plan's order, then the other kept indices (the output
    positions).  Each target block then receives every offset while it is in cache
    (nine passes over a whole conv gradient went to memory each time: 1.4 ms of
    NumPy adds against 0.3 ms), in the same order as the per-offset adds, so the same
    bits.  False where the kernel does not take the arrays."""
    from ..backends.c.window_pack import add_window
    order, flips, coefficients, origin, shared = _one_pass_walk(g, ranges, plan)
    part = values.transpose(order)[flips]
    if part.dtype != target.dtype:
        part = part.astype(target.dtype)
    return add_window(target, part, coefficients, origin, shared=shared)


def _one_pass_walk(g, ranges, plan: OffsetPlan):
    """(the values' axes in walk order, the flips of those walked downwards, the
    coefficients and origin of the walk in the target, its shared axes) for
    _add_in_one_pass."""
    indices = tuple(g.spec.output_indices)
    looped, kept, offsets, steps = plan.looped, plan.kept, plan.offsets, plan.steps
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
