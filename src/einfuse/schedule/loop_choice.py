"""The choice of a C loop nest for a bound call: the lowering's inputs (working dtype,
padding, the bounds mode of its gathers, the buffers' unit-stride axes after the lane
packing chosen here, the lane tile and register block of plan/blocking.py, the indices
too short for lanes) and the nest's loop order, tiling and row block
(plan/lower.nest_order), as one :class:`~einfuse.schedule.schedule.LoopChoice`, carried
by the call's :class:`~einfuse.schedule.schedule.LoopSchedule`.  plan/lower.plan_for
lowers what it names, and the C backend compiles and caches one kernel per choice
(backends/c/backend.py; two spellings of one computation share it through
LoopChoice.key).  A Triton kernel's lowering is chosen here too, as a
:class:`~einfuse.schedule.schedule.TritonChoice` (``triton_choice``: the same nest rule
for a block-per-program lowering), which backends/triton/backend.py renders; fusion
members (schedule/fusion.py) and the lane-packing search (plan/loop_plan.lane_packs,
through LoopChoice.relaid) lower the choices made here as well.  Nothing here runs or
copies: the facts are plan/'s, read from the buffers' shapes and strides (as a run
will hold them, or as it holds them)."""

from __future__ import annotations

import functools
from typing import Optional, Sequence, Tuple

from ..plan.blocking import block_for, tile_for
from ..plan.loop_plan import (call_bounds, lane_packs, laid_out_buffers, short_indices,
                              unit_axes)
from ..plan.slots import buffer_slots
from .schedule import LoopChoice, LoopSchedule, TritonChoice, triton_with_nest, with_nest

# A Triton kernel's output tile (rows, lanes) as its lowering plans it: the launch's
# blocks are chosen apart (schedule/triton_blocks.py) and masked to it.
TRITON_TILE = (32, 32)


def loop_choice(call, layouts: Sequence[int], bounds: Optional[str] = None) -> LoopChoice:
    """The loop nest's choice for this call's buffers laid out as ``layouts`` (their
    unit-stride axes, the output last) and ``bounds`` (default: the mode this call's
    data allows, plan/gathers.bounds_mode)."""
    working = call.dtypes.working
    return _choice(call.spec, working.name, call.options.pad is not None,
                   bounds or call_bounds(call), tuple(layouts), tile_for(working),
                   block_for(working), short_indices(call))


# one LoopChoice per distinct set of lowering inputs, made once: choosing the nest reads
# the statement's loads (plan/lower.nest_order), and a call without a signature to cache
# its schedule by chooses every time
_choice = functools.lru_cache(maxsize=1024)(with_nest)


def triton_choice(call, layouts: Sequence[int], bounds: str) -> TritonChoice:
    """The Triton kernel's choice for this call's buffers laid out as ``layouts``
    (their unit-stride axes, the output last) under the bounds mode ``bounds``."""
    return _triton_choice(call.spec, call.dtypes.working.name, call.options.pad is not None,
                          bounds, tuple(layouts), TRITON_TILE)


# (made once per distinct set of lowering inputs, as _choice)
_triton_choice = functools.lru_cache(maxsize=1024)(triton_with_nest)


def loop_schedule(call, buffers=None, bounds: Optional[str] = None) -> LoopSchedule:
    """The call's loop nest: its choice, the lane packs a run makes first
    (plan/loop_plan.lane_packs: the inputs a lane loop would otherwise walk along a
    strided axis, the packing that turns a scalar plan into a lane tile, padded strips),
    and what the lowering made of it.  ``buffers``: the call's buffers (the output
    last) as a run holds them; None: as a run will hold them, from shapes and strides,
    copying nothing (explain, the schedule)."""
    buffers = laid_out_buffers(call) if buffers is None else buffers
    given = tuple(unit_axes(buffers))
    bounds = bounds or call_bounds(call)
    first = loop_choice(call, given, bounds)
    packs = lane_packs(call, first, buffers, given)
    layouts = list(given)
    for slot, axis in packs:
        layouts[slot] = axis    # a packed copy's unit-stride axis
    choice = loop_choice(call, layouts, bounds) if packs else first
    return _described(choice, tuple(packs), given)


def packed_inputs(call, loops: LoopSchedule) -> Tuple[str, ...]:
    """The names of the inputs a run of ``loops`` copies into another layout."""
    slots = buffer_slots(call.spec)
    return tuple(dict.fromkeys(slots[slot][0] for slot, _ in loops.packs))


@functools.lru_cache(maxsize=1024)
def _described(choice: LoopChoice, packs, given) -> LoopSchedule:
    """The LoopSchedule of ``choice``, with what its lowering made of it (explain); made
    once per distinct value (a call without a signature chooses every time)."""
    plan = choice.plan()
    spec = choice.spec
    order = []
    body = plan.program.kernels[0].body
    while body:     # the first nest, outermost first; a loop's var is a letter and
        # the index's position (b0: blocked, p2: reduction ...); lane loops have none
        loop = next((s for s in body if hasattr(s, "var") and hasattr(s, "body")), None)
        if loop is None:
            break
        number = loop.var.lstrip("abcdefghijklmnopqrstuvwxyz")
        if number.isdigit() and int(number) < len(spec.all_indices):
            index = spec.all_indices[int(number)]
            if index not in order:
                order.append(index)
        body = loop.body
    parallel = tuple(n for n in spec.output_indices if n in spec.race_free_indices)
    tile = block = None
    if plan.mode == "tiled":
        if plan.row_index is None:
            tile = choice.tile
        else:
            rows, lanes = choice.block
            block = (plan.row_index, plan.inner, rows, lanes)
    return LoopSchedule(plan.mode, tuple(order), parallel, tuple(plan.lane_indices),
                        tile, block, choice, packs, given)
