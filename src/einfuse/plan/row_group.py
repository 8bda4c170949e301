"""A Triton row group as a value of the lowering: its inputs, members (each one
statement's reductions and value as IR expressions over the row counter ``row`` and the
column counter ``col``), launch shape and repeated subexpressions, and the lowering of
one statement's right-hand side into those expressions (RowLowering).  The schedule
(schedule/row_groups.py) decides which statements join a group; backends/triton/rows.py
prints and launches the group."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

from .. import ir
from ..ir import BinaryOp, Function, ReduceOp, UnaryOp
from ..lang import ast

ROW_REDUCTIONS = {"sum": ReduceOp.SUM, "max": ReduceOp.MAX, "min": ReduceOp.MIN}


@dataclass(frozen=True)
class RowInput:
    """An array the group reads: its environment key and, per axis, whether that axis
    runs along the rows (True) or the columns (False)."""
    key: str
    along_rows: Tuple[bool, ...]


@dataclass(frozen=True)
class RowReduction:
    """``acc`` := ``op`` over the columns of ``body`` (a value of the whole block)."""
    acc: str
    op: ReduceOp
    body: ir.Expr


@dataclass(frozen=True)
class RowMember:
    """One statement of the group: its reductions, computed first, then its value
    (``ir.Local(f"m{k}")`` in later members); ``grid``: its output is [r, c], else
    [r]; ``stored``: the number of the output buffer it is written to, or None when it
    lives only in registers.  ``column``: a column sum (``dg[c] := sum[r](value)``,
    output ``[c]``): ``value`` is a whole block, summed over the rows of every program
    (backends/triton/rows.py); no later member reads it."""
    key: str
    grid: bool
    reductions: Tuple[RowReduction, ...]
    value: ir.Expr
    stored: Optional[int]
    shape: Tuple[int, ...]
    column: bool = False


@dataclass(frozen=True)
class RowLaunch:
    """The grid: ``rows`` rows per program, ``block`` columns (a power of two at least
    the row's length), ``warps`` warps a program; ``parts``: in a group with column
    sums, how many programs' partial sums the last program adds at a time."""
    rows: int
    block: int
    warps: int
    parts: int = 1


@dataclass(frozen=True)
class RowGroup:
    statements: int                   # how many statements from the start it runs
    inputs: Tuple[RowInput, ...]      # load buffer b is inputs[b]
    params: Tuple[str, ...]           # ir.Param slot s is the value of env[params[s]]
    members: Tuple[RowMember, ...]
    working: str                      # "float32" or "float64"
    extents: Tuple[int, int]          # (M rows, N columns)
    launch: RowLaunch
    # subexpressions along the columns that occur more than once (an input's load,
    # softmax's exp(x - m) in the row sum and the quotient): each computed once
    shared: Tuple[ir.Expr, ...] = ()

    @property
    def outputs(self) -> Tuple[RowMember, ...]:
        return tuple(m for m in self.members if m.stored is not None)

    @property
    def columns(self) -> Tuple[RowMember, ...]:
        """The column-sum members, in order (their partial sums' slots)."""
        return tuple(m for m in self.members if m.column)


_LEAVES = (ir.Const, ir.Param, ir.Local, ir.AccValue, ir.IndexValue)


def repeated(members: Sequence[RowMember]) -> Tuple[ir.Expr, ...]:
    """The subexpressions that vary along the columns and occur twice or more in the
    group's reductions and values, in order of first occurrence.  (One that does not
    vary along the columns is cheap and may be needed as a row's value and as a
    block's: it is left where it is written.)"""
    grid = grid_locals(members)
    counts: Dict[ir.Expr, int] = {}
    for member in members:
        for root in [r.body for r in member.reductions] + [member.value]:
            for node in ir.walk(root):
                if not isinstance(node, _LEAVES):
                    counts[node] = counts.get(node, 0) + 1

    return tuple(node for node, count in counts.items()
                 if count > 1 and along_columns(node, grid))


def grid_locals(members: Sequence[RowMember]) -> Set[str]:
    """The names (``m{k}``) of the members whose values are whole blocks."""
    return {f"m{k}" for k, m in enumerate(members) if m.grid}


def along_columns(node: ir.Expr, grid: Set[str]) -> bool:
    """Whether ``node``'s value varies along the columns (else it is one per row)."""
    for part in ir.walk(node):
        if isinstance(part, ir.Load) and any("col" in sub.affine.names
                                             for sub in part.subscripts) or \
                isinstance(part, ir.IndexValue) and "col" in part.value.names or \
                isinstance(part, ir.Local) and part.name in grid:
            return True
    return False


class RowRefused(Exception):
    """The statement cannot join the group (raised inside the lowering only)."""


class RowLowering:
    """One statement's right-hand side as IR value expressions over the group's row
    (``row``) and column (``col``) counters; ``bound`` maps the statement's indices
    to them where they are visible (a reduction's own index is the column counter in
    its body).  It works on copies of the builder's inputs and parameters, which the
    builder takes once the statement joins."""

    def __init__(self, builder, spec, names: Dict[str, str]):
        self.builder, self.spec, self.names = builder, spec, names
        self.inputs = list(builder.inputs)
        self.params = list(builder.params)
        self.accs = builder.accs
        self.reductions: List[RowReduction] = []

    @staticmethod
    def counter(index: str, bound: Dict[str, str]) -> str:
        if index not in bound:
            raise RowRefused
        return bound[index]

    def expr(self, e: ast.Expr, bound: Dict[str, str]) -> ir.Expr:
        if isinstance(e, ast.Number):
            if e.value == 0 and math.copysign(1.0, e.value) < 0:
                # -0.0 as -(0.0): Const(-0.0) == Const(0.0), and the group's shared
                # subexpressions and kernel cache (keyed by equality) would merge them
                return ir.Unary(UnaryOp.NEG, ir.Const(0.0))
            return ir.Const(e.value)
        if isinstance(e, ast.Param):
            if e.name not in self.params:
                self.params.append(e.name)
            return ir.Param(self.params.index(e.name))
        if isinstance(e, ast.IndexValue):
            return ir.IndexValue(ir.Affine.var(self.counter(e.name, bound)))
        if isinstance(e, ast.Access):
            return self.access(e, bound)
        if isinstance(e, ast.Unary):
            operand = self.expr(e.operand, bound)
            return ir.Unary(UnaryOp.NEG, operand) if e.op == "-" else operand
        if isinstance(e, ast.Binary):
            return ir.Binary(BinaryOp(e.op), self.expr(e.left, bound),
                             self.expr(e.right, bound))
        if isinstance(e, ast.Call):
            return ir.Call(Function(e.func), tuple(self.expr(a, bound) for a in e.args))
        if isinstance(e, ast.Reduce):
            op = ROW_REDUCTIONS.get(e.op)
            if op is None or len(e.indices) != 1 or \
                    any(True for _ in ast.reductions(e.body)):
                raise RowRefused
            acc = f"a{self.accs}"
            self.accs += 1
            # in its body the column counter is the reduced index (a grid statement's
            # own column index is not visible there)
            inner = {n: c for n, c in bound.items() if c != "col"}
            body = self.expr(e.body, {**inner, e.indices[0]: "col"})
            self.reductions.append(RowReduction(acc, op, body))
            return ir.AccValue(acc, op)
        raise RowRefused

    def access(self, e: ast.Access, bound: Dict[str, str]) -> ir.Expr:
        counters = []
        for sub in e.indices:
            index = sub.plain_index
            if index is None:
                raise RowRefused
            counters.append(self.counter(index, bound))
        if len(set(counters)) != len(counters):
            raise RowRefused
        key = self.names.get(e.tensor, e.tensor)
        if key in self.builder.column_sums:
            raise RowRefused    # (known only once every program has added its part)
        producer = self.builder.produced.get(key)
        if producer is not None:
            made_grid = self.builder.members[producer][1]
            if counters != (["row", "col"] if made_grid else ["row"]):
                raise RowRefused
            return ir.Local(f"m{producer}")
        if any(info.name == e.tensor and info.as_index for info in self.spec.tensors):
            raise RowRefused
        wanted = RowInput(key, tuple(c == "row" for c in counters))
        if wanted not in self.inputs:     # (read with two layouts: one buffer each)
            self.inputs.append(wanted)
        number = self.inputs.index(wanted)
        subscripts = tuple(ir.Subscript(ir.Affine.var(c), (), ir.Policy.NONE,
                                        f"n{number}_{axis}", f"s{number}_{axis}")
                           for axis, c in enumerate(counters))
        return ir.Load(number, subscripts)
