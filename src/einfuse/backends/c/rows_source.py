"""C source of the row kernels (backends/c/rows.py): softmax and layernorm over the rows
of a matrix (and the helpers of the log-sum-exp kernel, backends/c/row_values.py), one
row per OpenMP iteration, written with GCC vector extensions so that the
accumulators stay in registers and each row is read from memory once.

The template is fixed: only the element type and the vector width vary; every size,
stride and constant is a runtime argument.

* ``ef_vexp`` is an inline vector exponential: x = n ln2 + r (|r| <= ln2/2, ln2 in two
  parts so that n ln2 is exact), exp(r) = 1 + r + r**2 q(r) with q a degree-4 polynomial
  fitted here for float32 (relative error 3e-9) and the Taylor terms up to 1/13! for
  float64, and 2**n made from its exponent bits.  Near the ends of the range 2**n is
  applied in two steps (2**(n -+ 64), then 2**+-64) so that overflow and gradual
  underflow round once.  Checked against a correctly rounded exp on every float32 (none
  more than 1 unit in the last place off, 99.6% exact) and on 2e7 float64 values (none
  more than 1 unit off); inf, -inf, NaN, overflow and subnormal results as exp's.
* Sums over a row run in blocks of ``EF_BLOCK`` values: 4 vectors of lane partials per
  block (each lane adds at most EF_BLOCK / (4 VW) values), folded into per-lane totals
  with Neumaier's compensated addition, the lanes then added pairwise: the error does
  not grow with the row's length (docs/notation.md, long sums).
* A row maximum propagates NaN as NumPy's maximum does.
* Outputs of 8 MiB or more are written around the caches (row_streams.py); the
  layernorm kernel's own source is row_layernorm.py."""

from __future__ import annotations

import numpy as np

from .row_layernorm import SOURCE as LAYERNORM
from .row_streams import SOURCE as STREAMS

