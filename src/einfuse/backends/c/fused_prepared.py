"""A fused group's run for repeated calls with the same layouts (schedule/fusion.py's
fast path): everything that depends only on the layouts is found once, so that a call
is a layout check per input, one allocation per delivered output and the kernel call.

The argument tuple is a template: the runner's own per-thread rows and column
accumulators sit in it already (they never leave a call); a call fills in its inputs
and fresh outputs.  The accumulators of every column member share one allocation, so
that zeroing them is one ``fill``.  A call that finds the runner's scratch in use by
another Python thread (ctypes and the kernel caller let go of the GIL while the kernel
runs) allocates scratch of its own.

At small sizes this bookkeeping is most of a call: a 64x64 layernorm backward (ten
statements, two column sums) spent 16 of its 21 µs in Python before it was prepared
this way.

Gathers (``x[b, y[b]]``) are prepared too: an index array is one more input, checked
for its own dtype (the one the plan read, uint64 read unsigned) and passed as the int64
array the plan takes.  What the first call's data decided is checked again per call:
a member whose index arrays were all in range runs a kernel without per-element tests
('verified', plan/gathers.py), so its arrays' extremes are taken again each call and
the full path runs where they are out of range now.  A raised error flag (an
out-of-bounds gather under bounds='check') delivers nothing: the full path runs the
call again, where the statements run alone and raise their own errors.

Scalar parameters are per-call arguments: a call writes each one's value (a Python
float, as the call signature has it) into the runner's own doubles, or takes the full
path where the value is anything else.  A parameter's key in the environment is its
name (the groups rename only the temporaries of hoisted forms: outputs)."""

from __future__ import annotations

import ctypes
import threading
from typing import Dict, FrozenSet, Optional, Sequence

import numpy as np

from ...errors import BackendError
from ...plan import buffer_slots
from ...plan.fuse import COLUMN_SUMS
from ...plan.gathers import array_extremes, bounds_mode, gather_spans, spans_in_range
from ...schedule.fusion import BoundGroup
from . import call as c_call, fused as c_fused, rows as c_rows
from .fused import column_total, thread_scratch
from .rows import laid_out
from .threads import default_threads, free_threads


