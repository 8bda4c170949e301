"""Running a fusion group (schedule/fusion.py decides it, with the row kernel that runs
it, if one does) as one C kernel: each member's plan is the one the C backend would use
for it alone; plan/fuse.py merges their loop nests;
the merged kernel is compiled once per combination of the members' loop choices (the
schedule's values, schedule/loop_choice.py) and called with every
member's arrays, runtime ints and parameters.  A column member's per-thread
accumulators are zeroed per call and added up after it (column_total)."""

from __future__ import annotations

import ctypes
import threading
from typing import Dict, FrozenSet, Optional, Tuple

import numpy as np

from ...analysis.cost import group_points
from ...errors import BackendError
from ...plan import call_arguments
from ...plan.fuse import COLUMN_SUMS, fuse_kernels, renamed_int, slots_after_fusion
from ...plan.fuse_columns import column_sum_dtype
from ...plan.fuse_sums import GUARD_INT, guard_verdict
from ...plan.expression_facts import divides
from ...plan.thread_rows import (fitting_rows, padded, padded_length, row_bytes,  # noqa: F401
                                 thread_rows_view, thread_scratch)
from ...schedule.cache_key import CacheKey, CacheKind
from ...schedule.fusion import BoundGroup
from . import build as c_build, rows as c_rows
from .backend import KERNEL_ARGTYPES, positional_ints
from .render import render_c
from .threads import PARALLEL_MIN_WORK, default_threads, fixed_thread_count, thread_count

_fused: Dict[CacheKey, Tuple] = {}     # (schedule/cache_key.py: CacheKind.FUSED_GROUP)
# which entry of _fused holds the group compiled for its members' structural keys
# (CacheKind.COMPILED_GROUP -> (a FUSED_GROUP key, its members' IR kernels, their
# runtime ints by index position)): what a group of other spellings finds (an index
# only: a cleared _fused compiles anew)
_compiled_by_structure: Dict[CacheKey, Tuple] = {}
_lock = threading.Lock()


def run(members, thread_rows: FrozenSet[int] = frozenset()) -> Optional[Dict[int, np.ndarray]]:
    """Run the group; None when its kernel flagged an out-of-bounds gather (nothing
    is delivered then: the statements run one by one and raise their own errors), else
    the results of its column members by member (their sums over the rows).
    The outputs of the members in ``thread_rows`` (nothing after the group reads them)
    may live as one row per thread: they are not delivered in their buffers.
    ``members``: the group as the schedule decided it (schedule/fusion.BoundGroup),
    run by the row kernel it names (a softmax or layernorm: backends/c/rows.py), else
    as the merged loop nests; or a plain sequence of members: the merged loop nests."""
    row_kernel = members.row_kernel if isinstance(members, BoundGroup) else None
    if row_kernel is not None:
        return c_rows.run(row_kernel, members, threads_for(members, frozenset()))
    function, passed, thread_rows, guards = compiled_for(members, thread_rows)
    threads = threads_for(members, thread_rows)
    buffers, rows = with_thread_rows(members, thread_rows, threads)
    columns = column_accumulators_for(members, thread_rows)
    ints, doubles, integers, fills = arguments_for(
        members, buffers, row_ints_for(members, rows, thread_rows, columns), guards)
    arrays = [_passed_array(buffers, columns, k, slot) for k, slot in passed]
    pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    error = ctypes.c_int32(0)
    function(pointers, ints.ctypes.data, doubles.ctypes.data,
             integers.ctypes.data, fills.ctypes.data, threads, ctypes.byref(error))
    if error.value:
        return None
    return {k: column_total(members[k], *pair) for k, pair in columns.items()}


