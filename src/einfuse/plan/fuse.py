"""Merging the lowered kernels of several statements into one loop nest (row fusion).

Each statement of a fusion group (schedule/fusion.py decides the groups) is lowered
on its own, to a kernel whose body is one parallel loop over its outermost output
index.  The merged kernel runs that loop once and, in each iteration, the statements'
loop bodies one after the other: statement 2 reads the row of an intermediate that
statement 1 has just written, from cache, in the same thread.

Names are made unique by a prefix per statement (``k0_``, ``k1_`` ...); buffer slots
and parameter slots are numbered on; every statement's loop counter of the shared
loop becomes one.  A statement's read of an intermediate written earlier in the group
reads the producer's own output buffer (not a second pointer to the same memory,
which ``restrict`` would forbid).  An intermediate that nothing after the group
reads lives as one row per thread instead (``thread_rows``): the row axis gets
stride 0 and each thread its own row, so the whole array never goes to memory.
A value an inner loop reads at every step (a row's sum, written just before) is read
once per row (plan/fuse_invariants.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, FrozenSet, Sequence, Tuple

from .. import ir
from ..ir import LoopKind
from .fuse_columns import ColumnAccumulators, accumulate_into_columns, column_sum_dtype
from .fuse_extrema import combine_extrema_by_vectors
from .fuse_invariants import read_invariants_once
from .fuse_siblings import merge_sibling_loops
from .fuse_sums import GUARD_INT, merge_row_sums

SHARED_LOOP = "f0"


@dataclass(frozen=True)
class FusedProgram:
    """The merged kernel, and the affine expressions of its runtime ints that must all
    be 0 for its merged producer/sum loops (plan/fuse_sums.py) and sibling loops
    (plan/fuse_siblings.py) to run; the caller passes their verdict as the last
    runtime int (``fuse_sums.GUARD_INT``)."""
    program: ir.LoopProgram
    guards: Tuple[ir.Affine, ...] = ()


def renamed_int(number: int, name: str) -> str:
    """The name of kernel ``number``'s runtime int ``name`` in the merged kernel."""
    return f"k{number}_{name}"


@dataclass(frozen=True)
class _Renaming:
    prefix: str
    loop_var: str                    # this kernel's shared loop counter
    buffers: Tuple[int, ...]         # slot -> merged slot
    params: int                      # offset of this kernel's parameter slots

    def name(self, value: str) -> str:
        return SHARED_LOOP if value == self.loop_var else self.prefix + value


def _rename(node, how: _Renaming):
    """``node`` with every generated name, buffer slot and parameter slot renamed."""
    if isinstance(node, tuple):
        return tuple(_rename(item, how) for item in node)
    if isinstance(node, ir.Affine):
        return ir.Affine(tuple((how.name(n), c) for n, c in node.terms), node.const)
    if isinstance(node, ir.Param):
        return ir.Param(node.slot + how.params)
    if not dataclasses.is_dataclass(node):
        return node
    changes = {}
    for field in dataclasses.fields(node):
        value = getattr(node, field.name)
        if field.name in _NAME_FIELDS.get(type(node), ()):
            if value is not None:
                changes[field.name] = how.name(value)
        elif field.name == "buffer":
            changes[field.name] = how.buffers[value]
        elif field.name == "reductions":
            changes[field.name] = tuple((how.name(acc), op) for acc, op in value)
        elif field.name == "strides":
            changes[field.name] = tuple(None if v is None else how.name(v) for v in value)
        elif field.name == "names" and isinstance(node, ir.NormalBranch):
            changes[field.name] = tuple(how.name(v) for v in value)
        elif field.name == "errors" and value is not None:
            changes[field.name] = tuple(how.name(v) for v in value)
        elif field.name == "fill":
            continue     # names the call's pad/fill values, shared by every kernel
        else:
            changes[field.name] = _rename(value, how)
    return dataclasses.replace(node, **changes)


_NAME_FIELDS: Dict[type, Tuple[str, ...]] = {
    ir.Subscript: ("size", "stride"),
    ir.AccValue: ("acc", "lane", "row"),
    ir.DeclareAcc: ("name",),
    ir.Accumulate: ("name", "lane", "row"),
    ir.Loop: ("var",),
    ir.Fold: ("into", "error", "source"),
    ir.Compensate: ("acc", "error"),
    ir.CombineLanes: ("name", "into"),
    ir.TiledLoop: ("var", "count"),
    ir.Let: ("name",),
    ir.Local: ("name",),
}