def prepared_runner(members, thread_rows: FrozenSet[int], sources: Sequence[object]):
    """The group's run for repeated calls with the same layouts, or None where its
    arguments could depend on the data (padding).
    ``sources[k][slot]``: where member k's input ``slot`` comes from, a key of the
    environment or None for a member's output.  The runner takes the environment,
    checks every array it reads has the layout seen here (False and nothing run when
    not) and stores the delivered members' outputs under ``keys``."""
    if any(m.call.options.pad is not None for m in members):
        return None
    params = _param_slots(members)
    if params is None:
        return None
    verified = _verified_spans(members, sources)
    if verified is None:
        return None
    rows_group = members.row_kernel if isinstance(members, BoundGroup) else None
    if rows_group is not None:      # the row kernel the schedule chose (plan/row_kernel.py)
        return c_rows.prepared_runner(rows_group, members, c_fused.is_adaptive(members),
                                      c_fused.threads_for(members, frozenset()))
    function, passed, thread_rows, guards = c_fused.compiled_for(members, thread_rows)
    # chosen per call where adaptive (OpenMP's default when no core is busy), with
    # per-thread rows for as many threads as any call may take
    adaptive = c_fused.is_adaptive(members)
    threads = (default_threads() if thread_rows else 0) if adaptive else \
        c_fused.threads_for(members, thread_rows)
    buffers, rows = c_fused.with_thread_rows(members, thread_rows, threads)
    scratch = {k: (max(threads, 1), length) for k, length in zip(sorted(thread_rows), rows)}
    columns = c_fused.column_accumulators_for(members, thread_rows)
    # the arguments depend on layouts only: computed once, kept alive with the runner
    arguments = c_fused.arguments_for(members, buffers,
                                   c_fused.row_ints_for(members, rows, thread_rows, columns),
                                   guards)
    addresses = tuple(a.ctypes.data for a in arguments)
    doubles, integers = arguments[1], arguments[2]
    working = members[0].call.dtypes.working
    plan = _plan(members, passed, scratch, sources)
    if plan is None:
        return None
    outputs = tuple(k for k, m in enumerate(members) if k not in scratch)
    shapes = tuple(tuple(members[k].call.output_shape) for k in outputs)
    slot_of = {k: n for n, k in enumerate(outputs)}
    owned = _Scratch(members, scratch, columns, threads, working)
    template = [None] * len(plan)
    by_key: Dict[tuple, list] = {}      # each input's layout is checked once a call
    fresh = []
    for position, how in enumerate(plan):
        if how[0] == "in":     # (one key may be read as values and as an index array)
            by_key.setdefault((how[1], how[2]), [how[3]]).append(position)
        elif how[0] == "out":
            fresh.append((position, slot_of[how[1]]))
        else:
            template[position] = owned.array(how)
    inputs = tuple((key, found[0], given, tuple(found[1:]))
                   for (key, given), found in by_key.items())
    fresh = tuple(fresh)
    totals = tuple((k, _column_total(members[k], *owned.columns[k]))
                   for k in sorted(owned.columns))
    caller = c_call.caller() if len(passed) <= c_call.MAX_BUFFERS else None
    entry = ctypes.cast(function, ctypes.c_void_p).value
    lock = threading.Lock()
    # the outputs nothing reads after the call (keys None) live in the runner's own
    # arrays, found for the keys of the first call (the same for every call of a Step)
    kept_for = [None, None]       # (keys, arrays: an owned array or None per output)

    def count_now() -> int:
        """This call's threads: the free cores where adaptive, but never more than the
        per-thread rows and column accumulators were made for (``threads``, found from
        OMP_NUM_THREADS when prepared; a later, larger value would have the kernel's
        extra threads write past them: heap corruption)."""
        if not adaptive:
            return threads
        count = free_threads() or threads
        return min(count, threads) if threads else count

    def launch(arrays, count, where=addresses) -> bool:
        if caller is not None:
            error = caller(entry, tuple(arrays), *where, count)
        else:
            pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
            flag = ctypes.c_int32(0)
            function(pointers, *where, count, ctypes.byref(flag))
            error = flag.value
        # an out-of-bounds gather: nothing is delivered; the full path runs the call
        # again and the statements raise their own errors
        return not error

    def fill(arrays, env, reused) -> Optional[list]:
        """The inputs and the outputs put into ``arrays`` (fresh ones where
        ``reused`` has None): the outputs, or None where an input's layout is not
        the one prepared for (or a verified gather is out of range now)."""
        for key, layout, given, positions in inputs:
            value = env[key]
            if given is None:
                array = laid_out(value, layout, working)
            else:
                array = _index_laid_out(value, layout, given)
            if array is None:
                return None
            for position in positions:
                arrays[position] = array
        for spans, keys in verified:
            if not spans_in_range(spans, lambda name: array_extremes(
                    np.asarray(env[keys[name]]))):
                return None
        made = [np.empty(shape, working) if old is None else old
                for shape, old in zip(shapes, reused)]
        for position, slot in fresh:
            arrays[position] = made[slot]
        return made

    def deliver(env, keys, made, column_totals) -> None:
        """The outputs and column sums that a later step reads, into ``env``."""
        for k, array in zip(outputs, made):
            if keys[k] is not None:
                env[keys[k]] = array
        for k, total in column_totals:
            if keys[k] is not None:
                env[keys[k]] = total()

    def runner(env, keys) -> bool:
        if not lock.acquire(blocking=False):
            return _unowned(env, keys)
        try:
            if kept_for[0] != keys:
                kept_for[1] = tuple(np.empty(shape, working) if keys[k] is None else None
                                    for k, shape in zip(outputs, shapes))
                kept_for[0] = keys
            arrays = template.copy()
            made = fill(arrays, env, kept_for[1])
            if made is None or params and not _set_params(params, env, doubles, integers):
                return False
            owned.zero()
            if not launch(arrays, count_now()):
                return False
            deliver(env, keys, made, totals)
            return True
        finally:
            lock.release()

    def _unowned(env, keys) -> bool:
        mine = _Scratch(members, scratch, columns, threads, working)
        arrays = [None if how[0] in ("in", "out") else mine.array(how) for how in plan]
        made = fill(arrays, env, (None,) * len(outputs))
        if made is None:
            return False
        where = addresses
        if params:      # the runner's own doubles are another thread's now
            mine_doubles, mine_integers = doubles.copy(), integers.copy()
            if not _set_params(params, env, mine_doubles, mine_integers):
                return False
            where = (addresses[0], mine_doubles.ctypes.data, mine_integers.ctypes.data,
                     addresses[3])
        if not launch(arrays, count_now(), where):
            return False
        deliver(env, keys, made, tuple((k, _column_total(members[k], *pair))
                                       for k, pair in mine.columns.items()))
        return True
    runner.keep = (arguments, owned)
    # what runtime/torch_node.py needs to run the same kernel call from C++: None where
    # a call depends on more than the layouts (parameters, gathers checked per call)
    runner.describe = None if params or verified or any(
        how[0] == "in" and how[2] is not None for how in plan) else lambda: {
        "entry": entry, "addresses": addresses, "adaptive": 2 if adaptive else 0,
        "threads": threads, "working": np.dtype(working), "plan": tuple(plan),
        "outputs": outputs, "shapes": shapes, "scratch": dict(scratch),
        "columns": {k: (pair[0].shape, pair[0].dtype) for k, pair in owned.columns.items()},
        "totals": {k: (tuple(members[k].column.call.output_shape),
                       owned.columns[k][0].dtype == working) for k in owned.columns}}
    return runner


