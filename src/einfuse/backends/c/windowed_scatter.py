"""The scatter run of a windowed contraction (plan/windowed_contraction.ScatterForm,
WindowMethod.SCATTER): the product over the windowed operand's array as it lies (no
patch matrix: for a stride-1 input gradient ``dy[b, o, k-p, l-q]`` the array is read by
BLAS in place), then its values added into a zeroed result at the window positions by
one C walk (backends/c/window_pack.add_window: col2im).

The two forms agree where padded reads give zero products: the pad is +0 (or absent)
and the other operand is finite, which each call checks (it is the small operand, a
weight); otherwise the call gathers (the patches), whose ``0 * inf`` is NaN as the
semantics say."""

from __future__ import annotations

import math
from typing import Callable, Mapping, Tuple

import numpy as np

from .blas_route import BlasRoute
from .window_pack import add_window
from ...plan.windowed_contraction import (WindowedContraction, WindowMethod,
                                          scatter_form, scatter_reach, with_method)

Runner = Callable[[Mapping[str, np.ndarray]], np.ndarray]


def scatter_runner(found: WindowedContraction, ranges, shapes, working: np.dtype, pad,
                   route: BlasRoute, runner_of) -> Runner:
    """The runner of ``found`` by its scatter form for these ranges, array shapes and
    pad; ``runner_of`` makes backends/c/windowed.py's gathering runners (the form a
    call falls back to)."""
    gathered = []

    def gather(named):
        if not gathered:
            gathered.append(runner_of(with_method(found, WindowMethod.PATCHES), ranges,
                                      shapes, working, pad, route))
        return gathered[0](named)

    form = scatter_form(found)
    zero_pad = pad is None or (pad == 0 and math.copysign(1.0, float(pad)) > 0)
    if form is None or not zero_pad:
        return gather
    reach = scatter_reach(form, ranges, shapes)
    if any(hi <= lo for lo, hi in reach.values()):
        return gather           # (no read lands inside the array: a sum of pads)
    value_ranges = dict(ranges)
    value_ranges.update(reach)
    values_of = runner_of(form.values, value_ranges, shapes, working, None, route)
    coefficients, origin = _positions(found, form, ranges, reach)
    out_shape = tuple(max(0, ranges[n][1] - ranges[n][0]) for n in found.output)
    other = found.operands[1 - form.windowed].tensor
    shared = max(0, len(found.window) + len(form.fresh) - 2)

    def run(named):
        if not np.isfinite(np.asarray(named[other])).all():
            return gather(named)
        values = np.asarray(values_of(named))
        if values.dtype != working:
            values = values.astype(working)
        out = np.zeros(out_shape, working)
        if add_window(out, values, coefficients, origin, shared=shared):
            return out
        return gather(named)    # (a size or dtype the C walk does not take)
    return run


def _positions(found: WindowedContraction, form, ranges, reach) -> Tuple[list, list]:
    """For each axis of the values (form.values.output): its step on each axis of the
    result, and the result's element of the values' first: the output index ``k`` a
    fresh index ``s`` stands for is ``+-(s - sum(c * w) - e)`` (its subscript solved),
    every other output index is itself."""
    axes = form.values.output
    at = {name: a for a, name in enumerate(axes)}
    coefficients = [[0] * len(found.output) for _ in axes]
    origin = [0] * len(found.output)
    standing = {k: (name, sub) for name, k, _, sub in form.fresh}
    for a, name in enumerate(found.output):
        if name not in standing:
            coefficients[at[name]][a] = 1
            continue
        fresh, sub = standing[name]
        sign = dict(sub.terms)[name]
        first = reach[fresh][0] - sub.constant
        coefficients[at[fresh]][a] = sign
        for n, c in sub.terms:
            if n != name:
                coefficients[at[n]][a] = -sign * c
                first -= c * ranges[n][0]
        origin[a] = sign * first - ranges[name][0]
    return coefficients, origin
