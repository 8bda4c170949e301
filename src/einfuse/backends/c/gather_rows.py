"""A prepared runner for the embedding form of a gather, ``E[b, d] := W[idx[b], d]`` (any
number of leading indices reading the index array whole, any number of trailing ones
reading whole rows of ``W``), as one fixed C function: per row one test of the index
value and one ``memcpy`` of the row, as ``np.take`` does.

The general prepared gather either tests each index value in the copy loop (which then
does not vectorise) or makes a min/max pass over the index array before a kernel without
tests (a second pass, and after a BLAS call, whose threads still spin, it cost ~37 µs
of a 130 µs gather).  Here the test is once per row, in the same pass; a value out of
bounds raises the error flag and the caller's full path names it.

A copy is memory-bound: below COPY_PARALLEL_BYTES it runs on the calling thread, as
np.take does (2 threads were 2-3x slower for a 2 MiB gather when the other core was busy,
e.g. with the spinning threads of a BLAS call just before); above it the rows are shared
among the threads c_threads.py allows (a quiet 16 MiB gather: 1.7-2.0 ms on 2 threads,
2.2-3.0 ms on 1), and ``threads=`` is obeyed."""

from __future__ import annotations

import ctypes
from typing import Optional, Tuple, Type

import numpy as np

from ...plan.library_patterns import row_gather  # noqa: F401  (the pattern: plan/)
from . import build as c_build, call as c_call
from .threads import free_threads

# From this many bytes copied (4 MiB), the rows are shared among threads.
COPY_PARALLEL_BYTES = 1 << 22

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


def gather_rows_runner(call, flagged: Type[Exception]):
    """``run(named)`` copying the rows for arrays of this call's signature (raising
    ``flagged`` for an index value out of bounds), for a call the schedule gave this
    kernel (schedule/library.py: the embedding form, bounds check/promise, no pad=);
    None where the data needs more than a copy (a dtype conversion, a window, rows not
    contiguous) or there is no compiler: the generic prepared kernel then."""
    found = row_gather(call.spec)
    if found is None or c_build.find_compiler() is None:
        return None
    table_name, index_name = found
    arrays = call.arrays
    table_shape, index_shape = tuple(arrays.shapes[table_name]), tuple(arrays.shapes[index_name])
    table_dtype = np.dtype(arrays.dtypes[table_name])
    from .backend import output_dtype
    ranges = call.bounds.range_map
    names = call.spec.output_indices
    extents = tuple(ranges[name] for name in names)
    if output_dtype(call) != table_dtype or table_dtype.hasobject or \
            extents != tuple((0, n) for n in index_shape + table_shape[1:]) or \
            np.dtype(arrays.dtypes[index_name]).kind not in "iu":
        return None
    table = arrays[table_name]
    item = table_dtype.itemsize
    # the trailing axes of each row must be contiguous (one memcpy a row)
    expected = item
    for size, stride in reversed(list(zip(table_shape[1:], table.strides[1:]))):
        if size > 1 and stride != expected:
            return None
        expected *= size
    shape = index_shape + table_shape[1:]
    rows, width = int(np.prod(index_shape, dtype=np.int64)), expected
    if rows * width == 0:
        return None
    ints = np.array([rows, width, table.strides[0], table_shape[0]], dtype=np.int64)
    function = c_build.load(_SOURCE).einfuse_gather_rows
    threads = call.options.threads or (1 if rows * width < COPY_PARALLEL_BYTES else None)
    return _runner(function, ints, table_name, index_name, shape, table_dtype, threads,
                   flagged)


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
