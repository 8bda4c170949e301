"""A TOTAL member of a Triton row schedule (plan/row_group.RowRole.TOTAL): a number
from the sum over the group's rows of a row's value, ``L[] := sum[i](l[i]) / N`` (a mean
cross-entropy).  The sum's body is lowered as a row member's value (its reductions over
the columns in registers); the rest of the right side -- numbers, parameters and
functions of them -- is lowered around ``ir.Local(TOTAL_LOCAL)``, which the last
program of the grid reads once every program's partial sum is added
(backends/triton/rows.py)."""

from __future__ import annotations

from .. import ir
from ..ir import BinaryOp, Function, UnaryOp
from ..lang import ast
from .row_group import TOTAL_LOCAL, RowRefused, row_body, total_sum


def lower_total(lowering, env):
    """(the row's value summed, the statement's value from that sum) of the TOTAL
    statement ``lowering`` lowers; ``env``: its row index bound to the row counter."""
    summed = total_sum(lowering.spec.rhs)
    if summed is None:
        raise RowRefused
    value = lowering.expr(row_body(summed), env, [])

    def outer(e) -> ir.Expr:
        if e is summed:
            return ir.Local(TOTAL_LOCAL)
        if isinstance(e, ast.Unary):
            inner = outer(e.operand)
            return inner if e.op == "+" else ir.Unary(UnaryOp.NEG, inner)
        if isinstance(e, ast.Binary):
            return ir.Binary(BinaryOp(e.op), outer(e.left), outer(e.right))
        if isinstance(e, ast.Call):
            return ir.Call(Function(e.func), tuple(outer(a) for a in e.args))
        return lowering.expr(e, env, [])      # a number or a parameter
    return value, outer(lowering.spec.rhs)