def fuse_kernels(kernels: Sequence[ir.LoopNest], reads: Sequence[Dict[int, Tuple[int, int]]],
                 working: str, thread_rows: FrozenSet[Tuple[int, int]] = frozenset(),
                 columns: FrozenSet[int] = frozenset()) -> FusedProgram:
    """One kernel running ``kernels`` (each a single parallel loop over the shared
    index, same extent at run time) in one loop.  ``reads[n]`` maps a buffer slot of
    kernel n that holds an intermediate of the group to (producer kernel, its output
    slot).  ``thread_rows`` lists the (kernel, output slot) pairs whose intermediates
    live as one row per thread (``ir.Buffer.per_thread``): their row lengths follow
    the kernels' own runtime ints, in the order of their buffers; then, where a row
    written and summed right after was merged into one pass, the guards' verdict.
    ``columns``: the kernels whose value rows are summed over the rows instead
    (plan/fuse_columns.py); each takes two more per-thread buffers after its own, the
    running sums and their errors, with the same row length, one row per slice of the
    loop (``ir.SLICE_ROWS``, after the row lengths)."""
    buffers = []
    ints = []
    body = []
    params = 0
    extent = None
    slots_of = []
    for number, kernel in enumerate(kernels):
        loop = kernel.body[0]
        prefix = renamed_int(number, "")
        mapping = []
        for slot, buffer in enumerate(kernel.buffers):
            if slot in reads[number]:
                producer, out_slot = reads[number][slot]
                mapping.append(slots_of[producer][out_slot])
            else:
                mapping.append(len(buffers))
                row = f"rows{len(buffers)}" if (number, slot) in thread_rows else None
                buffers.append(dataclasses.replace(buffer, name=f"t{len(buffers)}",
                                                   per_thread=row))
        slots_of.append(tuple(mapping))
        how = _Renaming(prefix, loop.var, tuple(mapping), params)
        params += kernel.n_params
        ints += [how.name(n) for n in kernel.ints]
        if extent is None:
            extent = _rename(loop.extent, how)
        renamed = _rename(loop.body, how)
        if number in columns:
            value = mapping[-1]
            wide = column_sum_dtype(working) != working
            for _ in range(2):     # (rows per slice of the loop: plan/fuse_columns.py)
                buffers.append(dataclasses.replace(
                    buffers[value], name=f"t{len(buffers)}", per_thread=f"rows{len(buffers)}",
                    dtype=column_sum_dtype(working) if wide else buffers[value].dtype,
                    per_slice=True))
            sums, errors = len(buffers) - 2, len(buffers) - 1
            renamed = accumulate_into_columns(
                renamed, ColumnAccumulators(value, sums, errors, buffers[sums].per_thread,
                                            compensated=not wide),
                prefix)
        body += list(renamed)
    ints += [b.per_thread for b in buffers if b.per_thread is not None]
    if columns:
        ints.append(ir.SLICE_ROWS)
    sums = merge_row_sums(tuple(body), SHARED_LOOP)
    siblings = merge_sibling_loops(sums.body, SHARED_LOOP)
    # one verdict for both passes' guards: any that fails turns every merge off
    guards = sums.guards + tuple(g for g in siblings.guards if g not in sums.guards)
    if guards or sums.body != tuple(body):
        ints.append(GUARD_INT)
    merged = ir.LoopNest("einfuse_kernel", tuple(buffers), tuple(ints), params,
                       (ir.Loop(SHARED_LOOP, extent, LoopKind.PARALLEL,
                                read_invariants_once(
                                    combine_extrema_by_vectors(siblings.body),
                                    tuple(buffers), working)),),
                       checks_bounds=any(k.checks_bounds for k in kernels))
    return FusedProgram(ir.LoopProgram(working, (merged,)), guards)


# The slots of a column member's accumulators in slots_after_fusion (after its own).
COLUMN_SUMS, COLUMN_ERRORS = -1, -2


def slots_after_fusion(kernels: Sequence[ir.LoopNest],
                       reads: Sequence[Dict[int, Tuple[int, int]]],
                       columns: FrozenSet[int] = frozenset()) -> Tuple[Tuple, ...]:
    """For each merged buffer slot, (kernel, slot) of the array passed there; a column
    member's running sums and errors are (kernel, COLUMN_SUMS) and (kernel,
    COLUMN_ERRORS)."""
    passed = []
    for number, kernel in enumerate(kernels):
        for slot in range(len(kernel.buffers)):
            if slot not in reads[number]:
                passed.append((number, slot))
        if number in columns:
            passed += [(number, COLUMN_SUMS), (number, COLUMN_ERRORS)]
    return tuple(passed)
