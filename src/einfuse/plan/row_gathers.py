"""A gathered read in a Triton row schedule (plan/lower.py's row lowering): ``X[i,
t[i]]``, a label's logit in a cross-entropy, one value per row read at a position that
an index array gives.

The index array is an input of the group read at the row (and column) counters, loaded
as integers (RowInput.index); the gathered subscript is ``affine + sum(c * label)``
with the bounds policy CHECK: the kernel never reads outside the array, and a label
outside its axis raises the group's error flag (backends/triton/rows.py), after which
the statements run one by one and raise their own error.  Only bounds='check' and
'promise' are taken (schedule/row_groups.py refuses clip/wrap/fill: Split.GATHER_POLICY);
an earlier member gathered, or used as an index array, is refused (its values are in
registers, not in memory at positions a label could pick)."""

from __future__ import annotations

from typing import List

from .. import ir
from ..ir import Affine, Policy
from ..lang import ast
from .row_group import RowInput, RowRefused

ROW = "row"


def gathered_load(lowering, e: ast.Access, env, as_index: bool = False) -> ir.Load:
    """``e`` (an input's read, some subscript of which gathers) as a load of the group's
    inputs; ``lowering``: the statement's row lowering (plan/lower._Lowering)."""
    key = dict(lowering.row.names).get(e.tensor, e.tensor)
    scope = lowering.scope
    if scope.producer(key) is not None or scope.column_sum(key):
        raise RowRefused    # (a member's values live in registers)
    parts: List = []
    along = []
    for sub in e.indices:
        if sub.quasi or any(name not in env for name, _ in sub.terms):
            raise RowRefused
        affine = Affine(const=sub.constant)
        for name, coeff in sub.terms:
            affine = affine + env[name].scale(coeff)
        gathers = tuple((index_load(lowering, access, env), coeff)
                        for access, coeff in sub.gathers)
        parts.append((affine, gathers))
        plain = sub.plain_index
        along.append(plain is not None and env[plain].names == (ROW,))
    wanted = RowInput(key, tuple(along), index=as_index)
    if wanted not in lowering.row_inputs:
        lowering.row_inputs.append(wanted)
    number = lowering.row_inputs.index(wanted)
    subscripts = tuple(
        ir.Subscript(affine, gathers, Policy.CHECK if gathers else Policy.NONE,
                     f"n{number}_{axis}", f"s{number}_{axis}")
        for axis, (affine, gathers) in enumerate(parts))
    return ir.Load(number, subscripts, is_index=as_index)


def index_load(lowering, e: ast.Access, env) -> ir.Load:
    """An index array's read inside a gathered subscript: ``t[i]`` at plain indices of
    the group (a gather inside a gather too), loaded as int64."""
    key = dict(lowering.row.names).get(e.tensor, e.tensor)
    scope = lowering.scope
    if scope.producer(key) is not None or scope.column_sum(key):
        raise RowRefused    # an intermediate as labels: not in memory
    if any(sub.gathers for sub in e.indices):
        return gathered_load(lowering, e, env, as_index=True)
    counters = row_counters(e, env)
    wanted = RowInput(key, tuple(c == ROW for c in counters), index=True)
    if wanted not in lowering.row_inputs:
        lowering.row_inputs.append(wanted)
    number = lowering.row_inputs.index(wanted)
    subscripts = tuple(ir.Subscript(Affine.var(c), (), Policy.NONE, f"n{number}_{axis}",
                                    f"s{number}_{axis}")
                       for axis, c in enumerate(counters))
    return ir.Load(number, subscripts, is_index=True)


def row_counters(e, env):
    """The row schedule's counters ``e`` is read along: each subscript a plain index the
    statement binds to one (plan/row_group.RowStatement.indices), none twice; else the
    read is refused."""
    counters = []
    for sub in e.indices:
        index = sub.plain_index
        if index is None or index not in env:
            raise RowRefused
        counters.append(env[index].names[0])
    if len(set(counters)) != len(counters):
        raise RowRefused
    return counters
