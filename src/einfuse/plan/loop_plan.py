"""The C loop nest's plan for one bound call: the lowering's inputs as this call fixes
them (working dtype, padding, the bounds mode of its gathers, the buffers' unit-stride
axes, the lane tile and register block of plan/blocking.py, the indices too short for
lanes), which inputs are packed so that lanes walk them contiguously
(plan/lane_layout.py), and the buffers' layouts as a run will hold them, laid out from
shapes and strides without copying anything.

These are facts of the lowering, read by the schedule, which chooses a loop nest's
lowering inputs from them (schedule/loop_choice.py: the key its compiled kernel is
cached by), and by the fusion rules (which statements can share a fused loop).  No
plan is made here: the packing search weighs the plans of the schedule's choices."""

from __future__ import annotations

from typing import List, NamedTuple, Tuple

import numpy as np

from ..lang.ast import accesses, reductions
from .blocking import aliases
from .gathers import bounds_mode
from .lane_layout import packing_for_lanes, packing_for_rows
from .arguments import unit_axis
from .slots import buffer_slots

# An index with fewer values than this is not worth spreading over SIMD lanes.
SHORT_EXTENT = 8
# Pack an input only when it is small next to the work: its copy must cost little.
PACK_WORK_RATIO = 8


def input_buffers(call) -> List[np.ndarray]:
    """One array per kernel buffer slot (the output excluded): value arrays in the
    working dtype, index arrays as int64 (no copy where they are already)."""
    working = call.dtypes.working
    result = []
    for tensor, kind in buffer_slots(call.spec)[:-1]:
        array = np.asarray(call.arrays[tensor])
        dtype = np.int64 if kind == "index" else working
        result.append(array.astype(dtype, copy=False))
    return result


def call_bounds(call) -> str:
    """The kernel's bounds mode; a C kernel tests each gathered value itself under
    check/promise too, so it reads uint64 index arrays as unsigned then as well."""
    return bounds_mode(call, unsigned_checks=True)


def short_indices(call) -> Tuple[str, ...]:
    return tuple(name for name in call.spec.all_indices
                 if call.bounds.extent(name) < SHORT_EXTENT)


def lane_packs(call, choice, buffers: List[np.ndarray], units=None
               ) -> Tuple[Tuple[int, int], ...]:
    """(buffer slot, axis to make unit-stride), in the order a run packs them: each
    input that a vectorised lane loop of ``choice``'s plan walks along a strided axis (gauss:
    y[j, d] walked along j), so that lanes load one contiguous vector instead of
    gathering; where there is none, the packing plan/lane_layout.py finds that turns
    a scalar plan into a lane tile, or that streams a row-blocked plan's reads.
    ``buffers``: the call's buffers (the output last), or what explain reads of them
    (shape, size, strides) with their unit-stride axes ``units``; nothing is copied.
    ``choice``: the schedule's loop choice for the buffers as they are
    (schedule/loop_choice.py); a packing is weighed by the plan of the choice it makes,
    ``choice.relaid(layouts)``."""
    plan = choice.plan()
    units = [unit_axis(b) for b in buffers] if units is None else list(units)
    shapes = [b.shape for b in buffers]
    if plan.mode == "scalar" and (not plan.lane_indices or not _short_inner(call)):
        # a lane tile over an output index first (explain's choice too): a scalar plan's
        # lanes over a reduced index run each inner contraction as a scalar chain (the
        # row-major gauss of distances, K=784: 21 -> 116 GFLOP/s with the tile's
        # register block, plan/epilogue_blocks.py).  Not where the inner reductions are
        # short (gauss D=3): there the epilogue's exp is the work, and GCC's AVX2 code
        # for the block's epilogue called the scalar exp for most lanes (2x slower)
        packs = _tile_packs(call, choice, units, shapes)
        if packs or not plan.lane_indices:
            return packs
    elif not plan.lane_indices:
        return ()
    work = call.bounds.points
    slots = buffer_slots(call.spec)
    packs = []
    for access in accesses(call.spec.rhs):
        slot = slots.index((access.tensor, "value")) if (access.tensor, "value") in slots \
            else None
        if slot is None or access.tensor == call.spec.output:
            continue
        if buffers[slot].size * PACK_WORK_RATIO > work:
            continue
        for axis, sub in enumerate(access.indices):
            walks = any(dict(sub.terms).get(lane) in (1, -1) for lane in plan.lane_indices)
            if walks and shapes[slot][axis] > 1 and units[slot] != axis:
                packs.append((slot, axis))
                units[slot] = axis      # a packed copy's unit-stride axis
                break
    packs = tuple(packs) or _tile_packs(call, choice, units, shapes, plan)
    return packs + _strip_pads(call, plan, buffers, units, {slot for slot, _ in packs})


def _short_inner(call) -> bool:
    """Whether every reduction nested inside another runs over short indices only."""
    short = set(short_indices(call))
    return all(set(inner.indices) <= short for top in reductions(call.spec.rhs)
               for inner in reductions(top.body))


