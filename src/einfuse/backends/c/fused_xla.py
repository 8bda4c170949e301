"""A fused group's C kernel (backends/c/fused.py: the merged loop nests of plan/fuse.py)
as an entry of the ef.jit XLA handler (backends/c/jit_ffi.py), so that a JAX caller's
group runs as one custom call (runtime/jax_groups.py) -- the same kernel, with the same
runtime ints, a NumPy caller's group of the same shapes runs.

The handler calls entries ``int entry(void **args, int busy)``; a fused kernel takes
``(buffers, ints, doubles, integers, fills, threads, &error)``.  One trampoline,
compiled once, stands between them: its argument slots are

    0  the fused kernel's address           (a constant of the record)
    1  meta: [accumulators to zero, threads, the bytes of each]
    2-5  the kernel's ints, doubles, integer parameters, pad/fill values
    6..  the buffers to zero (column sums and their errors), then the kernel's buffers

Everything in 0-5 depends on the shapes only, so it is found once when the call is
lowered, from a NumPy stand-in of each array (dense, row-major: XLA's layout).  What a
call of the NumPy path keeps to itself -- each thread's rows of an intermediate, a
column member's running sums and errors per slice of the rows -- are extra results of
the custom call here, so that every execution (XLA may run one executable on several
threads) has its own; the trampoline zeroes the sums each call, as c_fused.run does.
A column member's result is its slices' sums added in slice order after the call
(runtime/jax_groups.py, in XLA's own additions: the bits of fused.column_total).

Declined (None, with the reason), so that the statements run as their own calls:
gathers (the kernel was bound on stand-in index values, and an index out of range must
raise the statement's own error, which only a statement's call reports), pad=
(arguments that depend on the data), parameters that are traced arrays (their value
is part of the doubles), and inputs the kernel would read through a view other than
the dense array."""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Dict, Tuple, Union

import numpy as np

from ...plan.fuse import COLUMN_SUMS
from . import build as c_build, fused as c_fused
from .jit_ffi import EntryLayout, Source, converts

TRAMPOLINE = r"""
#include <stdint.h>
#include <string.h>

typedef void (*ef_group_kernel)(void **, const void *, const void *, const void *,
                                const void *, int, int32_t *);

/* busy: another einfuse kernel holds an OpenMP team (jit_ffi's handler says so), so
   this one runs on the calling thread; its per-thread rows were made for meta[1]
   threads, one row of which it then uses. */
int ef_group_entry(void **args, int busy) {
  const int64_t *meta = (const int64_t *)args[1];
  int64_t zeroed = meta[0];
  for (int64_t k = 0; k < zeroed; ++k) memset(args[6 + k], 0, (size_t)meta[2 + k]);
  int32_t error = 0;
  ((ef_group_kernel)args[0])(args + 6 + zeroed, args[2], args[3], args[4], args[5],
                             busy ? 1 : (int)meta[1], &error);
  return error != 0;
}
"""


@functools.lru_cache(maxsize=1)
def trampoline() -> int:
    """The address of ef_group_entry (its library compiled once, cached on disk)."""
    library = c_build.load(TRAMPOLINE)
    return ctypes.cast(library.ef_group_entry, ctypes.c_void_p).value


@dataclass(frozen=True)
class Operand:
    """An input of the group: the environment's key, read as ``shape`` in ``dtype``."""
    key: str
    dtype: str
    shape: Tuple[int, ...]


@dataclass(frozen=True)
class Delivered:
    """A member's output in its full shape: result ``index`` of the custom call."""
    member: int
    index: int
    dtype: str
    shape: Tuple[int, ...]


@dataclass(frozen=True)
class ColumnResult:
    """A column member's running sums and errors (results ``sums``, ``errors``, each
    (slices, padded row)) and what they add up to: ``size`` elements of ``shape`` in
    ``working``."""
    member: int
    sums: int
    errors: int
    size: int
    shape: Tuple[int, ...]
    working: str


@dataclass(frozen=True)
class XlaGroup:
    """Everything the custom call of one group needs, fixed when it is lowered."""
    function: int                                 # the fused kernel's address
    constants: Tuple[np.ndarray, ...]             # meta, ints, doubles, integers, fills
    operands: Tuple[Operand, ...]
    results: Tuple[Tuple[str, Tuple[int, ...]], ...]     # (dtype, shape) of every result
    delivered: Tuple[Delivered, ...]
    columns: Tuple[ColumnResult, ...]
    layout: EntryLayout

    def constant_addresses(self) -> Tuple[int, ...]:
        return (self.function,) + tuple(c.ctypes.data for c in self.constants)


@dataclass(frozen=True)
class Declined:
    reason: str


