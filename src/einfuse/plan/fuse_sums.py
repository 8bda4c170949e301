"""One pass over a row where a fused group made two: a row written by one statement and
summed by the next (softmax's ``e[i,j] := exp(X[i,j] - m[i])`` then ``sum[k](e[i,k])``).

In the merged loop body of a fusion group (plan/fuse.py) the producer's loop stores the
row and the reader's sum reads it back: for a short row one OpenMP SIMD reduction
loop (the small side of the sum's ``Branch``), for a long one blocks of per-lane
partials added with compensation (plan/sums.py).  Here every read of the row in the
sum becomes: compute the producer's value there, store it, add it.  The row is not
read a second time, and the sum adds the same values in the same order -- the loops
are the sum's own (same trip counts, same ``reduction(+:...)`` clause, same lanes and
blocks), so GCC vectorises them alike.  Not always to the bit: where the producer
calls a library function (softmax's expf), the columns past a row's last full vector
took scalar expf in the merged loop and libmvec's vector expf in the producer's own
loop, up to 3 ulp apart (tests/test_fusion_sums.py compares the two kernels).

The merged loops are only right where the sum reads exactly the row just written:
same length, from column 0, at the row just written, through the same strides.  Those
are runtime ints (one kernel serves every shape), so each merge comes with *guards*:
affine expressions of the kernel's ints that are all 0 exactly when it applies.  The
caller (backends/c/fused.py) evaluates them per call and passes their verdict as one
more runtime int; the kernel takes the merged loops only where it is 0, and the two
passes otherwise."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Optional, Tuple

from .. import ir
from ..ir import Policy, ReduceOp

# the runtime int that holds the guards' verdict (0: every merged loop applies)
GUARD_INT = "fsum_off"


@dataclass(frozen=True)
class MergedSums:
    """A kernel body with its producer/sum loop pairs merged, and the affine
    expressions of runtime ints that must all be 0 for the merged loops to apply."""
    body: Tuple[ir.Stmt, ...]
    guards: Tuple[ir.Affine, ...]


def merge_row_sums(body: Tuple[ir.Stmt, ...], shared_loop: str) -> MergedSums:
    """``body`` (of the shared loop over rows ``shared_loop``) with every producer row
    loop that is directly followed by a sum of that row merged with it (guarded)."""
    out: List[ir.Stmt] = []
    guards: List[ir.Affine] = []
    number = 0
    position = 0
    while position < len(body):
        merged = None
        if position + 2 < len(body):
            merged = _merge(body[position], body[position + 1], body[position + 2],
                            shared_loop, f"fsum{number}")
        if merged is None:
            out.append(body[position])
            position += 1
            continue
        statements, more = merged
        out += statements
        guards += more
        number += 1
        position += 3
    return MergedSums(tuple(out), tuple(guards))


def _merge(producer, declare, branch, shared_loop: str, value_name: str):
    """(statements, guards) replacing ``producer, declare, branch``, or None."""
    store = _row_store(producer, shared_loop)
    if store is None or not isinstance(declare, ir.DeclareAcc) or \
            declare.op != ReduceOp.SUM or declare.lanes is not None or \
            not isinstance(branch, ir.Branch) or len(branch.small) != 1:
        return None
    loop = branch.small[0]
    if not isinstance(loop, ir.Loop) or not loop.simd or loop.start is not None or \
            loop.reductions != ((declare.name, ReduceOp.SUM),) or len(loop.body) != 1:
        return None
    accumulate = loop.body[0]
    if not isinstance(accumulate, ir.Accumulate) or accumulate.name != declare.name or \
            accumulate.op != ReduceOp.SUM or accumulate.lane is not None or \
            accumulate.row is not None or accumulate.position:
        return None
    load = accumulate.value
    if not isinstance(load, ir.Load) or load.buffer != store.buffer or load.is_index or \
            load.fill is not None or len(load.subscripts) != 2:
        return None
    row, column = load.subscripts
    if row.gathers or column.gathers or row.quasi or column.quasi or \
            row.policy != Policy.NONE or column.policy != Policy.NONE or \
            row.stride is None or column.stride is not None:
        return None
    row_offset = row.affine + ir.Affine.var(shared_loop, -1)
    column_offset = column.affine + ir.Affine.var(loop.var, -1)
    if shared_loop in row_offset.names or loop.var in column_offset.names or \
            loop.var in row_offset.names or shared_loop in column_offset.names:
        return None
    stride = store.strides[0]
    guards = (loop.extent + producer.extent.scale(-1), row_offset, column_offset,
              ir.Affine.var(row.stride) + ir.Affine.var(stride, -1))
    if any(loop.var in g.names or shared_loop in g.names or producer.var in g.names
           for g in guards):
        return None
    merging = _Merging(producer, store, load, column_offset, value_name)
    fused = merging.statements(loop)
    large = merging.statements(tuple(branch.large))
    one_pass = ir.Branch((ir.Affine.var(GUARD_INT),), 0, (fused,), (producer, loop))
    # the long sum's blocks read each value once, where it is computed and stored
    long_pass = (producer,) + tuple(branch.large)
    if merging.complete:
        long_pass = (ir.Branch((ir.Affine.var(GUARD_INT),), 0, large, long_pass),)
    small = dataclasses.replace(branch, small=(one_pass,), large=long_pass)
    return [declare, small], [g for g in guards if g.terms or g.const]


class _Merging:
    """Rewrites every accumulation of a load of the producer's row (same row
    subscript, column ``offset + position``) into: compute the producer's value at
    ``position``, store it, accumulate it.  ``complete`` turns False where the row is
    read any other way (the statements then keep their two passes)."""

    def __init__(self, producer, store, load, offset: ir.Affine, value_name: str):
        self.producer, self.store, self.load = producer, store, load
        self.offset, self.value_name = offset, value_name
        self.complete = True

    def statements(self, node):
        if isinstance(node, tuple):
            out = []
            for item in node:
                out += self._statement(item)
            return tuple(out)
        return self._statement(node)[0]

    def _statement(self, node) -> List[ir.Stmt]:
        if isinstance(node, ir.Accumulate) and isinstance(node.value, ir.Load) and \
                node.value.buffer == self.store.buffer:
            load = node.value
            if load.subscripts[0] != self.load.subscripts[0] or \
                    dataclasses.replace(load.subscripts[1], affine=self.offset) != \
                    dataclasses.replace(self.load.subscripts[1], affine=self.offset) or \
                    load.fill != self.load.fill or load.is_index:
                self.complete = False
                return [node]
            column = load.subscripts[1].affine + self.offset.scale(-1)
            value = substitute_affine(self.store.value, self.producer.var, column)
            position = (self.store.position[0], column)
            return [ir.Let(self.value_name, value),
                    dataclasses.replace(self.store, position=position,
                                        value=ir.Local(self.value_name)),
                    dataclasses.replace(node, value=ir.Local(self.value_name))]
        if isinstance(node, ir.Load) and node.buffer == self.store.buffer:
            self.complete = False
            return [node]
        if isinstance(node, ir.Stmt) and dataclasses.is_dataclass(node):
            changes = {}
            for field in dataclasses.fields(node):
                value = getattr(node, field.name)
                if isinstance(value, tuple) and value and all(isinstance(v, ir.Stmt)
                                                              for v in value):
                    changes[field.name] = self.statements(value)
                elif isinstance(value, (ir.Expr, tuple)):
                    self._check(value)
            return [dataclasses.replace(node, **changes)]
        return [node]

    def _check(self, node) -> None:
        """complete turns False where an expression reads the producer's buffer."""
        if isinstance(node, tuple):
            for item in node:
                self._check(item)
        elif isinstance(node, ir.Load):
            if node.buffer == self.store.buffer:
                self.complete = False
            for subscript in node.subscripts:
                for gather, _ in subscript.gathers:
                    self._check(gather)
        elif dataclasses.is_dataclass(node) and not isinstance(node, ir.Affine):
            for field in dataclasses.fields(node):
                self._check(getattr(node, field.name))


