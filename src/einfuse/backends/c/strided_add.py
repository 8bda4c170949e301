"""``view += values`` for a strided view of a C-contiguous NumPy array whose points never
share an address (autodiff/strided_scatter.py decides that), as one fixed C kernel.

NumPy iterates such a view with its innermost axis in the values' order: for 2x2
pooling that axis has 2 elements, and the add of a 64x128x128 gradient took 9-15 ms
where memory bandwidth allows about 1 ms.  Here the axes are put in the target's memory
order and merged where both sides allow, so the innermost loops run along the target's
rows; threads split the outer rows (no two points share an address, so no two threads
write one element).  Each element receives exactly one IEEE addition in the target's
dtype, as with NumPy's ``+=``: the result is bit for bit NumPy's."""

from __future__ import annotations

import ctypes
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ...analysis.frameworks import NUMPY
from ...schedule.library import kernel_route
from ...schedule.schedule import Library
from ...schedule.scatter_kernels import CAPABILITIES, ScatterKernel, ScatterRoute
from . import build as c_build
from .threads import thread_count

_SOURCE = """\
/* INNER: the innermost extent where it is fixed (unrolled and vectorised across the
   next axis), 0 where it is read from shape[] */
#define INNER @INNER@
#include <stdint.h>
#include <omp.h>
/* target[offset + sum_k i_k * ts[k]] += values[sum_k i_k * vs[k]] over the box shape[];
   rank >= 2; the last two axes are the inner loops, the others are recovered from the
   row number */
#define STRIDED_ADD(NAME, T) \\
void NAME(T *target, const T *values, int64_t rank, const int64_t *shape, \\
          const int64_t *ts, const int64_t *vs, int nthreads) { \\
  int64_t rows = 1; \\
  for (int64_t k = 0; k < rank - 2; ++k) rows *= shape[k]; \\
  const int64_t n1 = shape[rank - 2], n2 = INNER ? INNER : shape[rank - 1]; \\
  const int64_t t1 = ts[rank - 2], t2 = ts[rank - 1]; \\
  const int64_t v1 = vs[rank - 2], v2 = vs[rank - 1]; \\
  int nth = nthreads > 0 ? nthreads : omp_get_max_threads(); \\
  _Pragma("omp parallel for schedule(static) num_threads(nth)") \\
  for (int64_t r = 0; r < rows; ++r) { \\
    int64_t rest = r, to = 0, vo = 0; \\
    for (int64_t k = rank - 3; k >= 0; --k) { \\
      int64_t i = rest % shape[k]; rest /= shape[k]; \\
      to += i * ts[k]; vo += i * vs[k]; \\
    } \\
    for (int64_t a = 0; a < n1; ++a) { \\
      T *out = target + to + a * t1; \\
      const T *in = values + vo + a * v1; \\
      if (t2 == 1 && v2 == 1) { \\
        _Pragma("omp simd") \\
        for (int64_t b = 0; b < n2; ++b) out[b] += in[b]; \\
      } else { \\
        for (int64_t b = 0; b < n2; ++b) out[b * t2] += in[b * v2]; \\
      } \\
    } \\
  } \\
}
STRIDED_ADD(einfuse_strided_add_f32, float)
STRIDED_ADD(einfuse_strided_add_f64, double)
"""

# Innermost extents up to this are compiled in (one library per extent): pooling's
# innermost axis has 2 elements, and a loop of 2 iterations costs more than its adds.
FIXED_INNER = 8

# Below this many elements NumPy's own add is as fast and needs no compiler (the
# kernel's declared capability, schedule/scatter_kernels.py).
MIN_ELEMENTS = CAPABILITIES[ScatterKernel.STRIDED_ADD].min_elements

_KINDS = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


def merged_axes(shape: Sequence[int], target_steps: Sequence[int],
                value_steps: Sequence[int]) -> List[Tuple[int, int, int]]:
    """(extent, target step, value step) per axis, in the target's memory order (largest
    step first), axes of one element dropped and neighbours merged where both arrays
    step through them as one axis; at least two axes (leading ones of one element)."""
    axes = sorted(((n, t, v) for n, t, v in zip(shape, target_steps, value_steps) if n > 1),
                  key=lambda axis: -axis[1])
    merged: List[Tuple[int, int, int]] = []
    for n, t, v in axes:
        if merged:
            n0, t0, v0 = merged[-1]
            if t0 == t * n and v0 == v * n:
                merged[-1] = (n0 * n, t, v)
                continue
        merged.append((n, t, v))
    while len(merged) < 2:
        merged.insert(0, (1, 0, 0))
    return merged


def strided_add(target: np.ndarray, offset: int, shape: Sequence[int],
                steps: Sequence[int], values: np.ndarray) -> bool:
    """``target``'s view (``shape``, ``steps`` and ``offset`` in elements) plus
    ``values`` in place, in C; False (nothing done) where its route
    (schedule/scatter_kernels.py) is not the compiled one: a dtype other than
    float32/float64, a small view, a non-contiguous or read-only target, no compiler
    (or values not of the view's shape).  The caller guarantees the view is in bounds
    and never repeats an address."""
    size = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    if tuple(values.shape) != tuple(shape) or kernel_route(
            Library.STRIDED_ADD, NUMPY, target.dtype, size,
            contiguous=target.flags.c_contiguous,
            writeable=target.flags.writeable).route is not ScatterRoute.COMPILED:
        return False
    kind = _KINDS[target.dtype]
    values = np.ascontiguousarray(values, dtype=target.dtype)
    value_steps = _contiguous_steps(shape)
    axes = merged_axes(shape, steps, value_steps)
    columns = [np.array(column, dtype=np.int64) for column in zip(*axes)]
    inner = axes[-1][0]
    function = _function(kind, inner if inner <= FIXED_INNER else 0)
    address = target.ctypes.data + offset * target.itemsize
    rows = int(np.prod([axis[0] for axis in axes[:-2]], dtype=np.int64))
    function(ctypes.c_void_p(address), ctypes.c_void_p(values.ctypes.data),
             ctypes.c_int64(len(axes)), *(ctypes.c_void_p(c.ctypes.data) for c in columns),
             ctypes.c_int(thread_count(None, size if rows > 1 else 0)))
    return True


def _contiguous_steps(shape: Sequence[int]) -> Tuple[int, ...]:
    steps, step = [], 1
    for n in reversed(shape):
        steps.append(step)
        step *= n
    return tuple(reversed(steps))


def _function(kind: str, inner: int) -> Optional[ctypes._CFuncPtr]:
    source = _SOURCE.replace("@INNER@", str(int(inner)))
    function = getattr(c_build.load(source), f"einfuse_strided_add_{kind}")
    function.restype = None
    return function
