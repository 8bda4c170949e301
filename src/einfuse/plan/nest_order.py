"""The loop nest's shape as decided before it is lowered: the order of the output
loops, whether the innermost one runs in lane tiles, and which output index (if any)
is blocked in rows of a register block.  A frozen value: schedule/loop_choice.py
chooses it (through plan/lower.nest_order, which reads the statement's loads and the
buffers' layouts) and carries it in the schedule; plan/lower.plan_for lowers the nest
it names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class NestOrder:
    order: Tuple[str, ...]        # the output loops, outermost first
    tiled: bool                   # the innermost output loop in lane tiles
    rows: Optional[str] = None    # the output index blocked in rows (a tiled nest only)
    # a row-blocked nest's lane tiles outside its row blocks (plan/blocking.lanes_outer)
    lanes_outer: bool = False

    @property
    def inner(self) -> Optional[str]:
        return self.order[-1] if self.order else None