def _strip_pads(call, plan, buffers, units, packed) -> Tuple[Tuple[int, int], ...]:
    """(slot, its unit axis) of each input whose lanes' strip is walked by a reduction
    along a stride that aliases in the cache (plan/blocking.aliases; dist's x[k, j] at
    4096-byte rows): the strip is read whole again for every other block of the
    output, and crowded into a few cache sets it is evicted first.  Its copy
    (backends/c/pack.pack_axis) keeps the layout and pads the rows; inputs packed
    already are padded by their copy.  An output index's axis is walked once: a row
    kernel's x[i, j] stays as it is."""
    work = call.bounds.points
    slots = buffer_slots(call.spec)
    outputs = set(call.spec.output_indices)
    lanes = set(plan.lane_indices)

    def walked(sub) -> bool:
        return any(dict(sub.terms).get(lane) in (1, -1) for lane in lanes)

    def reduced(sub) -> bool:
        terms = {index for index, scale in sub.terms if scale}
        return bool(terms) and not terms & outputs

    pads = []
    for access in accesses(call.spec.rhs):
        slot = slots.index((access.tensor, "value")) if (access.tensor, "value") in slots \
            else None
        if slot is None or slot in packed or access.tensor == call.spec.output \
                or units[slot] < 0 or buffers[slot].size * PACK_WORK_RATIO > work \
                or not walked(access.indices[units[slot]]):
            continue
        if any(buffers[slot].shape[axis] > 1 and reduced(sub)
               and aliases(buffers[slot].strides[axis])
               for axis, sub in enumerate(access.indices)):
            pads.append((slot, units[slot]))
            packed = packed | {slot}
    return tuple(pads)


def _tile_packs(call, choice, units, shapes, plan=None) -> Tuple[Tuple[int, int], ...]:
    """The inputs whose layout keeps a lane tile off an output index (cdist's y[j, d]
    read along j), or, given a row-blocked ``plan``, those it reads across its rows
    along their unit-stride axis (plan/lane_layout.py); each packing weighed by the
    plan of the schedule's choice for the layouts it makes."""
    args = (call.spec, tuple(units), list(shapes), call.bounds.points,
            lambda layouts: choice.relaid(layouts).plan(), PACK_WORK_RATIO)
    packing = packing_for_lanes(*args) if plan is None else packing_for_rows(plan, *args)
    return tuple((packing or {}).items())


def laid_out_buffers(call) -> List["_StridedLayout"]:
    """The call's buffers (the output last) as a run will hold them -- shapes, sizes,
    strides and item sizes --, copying nothing: what lane_packs and unit_axes read."""
    shape = tuple(call.output_shape)
    dtype = np.dtype(np.int64) if call.spec.result_is_position else call.dtypes.working
    strides = tuple(int(np.prod(shape[axis + 1:], dtype=np.int64)) * dtype.itemsize
                    for axis in range(len(shape)))
    return _strided_layouts(call) + [_StridedLayout(
        shape, int(np.prod(shape, dtype=np.int64)), strides, dtype.itemsize)]


def unit_axes(buffers) -> List[int]:
    """plan/arguments.unit_axis of each buffer (arrays, or laid_out_buffers' layouts)."""
    return [_unit_axis_of(b) if isinstance(b, _StridedLayout) else unit_axis(b)
            for b in buffers]


class _StridedLayout(NamedTuple):
    """What _strip_pads reads of a buffer, without converting it."""
    shape: Tuple[int, ...]
    size: int
    strides: Tuple[int, ...]
    itemsize: int = 0


def _strided_layouts(call) -> List[_StridedLayout]:
    """The input buffers' shapes and strides as a run will see them, copying nothing
    (a converted input is a fresh array laid out as ``astype`` lays it out)."""
    working = call.dtypes.working
    result = []
    for tensor, kind in buffer_slots(call.spec)[:-1]:
        array = np.asarray(call.arrays[tensor])
        dtype = np.dtype(np.int64 if kind == "index" else working)
        result.append(_StridedLayout(array.shape, array.size,
                                     _converted_strides(array, dtype), dtype.itemsize))
    return result


def _converted_strides(array: np.ndarray, dtype: np.dtype) -> Tuple[int, ...]:
    """The strides of ``array.astype(dtype, copy=False)`` (input_buffers' conversion),
    without converting: its own where the dtype is the same, else those of the array
    ``astype`` makes (order 'K': the input's axis order, packed; ``empty_like`` lays it
    out the same way and writes nothing)."""
    if array.dtype == dtype:
        return array.strides
    try:
        return np.empty_like(array, dtype=dtype).strides
    except (MemoryError, ValueError):
        # (no memory for the copy now: C order, which the run corrects where it differs)
        return tuple(int(np.prod(array.shape[axis + 1:], dtype=np.int64)) * dtype.itemsize
                     for axis in range(array.ndim))


def buffers_layout_only(call) -> List[int]:
    """The unit-stride axes the buffers will have, without converting anything."""
    return unit_axes(laid_out_buffers(call))


def _unit_axis_of(layout: _StridedLayout) -> int:
    """plan/arguments.unit_axis of a buffer laid out as ``layout``."""
    itemsize = layout.itemsize
    for axis in reversed(range(len(layout.shape))):
        if layout.shape[axis] > 1 and layout.strides[axis] == itemsize:
            return axis
    return -1