def compiled_for(members, thread_rows: FrozenSet[int]):
    """(function, the buffers it takes as (member, slot), the members kept as rows,
    the guards of its merged producer/sum loops or None where it has none)."""
    kernels = tuple(m.plan.program.kernels[0] for m in members)
    reads = tuple(m.reads for m in members)
    thread_rows = fitting_rows(members, thread_rows)
    columns = _columns(members)
    if not columns <= thread_rows:      # schedule/fusion.py joins only those that fit
        raise BackendError("a fused column sum whose rows do not fit per thread")
    local = frozenset((k, len(kernels[k].buffers) - 1) for k in thread_rows)
    joins = (tuple(tuple(sorted(r.items())) for r in reads), local, columns)
    key = CacheKey(CacheKind.FUSED_GROUP, tuple(m.choice for m in members) + joins)
    found = _fused.get(key)
    if found is None:
        found = _shared_group(members, kernels, reads, local, columns, joins, key)
        with _lock:
            found = _fused.setdefault(key, found)
    return found[0], found[1], thread_rows, found[2]


def _shared_group(members, kernels, reads, local, columns, joins, key):
    """(function, passed buffers, guards) of the group: compiled for a group of other
    spellings whose members' choices are structurally equal (LoopChoice.key) and whose
    members' plans are the same loop nests with the same runtime ints at the same index
    positions, else compiled now and shared under those keys."""
    shared = CacheKey(CacheKind.COMPILED_GROUP, tuple(m.choice.key for m in members) + joins)
    ints = tuple(positional_ints(m.choice, m.plan) for m in members)
    holder = _compiled_by_structure.get(shared)
    found = _fused.get(holder[0]) if holder is not None else None
    if found is not None and holder[1] == kernels and holder[2] == ints:
        return found
    working = members[0].call.dtypes.working.name
    fused = fuse_kernels(kernels, reads, working, local, columns)
    program = fused.program
    guards = fused.guards if GUARD_INT in program.kernels[0].ints else None
    # reciprocal math where every member allows it or has no division it could change
    library = c_build.load(render_c(program, c_build.vector_math()),
                           all(m.plan.fast_math or not divides(m.call.spec.rhs)
                               for m in members))
    function = getattr(library, program.kernels[0].name)
    function.argtypes = KERNEL_ARGTYPES
    function.restype = None
    compiled = (function, slots_after_fusion(kernels, reads, columns), guards)
    if found is None:   # (none yet, or its entry was cleared: this one holds it now)
        with _lock:
            _compiled_by_structure[shared] = (key, kernels, ints)
    return compiled


def threads_for(members, thread_rows) -> int:
    """The thread count for this call (backends/c/threads.py); per-thread rows need it
    known, so OpenMP's default becomes its number there."""
    count = thread_count(members[0].call.options.threads, _work(members))
    return default_threads() if count == 0 and thread_rows else count


def is_adaptive(members) -> bool:
    """Whether the thread count is chosen per call (no threads=, enough work)."""
    return fixed_thread_count(members[0].call.options.threads, _work(members)) is None


def _work(members) -> int:
    return group_points([member.call.bounds for member in members])


def with_thread_rows(members, thread_rows, threads: int):
    """Each member's buffers with the rows of ``thread_rows`` members as per-thread
    views (their output and every read of it), and those members' row lengths."""
    buffers = [list(m.buffers) for m in members]
    rows = []
    for k in sorted(thread_rows):
        view, length = thread_rows_view(members[k], threads)
        rows.append(length)
        for j, slot in _uses(members, k):
            buffers[j][slot] = view
    return buffers, rows


def _uses(members, k):
    """(member, slot) of member k's output and of every read of it in the group."""
    yield k, len(members[k].buffers) - 1
    for j, member in enumerate(members):
        for slot, (producer, _) in member.reads.items():
            if producer == k:
                yield j, slot


