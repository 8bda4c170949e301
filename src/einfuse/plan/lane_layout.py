"""Packing an input so that an output index can be spread over SIMD lanes.

The planner (plan/lower.py) tiles an output index over lanes only where a load inside
the reductions walks that index along its unit-stride axis.  A pairwise reduction

    D[i,j] := sqrt(sum[d]((x[i,d] - y[j,d])**2))

reads ``y`` along ``j`` with stride ``d``: as laid out, no output index qualifies and
each output element runs its own short dot product over ``d`` (a horizontal sum per
element).  With ``y`` copied so that ``j`` is its unit-stride axis the same statement is
a register-blocked lane tile over ``j`` (8 rows of ``i`` x 32 lanes of ``j``, the loop
over ``d`` outside the lanes): 5x faster at 1024 x 1024, d=64, and the copy costs one
pass over ``y``.

This module only chooses the layout: it asks the planner for the plan the packed
layout would get, and packs only when that plan tiles lanes over the index.  The
values read are the same, so the result is the same up to the order of additions
(both plans sum ``d`` in index order per output element)."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

from ..lang.ast import accesses, reductions

# A packed call has no prepared fast path (backends/c/repeat.py): it is bound every time,
# about 80 us more per call.  Below this many loop iterations the layout as given costs
# less than that (64 x 64 points, d=8: 52 us a call unpacked, 132 us packed).
MIN_WORK = 1 << 18


def packing_for_lanes(spec, layouts: Tuple[int, ...], shapes: List[Tuple[int, ...]],
                      work: int, plan_of: Callable[[Tuple[int, ...]], object],
                      ratio: int) -> Optional[Dict[int, int]]:
    """{buffer slot: axis to make unit-stride} that turns a plan with reductions but no
    lane tile into one tiling an output index over lanes, or None.  ``layouts``: each
    buffer's unit-stride axis (the output's last); ``shapes``: the input buffers' shapes;
    ``plan_of(layouts)``: the plan for other layouts; an input is packed only when
    ``ratio`` times its size is at most ``work`` (its copy must cost little)."""
    from .slots import buffer_slots
    if work < MIN_WORK:
        return None
    slots = buffer_slots(spec)
    outputs = spec.output_indices
    # the store's innermost index first: its lanes also store contiguously
    for index in reversed(outputs):
        packing: Dict[int, int] = {}
        for access, slot in _input_reads(spec, slots, packing):
            shape = shapes[slot]
            if _size(shape) * ratio > work:
                continue
            for axis, sub in enumerate(access.indices):
                if dict(sub.terms).get(index) in (1, -1) and len(sub.terms) == 1 and \
                        not sub.gathers and shape[axis] > 1 and layouts[slot] != axis:
                    packing[slot] = axis
                    break
        if not packing:
            continue
        trial = tuple(packing.get(slot, axis) for slot, axis in enumerate(layouts))
        plan = plan_of(trial)
        if plan.mode == "tiled" and plan.inner == index:
            return packing
    return None


def packing_for_rows(plan, spec, layouts: Tuple[int, ...], shapes: List[Tuple[int, ...]],
                     work: int, plan_of: Callable[[Tuple[int, ...]], object],
                     ratio: int) -> Optional[Dict[int, int]]:
    """{buffer slot: axis} for the inputs of a row-blocked plan that each reduction step
    reads across the rows, along their unit-stride axis, while the reduction walks
    another axis: cdist's ``dy[j,d] := sum[i](h1[i,j] * (...))`` reads ``h1[i, j0..j0+7]``
    per step, one cache line a full row of ``h1`` away from the last (at 1024 columns,
    a page: the reads wait on memory, 6.2 ms).  Packed along the reduced axis each row of
    the block reads a contiguous stream (2.5 ms, plus 0.6 ms for the copy).  Only where
    the plan for the packed layout keeps its lanes and rows."""
    from .slots import buffer_slots
    if plan.mode != "tiled" or plan.row_index is None or work < MIN_WORK:
        return None
    slots = buffer_slots(spec)
    reduced = {name for r in reductions(spec.rhs) for name in r.indices}
    packing: Dict[int, int] = {}
    for access, slot in _input_reads(spec, slots, packing):
        unit = layouts[slot]
        plain = [sub.plain_index for sub in access.indices]
        if unit < 0 or plain[unit] != plan.row_index or _size(shapes[slot]) * ratio > work:
            continue
        for axis, name in enumerate(plain):
            if name in reduced and name not in plan.lane_indices and shapes[slot][axis] > 1:
                packing[slot] = axis
                break
    if not packing:
        return None
    trial = plan_of(tuple(packing.get(slot, axis) for slot, axis in enumerate(layouts)))
    if trial.mode != "tiled" or trial.inner != plan.inner or \
            trial.row_index != plan.row_index:
        return None
    return packing


def _input_reads(spec, slots, packing: Dict[int, int]):
    """(access, buffer slot) of each read of a value input not yet in ``packing`` (a
    dict the caller fills while iterating): what a packing may copy."""
    for access in accesses(spec.rhs):
        key = (access.tensor, "value")
        if key in slots and access.tensor != spec.output:
            slot = slots.index(key)
            if slot not in packing:
                yield access, slot


def _size(shape) -> int:
    size = 1
    for extent in shape:
        size *= extent
    return size
