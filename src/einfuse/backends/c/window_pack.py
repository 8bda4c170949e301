"""The two copies a windowed contraction pays around its GEMMs, as fixed C kernels:

* :func:`pack_window`: a strided window view of an array (im2col's patches) copied into
  a fresh C-contiguous array, the reads that fall outside the array given the pad value
  -- no padded copy of the array first.  On a conv2d 8x16x64x64 (stride 2, pad 1) the
  NumPy form (np.zeros + the padded copy + a strided copy of 1.2 M elements) took
  0.6 ms of a 0.8 ms torch convolution.
* :func:`add_window`: ``target[view] += values`` for a view of the target whose points
  never repeat an address (one window offset of col2im), the values read with any
  steps (a GEMM's product as it lies) and points outside the target dropped (they were
  padded reads).  Each element receives one IEEE addition, as with NumPy's ``+=``; on
  one thread, rows of step 2 (a stride-2 col2im) are added with whole vectors, the
  elements between the points blended back as they were.

Both walk the view as rows of its last axis: per row the array coordinates of its first
point and the stretch of the row inside the array are found once (the bounds are linear
in the row's index), and the inner loop copies or adds without tests."""

from __future__ import annotations

import ctypes
import math
import threading
from typing import List, Optional, Sequence, Tuple

import numpy as np

from . import build as c_build
from .threads import thread_count

