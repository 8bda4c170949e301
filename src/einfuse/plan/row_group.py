"""A Triton row group: the row schedule (RowSchedule: which statements share the row
axis, in which role, with which launch -- decided by schedule/row_groups.py) and its
lowering (RowGroup: the inputs, members -- each statement's reductions and value as IR
expressions over the row counter ``row`` and the column counter ``col`` -- and repeated
subexpressions), made by the statements' lowering, plan/lower.py (``plan_rows``);
backends/triton/rows.py prints and launches the group."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Set, Tuple

from .. import ir
from ..ir import ReduceOp
from ..lang import ast

# the reductions a row keeps in registers (over the block's columns)
ROW_REDUCTIONS = {"sum": ReduceOp.SUM, "max": ReduceOp.MAX, "min": ReduceOp.MIN,
                  "logsumexp": ReduceOp.LOGSUMEXP}


@dataclass(frozen=True)
class RowInput:
    """An array the group reads: its environment key and, per axis, whether that axis
    runs along the rows (True) or the columns (False, or a gathered axis); ``index``:
    an index array, read as integers in a gathered subscript (plan/row_gathers.py)."""
    key: str
    along_rows: Tuple[bool, ...]
    index: bool = False


@dataclass(frozen=True)
class RowReduction:
    """``acc`` := ``op`` over the columns of ``body`` (a value of the whole block)."""
    acc: str
    op: ReduceOp
    body: ir.Expr


@dataclass(frozen=True)
class RowLaunch:
    """The grid: ``rows`` rows per program, ``block`` columns (a power of two at least
    the row's length), ``warps`` warps a program; ``parts``: in a group with column
    sums, how many programs' partial sums the last program adds at a time."""
    rows: int
    block: int
    warps: int
    parts: int = 1


class RowRole(enum.Enum):
    """How a statement of a row group uses the row axis: ``ROW``, output ``[r]`` (a
    row's value, one per row in registers); ``GRID``, output ``[r, c]`` (a block of
    whole rows); ``COLUMN``, a column sum ``o[c] := sum[r](body)`` (output ``[c]``:
    each program sums its rows' blocks, the programs' partial sums are added across the
    grid, docs/backends.md); ``TOTAL``, a number from the sum over the rows of a row's
    value (``L[] := sum[i](l[i]) / N``, a mean cross-entropy: output ``[]``, summed as
    a column sum of one column, then the rest of its right side applied)."""
    ROW = "row"
    GRID = "grid"
    COLUMN = "column"
    TOTAL = "total"


@dataclass(frozen=True)
class RowMember:
    """One statement of the group, lowered: its reductions, computed first, then its
    value (``ir.Local(f"m{k}")`` in later members); ``role``: its output is [r]
    (ROW), [r, c] (GRID) or a column sum [c] (COLUMN: ``value`` is a whole block,
    summed over the rows of every program, backends/triton/rows.py; no later member
    reads it); ``stored``: the number of the output buffer it is written to, or None
    when it lives only in registers; ``total`` (a TOTAL member): its value from the sum
    over the rows of ``value``, which it reads as ``ir.Local(TOTAL_LOCAL)``."""
    key: str
    role: RowRole
    reductions: Tuple[RowReduction, ...]
    value: ir.Expr
    stored: Optional[int]
    shape: Tuple[int, ...]
    total: Optional[ir.Expr] = None

    @property
    def grid(self) -> bool:
        return self.role == RowRole.GRID

    @property
    def column(self) -> bool:
        """Summed over the rows across the grid (a column sum, or a total)."""
        return self.role in (RowRole.COLUMN, RowRole.TOTAL)


@dataclass(frozen=True)
class RowStatement:
    """One statement of a row schedule: its analysed statement, its names that have
    other keys in the environment (``names``, a hoisted form's temporaries), its role,
    its output's key and shape, and whether that output is written to memory
    (``stored``; else it lives in registers only)."""
    spec: object
    names: Tuple[Tuple[str, str], ...]
    role: RowRole
    key: str
    shape: Tuple[int, ...]
    stored: bool = True

    @property
    def indices(self) -> Dict[str, str]:
        """The statement's indices bound to the group's counters: the row index to
        ``row`` and the output's column index to ``col`` (a reduction's own index is
        the column counter in its body only)."""
        spec = self.spec
        if self.role == RowRole.COLUMN:
            return {spec.rhs.indices[0]: "row", spec.output_indices[0]: "col"}
        if self.role == RowRole.TOTAL:
            return {total_sum(spec.rhs).indices[0]: "row"}
        if self.role == RowRole.GRID:
            return {spec.output_indices[0]: "row", spec.output_indices[1]: "col"}
        return {spec.output_indices[0]: "row"}


@dataclass(frozen=True)
class RowSchedule:
    """The row group's schedule: ``statements`` lowered as one kernel over ``extents``
    (M rows, N columns) in the ``working`` dtype ("float32" or "float64"), launched
    as ``launch``; ``joined``: how many of the program's statements from the group's
    start it runs (a statement with a hoisted form joins as its statements)."""
    joined: int
    statements: Tuple[RowStatement, ...]
    working: str
    extents: Tuple[int, int]
    launch: RowLaunch


@dataclass(frozen=True)
class RowScope:
    """The lowering of a row schedule so far (plan/lower.lower_row_statement): the
    inputs and parameters its statements read, its members (unnumbered: ``stored`` is
    None until the group is made) and the accumulators named."""
    inputs: Tuple[RowInput, ...] = ()
    params: Tuple[str, ...] = ()
    members: Tuple[RowMember, ...] = ()
    accs: int = 0

    def producer(self, key: str) -> Optional[int]:
        """The member whose row value ``key`` is (the latest), or None."""
        found = None
        for number, member in enumerate(self.members):
            if member.key == key and not member.column:
                found = number
        return found

    def column_sum(self, key: str) -> bool:
        return any(m.key == key and m.column for m in self.members)


@dataclass(frozen=True)
class RowGroup:
    """A row schedule lowered: what backends/triton/rows.py prints and launches (and
    the compiled kernel's key)."""
    schedule: RowSchedule
    inputs: Tuple[RowInput, ...]      # load buffer b is inputs[b]
    params: Tuple[str, ...]           # ir.Param slot s is the value of env[params[s]]
    members: Tuple[RowMember, ...]
    # subexpressions along the columns that occur more than once (an input's load,
    # softmax's exp(x - m) in the row sum and the quotient): each computed once
    shared: Tuple[ir.Expr, ...] = ()

    @property
    def statements(self) -> int:
        """How many statements from the start it runs."""
        return self.schedule.joined

    @property
    def working(self) -> str:
        return self.schedule.working

    @property
    def extents(self) -> Tuple[int, int]:
        return self.schedule.extents

    @property
    def launch(self) -> RowLaunch:
        return self.schedule.launch

    @property
    def outputs(self) -> Tuple[RowMember, ...]:
        return tuple(m for m in self.members if m.stored is not None)

    @property
    def columns(self) -> Tuple[RowMember, ...]:
        """The column-sum members, in order (their partial sums' slots)."""
        return tuple(m for m in self.members if m.column)


# the name a TOTAL member's ``total`` reads its sum over the rows by
TOTAL_LOCAL = "tsum"


def total_sum(rhs):
    """The one sum of a TOTAL statement's right side (outside it: numbers, parameters
    and functions of them), or None."""
    found = []

    def walk(e) -> bool:
        if isinstance(e, ast.Reduce):
            found.append(e)
            # (a sum over more indices than the rows' -- sum[i, j], which
            # rewrite/rules' nested-sums-merged makes of sum[i](sum[j]) -- sums each
            # row over the rest first: row_body)
            return e.op == "sum" and len(e.indices) >= 1
        if isinstance(e, (ast.Number, ast.Param)):
            return True
        if isinstance(e, (ast.Unary, ast.Binary, ast.Call)):
            return all(walk(child) for child in e.children())
        return False
    return found[0] if walk(rhs) and len(found) == 1 else None


def row_body(summed):
    """What a TOTAL's sum adds per row (its first index is the rows'): its body, or the
    sum of it over the sum's other indices, which the row's columns hold."""
    if len(summed.indices) == 1:
        return summed.body
    return ast.Reduce("sum", summed.indices[1:], summed.body, span=summed.span)


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
    """The statement cannot be lowered as a member of the row schedule (raised by
    plan/lower.lower_row_statement; the schedule then ends the group before it)."""
