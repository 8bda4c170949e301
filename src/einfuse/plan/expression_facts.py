"""What the lowering needs to know of an expression's operations: whether reciprocal
math could change its C code, whether fast-math could change its NaN/inf results, and
which indices its value depends on."""

from __future__ import annotations

from typing import Set

from ..lang import ast

# Operations whose NaN/inf behaviour fast-math could change (see c_build).
_NAN_SENSITIVE_CALLS = frozenset({"min", "max", "where", "relu", "softplus"})

# Functions whose C rendering divides nothing (libm calls, comparisons and selects).
_DIVISION_FREE_CALLS = frozenset({"exp", "log", "sqrt", "abs", "sin", "cos", "log1p",
                                  "expm1", "erf", "min", "max", "where", "relu"})


def indices_used(expr: ast.Expr) -> Set[str]:
    """Every index an expression's value can depend on (reduced ones included)."""
    names: Set[str] = set()
    for node in expr.walk():
        if isinstance(node, ast.Access):
            for sub in node.indices:
                names.update(sub.index_names)
        elif isinstance(node, ast.IndexValue):
            names.add(node.name)
        elif isinstance(node, ast.Reduce):
            names.update(node.indices)
    return names


def divides(expr: ast.Expr) -> bool:
    """Could reciprocal math change this expression's C code?  Only a division can be
    turned into a product by a reciprocal; an expression without one (a row maximum,
    say) computes the same with or without the flag, so it may share a fused kernel
    compiled with it."""
    for node in expr.walk():
        if isinstance(node, ast.Binary) and node.op in ("/", "//", "%"):
            return True
        if isinstance(node, ast.Call) and node.func not in _DIVISION_FREE_CALLS:
            return True
    return False


def fast_math_safe(expr: ast.Expr) -> bool:
    """True when no operation whose NaN/inf/signed-zero handling fast-math could
    change appears (comparisons, logicals, min/max/where/relu/softplus,
    max/min/logsumexp reductions, pad/fill selects are fine: they compare ints)."""
    for node in expr.walk():
        if isinstance(node, ast.Binary) and node.op in ast.COMPARISON_OPS + ast.LOGICAL_OPS:
            return False
        if isinstance(node, ast.Binary) and node.op in ("//", "%"):
            return False   # NumPy's (a - fmod(a, b)) / b, exactly (c_elementwise.py)
        if isinstance(node, ast.Call) and node.func in _NAN_SENSITIVE_CALLS:
            return False
        if isinstance(node, ast.Reduce) and node.op in ("max", "min", "logsumexp"):
            return False
    return True


def lane_panel(rhs: ast.Expr, lane: str, row: str) -> bool:
    """Whether some load of ``rhs`` walks the ``lane`` index but not the ``row`` index
    (a lane tile's own operand, which stays cached while row blocks pass over it:
    plan/blocking.lanes_outer)."""
    for access in ast.accesses(rhs):
        names = {n for sub in access.indices for n in sub.index_names}
        if lane in names and row not in names:
            return True
    return False