TEMPLATE = r"""
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <omp.h>
typedef %(ctype)s T;
#define EF_SINGLE %(single)d
#define VW %(lanes)d
#define EF_BLOCK 2048
typedef T vT __attribute__((vector_size(VW * sizeof(T))));
#if EF_SINGLE
typedef int32_t vI __attribute__((vector_size(VW * sizeof(T))));
#define EF_MANT 23
#define EF_SQRT sqrtf
/* n = x / ln2 rounded rides in the low mantissa bits of x log2(e) + EF_SHIFT (1.5 * 2**23
   + 126): the bits of that sum shifted left by 23 are those of 2**(n - 1) */
#define EF_SHIFT (0x1.8p23f + 126.0f)
#define EF_RINT 0x1.8p23f
#define EF_LOG2E 0x1.715476p0f
#define EF_LN2HI 0x1.62e4p-1f
#define EF_LN2LO 0x1.7f7d1cp-20f
#define EF_BIG 0x1.5p6f
#define EF_OVER 0x1.62e42ep6f
#define EF_UNDER -0x1.9fe368p6f
static inline vT ef_poly(vT r) {
  vT q = (T)0x1.6a244cp-10f * r + (T)0x1.1239d4p-7f;
  q = q * r + (T)0x1.5558f2p-5f;
  q = q * r + (T)0x1.555492p-3f;
  return q * r + (T)0x1.fffffcp-2f;
}
#else
typedef int64_t vI __attribute__((vector_size(VW * sizeof(T))));
#define EF_MANT 52
#define EF_SQRT sqrt
#define EF_SHIFT (0x1.8p52 + 1022.0)
#define EF_RINT 0x1.8p52
#define EF_LOG2E 0x1.71547652b82fep0
#define EF_LN2HI 0x1.62e42fefa3800p-1
#define EF_LN2LO 0x1.ef35793c76730p-45
#define EF_BIG 0x1.6p9
#define EF_OVER 0x1.62e42fefa39efp9
#define EF_UNDER -0x1.74910d52d3052p9
static inline vT ef_poly(vT r) {
  vT q = (T)(1.0 / 6227020800.0) * r + (T)(1.0 / 479001600.0);
  q = q * r + (T)(1.0 / 39916800.0);
  q = q * r + (T)(1.0 / 3628800.0);
  q = q * r + (T)(1.0 / 362880.0);
  q = q * r + (T)(1.0 / 40320.0);
  q = q * r + (T)(1.0 / 5040.0);
  q = q * r + (T)(1.0 / 720.0);
  q = q * r + (T)(1.0 / 120.0);
  q = q * r + (T)(1.0 / 24.0);
  q = q * r + (T)(1.0 / 6.0);
  return q * r + (T)0.5;
}
#endif
/* the C library's function f for T (expf or exp ...) */
#if EF_SINGLE
#define EF_FN(name) name##f
#else
#define EF_FN(name) name
#endif
static inline T ef_square(T a) { return a * a; }
static inline vT ef_sel(vI m, vT a, vT b) { return (vT)((m & (vI)a) | (~m & (vI)b)); }
static inline vT ef_splat(T x) { return (vT){} + x; }
static inline vT ef_load(const T *p) { vT v; memcpy(&v, p, sizeof v); return v; }
static inline void ef_store(T *p, vT v) { memcpy(p, &v, sizeof v); }
/* the first c lanes of p, the others `fill` */
static inline vT ef_load_part(const T *p, int64_t c, T fill) {
  vT v = ef_splat(fill); memcpy(&v, p, (size_t)c * sizeof(T)); return v;
}
/* exp(x) for x in [-EF_BIG, EF_BIG] (no NaN): ef_vexp's arithmetic without its
   special cases, the same bits there.  p * 2**n, which ef_vexp takes as p * 2**(n - 1)
   * 2, is n added to p's exponent bits: exact (p is near 1 and |n| <= EF_BIG / ln2, so
   the result is a normal number) and an integer addition, not a product -- the
   products are what bound a row's exponentials.  n rides in the low bits of
   x log2(e) + EF_RINT (EF_SHIFT less its exponent bias, which is even: the same n), and
   those bits shifted into the exponent field are n's (the negative ones wrap).  A NaN
   x may come out a number here (its payload's low bits land in the exponent): the
   rows that take this form make their sums NaN themselves (ef_exp_block). */
#if defined(__AVX512F__) && VW * (EF_SINGLE ? 4 : 8) == 64
#include <immintrin.h>
#define EF_SCALEF 1
#else
#define EF_SCALEF 0
#endif
static inline vT ef_vexp_fast(vT x) {
  vT k = x * (T)EF_LOG2E + (T)EF_RINT;
  vT n = k - (T)EF_RINT;
  vT r = x - n * (T)EF_LN2HI;
  r = r - n * (T)EF_LN2LO;
  vT p = ef_poly(r) * (r * r) + r + (T)1;
#if EF_SCALEF
  /* AVX-512's scalef is p * 2**n in one instruction (exact here, as the addition is),
     where the shift and the addition take a multiply-add unit's turn (Zen 4, log-sum-exp
     rows of 1024 float32 in the L2 cache: 221 -> 215 ns a row); a NaN stays NaN */
#if EF_SINGLE
  return (vT)_mm512_scalef_ps((__m512)p, (__m512)n);
#else
  return (vT)_mm512_scalef_pd((__m512d)p, (__m512d)n);
#endif
#else
  return (vT)((vI)p + ((vI)k << EF_MANT));
#endif
}
static inline vT ef_vexp(vT x) {
  vT k = x * (T)EF_LOG2E + (T)EF_SHIFT;
  vT n = k - (T)EF_SHIFT;
  vT r = x - n * (T)EF_LN2HI;
  r = r - n * (T)EF_LN2LO;
  vT p = ef_poly(r) * (r * r) + r + (T)1;
  vI low = x < -(T)EF_BIG;
  vI bits = (vI)k + (low & 64);
  vT y = p * (vT)(bits << EF_MANT);
  y = y * ef_sel(low, ef_splat((T)0x1p-63), ef_splat((T)2));
  y = ef_sel(x > (T)EF_OVER, ef_splat((T)INFINITY), y);
  return ef_sel(x < (T)EF_UNDER, (vT){}, y);
}
/* NaN wins, as in NumPy's maximum */
static inline T ef_max(T a, T b) { return (a > b || a != a) ? a : b; }
static inline vT ef_vmax(vT a, vT b) { return ef_sel((a > b) | (a != a), a, b); }
/* max(v, a) and min(v, a) of an accumulator a that holds no NaN, ignoring a NaN v
   (the x86 instructions return their second operand where either is NaN) */
#if %(minmax_guard)s
#include <immintrin.h>
static inline vT ef_qmax(vT v, vT a) { return (vT)%(max_op)s((%(mm)s)v, (%(mm)s)a); }
static inline vT ef_qmin(vT v, vT a) { return (vT)%(min_op)s((%(mm)s)v, (%(mm)s)a); }
#else
static inline vT ef_qmax(vT v, vT a) { return ef_sel(v > a, v, a); }
static inline vT ef_qmin(vT v, vT a) { return ef_sel(v < a, v, a); }
#endif
/* lane l of EF_ROTk(v) is lane (l + VW / 2**k) %% VW of v: after folding v with each
   rotation in turn every lane holds the fold of all (the lanes taken pairwise) */
%(rotations)s
static inline T ef_hmax(vT v) {
%(max_steps)s
  return v[0];
}
static inline T ef_hmin(vT v) {     /* (of a vector without NaN) */
%(min_steps)s
  return v[0];
}
static inline vT ef_vabs(vT v) { return ef_sel(v < 0, -v, v); }
/* Neumaier: s + x into s, its rounding error into c */
static inline void ef_vfold(vT *s, vT *c, vT x) {
  vT t = *s + x;
  *c += ef_sel(ef_vabs(*s) >= ef_vabs(x), (*s - t) + x, (x - t) + *s);
  *s = t;
}
static inline T ef_hsum(vT s) {
%(sum_steps)s
  return s[0];
}
/* the compensated lanes' total: lanes added pairwise, the error added where finite */
static inline T ef_total(vT s, vT c) {
  const T total = ef_hsum(s), error = ef_hsum(c);
  return isfinite(total) ? total + error : total;
}
/* 0, 1, ... VW - 1: the lanes of a partial vector that hold values are those below its count */
static inline vT ef_lanes(void) {
  vT lane = {};
  for (int l = 0; l < VW; ++l) lane[l] = (T)l;
  return lane;
}
static inline int64_t ef_min(int64_t a, int64_t b) { return a < b ? a : b; }

/* The row's maximum; NaN if it holds one. */
static inline T ef_row_max(const T *x, int64_t n) {
  vT a0 = ef_splat(-INFINITY), a1 = a0, a2 = a0, a3 = a0;
  int64_t j = 0;
  for (; j + 4 * VW <= n; j += 4 * VW) {
    a0 = ef_vmax(ef_load(x + j), a0); a1 = ef_vmax(ef_load(x + j + VW), a1);
    a2 = ef_vmax(ef_load(x + j + 2 * VW), a2); a3 = ef_vmax(ef_load(x + j + 3 * VW), a3);
  }
  for (; j + VW <= n; j += VW) a0 = ef_vmax(ef_load(x + j), a0);
  if (j < n) a1 = ef_vmax(ef_load_part(x + j, n - j, -INFINITY), a1);
  return ef_hmax(ef_vmax(ef_vmax(a0, a1), ef_vmax(a2, a3)));
}

/* The row's maximum and (into *lo) minimum over its values that are not NaN (-inf
   and inf where all are NaN), by the machine's max and min instructions: one each a
   vector, where the NaN-propagating maximum takes four.  A row holding a NaN has a
   NaN sum of exponentials whatever its maximum, which is how the kernels find the
   rows to take again with ef_row_max.  The minimum tells whether every exp(x - max)
   of the row is in ef_vexp_fast's range. */
static inline T ef_row_range(const T *x, int64_t n, T *lo) {
  vT a0 = ef_splat(-INFINITY), a1 = a0, a2 = a0, a3 = a0;
  vT b0 = ef_splat(INFINITY), b1 = b0;
  int64_t j = 0;
  for (; j + 4 * VW <= n; j += 4 * VW) {
    const vT x0 = ef_load(x + j), x1 = ef_load(x + j + VW);
    const vT x2 = ef_load(x + j + 2 * VW), x3 = ef_load(x + j + 3 * VW);
    a0 = ef_qmax(x0, a0); a1 = ef_qmax(x1, a1); a2 = ef_qmax(x2, a2); a3 = ef_qmax(x3, a3);
    b0 = ef_qmin(ef_qmin(x0, x1), b0); b1 = ef_qmin(ef_qmin(x2, x3), b1);
  }
  for (; j + VW <= n; j += VW) {
    const vT v = ef_load(x + j);
    a0 = ef_qmax(v, a0); b0 = ef_qmin(v, b0);
  }
  if (j < n) {
    a1 = ef_qmax(ef_load_part(x + j, n - j, -INFINITY), a1);
    b1 = ef_qmin(ef_load_part(x + j, n - j, INFINITY), b1);
  }
  *lo = ef_hmin(ef_qmin(b0, b1));
  return ef_hmax(ef_qmax(ef_qmax(a0, a1), ef_qmax(a2, a3)));
}

%(streams)s
/* The lanes of a row's maximum and minimum as the row is scanned with the previous
   row's exponentials (ef_exp_block), by ef_row_range's instructions; four vectors are
   folded pairwise first (a pair's fold may drop a lane's value where its partner is
   NaN: only in a row holding a NaN, whose sum of exponentials is NaN whatever its
   range, so that it is taken again). */
typedef struct { vT hi, lo; } ef_range;
static inline ef_range ef_range_start(void) {
  const ef_range r = {ef_splat(-INFINITY), ef_splat(INFINITY)};
  return r;
}
static inline void ef_range_add4(ef_range *r, const T *y, int64_t j) {
  const vT y0 = ef_load(y + j), y1 = ef_load(y + j + VW);
  const vT y2 = ef_load(y + j + 2 * VW), y3 = ef_load(y + j + 3 * VW);
  r->hi = ef_qmax(ef_qmax(ef_qmax(y0, y1), ef_qmax(y2, y3)), r->hi);
  r->lo = ef_qmin(ef_qmin(ef_qmin(y0, y1), ef_qmin(y2, y3)), r->lo);
}
static inline void ef_range_add(ef_range *r, const T *y, int64_t j) {
  const vT v = ef_load(y + j);
  r->hi = ef_qmax(v, r->hi); r->lo = ef_qmin(v, r->lo);
}
/* y[j, j + c), c < VW */
static inline void ef_range_add_part(ef_range *r, const T *y, int64_t j, int64_t c) {
  r->hi = ef_qmax(ef_load_part(y + j, c, -INFINITY), r->hi);
  r->lo = ef_qmin(ef_load_part(y + j, c, INFINITY), r->lo);
}
/* the row's maximum, its minimum into *lo (as ef_row_range's) */
static inline T ef_range_end(const ef_range *r, T *lo) {
  *lo = ef_hmin(r->lo);
  return ef_hmax(r->hi);
}

/* Whether every exp(x - m) of a row with maximum m and minimum lo is in
   ef_vexp_fast's range (false for NaN and infinite maxima). */
static inline int ef_fast_row(T m, T lo) { return isfinite(m) && lo - m >= -(T)EF_BIG; }
/* Whether every exp(x) of a row (unshifted) with maximum top and minimum lo is in that
   range (false for infinite extremes; a NaN, which ef_row_range passes over, gives NaN
   there as in ef_vexp: ef_exp_block) */
static inline int ef_fast_unshifted(T top, T lo) {
  return lo <= top && top <= (T)EF_BIG && lo >= -(T)EF_BIG;
}

/* Rows stream from memory while the kernels compute in the L1 cache: each pass over a
   row that is in the cache already prefetches, line by line, the row EF_AHEAD rows
   on, so that its loads overlap this row's arithmetic (without it a short row's time
   was its arithmetic plus its transfer).  A row longer than EF_SHORT bytes prefetches
   its own lines (a no-op: the hardware's stream prefetch runs far enough ahead in a
   long row), and so does a thread's last row.  (ef_ahead_rows: ``on`` rows on.) */
#define EF_AHEAD 2
#define EF_SHORT 8192
static inline const T *ef_ahead_rows(const T *X, int64_t i, int64_t hi, int64_t ldx,
                                     int64_t n, int64_t on) {
  const int near = n * (int64_t)sizeof(T) <= EF_SHORT && i + on < hi;
  return X + (near ? i + on : i) * ldx;
}
static inline const T *ef_ahead_row(const T *X, int64_t i, int64_t hi, int64_t ldx,
                                    int64_t n) {
  return ef_ahead_rows(X, i, hi, ldx, n, EF_AHEAD);
}
/* the lines of ahead[j, j + 4 VW) (64, 128 or 256 bytes), written out: GCC drops a
   loop of prefetches */
static inline void ef_prefetch4(const T *ahead, int64_t j) {
  const char *a = (const char *)(ahead + j);
  const int bytes = 4 * VW * (int)sizeof(T);
  __builtin_prefetch(a, 0, 3);
  if (bytes >= 128) __builtin_prefetch(a + 64, 0, 3);
  if (bytes >= 256) { __builtin_prefetch(a + 128, 0, 3); __builtin_prefetch(a + 192, 0, 3); }
}

/* exp(v) by ef_vexp_fast where fast (a constant after inlining), else by ef_vexp */
static inline vT ef_vexp_row(vT v, int fast) { return fast ? ef_vexp_fast(v) : ef_vexp(v); }

/* p[j] = exp(x[j] - m) for j in [b, end) (where ``store``; else p is not touched),
   their sum added into two vectors of lanes (each lane adds at most (end - b) / (2 VW)
   + 1 values); ``ahead``: the row to prefetch (or null).  ``fast``: by ef_vexp_fast,
   whose exponent addition may turn a NaN into a number, so there (``check``: not
   where scalef keeps NaN) the arguments are summed too (in [-EF_BIG, EF_BIG] they
   cannot overflow) and a NaN among them makes the sum NaN, as ef_vexp's would be: a
   row holding a NaN is found by its sum whichever form it took (an addition a vector;
   left out with scalef, a log-sum-exp row of 1024 float32 in the L2 cache took 210 ->
   206 ns: on Zen 4 the 512-bit additions and multiply-adds do not issue fully side by
   side, so every operation counts).  Where ``scan`` is
   not null (a constant after inlining) next[b, end) is added to its range in the same
   loop: the exponentials keep the multiply-add units busy, a range pass of its own
   runs only on the other two pipes, so there the next row's range costs its loads
   (and its maximum is ready when that row starts). */
static inline void ef_exp_block(const T *x, T *p, int64_t b, int64_t end, vT mv,
                                vT *sum0, vT *sum1, int fast, const T *ahead, int store,
                                const T *next, ef_range *scan, ef_out *out) {
  vT t0 = {}, t1 = {}, t2 = {}, t3 = {}, args = {};
  const int check = fast && !EF_SCALEF;
  int64_t j = b;
  for (; j + 4 * VW <= end; j += 4 * VW) {
    ef_prefetch4(ahead, j);
    const vT d0 = ef_load(x + j) - mv, d1 = ef_load(x + j + VW) - mv;
    const vT d2 = ef_load(x + j + 2 * VW) - mv, d3 = ef_load(x + j + 3 * VW) - mv;
    vT e0 = ef_vexp_row(d0, fast), e1 = ef_vexp_row(d1, fast);
    vT e2 = ef_vexp_row(d2, fast), e3 = ef_vexp_row(d3, fast);
    if (check) args += (d0 + d1) + (d2 + d3);
    if (scan) ef_range_add4(scan, next, j);
    if (out && out->k + 4 * VW <= out->n) ef_out_step(out);
    if (store) {
      ef_store(p + j, e0); ef_store(p + j + VW, e1);
      ef_store(p + j + 2 * VW, e2); ef_store(p + j + 3 * VW, e3);
    }
    t0 += e0; t1 += e1; t2 += e2; t3 += e3;
  }
  for (; j + VW <= end; j += VW) {
    const vT d = ef_load(x + j) - mv;
    vT e = ef_vexp_row(d, fast);
    if (check) args += d;
    if (scan) ef_range_add(scan, next, j);
    if (store) ef_store(p + j, e);
    t0 += e;
  }
  if (j < end) {     /* the lanes past the row hold m: exp(0), in range, not added */
    const vT d = ef_load_part(x + j, end - j, mv[0]) - mv;
    vT e = ef_vexp_row(d, fast);
    if (check) args += d;
    if (scan) ef_range_add_part(scan, next, j, end - j);
    if (store) memcpy(p + j, &e, (size_t)(end - j) * sizeof(T));
    t1 += ef_sel(ef_lanes() < (T)(end - j), e, (vT){});
  }
  /* args - args: 0 (the sums are not -0.0: adding it changes no bit), or NaN */
  *sum0 += t0 + t2 + (check ? args - args : (vT){});
  *sum1 += t1 + t3;
}

/* The row's sum of exp(x[j] - m), the exponentials written to p[0, n) where ``store``
   (a constant after inlining: the log-sum-exp rows keep only the sum); where ``scan``
   is not null, next[0, n) added to it (ef_exp_block) */
static inline T ef_exp_row_scan(const T *x, T *p, int64_t n, T m, int fast,
                                const T *ahead, int store, const T *next, ef_range *scan,
                                ef_out *out) {
  const vT mv = ef_splat(m);
  vT t0 = {}, t1 = {}, c0 = {}, c1 = {};
  if (n <= EF_BLOCK) {     /* one block: its lane partials need no compensation */
    if (fast) ef_exp_block(x, p, 0, n, mv, &t0, &t1, 1, ahead, store, next, scan, out);
    else ef_exp_block(x, p, 0, n, mv, &t0, &t1, 0, ahead, store, next, scan, out);
    return ef_hsum(t0 + t1);
  }
  vT s0 = {}, s1 = {};
  for (int64_t b = 0; b < n; b += EF_BLOCK) {
    vT u0 = {}, u1 = {};
    const int64_t end = ef_min(n, b + EF_BLOCK);
    if (fast) ef_exp_block(x, p, b, end, mv, &u0, &u1, 1, ahead, store, next, scan, out);
    else ef_exp_block(x, p, b, end, mv, &u0, &u1, 0, ahead, store, next, scan, out);
    ef_vfold(&s0, &c0, u0);
    ef_vfold(&s1, &c1, u1);
  }
  return ef_total(s0 + s1, c0 + c1);
}
static inline T ef_exp_row(const T *x, T *p, int64_t n, T m, int fast, const T *ahead,
                           int store) {
  return ef_exp_row_scan(x, p, n, m, fast, ahead, store, 0, 0, 0);
}

/* Whether row i's exponentials scan the next row's range (ef_exp_block): a short row
   with a row after it in the thread's run (a long row's next range is a pass of its
   own, after it), in a build of 64-byte vectors.  AVX-512's 32 registers hold the
   exponential's constants, its sums and the range's; with AVX2's 16 (a Zen 4 running
   the znver3 build, log-sum-exp rows of 1024 float32 from memory) a scanned row took
   longer, 303 -> 323 ns, and one in the L2 cache no less, 295 -> 297 ns. */
#define EF_SCAN (VW * (EF_SINGLE ? 4 : 8) >= 64)
static inline int ef_scans_next(int64_t i, int64_t hi, int64_t n) {
  return EF_SCAN && i + 1 < hi && n * (int64_t)sizeof(T) <= EF_SHORT;
}

/* Row i's sum of exp(x - m) (the exponentials written to p where ``store``), m and low
   its range (ef_row_range's); the next row's range into *next and *next_low, scanned
   with this row's exponentials where ef_scans_next, else in a pass of its own after
   them.  A row is then read from memory once, by the previous row's exponentials,
   while they run (Zen 4, one thread, log-sum-exp rows of 1024 float32 from memory: 263
   -> 225 ns a row).  A row whose sum is NaN may hold a NaN that its range passed over:
   it is taken again as the statements are written (ef_row_max, which propagates NaN,
   and ef_vexp), its maximum into *m.  (The softmax rows take it only where their
   exponentials go to a buffer in the L1 cache: stored to P, the stores' misses among
   the next row's loads made a row from memory take longer, 400 -> 445 ns.) */
static inline T ef_exp_next(const T *X, T *p, int64_t i, int64_t hi, int64_t ldx,
                            int64_t n, T *m, T low, int store, T *next, T *next_low,
                            ef_out *out) {
  const T *x = X + i * ldx;
  const int fast = ef_fast_row(*m, low);
  T s;
  if (ef_scans_next(i, hi, n)) {
    /* a scanned row is read a row sooner, so the prefetch runs a row further on (Zen 4,
       log-sum-exp rows of 1024 float32 from memory, load 6: 234 -> 224 ns a row) */
    const T *ahead = ef_ahead_rows(X, i, hi, ldx, n, EF_AHEAD + 1);
    ef_range range = ef_range_start();
    s = ef_exp_row_scan(x, p, n, *m, fast, ahead, store, x + ldx, &range, out);
    *next = ef_range_end(&range, next_low);
  } else {
    s = ef_exp_row_scan(x, p, n, *m, fast, ef_ahead_row(X, i, hi, ldx, n), store, 0, 0,
                        out);
    if (i + 1 < hi) *next = ef_row_range(x + ldx, n, next_low);
  }
  if (s != s) {
    *m = ef_row_max(x, n);
    s = ef_exp_row(x, p, n, *m, 0, x, store);
  }
  return s;
}

/* P[i,:] = exp(X[i,:] - M[i]) / S[i], M the row max, S the row sum of the exponentials.
   A row is read from memory once, by ef_row_range; its exponentials and their scaling
   run in the L1 cache.  Where the rows stream (ef_streams) the exponentials of a short
   row are kept in a buffer of the thread's, in the L1 cache, and scaled into P by
   streaming stores, the row's range is scanned with the previous row's exponentials
   (ef_exp_next: 4096 rows of 1024 float32, 361 -> 348 ns a row), and the scaled row is
   written out with the next row's exponentials (row_streams.ef_out: 355 -> 327 ns).
   A row whose sum is NaN may hold a NaN that ef_row_range passed over: it is taken
   again as the statements are written (ef_row_max, which propagates NaN, and
   ef_vexp), so its M and P are theirs. */
void ef_softmax_rows(const T *X, T *P, T *M, T *S, int64_t rows, int64_t n,
                     int64_t ldx, int64_t ldp, int nthreads) {
  const int nth = nthreads > 0 ? nthreads : omp_get_max_threads();
  /* a short row's next maximum is computed before this row's sum is reduced: the two
     are independent, so the next row's loads and comparisons overlap the lane
     reduction, the division and the scaling (a long row would push this one's
     exponentials out of the L1 cache before they are scaled) */
  const int early = n * (int64_t)sizeof(T) <= EF_SHORT;
  const int stream = early && ef_streams(rows, n);
  #pragma omp parallel num_threads(nth)
  {
    /* the rows split as schedule(static) does: one run of consecutive rows a thread */
    const int64_t parts = omp_get_num_threads(), part = omp_get_thread_num();
    const int64_t lo = rows / parts * part + (part < rows %% parts ? part : rows %% parts);
    const int64_t hi = lo + rows / parts + (part < rows %% parts);
    /* (two buffers: a row's exponentials are computed while the previous row's are
       written out) */
    T buffers[2][EF_SHORT / sizeof(T)] __attribute__((aligned(64)));
    ef_out out = {buffers[0], P, {}, n, n};      /* nothing to write yet */
    T low = 0, m = lo < hi ? ef_row_range(X + lo * ldx, n, &low) : 0;
    for (int64_t i = lo; i < hi; ++i) {
      const T *x = X + i * ldx;
      T *p = P + i * ldp;
      T *e = stream ? buffers[(i - lo) & 1] : p;
      T next = 0, next_low = 0, s;
      if (stream) {
        s = ef_exp_next(X, e, i, hi, ldx, n, &m, low, 1, &next, &next_low, &out);
        ef_out_finish(&out);
      } else {
        s = ef_exp_row(x, e, n, m, ef_fast_row(m, low), ef_ahead_row(X, i, hi, ldx, n), 1);
        if (s != s) {
          m = ef_row_max(x, n);
          s = ef_exp_row(x, e, n, m, 0, x, 1);
        }
        if (early && i + 1 < hi) next = ef_row_range(x + ldx, n, &next_low);
      }
      M[i] = m;
      S[i] = s;
      const T r = (T)1 / s;
      if (isnormal(r) && stream) {       /* written out with the next row's exponentials */
        out = ef_out_start(e, p, r, n);
      } else if (isnormal(r)) {
        const vT rv = ef_splat(r);
        int64_t j = 0;
        for (; j + VW <= n; j += VW) ef_store(p + j, ef_load(e + j) * rv);
        for (; j < n; ++j) p[j] = e[j] * r;
      } else {
        for (int64_t j = 0; j < n; ++j) p[j] = e[j] / s;
      }
      if (!early && i + 1 < hi) next = ef_row_range(x + ldx, n, &next_low);
      m = next;
      low = next_low;
    }
    if (stream) {
      ef_out_finish(&out);
      ef_stream_fence();
    }
  }
}

/* y = exp(x), n values: the kernels' exponential on its own (tests check it against
   NumPy's over the whole float32 range) */
void ef_exp_values(const T *x, T *y, int64_t n) {
  int64_t j = 0;
  for (; j + VW <= n; j += VW) ef_store(y + j, ef_vexp(ef_load(x + j)));
  if (j < n) {
    vT e = ef_vexp(ef_load_part(x + j, n - j, 0));
    memcpy(y + j, &e, (size_t)(n - j) * sizeof(T));
  }
}

/* the same by ef_vexp_fast, for arguments in its range (tests check it gives
   ef_vexp's bits there) */
void ef_exp_values_fast(const T *x, T *y, int64_t n) {
  int64_t j = 0;
  for (; j + VW <= n; j += VW) ef_store(y + j, ef_vexp_fast(ef_load(x + j)));
  if (j < n) {
    vT e = ef_vexp_fast(ef_load_part(x + j, n - j, 0));
    memcpy(y + j, &e, (size_t)(n - j) * sizeof(T));
  }
}

%(layernorm)s
/* The same kernels with the C backend's kernel signature (backends/c/call.py calls it
   without ctypes): bufs X, M, S, P (softmax) or X, G, B, MU, V, Y (layernorm); ints
   rows, n, ldx, ldp; dprm (layernorm) n1, n2, eps.  (The log-sum-exp row kernel is
   printed per group after these: backends/c/row_values.py.) */
void ef_softmax_call(void **bufs, const int64_t *ints, const double *dprm,
                     const int64_t *iprm, const double *fills, int nthreads, int32_t *err) {
  (void)dprm; (void)iprm; (void)fills; (void)err;
  ef_softmax_rows((const T *)bufs[0], (T *)bufs[3], (T *)bufs[1], (T *)bufs[2],
                  ints[0], ints[1], ints[2], ints[3], nthreads);
}
void ef_layernorm_call(void **bufs, const int64_t *ints, const double *dprm,
                       const int64_t *iprm, const double *fills, int nthreads, int32_t *err) {
  (void)iprm; (void)fills; (void)err;
  ef_layernorm_rows((const T *)bufs[0], (const T *)bufs[1], (const T *)bufs[2], (T *)bufs[5],
                    (T *)bufs[3], (T *)bufs[4], ints[0], ints[1], ints[2], ints[3],
                    dprm[0], dprm[1], dprm[2], nthreads);
}
"""