_SOURCE = """\
#include <stdint.h>
#include <string.h>
#include <omp.h>
#define MAX_AXES 16
/* The stretch [*lo, *hi) of positions t (0 <= t < n) at which every array coordinate
   base[a] + t * step[a] of the axes that ``step`` moves lies in 0 .. size[a] - 1. */
static void stretch(int64_t naxes, const int64_t *base, const int64_t *step,
                    const int64_t *size, int64_t n, int64_t *lo, int64_t *hi) {
  int64_t first = 0, last = n;        /* last: exclusive */
  for (int64_t a = 0; a < naxes; ++a) {
    int64_t b = base[a], d = step[a], m = size[a];
    if (d > 0) {
      /* b + t d >= 0 <=> t >= ceil(-b / d);  b + t d <= m - 1 <=> t <= floor((m-1-b) / d) */
      int64_t f = b >= 0 ? 0 : (-b + d - 1) / d;
      int64_t l = (m - 1 - b) < 0 ? -1 : (m - 1 - b) / d;
      if (f > first) first = f;
      if (l + 1 < last) last = l + 1;
    } else if (d < 0) {
      int64_t e = -d;   /* b - t e <= m - 1 <=> t >= ceil((b-m+1) / e); b - t e >= 0 <=> t <= b / e */
      int64_t f = (b - m + 1) <= 0 ? 0 : (b - m + 1 + e - 1) / e;
      int64_t l = b < 0 ? -1 : b / e;
      if (f > first) first = f;
      if (l + 1 < last) last = l + 1;
    }
  }
  if (last < first) last = first;
  *lo = first; *hi = last;
}

/* Whether the coordinates of the axes that neither inner axis moves are inside. */
static int fixed_inside(int64_t naxes, const int64_t *base, const int64_t *s1,
                        const int64_t *s2, const int64_t *size) {
  for (int64_t a = 0; a < naxes; ++a)
    if (s1[a] == 0 && s2[a] == 0 && (base[a] < 0 || base[a] >= size[a])) return 0;
  return 1;
}

/* The view is walked as blocks of its last two axes (rows, then the inner axis); the
   caller makes sure no array axis is moved by both (it adds a unit row axis where one
   is), so that the points inside the array form a rectangle [lo1, hi1) x [lo2, hi2) of
   the block, found once per block.  blocks: this thread's share, first block r0, by an
   odometer over the outer axes (no division per block). */
typedef struct {
  int64_t idx[MAX_AXES], base[MAX_AXES];
} Walk;

static void walk_start(Walk *w, int64_t r, int64_t outer, const int64_t *shape,
                       int64_t naxes, const int64_t *coef, const int64_t *origin) {
  for (int64_t a = 0; a < naxes; ++a) w->base[a] = origin[a];
  for (int64_t k = outer - 1; k >= 0; --k) {
    int64_t i = r % shape[k]; r /= shape[k];
    w->idx[k] = i;
    for (int64_t a = 0; a < naxes; ++a) w->base[a] += i * coef[k * naxes + a];
  }
}

static void walk_next(Walk *w, int64_t outer, const int64_t *shape, int64_t naxes,
                      const int64_t *coef) {
  for (int64_t k = outer - 1; k >= 0; --k) {
    const int64_t *c = coef + k * naxes;
    if (++w->idx[k] < shape[k]) {
      for (int64_t a = 0; a < naxes; ++a) w->base[a] += c[a];
      return;
    }
    w->idx[k] = 0;
    for (int64_t a = 0; a < naxes; ++a) w->base[a] -= (shape[k] - 1) * c[a];
  }
}

static int64_t offset_of(const int64_t *base, int64_t naxes, const int64_t *strides) {
  int64_t at = 0;
  for (int64_t a = 0; a < naxes; ++a) at += base[a] * strides[a];
  return at;
}

static int64_t dot(const int64_t *c, int64_t naxes, const int64_t *strides) {
  return offset_of(c, naxes, strides);
}

/* this thread's share [*r0, *r1) of `blocks`, in whole runs of `group` blocks */
static void share(int64_t blocks, int64_t group, int64_t *r0, int64_t *r1) {
  int64_t nth = omp_get_num_threads(), me = omp_get_thread_num();
  int64_t runs = blocks / group;
  int64_t each = runs / nth, extra = runs % nth;
  *r0 = (me * each + (me < extra ? me : extra)) * group;
  *r1 = *r0 + (each + (me < extra)) * group;
}

/* out[2 t] += in[t] for lo <= t < hi, as the scalar loop (one IEEE addition each), but
   with whole vectors of ``out``: the points between (out[2 t + 1]) are loaded and
   stored back unchanged (a blend, so their bits stay), which only one thread may do --
   another block's points may lie there -- and only in a C-contiguous target (they are
   its own elements).  The vectors stop before the last point, so
   every element touched lies between two points of the row, inside the array. */
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
static void add_every_other_f32(float *out, const float *in, int64_t lo, int64_t hi) {
  int64_t t = lo;
#if defined(__AVX512F__)
  const __m512i low = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i high = _mm512_add_epi32(low, _mm512_set1_epi32(8));
  for (; t + 16 < hi; t += 16) {
    __m512 v = _mm512_loadu_ps(in + t);
    __m512 o0 = _mm512_loadu_ps(out + 2 * t), o1 = _mm512_loadu_ps(out + 2 * t + 16);
    o0 = _mm512_mask_add_ps(o0, 0x5555, o0, _mm512_permutexvar_ps(low, v));
    o1 = _mm512_mask_add_ps(o1, 0x5555, o1, _mm512_permutexvar_ps(high, v));
    _mm512_storeu_ps(out + 2 * t, o0); _mm512_storeu_ps(out + 2 * t + 16, o1);
  }
  if (t < hi) {   /* the last 1..16 points: masked, so nothing past the last point */
    const int64_t n = hi - t;
    const uint32_t lanes = (uint32_t)(2 * n - 1) >= 32 ? 0xFFFFFFFFu : (1u << (2 * n - 1)) - 1;
    const __mmask16 m0 = (__mmask16)(lanes & 0xFFFF), m1 = (__mmask16)(lanes >> 16);
    __m512 v = _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), in + t);
    __m512 o0 = _mm512_maskz_loadu_ps(m0, out + 2 * t);
    __m512 o1 = _mm512_maskz_loadu_ps(m1, out + 2 * t + 16);
    o0 = _mm512_mask_add_ps(o0, 0x5555, o0, _mm512_permutexvar_ps(low, v));
    o1 = _mm512_mask_add_ps(o1, 0x5555, o1, _mm512_permutexvar_ps(high, v));
    _mm512_mask_storeu_ps(out + 2 * t, m0, o0);
    _mm512_mask_storeu_ps(out + 2 * t + 16, m1, o1);
    t = hi;
  }
#elif defined(__AVX2__)
  const __m256i low = _mm256_set_epi32(3, 3, 2, 2, 1, 1, 0, 0);
  const __m256i high = _mm256_set_epi32(7, 7, 6, 6, 5, 5, 4, 4);
  for (; t + 8 < hi; t += 8) {
    __m256 v = _mm256_loadu_ps(in + t);
    __m256 o0 = _mm256_loadu_ps(out + 2 * t), o1 = _mm256_loadu_ps(out + 2 * t + 8);
    o0 = _mm256_blend_ps(o0, _mm256_add_ps(o0, _mm256_permutevar8x32_ps(v, low)), 0x55);
    o1 = _mm256_blend_ps(o1, _mm256_add_ps(o1, _mm256_permutevar8x32_ps(v, high)), 0x55);
    _mm256_storeu_ps(out + 2 * t, o0); _mm256_storeu_ps(out + 2 * t + 8, o1);
  }
#endif
  for (; t < hi; ++t) out[2 * t] += in[t];
}

static void add_every_other_f64(double *out, const double *in, int64_t lo, int64_t hi) {
  int64_t t = lo;
#if defined(__AVX512F__)
  const __m512i low = _mm512_set_epi64(3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i high = _mm512_set_epi64(7, 7, 6, 6, 5, 5, 4, 4);
  for (; t + 8 < hi; t += 8) {
    __m512d v = _mm512_loadu_pd(in + t);
    __m512d o0 = _mm512_loadu_pd(out + 2 * t), o1 = _mm512_loadu_pd(out + 2 * t + 8);
    o0 = _mm512_mask_add_pd(o0, 0x55, o0, _mm512_permutexvar_pd(low, v));
    o1 = _mm512_mask_add_pd(o1, 0x55, o1, _mm512_permutexvar_pd(high, v));
    _mm512_storeu_pd(out + 2 * t, o0); _mm512_storeu_pd(out + 2 * t + 8, o1);
  }
  if (t < hi) {   /* the last 1..8 points, masked */
    const int64_t n = hi - t;
    const uint32_t lanes = (1u << (2 * n - 1)) - 1;
    const __mmask8 m0 = (__mmask8)(lanes & 0xFF), m1 = (__mmask8)(lanes >> 8);
    __m512d v = _mm512_maskz_loadu_pd((__mmask8)((1u << n) - 1), in + t);
    __m512d o0 = _mm512_maskz_loadu_pd(m0, out + 2 * t);
    __m512d o1 = _mm512_maskz_loadu_pd(m1, out + 2 * t + 8);
    o0 = _mm512_mask_add_pd(o0, 0x55, o0, _mm512_permutexvar_pd(low, v));
    o1 = _mm512_mask_add_pd(o1, 0x55, o1, _mm512_permutexvar_pd(high, v));
    _mm512_mask_storeu_pd(out + 2 * t, m0, o0);
    _mm512_mask_storeu_pd(out + 2 * t + 8, m1, o1);
    t = hi;
  }
#endif
  /* (no AVX2 form: with 4 doubles a vector, the blends and the scalar tail of a
     32-point row measured 10% slower than this loop) */
  for (; t < hi; ++t) out[2 * t] += in[t];
}

/* out[t] = row[t * step] for lo <= t < hi, step 1 or 2 (a stride-1 or stride-2 row of
   im2col's patches or of a panel): whole vectors with the last one overlapping the one
   before (its stores repeat values already written), so that a row of 31 or 32 points
   runs no scalar tail and no memcpy call -- a conv2d's rows are that short, and the
   per-row tail and call were most of the pack's time (a stride-2 pack of 1.2 M elements
   in rows of 32: 0.44 ms by the compiler's loop with its scalar tail).  Every load lies
   between row[lo * step] and row[(hi - 1) * step]: between two points of the row, so
   inside the array (the stretch checked both ends). */
static inline void copy_row_f32(float *out, const float *row, int64_t lo, int64_t hi,
                                int64_t step) {
  int64_t t = lo;
#if defined(__AVX2__)
  if (step == 1 && hi - lo >= 8) {
    for (; t + 8 <= hi; t += 8) _mm256_storeu_ps(out + t, _mm256_loadu_ps(row + t));
    if (t < hi) _mm256_storeu_ps(out + hi - 8, _mm256_loadu_ps(row + hi - 8));
    return;
  }
  if (step == 2 && hi - lo >= 9) {
    /* eight points from sixteen elements row[2t .. 2t+15]: the last, 2t+15, is read
       only while t + 8 < hi (it lies before the next point) */
    for (; t + 8 < hi; t += 8) {
      __m256 a = _mm256_loadu_ps(row + 2 * t), b = _mm256_loadu_ps(row + 2 * t + 8);
      __m256 even = _mm256_shuffle_ps(a, b, 0x88);   /* a0 a2 b0 b2 a4 a6 b4 b6 */
      _mm256_storeu_ps(out + t, _mm256_castpd_ps(
          _mm256_permute4x64_pd(_mm256_castps_pd(even), 0xD8)));
    }
    if (t < hi) {   /* the last eight points, from the elements one before them */
      const float *at = row + 2 * (hi - 8) - 1;
      __m256 a = _mm256_loadu_ps(at), b = _mm256_loadu_ps(at + 8);
      __m256 odd = _mm256_shuffle_ps(a, b, 0xDD);
      _mm256_storeu_ps(out + hi - 8, _mm256_castpd_ps(
          _mm256_permute4x64_pd(_mm256_castps_pd(odd), 0xD8)));
    }
    return;
  }
#endif
  if (step == 1) {
    if (hi > lo) memcpy(out + lo, row + lo, (size_t)(hi - lo) * sizeof(float));
    return;
  }
  for (; t < hi; ++t) out[t] = row[t * step];
}

static inline void copy_row_f64(double *out, const double *row, int64_t lo, int64_t hi,
                                int64_t step) {
  int64_t t = lo;
#if defined(__AVX2__)
  if (step == 1 && hi - lo >= 4) {
    for (; t + 4 <= hi; t += 4) _mm256_storeu_pd(out + t, _mm256_loadu_pd(row + t));
    if (t < hi) _mm256_storeu_pd(out + hi - 4, _mm256_loadu_pd(row + hi - 4));
    return;
  }
  if (step == 2 && hi - lo >= 5) {
    for (; t + 4 < hi; t += 4) {    /* row[2t .. 2t+7], 2t+7 before the next point */
      __m256d a = _mm256_loadu_pd(row + 2 * t), b = _mm256_loadu_pd(row + 2 * t + 4);
      _mm256_storeu_pd(out + t, _mm256_permute4x64_pd(_mm256_unpacklo_pd(a, b), 0xD8));
    }
    if (t < hi) {
      const double *at = row + 2 * (hi - 4) - 1;
      __m256d a = _mm256_loadu_pd(at), b = _mm256_loadu_pd(at + 4);
      _mm256_storeu_pd(out + hi - 4,
                       _mm256_permute4x64_pd(_mm256_unpackhi_pd(a, b), 0xD8));
    }
    return;
  }
#endif
  if (step == 1) {
    if (hi > lo) memcpy(out + lo, row + lo, (size_t)(hi - lo) * sizeof(double));
    return;
  }
  for (; t < hi; ++t) out[t] = row[t * step];
}

#define KERNELS(SUFFIX, T) \\
void einfuse_pack_window_##SUFFIX(const T *src, T *dst, int64_t rank, \\
    const int64_t *shape, int64_t naxes, const int64_t *size, const int64_t *strides, \\
    const int64_t *coef, const int64_t *origin, double fill_value, int nthreads) { \\
  const T fill = (T)fill_value; \\
  const int64_t outer = rank - 2, n1 = shape[rank - 2], n2 = shape[rank - 1]; \\
  int64_t blocks = 1; \\
  for (int64_t k = 0; k < outer; ++k) blocks *= shape[k]; \\
  const int64_t *c1 = coef + outer * naxes, *c2 = c1 + naxes; \\
  const int64_t step1 = dot(c1, naxes, strides), step = dot(c2, naxes, strides); \\
  int nth = nthreads > 0 ? nthreads : omp_get_max_threads(); \\
  _Pragma("omp parallel num_threads(nth)") \\
  { \\
    int64_t r0, r1, lo1, hi1, lo2, hi2; \\
    Walk w; \\
    share(blocks, 1, &r0, &r1); \\
    if (r0 < r1) walk_start(&w, r0, outer, shape, naxes, coef, origin); \\
    for (int64_t r = r0; r < r1; ++r) { \\
      T *out = dst + r * n1 * n2; \\
      if (fixed_inside(naxes, w.base, c1, c2, size)) { \\
        stretch(naxes, w.base, c1, size, n1, &lo1, &hi1); \\
        stretch(naxes, w.base, c2, size, n2, &lo2, &hi2); \\
      } else { lo1 = hi1 = 0; lo2 = hi2 = 0; } \\
      const T *in = src + offset_of(w.base, naxes, strides); \\
      for (int64_t i = 0; i < n1; ++i, out += n2) { \\
        if (i < lo1 || i >= hi1) { \\
          for (int64_t t = 0; t < n2; ++t) out[t] = fill; \\
          continue; \\
        } \\
        const T *row = in + i * step1; \\
        for (int64_t t = 0; t < lo2; ++t) out[t] = fill; \\
        copy_row_##SUFFIX(out, row, lo2, hi2, step); \\
        for (int64_t t = hi2; t < n2; ++t) out[t] = fill; \\
      } \\
      walk_next(&w, outer, shape, naxes, coef); \\
    } \\
  } \\
} \\
/* target[view] += values: the view's points never share an address (the caller \\
   checks), so threads may split the blocks */ \\
void einfuse_add_window_##SUFFIX(T *target, const T *values, int64_t rank, \\
    const int64_t *shape, int64_t naxes, const int64_t *size, const int64_t *strides, \\
    const int64_t *coef, const int64_t *origin, const int64_t *vsteps, int64_t group, int nthreads, \\
    int dense) { \\
  const int64_t outer = rank - 2, n1 = shape[rank - 2], n2 = shape[rank - 1]; \\
  const int64_t v1 = vsteps[rank - 2], vs = vsteps[rank - 1]; \\
  int64_t blocks = 1; \\
  for (int64_t k = 0; k < outer; ++k) blocks *= shape[k]; \\
  const int64_t *c1 = coef + outer * naxes, *c2 = c1 + naxes; \\
  const int64_t step1 = dot(c1, naxes, strides), step = dot(c2, naxes, strides); \\
  int nth = nthreads > 0 ? nthreads : omp_get_max_threads(); \\
  _Pragma("omp parallel num_threads(nth)") \\
  { \\
    int64_t r0, r1, lo1, hi1, lo2, hi2; \\
    Walk w; \\
    /* the whole-vector rows: one thread, and a target whose every element between two \\
       points is its own (C-contiguous) */ \\
    const int alone = dense && omp_get_num_threads() == 1; \\
    share(blocks, group, &r0, &r1); \\
    if (r0 < r1) walk_start(&w, r0, outer, shape, naxes, coef, origin); \\
    for (int64_t r = r0; r < r1; ++r) { \\
      if (fixed_inside(naxes, w.base, c1, c2, size)) { \\
        stretch(naxes, w.base, c1, size, n1, &lo1, &hi1); \\
        stretch(naxes, w.base, c2, size, n2, &lo2, &hi2); \\
        int64_t vo = 0; \\
        for (int64_t k = 0; k < outer; ++k) vo += w.idx[k] * vsteps[k]; \\
        T *at = target + offset_of(w.base, naxes, strides); \\
        for (int64_t i = lo1; i < hi1; ++i) { \\
          T *out = at + i * step1; \\
          const T *in = values + vo + i * v1; \\
          if (step == 1 && vs == 1) { \\
            _Pragma("omp simd") \\
            for (int64_t t = lo2; t < hi2; ++t) out[t] += in[t]; \\
          } else if (step == 2 && vs == 1 && alone) { \\
            add_every_other_##SUFFIX(out, in, lo2, hi2); \\
          } else if (step == 2 && vs == 1) { \\
            for (int64_t t = lo2; t < hi2; ++t) out[2 * t] += in[t]; \\
          } else { \\
            for (int64_t t = lo2; t < hi2; ++t) out[t * step] += in[t * vs]; \\
          } \\
        } \\
      } \\
      walk_next(&w, outer, shape, naxes, coef); \\
    } \\
  } \\
}
KERNELS(f32, float)
KERNELS(f64, double)
"""

