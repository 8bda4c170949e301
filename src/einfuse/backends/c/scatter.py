"""Row scatter-add, ``target[where[n], :] += rows[n, :]``, as one fixed C kernel, and
any other scatter-add of a gradient (:func:`scatter_flat`) as a serial compiled loop.

The gradient of a gather (``dW[idx[b], d] += dE[b, d]``) adds rows that may collide.
Threads split the columns, not the rows, so no two threads ever write the same element
(no atomics), and each element receives its rows in index order: the result is
deterministic, in float32 as in float64.  Without a compiler a sort-and-reduce in NumPy
does the same job."""

from __future__ import annotations

import ctypes

import numpy as np

from ...analysis.frameworks import NUMPY
from ...schedule.library import kernel_route
from ...schedule.schedule import Library
from ...schedule.scatter_kernels import ScatterRoute
from . import build as c_build

_SOURCE = """\
#include <stdint.h>
#include <omp.h>
#define SCATTER(NAME, T) \\
void NAME(T *target, const T *rows, const int64_t *where, int64_t n, int64_t width, \\
          int nthreads) { \\
  int64_t block = 256; \\
  int64_t blocks = (width + block - 1) / block; \\
  int nth = nthreads > 0 ? nthreads : omp_get_max_threads(); \\
  if (blocks < nth) { block = (width + nth - 1) / nth; blocks = (width + block - 1) / block; } \\
  _Pragma("omp parallel for schedule(static) num_threads(nth)") \\
  for (int64_t c = 0; c < blocks; ++c) { \\
    int64_t start = c * block, stop = start + block < width ? start + block : width; \\
    for (int64_t r = 0; r < n; ++r) { \\
      T *out = target + where[r] * width; \\
      const T *in = rows + r * width; \\
      _Pragma("omp simd") \\
      for (int64_t k = start; k < stop; ++k) out[k] += in[k]; \\
    } \\
  } \\
}
SCATTER(einfuse_scatter_rows_f32, float)
SCATTER(einfuse_scatter_rows_f64, double)
#define SCATTER_FLAT(NAME, T) \
void NAME(T *target, const T *values, const int64_t *where, int64_t n) { \
  for (int64_t k = 0; k < n; ++k) target[where[k]] += values[k]; \
}
SCATTER_FLAT(einfuse_scatter_flat_f32, float)
SCATTER_FLAT(einfuse_scatter_flat_f64, double)
"""

_KINDS = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


def rows_route(target: np.ndarray, rows: np.ndarray):
    """The route (schedule/scatter_kernels.py) :func:`scatter_rows` takes for arrays
    like these: it depends on the target's dtype and layout and the rows' size only."""
    return kernel_route(Library.SCATTER_ROWS, NUMPY, target.dtype, rows.size,
                        contiguous=target.flags.c_contiguous)


def scatter_rows(target: np.ndarray, rows: np.ndarray, where: np.ndarray,
                 route=None) -> None:
    """``target[where[n]] += rows[n]`` for 2-D ``target`` and ``rows`` (same width);
    ``where`` must already be in range.  ``route``: the decision of :func:`rows_route`
    for arrays like these, where the caller made it once (else made here)."""
    if rows.size == 0:
        return
    if route is None:
        route = rows_route(target, rows)
    if route.route is not ScatterRoute.COMPILED:
        _scatter_rows_numpy(target, rows, where)
        return
    kind = _KINDS[target.dtype]
    rows = np.ascontiguousarray(rows, dtype=target.dtype)
    where = np.ascontiguousarray(where, dtype=np.int64)
    function = getattr(c_build.load(_SOURCE), f"einfuse_scatter_rows_{kind}")
    function.restype = None
    function(ctypes.c_void_p(target.ctypes.data), ctypes.c_void_p(rows.ctypes.data),
             ctypes.c_void_p(where.ctypes.data), ctypes.c_int64(rows.shape[0]),
             ctypes.c_int64(rows.shape[1]), ctypes.c_int(0))


def flat_route(target: np.ndarray, values: np.ndarray):
    """The route (schedule/scatter_kernels.py) :func:`scatter_flat` takes for arrays
    like these: their dtypes, the target's layout and the values' size only."""
    return kernel_route(Library.SCATTER_ADD, NUMPY, target.dtype, values.size,
                        contiguous=target.flags.c_contiguous,
                        writeable=target.flags.writeable, values_dtype=values.dtype)


def scatter_flat(target: np.ndarray, positions, values: np.ndarray, route=None) -> bool:
    """``np.add.at(target, positions, values)`` (``positions`` a tuple of in-range
    integer arrays of ``values``' shape, one per axis of ``target``) as one compiled
    loop over the values in their order, which is np.add.at's: the same bits.  False
    (nothing done) where its route (schedule/scatter_kernels.py) is not the compiled
    one: not float32/float64, values of another dtype (np.add.at would round their
    sum differently), not C-contiguous or read-only, no values, no compiler.
    ``route``: :func:`flat_route`'s decision for arrays like these, where the caller
    made it once (else made here)."""
    if (route or flat_route(target, values)).route is not ScatterRoute.COMPILED:
        return False
    kind = _KINDS[target.dtype]
    flat = np.ravel_multi_index(tuple(np.asarray(p, dtype=np.int64) for p in positions),
                                target.shape) if target.ndim else \
        np.zeros(values.shape, np.int64)
    flat = np.ascontiguousarray(flat, dtype=np.int64).reshape(-1)
    values = np.ascontiguousarray(values).reshape(-1)
    function = getattr(c_build.load(_SOURCE), f"einfuse_scatter_flat_{kind}")
    function.restype = None
    function(ctypes.c_void_p(target.ctypes.data), ctypes.c_void_p(values.ctypes.data),
             ctypes.c_void_p(flat.ctypes.data), ctypes.c_int64(flat.size))
    return True


def _scatter_rows_numpy(target: np.ndarray, rows: np.ndarray, where: np.ndarray) -> None:
    order = np.argsort(where, kind="stable")
    where = where[order]
    starts = np.flatnonzero(np.r_[True, where[1:] != where[:-1]])
    grouped = rows[order]
    sums = grouped if len(starts) == len(where) else np.add.reduceat(grouped, starts, axis=0)
    target[where[starts]] += sums
