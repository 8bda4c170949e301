"""The col2im scatter's route (runtime/window_scatter.py: a gradient's scatter-add
through affine subscripts whose points collide, a strided convolution's input gradient)
decided here from the index expressions, the ranges and the arrays' signature (types,
shapes, strides, flags: no values), as a frozen :class:`WindowScatterDecision`; the
runtime only adds what it is handed.

The form: every subscript affine with no gathers, at most one index of each subscript
kept (the one of largest coefficient times extent, the others looped over), the kept
indices' views collision-free by the mixed-radix test, few enough offsets (at most
MAX_OFFSETS).  The routes: ONE_PASS (NumPy target and values the walk's capability,
:data:`ONE_PASS`, takes: the whole scatter as one C walk,
backends/c/window_pack.add_window, which still declines a layout it has no variant
for: then the per-offset adds), VIEW_ADDS (one strided view add per window offset,
NumPy or torch; the reason the walk does not take the arrays), NOT_THIS_FORM (the
scatter's general path)."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Tuple


class WindowScatterRoute(enum.Enum):
    ONE_PASS = "one C walk over the whole scatter (backends/c/window_pack.add_window)"
    VIEW_ADDS = "one strided view add per window offset"
    NOT_THIS_FORM = "not the window form: the scatter's general path"


@dataclass(frozen=True)
class OffsetPlan:
    """The looped (window) indices in the order they nest, the kept ones, the offsets
    in the order they are added, and the target's element steps."""
    looped: Tuple[str, ...]
    kept: Tuple[str, ...]
    offsets: Tuple[Tuple[int, ...], ...]
    steps: Tuple[int, ...]


@dataclass(frozen=True)
class WindowScatterDecision:
    route: WindowScatterRoute
    plan: Optional[OffsetPlan] = None
    reason: Optional[str] = None


@dataclass(frozen=True)
class WindowTarget:
    """What the decision reads of the arrays: whether the target and the values are
    NumPy arrays, the target's shape and element steps, whether it is C-contiguous and
    writeable (a NumPy target must be both), and the values' shape."""
    numpy_target: bool
    numpy_values: bool
    shape: Tuple[int, ...]
    steps: Tuple[int, ...]
    contiguous: bool
    writeable: bool
    values_shape: Tuple[int, ...]
    dtype: str = ""          # the target's dtype name


@dataclass(frozen=True)
class OnePassCapability:
    """What the one C walk (backends/c/window_pack.add_window) takes: a target of these
    dtypes, at least ``min_elements`` values (below, NumPy's view adds are as fast and
    need no compiler), at most ``max_axes`` axes of the target and of the values plus
    one.  (The kernel tests the same facts again and declines what it has no variant
    for: then the view adds.)"""
    dtypes: Tuple[str, ...] = ("float32", "float64")
    min_elements: int = 1 << 12
    max_axes: int = 16


ONE_PASS = OnePassCapability()


def _one_pass_reason(target: WindowTarget) -> Optional[str]:
    """Why the one C walk does not take these arrays, or None where it does."""
    from ..analysis.capabilities import can_build
    size = 1
    for extent in target.values_shape:
        size *= extent
    if not target.numpy_target or not target.numpy_values:
        return "not NumPy arrays"
    if target.dtype not in ONE_PASS.dtypes:
        return f"a {target.dtype} target (the walk takes float32 and float64)"
    if size < ONE_PASS.min_elements:
        return f"{size} values (below {ONE_PASS.min_elements}, the view adds are as fast)"
    if len(target.shape) > ONE_PASS.max_axes or \
            len(target.values_shape) + 1 > ONE_PASS.max_axes:
        return f"more than {ONE_PASS.max_axes} axes"
    if not can_build("c"):
        return "no C compiler"
    return None


def window_target(target, values) -> WindowTarget:
    """The facts of a NumPy array or torch tensor ``target`` and ``values``."""
    import numpy as np
    numpy_target = isinstance(target, np.ndarray)
    if numpy_target:
        steps = tuple(s // target.itemsize for s in target.strides)
        contiguous, writeable = target.flags.c_contiguous, target.flags.writeable
    else:
        steps, contiguous, writeable = tuple(target.stride()), True, True
    return WindowTarget(numpy_target, isinstance(values, np.ndarray), tuple(target.shape),
                        steps, bool(contiguous), bool(writeable), tuple(values.shape),
                        str(target.dtype).rsplit(".", 1)[-1])


def _not_this_form(reason: str) -> WindowScatterDecision:
    return WindowScatterDecision(WindowScatterRoute.NOT_THIS_FORM, reason=reason)


def window_scatter_decision(scatter, indices: Sequence[str], ranges: Mapping[str, range],
                            target: WindowTarget) -> WindowScatterDecision:
    """The route of a scatter of values over ``indices`` (``scatter``: the target's
    subscripts) into a target of these facts."""
    if target.numpy_target and (not target.contiguous or not target.writeable or
                                not target.shape):
        return _not_this_form("a NumPy target that is not C-contiguous and writeable")
    if target.values_shape != tuple(len(ranges[n]) for n in indices):
        return _not_this_form("values not of the ranges' shape")
    found = offset_plan(scatter, indices, ranges, target.shape)
    if found is None:
        return _not_this_form("subscripts not of the window form (or too many offsets)")
    looped, kept, offsets = found
    # the kept indices' views must never repeat an address (the mixed-radix test)
    strides = {n: 0 for n in kept}
    for sub, step in zip(scatter, target.steps):
        for name, c in sub.terms:
            if name in strides:
                strides[name] += c * step
    covered = 0
    for stride, count in sorted((abs(strides[n]), len(ranges[n])) for n in kept
                                if len(ranges[n]) > 1):
        if stride <= covered:
            return _not_this_form("the kept indices' views would repeat an address")
        covered += stride * (count - 1)
    plan = OffsetPlan(tuple(looped), tuple(kept), tuple(offsets), tuple(target.steps))
    one_pass = _one_pass_reason(target)
    if one_pass is None:
        return WindowScatterDecision(WindowScatterRoute.ONE_PASS, plan)
    if not target.numpy_target and any(c < 0 for sub in scatter for _, c in sub.terms):
        return _not_this_form("a falling subscript (torch's views take no negative steps)")
    return WindowScatterDecision(WindowScatterRoute.VIEW_ADDS, plan, one_pass)


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