_KINDS = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
MAX_AXES = 16

# Below this many elements NumPy's own copy or add is as fast and needs no compiler.
MIN_ELEMENTS = 1 << 12


_FUNCTIONS: dict = {}


def _function(name: str):
    """The kernel, or None where it cannot be built (the callers then copy or add by
    NumPy); looked up once."""
    if name in _FUNCTIONS:
        return _FUNCTIONS[name]
    from .compiler_process import CompileError
    function = None
    if c_build.find_compiler() is not None:
        try:
            function = getattr(c_build.load(_SOURCE), name)
            function.restype = None
        except CompileError:
            function = None
    _FUNCTIONS[name] = function
    return function


def _arguments(*groups) -> Tuple[np.ndarray, List[ctypes.c_void_p]]:
    """The integer arrays the kernels read, in one int64 buffer (one NumPy call, not
    one per array: these calls are made per GEMM operand), and a pointer to each."""
    flat = [int(v) for group in groups for v in group]
    buffer = np.array(flat, dtype=np.int64)
    address, at, pointers = buffer.ctypes.data, 0, []
    for group in groups:
        pointers.append(ctypes.c_void_p(address + 8 * at))
        at += len(group)
    return buffer, pointers


def _usable(array: np.ndarray, shape: Sequence[int], coefficients) -> Optional[str]:
    """The kernel suffix for ``array`` (its dtype), or None where these kernels do not
    take it: another dtype, too few elements, too many axes."""
    kind = _KINDS.get(array.dtype)
    if kind is None or not len(shape) or math.prod(shape) < MIN_ELEMENTS or \
            array.ndim > MAX_AXES or array.ndim == 0 or len(shape) + 1 > MAX_AXES or \
            any(s % array.itemsize for s in array.strides) or \
            len(coefficients) != len(shape):
        return None
    return kind


