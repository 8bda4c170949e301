"""A Triton row group is a row schedule lowered by the statements' lowering
(plan/lower.plan_rows): what the lowering holds in a row's registers and what it
refuses, checked on the values it returns (no Triton needed: the lowering is the same
Python for every backend).  The kernels' values are tests/test_triton_rows.py's."""

import pytest

from einfuse import ir
from einfuse.analysis.spec import spec_of
from einfuse.plan.lower import lower_row_statement, plan_rows
from einfuse.plan.row_group import (RowInput, RowLaunch, RowRefused, RowRole, RowSchedule,
                                    RowScope, RowStatement)

M, N = 4, 8
SHAPES = {RowRole.ROW: (M,), RowRole.GRID: (M, N), RowRole.COLUMN: (N,)}


def _statement(text, role, stored=True):
    spec = spec_of(text)
    return RowStatement(spec, (), role, spec.output, SHAPES[role], stored)


def _schedule(*statements):
    return RowSchedule(len(statements), statements, "float32", (M, N),
                       RowLaunch(4, N, 4))


SOFTMAX = [("m[i] := max[j](X[i,j])", RowRole.ROW, False),
           ("e[i,j] := exp(X[i,j] - m[i])", RowRole.GRID, False),
           ("s[i] := sum[j](e[i,j])", RowRole.ROW, False),
           ("P[i,j] := e[i,j] / s[i]", RowRole.GRID, True)]


def test_softmax_rows_live_in_registers():
    group = plan_rows(_schedule(*(_statement(*s) for s in SOFTMAX)))
    # X is read once (one input, rows along its first axis); m, e, s are registers
    assert group.inputs == (RowInput("X", (True, False)),)
    assert [m.stored for m in group.members] == [None, None, None, 0]
    assert [len(m.reductions) for m in group.members] == [1, 0, 1, 0]
    assert [m.reductions[0].op for m in group.members if m.reductions] == \
        [ir.ReduceOp.MAX, ir.ReduceOp.SUM]
    # later members read earlier ones from registers, not memory
    locals_read = {node.name for m in group.members[1:] for root in
                   [m.value] + [r.body for r in m.reductions]
                   for node in ir.walk(root) if isinstance(node, ir.Local)}
    assert locals_read == {"m0", "m1", "m2"}
    assert group.statements == 4 and group.outputs == (group.members[3],)


def test_layernorm_gradient_column_sum_joins():
    rows = _statement("xh[i,j] := X[i,j] * r[i]", RowRole.GRID, False)
    column = _statement("dg[j] := sum[i](dy[i,j] * xh[i,j])", RowRole.COLUMN)
    group = plan_rows(_schedule(rows, column))
    assert group.columns == (group.members[1],)
    assert set(group.inputs) == {RowInput("X", (True, False)), RowInput("r", (True,)),
                                 RowInput("dy", (True, False))}


@pytest.mark.parametrize("text, role", [
    ("l[i] := X[i, 2 * i]", RowRole.ROW),                      # a strided subscript
    ("y[i] := sum[j](X[i,j] * sum[k](X[i,k]))", RowRole.ROW),   # a nested reduction
    ("y[i] := prod[j](X[i,j])", RowRole.ROW),                   # no row prod
    ("y[i,j] := X[i,j+1]", RowRole.GRID),                       # a shifted read
    ("y[i,j] := X[i,i]", RowRole.GRID),                          # an index twice
])
def test_the_lowering_refuses_what_a_row_cannot_hold(text, role):
    with pytest.raises(RowRefused):
        lower_row_statement(RowScope(), _statement(text, role), "float32")


def test_a_column_sum_cannot_be_read_in_the_group():
    column = _statement("dg[j] := sum[i](X[i,j])", RowRole.COLUMN)
    scope = lower_row_statement(RowScope(), column, "float32")
    with pytest.raises(RowRefused):
        lower_row_statement(scope, _statement("y[i,j] := X[i,j] * dg[j]", RowRole.GRID),
                            "float32")


def test_an_earlier_member_is_read_as_written():
    scope = lower_row_statement(RowScope(), _statement("m[i] := max[j](X[i,j])",
                                                       RowRole.ROW), "float32")
    with pytest.raises(RowRefused):     # m is one value per row, not per column
        lower_row_statement(scope, _statement("y[i,j] := X[i,j] - m[j]", RowRole.GRID),
                            "float32")


def test_negative_zero_stays_apart_from_zero():
    # equal IR values share one register and one compiled kernel: -0.0 must not
    # compare equal to 0.0 there
    plus = plan_rows(_schedule(_statement("y[i,j] := X[i,j] + 0.0", RowRole.GRID),
                               _statement("z[i] := sum[j](y[i,j])", RowRole.ROW)))
    minus = plan_rows(_schedule(_statement("y[i,j] := X[i,j] + -0.0", RowRole.GRID),
                                _statement("z[i] := sum[j](y[i,j])", RowRole.ROW)))
    assert plus.members != minus.members
