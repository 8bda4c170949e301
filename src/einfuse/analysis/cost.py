"""What a statement or a typed program costs, counted once for every stage that reports
it (explain, the sharding planner, attention's notes, the threading of ``ef.jit``'s
loops and of a fused C group): operations executed, bytes moved, iteration points, and
numbers as explain prints them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Tuple

from .. import ir
from ..lang.ast import Access, Binary, Call, Expr, Reduce, Unary
from .ranges import Bounds
from .spec import Spec


def count_text(n: int) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n:,} ({n / scale:.2f} {unit})"
    return f"{n:,}"


def bytes_text(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


# -- operations -----------------------------------------------------------------------------------
def _ops(expr: Expr) -> int:
    if isinstance(expr, (Binary, Call)):
        return 1
    if isinstance(expr, Unary):
        return 1
    if isinstance(expr, Reduce):
        return 1 if expr.op != "logsumexp" else 3  # max, exp, add per element
    return 0


def count_flops(spec: Spec, bounds: Bounds, hoisted=None) -> int:
    """Operations executed, counting each arithmetic operator, comparison, function and
    reduction step as one (logsumexp as three), times how often its scope runs; with the
    statement's ``hoisted`` form, the operations of its statements."""
    if hoisted is not None:
        return sum(_statement_flops(s.output_indices, s.rhs, bounds)
                   for s in hoisted.statements)
    return _statement_flops(spec.output_indices, spec.rhs, bounds)


@dataclass(frozen=True)
class SplitBounds:
    """The extents one device sees when indices are split over a mesh: a split index's
    extent divided by the size of its device group (the planner splits only what divides)."""
    bounds: Bounds
    divisors: Tuple[Tuple[str, int], ...]

    def extent(self, name: str) -> int:
        return self.bounds.extent(name) // dict(self.divisors).get(name, 1)


def device_flops(spec: Spec, bounds: Bounds, divisors: Mapping[str, int], hoisted=None) -> int:
    """count_flops for what one device computes when each index in ``divisors`` is split
    into that many blocks."""
    return count_flops(spec, SplitBounds(bounds, tuple(sorted(divisors.items()))), hoisted)


def _statement_flops(output_indices, rhs: Expr, bounds: Bounds) -> int:
    def visit(expr: Expr, scope: int) -> int:
        if isinstance(expr, Reduce):
            inner = scope
            for name in expr.indices:
                inner *= bounds.extent(name)
            return inner * _ops(expr) + visit(expr.body, inner)
        if isinstance(expr, Access):
            return 0
        return scope * _ops(expr) + sum(visit(c, scope) for c in expr.children())

    outer = 1
    for name in output_indices:
        outer *= bounds.extent(name)
    return visit(rhs, outer)


# -- iteration points ----------------------------------------------------------------------------
def group_points(bounds: Sequence[Bounds]) -> int:
    """The work of statements run as one fused loop: the sum of their iteration points
    (Bounds.points), the measure the thread thresholds compare with.  (Asked per call of
    a fused group: lists, not generators, keep it as fast as the sum it replaced.)"""
    return sum([b.points for b in bounds])


# -- attention run as one pass with online softmax ------------------------------------------------
def attention_pairs(rows: int, keys: int, band: Optional[Tuple[int, int]]) -> int:
    """(row, key) pairs one batch element computes: all of them, or those with
    ``lower <= j - i <= upper`` for ``band = (lower, upper)`` (key blocks outside it are
    never computed)."""
    if band is None:
        return rows * keys
    lower, upper = band
    return sum(max(0, min(keys - 1, i + upper) - max(0, i + lower) + 1) for i in range(rows))


def attention_flops(groups: int, pairs: int, rows: int, dot: int, features: int, *,
                    scaled: bool, terms: int, normalised: bool) -> int:
    """Operations of the fused kernel: per (row, key) pair the dot product (2 per ``dot``
    element), the scale, each additive term (2), the weight and the denominator (3) and
    the weighted sum (2 per feature); per row the division by the denominator where the
    result is normalised; times the batch ``groups``.  ``pairs``: per batch element."""
    per_pair = 2 * dot + 2 * features + (1 if scaled else 0) + 2 * terms + 3
    final = rows * features if normalised else 0
    return groups * (pairs * per_pair + final)


def attention_bytes(groups: int, rows: int, keys: int, dot: int, features: int,
                    itemsize: int) -> Tuple[int, int]:
    """(bytes read, bytes written) of the fused kernel: each query, key and value once,
    the result once (nothing N x N)."""
    read = groups * (rows * dot + keys * (dot + features)) * itemsize
    return read, groups * rows * features * itemsize


# -- typed programs (ef.jit) ----------------------------------------------------------------------
# int64 subscript arithmetic is address arithmetic, not counted as work
_ADDRESS_OPS = (ir.ElementOp.ADD, ir.ElementOp.MUL, ir.ElementOp.IDIV, ir.ElementOp.IMOD,
                ir.ElementOp.MIN, ir.ElementOp.MAX)


def typed_operations(node: ir.Expr) -> int:
    """Operations of one evaluation of a typed expression (each operation, select and
    cast one; int64 address arithmetic and reads none)."""
    if isinstance(node, (ir.Apply, ir.Select, ir.Cast)):
        own = 0 if isinstance(node, ir.Apply) and node.dtype is ir.INDEX and \
            node.op in _ADDRESS_OPS else 1
        return own + sum(typed_operations(c) for c in node.children())
    if isinstance(node, ir.Read):
        return sum(typed_operations(s) for s in node.subscripts)
    return 0


def step_flops(step: ir.Assign) -> int:
    """Operations of one typed statement: per point of its nest its value's, or per
    point of its nest and reduction the body's and one to combine."""
    points = math.prod(e for _, e in step.indices)
    if step.reduction is None:
        return points * typed_operations(step.value)
    return points * math.prod(e for _, e in step.reduction.indices) * \
        (typed_operations(step.reduction.body) + 1)


def typed_work(steps, repeat: int = 1) -> int:
    """Operations of ``steps`` run ``repeat`` times: scan bodies times their lengths, a
    ``while_loop``'s condition and body once (its trip count is not known), every branch."""
    total = 0
    for step in steps:
        if isinstance(step, ir.Assign):
            total += step_flops(step) * repeat
        elif isinstance(step, ir.Loop):
            if step.kind is ir.LoopKind.SCAN:
                inner = repeat * step.length
            else:
                total += typed_work(step.condition_steps, repeat)
                inner = repeat
            total += typed_work(step.body, inner)
        elif isinstance(step, ir.Switch):
            for body in step.branches:
                total += typed_work(body, repeat)
    return total
