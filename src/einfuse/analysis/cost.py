"""What a statement costs, counted once for every stage that reports it (explain, the
sharding planner, attention's notes): operations executed, and numbers as explain prints them."""

from __future__ import annotations

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
