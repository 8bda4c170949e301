"""The parts of an explanation as data, beside its text: the arrays a statement reads
and writes, and its loop nest (what the pictures draw, docs/pictures.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from ..analysis.ranges import Bounds
from ..analysis.spec import Spec
from ..lang.ast import Expr, Reduce


@dataclass(frozen=True)
class Operand:
    """An array a statement reads or writes, as explained: shape, dtype and bytes."""
    name: str
    shape: Tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass(frozen=True)
class LoopLevel:
    """One loop of the statement's loop nest (the 'Loop nest' text, as data): its depth,
    index, extent (None without shapes) and kind ('parallel', 'serial', or the reduction
    it runs: 'sum', 'max' ...)."""
    depth: int
    index: str
    extent: Optional[int]
    kind: str


def loop_levels(spec: Spec, bounds: Optional[Bounds]) -> List[LoopLevel]:
    """The loops of ``loop_nest``, in its order, as data."""
    levels: List[LoopLevel] = []

    def extent(name: str) -> Optional[int]:
        return None if bounds is None else bounds.extent(name)

    def visit(expr: Expr, depth: int) -> None:
        if isinstance(expr, Reduce):
            for offset, name in enumerate(expr.indices):
                levels.append(LoopLevel(depth + offset, name, extent(name), expr.op))
            visit(expr.body, depth + len(expr.indices))
            return
        for child in expr.children():
            visit(child, depth)

    for depth, name in enumerate(spec.output_indices):
        kind = "parallel" if name in spec.race_free_indices else "serial"
        levels.append(LoopLevel(depth, name, extent(name), kind))
    visit(spec.rhs, len(spec.output_indices))
    return levels
