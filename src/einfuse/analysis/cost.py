"""What a statement or a typed program costs, counted once for every stage that reports
it (explain, the sharding planner, attention's notes, the threading of ``ef.jit``'s
loops): operations executed, and numbers as explain prints them."""

from __future__ import annotations

import math

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