def _row_store(producer, shared_loop: str) -> Optional[ir.Store]:
    """The store of a SIMD loop writing one value per column of the row just computed
    (``t[f0, p] = ...`` with unit stride along ``p``), or None."""
    if not isinstance(producer, ir.Loop) or not producer.simd or producer.reductions or \
            producer.start is not None or len(producer.body) != 1:
        return None
    store = producer.body[0]
    if not isinstance(store, ir.Store) or len(store.position) != 2 or \
            store.strides[1] is not None or store.strides[0] is None:
        return None
    if store.position != (ir.Affine.var(shared_loop), ir.Affine.var(producer.var)):
        return None
    return store


def substitute_affine(node, old: str, new: ir.Affine):
    """``node`` with the loop counter ``old`` replaced by the affine ``new``."""
    if isinstance(node, tuple):
        return tuple(substitute_affine(item, old, new) for item in node)
    if isinstance(node, ir.Affine):
        terms = dict(node.terms)
        coefficient = terms.pop(old, 0)
        return ir.Affine(tuple(terms.items()), node.const) + new.scale(coefficient)
    if not dataclasses.is_dataclass(node):
        return node
    return dataclasses.replace(node, **{
        f.name: substitute_affine(getattr(node, f.name), old, new)
        for f in dataclasses.fields(node)})


def guard_verdict(guards: Tuple[ir.Affine, ...], ints: dict) -> int:
    """0 where every guard is 0 for these runtime ints (name -> value), else 1 (also
    where a guard names an int the call does not have: the two passes are always
    right)."""
    for guard in guards:
        if any(n not in ints for n, _ in guard.terms) or \
                sum(ints[n] * c for n, c in guard.terms) + guard.const != 0:
            return 1
    return 0
