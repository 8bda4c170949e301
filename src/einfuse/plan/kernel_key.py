"""The key of a compiled loop-nest kernel: everything its lowering
(plan/lower.plan_for) reads -- the statement's spec, and the schedule's choices for the
loop nest (working dtype, padding, the bounds mode of its gathers, the buffers'
unit-stride axes, the lane tile, the register block, the indices too short for lanes).
One frozen value, so that a cache keyed by it holds one kernel per distinct plan and
two callers that agree on the plan share the kernel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from .lower import Plan, plan_for


@dataclass(frozen=True)
class KernelKey:
    spec: object
    working: str
    pad: bool
    bounds: str
    layouts: Tuple[int, ...]
    tile: int
    block: Tuple[int, int]
    short: Tuple[str, ...]

    def plan(self) -> Plan:
        """The lowering of the statement under these choices (plan_for caches it)."""
        return plan_for(self.spec, self.working, self.pad, self.bounds, self.layouts,
                        self.tile, self.block, self.short)