def arguments_for(members, buffers, rows, guards=None):
    """The runtime ints (each member's, then the per-thread row lengths and, where the
    kernel has merged producer/sum loops, their guards' verdict), doubles, integer
    parameters and pad/fill values of the fused call."""
    ints, doubles, integers = [], [], []
    named = {}
    for number, (member, arrays) in enumerate(zip(members, buffers)):
        kernel = member.plan.program.kernels[0]
        i, d, n = call_arguments(member.plan, member.call, arrays)
        ints.append(i[:len(kernel.ints)])
        named.update((renamed_int(number, name), int(value))
                     for name, value in zip(kernel.ints, i))
        doubles.append(d[:kernel.n_params])
        integers.append(n[:kernel.n_params])
    options = members[0].call.options
    fills = np.array([options.pad if options.pad is not None else 0.0, options.fill],
                     dtype=np.float64)
    verdict = [] if guards is None else [guard_verdict(guards, named)]
    return (np.concatenate(ints + [np.array(rows + verdict + [0], dtype=np.int64)]),
            np.concatenate(doubles + [np.zeros(1)]),
            np.concatenate(integers + [np.zeros(1, np.int64)]), fills)


def _columns(members) -> FrozenSet[int]:
    """The column members (plan/fuse_columns.py): sums over the rows."""
    return frozenset(k for k, m in enumerate(members) if m.column is not None)


def column_accumulators_for(members, thread_rows: FrozenSet[int]):
    """member -> (running sums, errors): zeroed, one row per slice of the rows each
    (plan/fuse_columns.py)."""
    # as long as the value row (the kernel steps from slice to slice by its length)
    slices = column_slices(members)
    return {k: tuple(thread_scratch(slices, padded(members[k]),
                                    _column_dtype(members[k]), zeroed=True)
                     for _ in range(2))
            for k in sorted(_columns(members) & thread_rows)}


def column_slices(members) -> int:
    """How many slices a group's rows are cut into for its column sums: as many as
    the most threads a call may take (OpenMP's default, or threads=), whatever the
    count a call takes (c_threads.py), so that the sums' bits never depend on it; one
    below the work that is worth a second thread."""
    if _work(members) < PARALLEL_MIN_WORK:
        return 1
    return max(default_threads(), members[0].call.options.threads or 1)


def _slice_rows(members) -> int:
    """Rows per slice (ir.SLICE_ROWS): the group's rows cut into column_slices parts."""
    return max(1, -(-members[0].extent // column_slices(members)))


def _column_dtype(member) -> np.dtype:
    """The dtype a column member's accumulators hold (plan/fuse_columns.py)."""
    return np.dtype(column_sum_dtype(member.call.dtypes.working.name))


def row_ints_for(members, rows, thread_rows: FrozenSet[int], columns) -> list:
    """The per-thread row lengths in the merged kernel's order: each member's row, and
    after a column member's the same length twice (its sums and errors); then, where
    there are column sums, the rows per slice."""
    ints = []
    for k, length in zip(sorted(thread_rows), rows):
        ints += [length] * (3 if k in columns else 1)
    return ints + ([_slice_rows(members)] if columns else [])


def _passed_array(buffers, columns, k: int, slot: int):
    if slot < 0:
        return columns[k][0 if slot == COLUMN_SUMS else 1]
    return buffers[k][slot]


def column_total(member, sums: np.ndarray, errors: np.ndarray) -> np.ndarray:
    """A column member's result: each slice's sum (a compensated one with its error
    added back where the sum is finite, as ef_total does), added in slice order, in
    the output's shape and the working dtype."""
    shape = member.column.call.output_shape
    size = int(np.prod(shape, dtype=np.int64))
    sums, errors = sums[:, :size], errors[:, :size]      # rows are padded (thread_scratch)
    working = member.call.dtypes.working
    if sums.dtype != working:      # wide sums (no errors): added up, rounded once
        result = sums[0].copy()
        for row in sums[1:]:
            result += row
        return result.astype(working).reshape(shape)
    with np.errstate(all="ignore"):
        totals = np.where(np.isfinite(sums), sums + errors, sums)
        result = totals[0].copy()
        for row in totals[1:]:
            result += row
    return result.reshape(shape)