def _blocks(shape, coefficients, steps=None):
    """The view as the kernels walk it: blocks of its last two axes, no array axis
    moved by both (a unit row axis put in before the last where one is, or where the
    view has one axis)."""
    shape, coefficients = list(shape), [list(c) for c in coefficients]
    steps = None if steps is None else list(steps)
    if len(shape) < 2 or any(a and b for a, b in zip(coefficients[-2], coefficients[-1])):
        shape.insert(len(shape) - 1, 1)
        coefficients.insert(len(coefficients) - 1, [0] * len(coefficients[-1]))
        if steps is not None:
            steps.insert(len(steps) - 1, 0)
    return shape, coefficients, steps


# Packs kept by one PackMemo at most (bytes): past it they are packed again.
MEMO_BYTES = 1 << 28

_ACTIVE = threading.local()       # the PackMemo in force on this thread, if any


class PackMemo:
    """The patch matrices packed while it is in force (:func:`keeping_packs`), kept by
    what they were packed from: the array's memory, layout and dtype and the pack's
    window, so that a later pack of the same view of the same array (a conv's weight
    gradient re-packing the forward's patches) is the kept one.

    Whoever puts it in force answers for the arrays not changing while it lives: a
    torch autograd node keeps one from its forward to its backward, over tensors it has
    saved, whose version check refuses a backward after an in-place change
    (runtime/torch_prepared.py).  Each entry holds its source array, so that no other
    array can come to lie at its address while the memo lives."""

    def __init__(self):
        self.kept: dict = {}
        self.sources: set = set()     # (address, shape, strides) of the arrays packed
        self.bytes = 0

    def packed_from(self, array: np.ndarray) -> bool:
        """Whether it keeps a pack of an array at ``array``'s address and of its shape
        and strides."""
        return (array.ctypes.data, array.shape, array.strides) in self.sources

    def find(self, key) -> Optional[np.ndarray]:
        entry = self.kept.get(key)
        return None if entry is None else entry[1]

    def keep(self, key, source: np.ndarray, packed: np.ndarray) -> None:
        if self.bytes + packed.nbytes <= MEMO_BYTES:
            self.kept[key] = (source, packed)
            self.sources.add((key[0], source.shape, source.strides))
            self.bytes += packed.nbytes