def _plan(members, passed, scratch, sources) -> Optional[list]:
    """Per passed buffer: ("in", key, given, layout) | ("out", k) | ("rows", k) |
    ("column", k, slot); None where an input comes from no key of the environment.
    ``given``: an index array's dtype as the call gave it (None for values)."""
    plan = []
    for k, slot in passed:
        if slot < 0:
            plan.append(("column", k, slot))
            continue
        if slot == len(members[k].buffers) - 1:
            plan.append(("rows", k) if k in scratch else ("out", k))
            continue
        producer = members[k].reads.get(slot)
        if producer is not None:
            plan.append(("rows", producer[0]) if producer[0] in scratch
                        else ("out", producer[0]))
            continue
        key, array = sources[k][slot], members[k].buffers[slot]
        if key is None:
            return None
        tensor, kind = buffer_slots(members[k].kernel.spec)[slot]
        given = np.dtype(members[k].call.arrays.dtypes[tensor]) if kind == "index" else None
        plan.append(("in", key, given, (array.shape, array.dtype, array.strides)))
    return plan


def _param_slots(members):
    """(position in the fused call's doubles, parameter name) of every member's scalar
    parameters (c_fused.arguments_for lays them out member after member), or None
    where one was not given as a Python float."""
    slots, start = [], 0
    for member in members:
        count = member.plan.program.kernels[0].n_params
        for n, name in enumerate(member.plan.params[:count]):
            if type(member.call.params[name]) is not float:
                return None
            slots.append((start + n, name))
        start += count
    return tuple(slots)


def _set_params(slots, env, doubles: np.ndarray, integers: np.ndarray) -> bool:
    """This call's parameter values written into ``doubles`` (and ``integers``, which
    only integer working dtypes read: a float parameter makes the working dtype a
    float one); False where one is not a Python float (the full path decides)."""
    for position, name in slots:
        value = env.get(name)
        if type(value) is not float:
            return False
        doubles[position] = value
        integers[position] = int(value) if value.is_integer() and \
            -2**63 <= value < 2**63 else 0
    return True


