"""Whether a call the schedule gave the row gather (schedule/library.py's
Library.GATHER_ROWS: the embedding form ``E[b, d] := W[idx[b], d]``) is copied row by
row by backends/c/gather_rows.py, decided here from its signature's facts (dtypes, the
output's extents, the table's strides, whether a C compiler is there), and what the
copy is: rows, bytes per row, the table's row stride, threads.  The backend only runs
the :class:`RowCopy` it is handed; an index value out of bounds is a value check the
kernel makes per row (it raises its flag), not a route.

The kernel's capability is data (:data:`CAPABILITY`); where the data needs more than a
copy the decision is LOOP_NEST with the reason: the generic prepared kernel runs."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from ..analysis.capabilities import can_build
from ..plan.library_patterns import row_gather

# From this many bytes copied (4 MiB), the rows are shared among threads: a copy is
# memory-bound, and below it 2 threads were 2-3x slower for a 2 MiB gather when the
# other core was busy (e.g. with the spinning threads of a BLAS call just before); a
# quiet 16 MiB gather took 1.7-2.0 ms on 2 threads, 2.2-3.0 ms on 1.
COPY_PARALLEL_BYTES = 1 << 22


class RowGatherRoute(enum.Enum):
    COPY_ROWS = "one index test and one memcpy per row (backends/c/gather_rows.py)"
    LOOP_NEST = "the generic prepared kernel"


@dataclass(frozen=True)
class RowGatherCapability:
    """What the row copy takes: the result of the table's own dtype (no conversion; no
    object arrays), integer index values, the output's extents the whole index array
    by whole rows (no window), rows whose trailing axes are contiguous (one memcpy a
    row), something to copy, a C compiler."""
    index_kinds: str = "iu"
    same_dtype: bool = True
    whole_extents: bool = True
    contiguous_rows: bool = True
    nonempty: bool = True


CAPABILITY = RowGatherCapability()


@dataclass(frozen=True)
class RowCopy:
    """What the copy does: ``rows`` rows of ``width`` bytes from ``table`` (rows
    ``row_stride`` bytes apart, ``table_rows`` of them) at the positions ``index``
    holds, into a new ``shape`` array of ``dtype``; ``threads`` fixed (None: as many as
    are free, c_threads.py)."""
    table: str
    index: str
    shape: Tuple[int, ...]
    dtype: np.dtype
    rows: int
    width: int
    row_stride: int
    table_rows: int
    threads: Optional[int]


@dataclass(frozen=True)
class RowGatherDecision:
    route: RowGatherRoute
    copy: Optional[RowCopy] = None
    reason: Optional[str] = None


def _loop_nest(reason: str) -> RowGatherDecision:
    return RowGatherDecision(RowGatherRoute.LOOP_NEST, reason=reason)


def row_gather_decision(call) -> RowGatherDecision:
    """The route of ``call``'s prepared repeat (a bound call whose arrays are the
    signature's: shapes, dtypes, strides), COPY_ROWS with its copy where the capability
    takes the data, else LOOP_NEST and the first fact it does not take."""
    found = row_gather(call.spec)
    if found is None:
        return _loop_nest("not the embedding form of a gather")
    table_name, index_name = found
    arrays = call.arrays
    table_shape = tuple(arrays.shapes[table_name])
    index_shape = tuple(arrays.shapes[index_name])
    table_dtype = np.dtype(arrays.dtypes[table_name])
    # (the kernel's output buffer: int64 for positions, else the working dtype)
    result = np.dtype(np.int64) if call.spec.result_is_position else \
        np.dtype(call.dtypes.working)
    ranges = call.bounds.range_map
    extents = tuple(ranges[name] for name in call.spec.output_indices)
    if CAPABILITY.same_dtype and (result != table_dtype or table_dtype.hasobject):
        return _loop_nest(f"a {result.name} result from a {table_dtype.name} table")
    if CAPABILITY.whole_extents and \
            extents != tuple((0, n) for n in index_shape + table_shape[1:]):
        return _loop_nest("a window of the rows")
    index_dtype = np.dtype(arrays.dtypes[index_name])
    if index_dtype.kind not in CAPABILITY.index_kinds:
        return _loop_nest(f"{index_dtype.name} index values")
    strides = arrays[table_name].strides
    item = table_dtype.itemsize
    expected = item
    for size, stride in reversed(list(zip(table_shape[1:], strides[1:]))):
        if size > 1 and stride != expected:
            if CAPABILITY.contiguous_rows:
                return _loop_nest("rows that are not contiguous")
        expected *= size
    rows = int(np.prod(index_shape, dtype=np.int64))
    width = expected
    if CAPABILITY.nonempty and rows * width == 0:
        return _loop_nest("nothing to copy")
    if not can_build("c"):
        return _loop_nest("no C compiler")
    threads = call.options.threads or (1 if rows * width < COPY_PARALLEL_BYTES else None)
    return RowGatherDecision(RowGatherRoute.COPY_ROWS, RowCopy(
        table_name, index_name, index_shape + table_shape[1:], table_dtype, rows, width,
        int(strides[0]), int(table_shape[0]), threads))
