"""Column sums inside a fused loop over rows (plan/fuse.py): a statement that sums over
the group's row index, keeping the others (layernorm's gradients
``dg[j] := dy[i,j] * xhat[i,j]`` and ``db[j] := dy[i,j]``), adds each row's values
into per-thread accumulators while the row is in cache, instead of a kernel of its own
that walks the whole array again column strip by column strip.

The member is lowered as the elementwise statement ``t[i, j...] := body`` (one parallel
loop over rows, as any member); here every store of its value becomes Neumaier's
compensated addition into two per-thread rows, the running sum ``s`` and the rounding
error ``c``:

    x = value;  t = s[j] + x
    c[j] += |s[j]| >= |x| ? (s[j] - t) + x : (x - t) + s[j]
    s[j] = t

``s`` alone is the plain sum in row order, so inf and NaN propagate as in any sum;
the caller (backends/c/fused.py) adds ``c`` back where ``s`` is finite and adds the
rows' totals in order.  The compensation keeps the error of a long column at a few
roundings, independent of the number of rows.

The accumulator rows belong to slices of the loop over rows, not to threads
(``ir.Buffer.per_slice``): slice ``s`` is the rows ``s*C .. s*C + C - 1`` (``C``, the
runtime int ``ir.SLICE_ROWS``, fixed for a call's shapes), run by one thread from first
to last (OpenMP's ``schedule(static, C)``).  Which rows each partial sum holds, and so
every bit of the result, is then the same on any number of threads: the thread count
of a kernel follows the cores other tasks leave, call by call (backends/c/threads.py),
and a gradient must not change from one call to the next (torch's gradcheck checks).

A float32 column is summed in float64 instead (``s[j] += x``, ``c`` stays zero): its
error stays below one float32 rounding of the sum of magnitudes for columns of fewer
than 2**29 rows, it is rounded to float32 once at the end, and it is half the work per
element.  With the compensated form, layernorm's two column
sums (``dg``, ``db``) made its 8192x256 backward 2x slower."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Tuple

from .. import ir
from ..ir import BinaryOp, Function, Policy


@dataclass(frozen=True)
class ColumnAccumulators:
    """The merged buffer slots of one column member: its (never written) value row,
    the running sums and the rounding errors, both one row per slice of ``length``
    elements (the runtime int holding it)."""
    value: int
    sums: int
    errors: int
    length: str
    compensated: bool = True


# The dtype a column of this working dtype is summed in (a buffer dtype name).
_WIDER = {"float32": "float64"}


def column_sum_dtype(working: str) -> str:
    return _WIDER.get(working, working)


def accumulate_into_columns(body: Tuple[ir.Stmt, ...], slots: ColumnAccumulators,
                            prefix: str) -> Tuple[ir.Stmt, ...]:
    """``body`` (a member's renamed loop body) with every store of its value row
    turned into the compensated addition above.  ``prefix`` makes the scalar names
    unique in the merged kernel."""
    rewriter = _Rewriter(slots, prefix)
    return rewriter.block(body)


class _Rewriter:
    def __init__(self, slots: ColumnAccumulators, prefix: str):
        self.slots, self.prefix, self.count = slots, prefix, 0

    def block(self, body) -> Tuple[ir.Stmt, ...]:
        out: List[ir.Stmt] = []
        for stmt in body:
            out += self.stmt(stmt)
        return tuple(out)

    def stmt(self, node) -> List[ir.Stmt]:
        if isinstance(node, ir.Store) and node.buffer == self.slots.value:
            return self.accumulate(node)
        if not dataclasses.is_dataclass(node):
            return [node]
        changes = {}
        for field in dataclasses.fields(node):
            value = getattr(node, field.name)
            if isinstance(value, tuple) and value and isinstance(value[0], ir.Stmt):
                changes[field.name] = self.block(value)
        return [dataclasses.replace(node, **changes)] if changes else [node]

    def accumulate(self, store: ir.Store) -> List[ir.Stmt]:
        n = self.count
        self.count += 1
        x, s, t = (f"{self.prefix}col{n}{part}" for part in ("x", "s", "t"))

        def load(slot: int) -> ir.Load:
            # the accumulators are laid out as the value row: same position, strides
            # (a "none" subscript is never checked against its size)
            return ir.Load(slot, tuple(ir.Subscript(p, (), Policy.NONE, self.slots.length, stride)
                                       for p, stride in zip(store.position, store.strides)))

        def local(name: str) -> ir.Local:
            return ir.Local(name)
        if not self.slots.compensated:
            return [ir.Let(x, store.value),
                    dataclasses.replace(store, buffer=self.slots.sums,
                                        value=ir.Binary(BinaryOp.ADD, load(self.slots.sums),
                                                        local(x)))]
        error = ir.Call(Function.WHERE, (
            ir.Binary(BinaryOp.GE, ir.Call(Function.ABS, (local(s),)),
                      ir.Call(Function.ABS, (local(x),))),
            ir.Binary(BinaryOp.ADD, ir.Binary(BinaryOp.SUB, local(s), local(t)), local(x)),
            ir.Binary(BinaryOp.ADD, ir.Binary(BinaryOp.SUB, local(x), local(t)), local(s))))
        return [ir.Let(x, store.value),
                ir.Let(s, load(self.slots.sums)),
                ir.Let(t, ir.Binary(BinaryOp.ADD, local(s), local(x))),
                dataclasses.replace(store, buffer=self.slots.errors,
                                    value=ir.Binary(BinaryOp.ADD, load(self.slots.errors), error)),
                dataclasses.replace(store, buffer=self.slots.sums, value=local(t))]
