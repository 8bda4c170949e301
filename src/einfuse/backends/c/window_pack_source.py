"""The C source of window_pack.py's two kernels: the pack of a strided window view
(im2col's patches, a panel) into a fresh array, each row's stretch inside the array
found once and the pad value written around it, rows optionally a padded step apart;
and the add of values into a view of a target (one window offset of col2im).  See
window_pack.py for what each computes and why."""

SOURCE = """\
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
    const int64_t *coef, const int64_t *origin, double fill_value, int nthreads, \\
    int64_t block_stride) { \\
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
      T *out = dst + r * block_stride;   /* (n1 * n2, or past it: a padded row) */ \\
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
