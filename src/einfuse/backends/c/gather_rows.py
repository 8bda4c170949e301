"""A prepared runner for the embedding form of a gather, ``E[b, d] := W[idx[b], d]`` (any
number of leading indices reading the index array whole, any number of trailing ones
reading whole rows of ``W``), as one fixed C function: per row one test of the index
value and one ``memcpy`` of the row, as ``np.take`` does.

The general prepared gather either tests each index value in the copy loop (which then
does not vectorise) or makes a min/max pass over the index array before a kernel without
tests (a second pass, and after a BLAS call, whose threads still spin, it cost ~37 µs
of a 130 µs gather).  Here the test is once per row, in the same pass; a value out of
bounds raises the error flag and the caller's full path names it.

Whether a call's data takes the copy (dtype, whole extents, contiguous rows), and on how
many threads (one below schedule/row_gather.COPY_PARALLEL_BYTES, as np.take; above it
the threads c_threads.py allows; ``threads=`` obeyed) is the schedule's decision
(schedule/row_gather.py); this module renders and runs the copy it is handed."""

from __future__ import annotations

import ctypes
from typing import Optional, Type

import numpy as np

from ...plan.library_patterns import row_gather  # noqa: F401  (the pattern: plan/)
from ...schedule.row_gather import RowCopy, RowGatherDecision, RowGatherRoute, \
    row_gather_decision
from . import build as c_build, call as c_call
from .threads import free_threads

_SOURCE = """\
#include <stdint.h>
#include <string.h>
#include <omp.h>
/* bufs: table, index values (int64; uint64 ones as their bit patterns), result.
   ints: rows to copy, bytes per row, the table's byte stride between rows, its rows. */
void einfuse_gather_rows(void **bufs, const int64_t *ints, const double *dprm,
                         const int64_t *iprm, const double *fills, int nthreads,
                         int32_t *err) {
  const char *table = (const char *)bufs[0];
  const int64_t *where = (const int64_t *)bufs[1];
  char *out = (char *)bufs[2];
  const int64_t n = ints[0], width = ints[1], stride = ints[2];
  const uint64_t rows = (uint64_t)ints[3];
  (void)dprm; (void)iprm; (void)fills;
  if (nthreads == 1) {
    for (int64_t r = 0; r < n; ++r) {
      /* one test for both ends: a negative value is a large unsigned one */
      const uint64_t g = (uint64_t)where[r];
      if (g >= rows) { *err = 1; return; }
      memcpy(out + r * width, table + (int64_t)g * stride, (size_t)width);
    }
    return;
  }
  int32_t bad = 0;
  #pragma omp parallel for schedule(static) reduction(|:bad) \\
      num_threads(nthreads > 0 ? nthreads : omp_get_max_threads())
  for (int64_t r = 0; r < n; ++r) {
    const uint64_t g = (uint64_t)where[r];
    if (g >= rows) { bad = 1; continue; }
    memcpy(out + r * width, table + (int64_t)g * stride, (size_t)width);
  }
  if (bad) *err = 1;
}
"""


def gather_rows_runner(call, flagged: Type[Exception],
                       decision: Optional[RowGatherDecision] = None):
    """``run(named)`` copying the rows for arrays of this call's signature (raising
    ``flagged`` for an index value out of bounds), for a call the schedule gave this
    kernel (schedule/library.py: the embedding form, bounds check/promise, no pad=);
    None where the schedule's decision for the signature (``decision``, else
    schedule/row_gather.row_gather_decision's, asked once per signature: a prepared
    runner is built once) is the generic prepared kernel."""
    if decision is None:
        decision = row_gather_decision(call)
    if decision.route is not RowGatherRoute.COPY_ROWS:
        return None
    return copy_runner(decision.copy, flagged)


def copy_runner(copy: RowCopy, flagged: Type[Exception]):
    """The runner of one decided row copy."""
    ints = np.array([copy.rows, copy.width, copy.row_stride, copy.table_rows],
                    dtype=np.int64)
    function = c_build.load(_SOURCE).einfuse_gather_rows
    return _runner(function, ints, copy.table, copy.index, copy.shape, copy.dtype,
                   copy.threads, flagged)


def _runner(function, ints, table_name, index_name, shape, dtype, threads, flagged):
    call_kernel = c_call.caller()
    fixed = threads or 0
    int64 = np.dtype(np.int64)
    empty = np.empty

    def index_of(named):
        where = named[index_name]
        if where.dtype != int64 or not where.flags.c_contiguous:
            # (uint64 values keep their bits: the kernel's test refuses them as negative)
            where = np.ascontiguousarray(where).astype(int64, copy=False)
        return where

    if call_kernel is not None:
        entry = ctypes.cast(function, ctypes.c_void_p).value
        given = (ints.ctypes.data, 0, 0, 0)

        def run(named):
            out = empty(shape, dtype)
            if call_kernel(entry, (named[table_name], index_of(named), out), *given,
                           fixed if threads else free_threads()):
                raise flagged(f"{index_name}: an index value out of bounds")
            return out
        run.keep = (ints, function)
        return run

    function.restype = None

    def run_ctypes(named):
        out = empty(shape, dtype)
        where = index_of(named)
        table = named[table_name]
        pointers = (ctypes.c_void_p * 3)(table.ctypes.data, where.ctypes.data,
                                         out.ctypes.data)
        error = ctypes.c_int32(0)
        function(pointers, ctypes.c_void_p(ints.ctypes.data), None, None, None,
                 fixed if threads else free_threads(), ctypes.byref(error))
        if error.value:
            raise flagged(f"{index_name}: an index value out of bounds")
        return out
    run_ctypes.keep = (ints, function)
    return run_ctypes
