"""The row schedule's part of the lowering (plan/lower.plan_rows): a statement as the
next member of a Triton row group -- its reductions over the block's columns, kept in
registers one per row, its reads along the row and column counters, and its value.
A mixin of plan/lower's lowering, whose expression lowering calls ``row_reduce`` and
``row_load`` where it lowers a row statement."""

from __future__ import annotations

from .. import ir
from ..ir import Affine, Policy
from ..lang import ast
from .row_gathers import gathered_load, row_counters
from .row_group import (ROW_REDUCTIONS, RowInput, RowMember, RowReduction, RowRefused,
                        RowRole, RowScope)
from .row_totals import lower_total

# A row schedule's counters: the row (one per row of a program's block) and the column.
ROW, COL = "row", "col"


class RowStatements:
    def run_row(self) -> RowScope:
        """The statement as the row scope's next member: its reductions over the
        block's columns (kept in registers, one per row) and its value, over the
        counters its role binds (RowStatement.indices)."""
        statement = self.row
        rhs = self.spec.rhs.body if statement.role == RowRole.COLUMN else self.spec.rhs
        env = {index: Affine.var(counter) for index, counter in statement.indices.items()}
        value, total = lower_total(self, env) if statement.role == RowRole.TOTAL else \
            (self.expr(rhs, env, []), None)       # (a total: plan/row_totals.py)
        member = RowMember(statement.key, statement.role, tuple(self.row_reductions), value,
                           None, statement.shape, total)
        return RowScope(tuple(self.row_inputs), tuple(self.row_params),
                        self.scope.members + (member,), self.n_acc)

    def row_reduce(self, e: ast.Reduce, env) -> ir.Expr:
        """A row's sum, max or min over one index, not nested: the reduced index is the
        column counter in its body (a grid statement's own column index is not visible
        there)."""
        op = ROW_REDUCTIONS.get(e.op)
        if op is None or len(e.indices) != 1 or any(True for _ in ast.reductions(e.body)):
            raise RowRefused
        acc = self.fresh_acc()
        column = Affine.var(COL)
        inner = {name: at for name, at in env.items() if at != column}
        body = self.expr(e.body, {**inner, e.indices[0]: column}, [])
        self.row_reductions.append(RowReduction(acc, op, body))
        return ir.AccValue(acc, op)

    def row_load(self, e: ast.Access, env) -> ir.Expr:
        """An input read along the row and column counters (plain indices, each at most
        once), an earlier member read as written (in registers), or a gather
        (plan/row_gathers.py)."""
        if any(sub.gathers for sub in e.indices):
            return gathered_load(self, e, env)
        counters = row_counters(e, env)
        key = dict(self.row.names).get(e.tensor, e.tensor)
        if self.scope.column_sum(key):
            raise RowRefused    # (known only once every program has added its part)
        producer = self.scope.producer(key)
        if producer is not None:
            made_grid = self.scope.members[producer].grid
            if counters != ([ROW, COL] if made_grid else [ROW]):
                raise RowRefused
            return ir.Local(f"m{producer}")
        # (an index array the statement also gathers with -- a cross-entropy's gradient
        # reads its labels in X[n, y[n]] and as the values of where(s1 == y[n], ..) --
        # is two inputs: its labels as integers, RowInput.index, and its values in the
        # working dtype, as the statement alone computes with them)
        wanted = RowInput(key, tuple(c == ROW for c in counters))
        if wanted not in self.row_inputs:     # (read with two layouts: one buffer each)
            self.row_inputs.append(wanted)
        number = self.row_inputs.index(wanted)
        subscripts = tuple(ir.Subscript(Affine.var(c), (), Policy.NONE, f"n{number}_{axis}",
                                        f"s{number}_{axis}")
                           for axis, c in enumerate(counters))
        return ir.Load(number, subscripts)


__all__ = ["COL", "ROW", "RowStatements"]
