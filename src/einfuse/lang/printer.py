"""Prints syntax trees back as statement text, with only the parentheses needed."""

from __future__ import annotations

import math

from .ast import Access, Binary, Call, Expr, IndexValue, Number, Param, Reduce, Statement, Unary

# Binding strength, higher binds tighter (Python's order).
_PRECEDENCE = {"<": 1, "<=": 1, ">": 1, ">=": 1, "==": 1, "!=": 1, "|": 2, "&": 3,
               "+": 4, "-": 4, "*": 5, "/": 5, "//": 5, "%": 5, "neg": 6, "**": 7}
_ATOM = 8


def format_number(value) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if math.isnan(value):
        return "nan"
    if value == 0 and math.copysign(1.0, value) < 0:
        return "-0.0"   # (int(-0.0) is 0: printed so, a reparsed statement lost the sign)
    if value == int(value) and abs(value) < 1e16:
        return f"{int(value)}.0"
    return repr(float(value))


def _precedence(expr: Expr) -> int:
    if isinstance(expr, Binary):
        return _PRECEDENCE[expr.op]
    if isinstance(expr, Unary):
        return _PRECEDENCE["neg"]
    if isinstance(expr, Number) and format_number(expr.value).startswith("-"):
        return _PRECEDENCE["neg"]
    return _ATOM


def format_expr(expr: Expr) -> str:
    if isinstance(expr, Number):
        return format_number(expr.value)
    if isinstance(expr, (Param, IndexValue)):
        return expr.name
    if isinstance(expr, Access):
        return str(expr)
    if isinstance(expr, Call):
        return f"{expr.func}({', '.join(format_expr(a) for a in expr.args)})"
    if isinstance(expr, Reduce):
        return f"{expr.op}[{', '.join(expr.indices)}]({format_expr(expr.body)})"
    if isinstance(expr, Unary):
        inner = format_expr(expr.operand)
        if _precedence(expr.operand) < _PRECEDENCE["**"]:
            inner = f"({inner})"
        return "-" + inner
    if isinstance(expr, Binary):
        mine = _PRECEDENCE[expr.op]
        left, right = format_expr(expr.left), format_expr(expr.right)
        left_prec, right_prec = _precedence(expr.left), _precedence(expr.right)
        if expr.op == "**":
            # right-associative; the base binds tighter than unary minus
            if left_prec <= mine:
                left = f"({left})"
            if right_prec < _PRECEDENCE["neg"]:
                right = f"({right})"
        else:
            if left_prec < mine or (mine == 1 and left_prec == 1):
                left = f"({left})"
            if right_prec <= mine:
                right = f"({right})"
        spaced = expr.op not in ("**",)
        return f"{left} {expr.op} {right}" if spaced else f"{left}{expr.op}{right}"
    raise TypeError(f"cannot print {type(expr).__name__}")


def format_statement(statement: Statement, rhs: Expr = None) -> str:
    rhs = statement.rhs if rhs is None else rhs
    lhs = statement.output
    if statement.output_indices:
        lhs += f"[{', '.join(statement.output_indices)}]"
    return f"{lhs} {statement.assign} {format_expr(rhs)}"