def active_memo() -> Optional[PackMemo]:
    return getattr(_ACTIVE, "memo", None)


def set_memo(memo: Optional[PackMemo]) -> Optional[PackMemo]:
    """Puts ``memo`` (or none) in force on this thread; the one it replaces."""
    previous = getattr(_ACTIVE, "memo", None)
    _ACTIVE.memo = memo
    return previous


class WindowPack:
    """:func:`pack_window` prepared for arrays of one shape, dtype and strides (a
    runner's signature): the kernel and its integer arguments found once, so that a
    call costs the allocation and the kernel (a small conv's forward is 0.3 ms)."""

    def __init__(self, function, like: np.ndarray, shape, coefficients, origin, fill):
        self.function, self.shape = function, tuple(shape)
        self.dtype, self.key = like.dtype, (like.shape, like.strides)
        strides = [s // like.itemsize for s in like.strides]
        blocked, coefficients, _ = _blocks(shape, coefficients)
        self.keep, pointers = _arguments(blocked, like.shape, strides,
                                         [c for row in coefficients for c in row], origin)
        self.rank = ctypes.c_int64(len(blocked))
        self.naxes = ctypes.c_int64(like.ndim)
        self.pointers = pointers
        self.fill = ctypes.c_double(float(fill))
        self.size = math.prod(self.shape)
        # what the result depends on besides the array's values
        self.window = (self.dtype.str, like.shape, like.strides, self.shape,
                       tuple(tuple(int(c) for c in row) for row in coefficients),
                       tuple(int(o) for o in origin), float(fill))

    def __call__(self, array: np.ndarray) -> np.ndarray:
        if (array.shape, array.strides) != self.key or array.dtype != self.dtype:
            raise ValueError("a WindowPack was given an array of another layout")
        memo = getattr(_ACTIVE, "memo", None)
        if memo is not None:
            key = (array.ctypes.data, self.window)
            kept = memo.find(key)
            if kept is not None:
                return kept
            out = self._pack(array)
            memo.keep(key, array, out)
            return out
        return self._pack(array)

    def _pack(self, array: np.ndarray) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        self.function(ctypes.c_void_p(array.ctypes.data), ctypes.c_void_p(out.ctypes.data),
                      self.rank, self.pointers[0], self.naxes, *self.pointers[1:],
                      self.fill, ctypes.c_int(thread_count(None, self.size)))
        return out


def prepared_pack(like: np.ndarray, shape: Sequence[int], coefficients: Sequence[Sequence[int]],
                  origin: Sequence[int], fill) -> Optional[WindowPack]:
    """:func:`pack_window` for arrays laid out as ``like``, or None where the kernel
    does not take them."""
    kind = _usable(like, shape, coefficients)
    function = None if kind is None else _function(f"einfuse_pack_window_{kind}")
    if function is None:
        return None
    return WindowPack(function, like, shape, coefficients, origin, fill)


def pack_window(array: np.ndarray, shape: Sequence[int], coefficients: Sequence[Sequence[int]],
                origin: Sequence[int], fill) -> Optional[np.ndarray]:
    """The view of ``array`` whose point ``(t_0, .., t_k)`` is the element at array
    coordinates ``origin + sum_k t_k * coefficients[k]`` (``fill`` where those leave the
    array), copied into a fresh C-contiguous array of ``shape``; None where the kernel
    does not take these arrays (the caller copies by NumPy)."""
    pack = prepared_pack(array, shape, coefficients, origin, fill)
    return None if pack is None else pack(array)


def add_window(target: np.ndarray, values: np.ndarray, coefficients: Sequence[Sequence[int]],
               origin: Sequence[int], shared: int = 0) -> bool:
    """``target`` at coordinates ``origin + sum_k t_k * coefficients[k]`` plus
    ``values[t]``, in place, in the order of the view's points, points outside
    ``target`` dropped; False (nothing done) where the kernel does not take these
    arrays.  The caller guarantees that two points which share an address differ only
    in the view's last ``shared`` axes and the two innermost (those run on one
    thread; threads split the others)."""
    adder = window_adder(target, values, coefficients, origin, shared)
    if adder is None:
        return False
    return adder(target, values)


class WindowAdder:
    """:func:`add_window` for one layout of target and values (shapes, strides, dtype),
    its kernel arguments made once: a repeated backward's col2im then costs the
    kernel alone."""

    def __init__(self, function, target, values, coefficients, origin, shared):
        shape = tuple(values.shape)
        self.function = function
        self.key = (target.shape, target.strides, values.shape, values.strides,
                    target.dtype)
        strides = [s // target.itemsize for s in target.strides]
        vsteps = [s // values.itemsize for s in values.strides]
        rank = len(shape)
        shape, coefficients, vsteps = _blocks(shape, coefficients, vsteps)
        # (the runs: the blocks of the shared axes, and of the row axis where a unit one
        # was put in after it)
        group = math.prod(shape[max(0, rank - 2 - shared):len(shape) - 2])
        self.keep, pointers = _arguments(shape, target.shape, strides,
                                         [c for row in coefficients for c in row], origin,
                                         vsteps)
        self.head = (ctypes.c_int64(len(shape)), pointers[0], ctypes.c_int64(target.ndim),
                     *pointers[1:], ctypes.c_int64(max(1, group)))
        self.size = values.size
        self.dense = ctypes.c_int(int(target.flags.c_contiguous))

    def __call__(self, target: np.ndarray, values: np.ndarray) -> bool:
        """The add, True; False (nothing done) for arrays of another layout."""
        if (target.shape, target.strides, values.shape, values.strides,
                target.dtype) != self.key or values.dtype != target.dtype or \
                not target.flags.writeable:
            return False
        self.function(ctypes.c_void_p(target.ctypes.data),
                      ctypes.c_void_p(values.ctypes.data), *self.head,
                      ctypes.c_int(thread_count(None, self.size)), self.dense)
        return True


def window_adder(target: np.ndarray, values: np.ndarray, coefficients: Sequence[Sequence[int]],
                 origin: Sequence[int], shared: int = 0) -> Optional[WindowAdder]:
    """:func:`add_window` prepared for arrays laid out as ``target`` and ``values``, or
    None where the kernel does not take them."""
    kind = _usable(target, tuple(values.shape), coefficients)
    if kind is None or not target.flags.writeable or values.dtype != target.dtype or \
            any(s % values.itemsize for s in values.strides):
        return None
    function = _function(f"einfuse_add_window_{kind}")
    if function is None:
        return None
    return WindowAdder(function, target, values, coefficients, origin, shared)