def source(dtype: np.dtype, vector_bytes: int) -> str:
    """The kernels' C source for float32 or float64 elements."""
    single = dtype == np.float32
    lanes = max(vector_bytes, 16) // dtype.itemsize
    rotations, max_steps, min_steps, sum_steps = [], [], [], []
    step, half = 1, lanes // 2
    while half:
        order = ", ".join(str((lane + half) % lanes) for lane in range(lanes))
        rotations += ["#if defined(__clang__)",
                      f"#define EF_ROT{step}(v) __builtin_shufflevector(v, v, {order})",
                      "#else",
                      f"#define EF_ROT{step}(v) __builtin_shuffle(v, (vI){{{order}}})",
                      "#endif"]
        max_steps.append(f"  v = ef_vmax(v, EF_ROT{step}(v));")
        min_steps.append(f"  v = ef_qmin(v, EF_ROT{step}(v));")
        sum_steps.append(f"  s = s + EF_ROT{step}(s);")
        step, half = step + 1, half // 2
    width = max(vector_bytes, 16)
    prefix, guard = {64: ("_mm512", "defined(__AVX512F__)"), 32: ("_mm256", "defined(__AVX__)"),
                     16: ("_mm", "defined(__SSE2__)")}.get(width, ("", "0"))
    suffix = "ps" if single else "pd"
    mm = {64: "__m512", 32: "__m256", 16: "__m128"}.get(width, "") + ("" if single else "d")
    return TEMPLATE % {"ctype": "float" if single else "double", "single": int(single),
                       "streams": STREAMS, "layernorm": LAYERNORM,
                       "minmax_guard": guard, "max_op": f"{prefix}_max_{suffix}",
                       "min_op": f"{prefix}_min_{suffix}", "mm": mm,
                       "lanes": lanes, "rotations": "\n".join(rotations),
                       "max_steps": "\n".join(max_steps),
                       "min_steps": "\n".join(min_steps), "sum_steps": "\n".join(sum_steps)}