def _index_laid_out(value, layout, given: np.dtype) -> Optional[np.ndarray]:
    """An index array as the plan takes it (int64, the layout prepared for), or None
    where its dtype is not the one prepared for (the plan reads uint64 unsigned, and
    the gathers' overflow checks depend on the dtype) or no int64 copy has the
    layout."""
    if type(value) is np.ndarray and value.dtype == given:
        array = value
    else:
        array = np.asarray(value)
        if array.dtype != given:
            return None
    if array.dtype != np.int64:
        array = array.astype(np.int64)
    return array if (array.shape, array.dtype, array.strides) == layout else None


def _verified_spans(members, sources):
    """Per member whose kernel tests no gather (its index arrays were in range when
    planned: 'verified'), its gathers' spans and the environment's key of each index
    array it reads; None where an index array comes from no key."""
    found = []
    for k, member in enumerate(members):
        spec = member.kernel.spec
        if not any(t.as_index for t in spec.tensors) or \
                bounds_mode(member.call, unsigned_checks=True) != "verified":
            continue
        keys = {}
        for slot, (tensor, kind) in enumerate(buffer_slots(spec)[:-1]):
            if kind == "index":
                if sources[k][slot] is None:
                    return None
                keys[tensor] = sources[k][slot]
        found.append((gather_spans(member.call), keys))
    return tuple(found)


class _Scratch:
    """One set of per-thread rows (by member) and column accumulators (by member: sums
    and errors), the accumulators carved from one allocation."""

    def __init__(self, members, scratch, columns, threads: int, working):
        self.rows = {k: thread_scratch(*shape, working) for k, shape in scratch.items()}
        pairs = [(k, pair[0].shape, pair[0].dtype) for k, pair in columns.items()]
        dtype = pairs[0][2] if pairs else np.dtype(np.float64)
        # rows are whole 128-byte lines, so accumulators laid end to end stay aligned
        sizes = [2 * shape[0] * shape[1] for _, shape, _ in pairs]
        if any(d != dtype for _, _, d in pairs):
            raise BackendError("column accumulators of different dtypes in one group")
        self._block = thread_scratch(1, sum(sizes), dtype, zeroed=True)[0] \
            if pairs else None
        self.columns: Dict[int, tuple] = {}
        start = 0
        for (k, shape, _), size in zip(pairs, sizes):
            half = size // 2
            self.columns[k] = (self._block[start:start + half].reshape(shape),
                               self._block[start + half:start + size].reshape(shape))
            start += size

    def array(self, how) -> np.ndarray:
        if how[0] == "column":
            return self.columns[how[1]][0 if how[2] == COLUMN_SUMS else 1]
        return self.rows[how[1]]

    def zero(self) -> None:
        if self._block is not None:
            self._block.fill(0)


def _column_total(member, sums: np.ndarray, errors: np.ndarray):
    """A function giving a column member's result from its accumulators (as
    c_fused.column_total, with the views and shapes found once)."""
    shape = tuple(member.column.call.output_shape)
    size = int(np.prod(shape, dtype=np.int64))
    working = member.call.dtypes.working
    if sums.dtype == working:      # compensated: c_fused's own way, its views found once
        slices, corrections = sums[:, :size], errors[:, :size]

        def compensated() -> np.ndarray:
            # finite sums: each plus its error, added in slice order (column_total's
            # numbers without its errstate and where, 10-20 µs a call at 256 columns);
            # any other sum: column_total itself
            if not np.isfinite(slices).all():
                return column_total(member, sums, errors)
            totals = slices + corrections
            result = totals[0]
            for row in totals[1:]:
                result += row
            return result.reshape(shape)
        return compensated
    rows = sums[:, :size]      # wide sums (no errors): added in thread order, rounded once
    if len(rows) == 1:
        return lambda: rows[0].astype(working).reshape(shape)

    def total() -> np.ndarray:
        result = rows[0].copy()
        for row in rows[1:]:
            result += row
        return result.astype(working).reshape(shape)
    return total