def xla_group(group, stand: Dict[str, object]) -> Union[XlaGroup, Declined]:
    """The custom call of ``group`` (schedule/fusion.BoundGroup, bound on ``stand``:
    NumPy stand-ins of a JAX caller's arrays, Python numbers as they are)."""
    members = group.members
    if group.row_kernel is not None:
        return Declined("the group runs a row kernel")
    if any(m.call.options.pad is not None for m in members):
        return Declined("pad= makes the arguments depend on the data")
    for member in members:
        spec = member.kernel.spec
        if any(info.as_index for info in spec.tensors):
            return Declined("a gather's bounds are reported by its statement's own call")
        if any(not isinstance(stand.get(name), (bool, int, float)) for name in spec.params):
            return Declined("a scalar parameter is an array")
    working = members[0].call.dtypes.working
    if not converts(working.name):
        return Declined(f"the XLA handler does not take {working}")
    function, passed, thread_rows, guards = c_fused.compiled_for(members, group.inside)
    threads = c_fused.threads_for(members, thread_rows)
    buffers, rows = c_fused.with_thread_rows(members, thread_rows, threads)
    columns = c_fused.column_accumulators_for(members, thread_rows)
    ints, doubles, integers, fills = c_fused.arguments_for(
        members, buffers, c_fused.row_ints_for(members, rows, thread_rows, columns), guards)
    results, delivered, operands = [], {}, {}
    row_result, column_results = {}, {}

    def result(dtype, shape) -> int:
        results.append((np.dtype(dtype).name, tuple(int(n) for n in shape)))
        return len(results) - 1

    for k, member in enumerate(members):
        if k not in thread_rows:
            out = member.buffers[-1]
            delivered[k] = Delivered(k, result(working, out.shape), working.name,
                                     tuple(out.shape))
    for k, length in zip(sorted(thread_rows), rows):
        row_result[k] = result(working, (max(threads, 1), length))
    for k in sorted(columns):
        sums, errors = columns[k]
        column_results[k] = (result(sums.dtype, sums.shape), result(errors.dtype,
                                                                    errors.shape))
    kernel_slots = []
    for k, slot in passed:
        member = members[k]
        if slot < 0:
            kernel_slots.append((Source.RESULT, column_results[k][0 if slot == COLUMN_SUMS
                                                                  else 1]))
        elif slot == len(member.buffers) - 1:
            kernel_slots.append((Source.RESULT, row_result[k] if k in thread_rows
                                 else delivered[k].index))
        else:
            key = member.sources[slot] if slot < len(member.sources) else None
            array = member.buffers[slot]
            given = stand.get(key) if key is not None else None
            if not _dense_copy_of(array, given, working):
                return Declined(f"{key} is read through a view of its own")
            operand = Operand(key, working.name, tuple(array.shape))
            kernel_slots.append((Source.OPERAND, operands.setdefault(operand,
                                                                     len(operands))))
    zeroed = [(index, np.dtype(results[index][0]).itemsize *
               int(np.prod(results[index][1], dtype=np.int64)))
              for pair in column_results.values() for index in pair]
    meta = np.array([len(zeroed), threads] + [n for _, n in zeroed], dtype=np.int64)
    slots = tuple([(Source.CONSTANT, n) for n in range(6)] +
                  [(Source.RESULT, index) for index, _ in zeroed] + kernel_slots)
    ordered = tuple(sorted(operands, key=operands.get))
    layout = EntryLayout(tuple((o.dtype, o.shape) for o in ordered), tuple(results),
                         slots, True)
    column_list = tuple(
        ColumnResult(k, *column_results[k],
                     int(np.prod(members[k].column.call.output_shape, dtype=np.int64)),
                     tuple(members[k].column.call.output_shape), working.name)
        for k in sorted(columns))
    return XlaGroup(ctypes.cast(function, ctypes.c_void_p).value,
                    (meta, ints, doubles, integers, fills), ordered, tuple(results),
                    tuple(delivered[k] for k in sorted(delivered)), column_list, layout)


def _dense_copy_of(array, given, working) -> bool:
    """Whether the kernel's buffer ``array`` holds ``given``'s elements in row-major
    order (itself, reshaped, or converted to the working dtype), as XLA's dense
    operand of ``given`` cast to ``working`` does."""
    if not isinstance(given, np.ndarray) or not isinstance(array, np.ndarray) or \
            not array.flags.c_contiguous or array.dtype != working or \
            array.size != given.size:
        return False
    if array.ctypes.data == given.ctypes.data:
        return True
    return given.dtype != working and array.shape == given.shape


__all__ = ["ColumnResult", "Declined", "Delivered", "Operand", "XlaGroup", "trampoline",
           "xla_group"]
