"""The gradient of fused attention (c_attention.py) as one C kernel: dQ, dK and dV from
the query, key, value, output, the output's gradient dO and each row's log-sum-exp L of
its scores (written by the forward), in the forward's canonical layout -- query (G, NQ,
D), key (G, NK, D), value (G, NK, E), C-contiguous.

With s = q_i . k_j (scaled as the forward scales it), the weights are recomputed per
block as p_ij = exp(s_ij - L_i) (0 where the mask hides key j from row i), and

    dv_j += p_ij do_i          dp_ij = do_i . v_j          ds_ij = p_ij (dp_ij - delta_i)
    dq_i += c ds_ij k_j        dk_j += c ds_ij q_i          delta_i = do_i . o_i

where s also adds the scores' terms (backends/c/attention_terms.TERMS) and row i sees the
keys lo <= j - i <= hi.  An added tensor's gradient is sign * ds summed over the axes
it is broadcast along (ef_term_gradients: per batch element, then summed by the
runtime in a fixed order); an index term's coefficient c (ALiBi's slope) gets
sum ds * (a j + b i + k) the same way.

with c the scale's derivative (scale, 1/scale or 1).  Each thread owns whole batch
elements g (so dQ needs no atomics); for each block of BK keys it walks the row blocks
that see them (the band: a causal mask starts at the block's first key, a window ends
W rows past its last), and keeps the key block
and value block transposed and their gradients in per-thread buffers: the extra memory
is a few blocks per thread and one row of delta per batch element, never N x N (but
for the gradient slices of an added tensor that wants one, its size per batch element).  The
five block products (scores, dP, P^T dO, dS^T Q, dS K) are one register-blocked routine
(RB rows x CV vectors of accumulators, as the forward's), which took a 1 x 4 x 1024 x 64
causal backward from 44 to 16 ms on one core.  A batch of fewer elements than threads
leaves threads idle.  The
forward's condition holds here too: values without inf or NaN (the runtime checks the
query and key as well, and dO, before calling)."""

from __future__ import annotations

import ctypes
import threading
from typing import Dict

import numpy as np

from . import attention_softmax as softmax
from . import build as c_build
from .attention_terms import TERMS
from ...plan.blocking import attention_block

_TEMPLATE = r"""
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
typedef %(ctype)s T;
#define VW %(lanes)d
#define RB %(rows)d
#define CV %(vectors)d
#define EF_DOUBLE %(double)d
#define BQ 64
#define BK 64
typedef T vT __attribute__((vector_size(VW * sizeof(T))));
%(declarations)s
static inline vT ef_load(const T *p) { vT v; memcpy(&v, p, sizeof v); return v; }
static inline void ef_store(T *p, vT v) { memcpy(p, &v, sizeof v); }
/* keeps a loaded vector in a register (see c_attention.py) */
#if defined(__x86_64__) && defined(__AVX512F__)
#define EF_KEEP(v) __asm__("" : "+v"(v))
#elif defined(__x86_64__) && defined(__SSE2__)
#define EF_KEEP(v) __asm__("" : "+x"(v))
#else
#define EF_KEEP(v) ((void)0)
#endif
static inline long ef_min(long a, long b) { return a < b ? a : b; }
static inline long ef_max(long a, long b) { return a > b ? a : b; }
%(exp_source)s
%(terms)s
static inline T *ef_alloc(long n) {
  return aligned_alloc(64, ((size_t)(n > 0 ? n : 1) * sizeof(T) + 63) / 64 * 64);
}
/* the scale's derivative applied to x: scale_mode 0 none, 1 multiply, 2 divide */
static inline T ef_scaled(T x, T scale, int scale_mode) {
  return scale_mode == 1 ? x * scale : (scale_mode == 2 ? x / scale : x);
}

/* C[m][n] += sum_k A[m*sm + k*sk] * B[k*ldb + n] for m < M, n < N, k < KD (``zero``: C
   is set to the sum, not read -- the scores and dP blocks, which need no clearing
   first): RB rows of C
   times CV vectors of columns in registers (plan/blocking.py), one broadcast A value per row and step of
   k; then single vectors, then scalars for the columns left. */
#define EF_ROWS(R)                                                                     \
  for (; m0 + R <= M; m0 += R) {                                                       \
    long n0 = 0;                                                                       \
    for (; n0 + CV * VW <= N; n0 += CV * VW) {                                         \
      vT a[R][CV];                                                                     \
      _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)                             \
        _Pragma("GCC unroll 8") for (int x = 0; x < CV; ++x)                           \
          a[r][x] = zero ? (vT){0} : ef_load(C + (m0 + r) * ldc + n0 + x * VW);        \
      for (long k = 0; k < KD; ++k) {                                                  \
        const T *b = B + k * ldb + n0;                                                 \
        vT bv[CV];                                                                     \
        _Pragma("GCC unroll 8") for (int x = 0; x < CV; ++x) {                         \
          bv[x] = ef_load(b + x * VW); EF_KEEP(bv[x]);                                 \
        }                                                                              \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r) {                         \
          const T w = A[(m0 + r) * sm + k * sk];                                       \
          _Pragma("GCC unroll 8") for (int x = 0; x < CV; ++x) a[r][x] += w * bv[x];   \
        }                                                                              \
      }                                                                                \
      _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)                             \
        _Pragma("GCC unroll 8") for (int x = 0; x < CV; ++x)                           \
          ef_store(C + (m0 + r) * ldc + n0 + x * VW, a[r][x]);                         \
    }                                                                                  \
    for (; n0 + VW <= N; n0 += VW) {                                                   \
      vT a[R];                                                                         \
      _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)                             \
        a[r] = zero ? (vT){0} : ef_load(C + (m0 + r) * ldc + n0);                      \
      for (long k = 0; k < KD; ++k) {                                                  \
        const vT b0 = ef_load(B + k * ldb + n0);                                       \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)                           \
          a[r] += A[(m0 + r) * sm + k * sk] * b0;                                      \
      }                                                                                \
      _Pragma("GCC unroll 16") for (int r = 0; r < R; ++r)                             \
        ef_store(C + (m0 + r) * ldc + n0, a[r]);                                       \
    }                                                                                  \
    for (; n0 < N; ++n0)                                                               \
      for (int r = 0; r < R; ++r) {                                                    \
        T total = zero ? (T)0 : C[(m0 + r) * ldc + n0];                                \
        for (long k = 0; k < KD; ++k) total += A[(m0 + r) * sm + k * sk] * B[k * ldb + n0]; \
        C[(m0 + r) * ldc + n0] = total;                                                \
      }                                                                                \
  }
static void ef_product(const T *restrict A, long sm, long sk, const T *restrict B, long ldb,
                       T *restrict C, long ldc, long M, long N, long KD, const int zero) {
  long m0 = 0;
  EF_ROWS(RB)
  /* (the rows left of a block of 64: 4 with RB = 6, run as one block of 4 rather than
     4 single rows, which load a vector per multiply-add) */
#if RB > 4
  EF_ROWS(4)
#endif
#if RB > 2
  EF_ROWS(2)
#endif
  EF_ROWS(1)
}

/* Adds row i's dS (keys j0 + first .. j0 + seen - 1) into the gradient of each term
   that wants one: term_grads[t] (NULL: none) holds one slice per batch element g
   (info[3] elements of grad_info + 8t).  An added tensor (info[7] == 0): the row's
   slot at i * info[1], key j's at j * info[2] (a stride 0: the term is broadcast along
   that axis, summed here), times its sign info[0].  An index term's coefficient
   (info[7] == 1): one slot per g, the sum of dS times (a j + b i + k), a b k = info[4..6].
   A slice belongs to one g, so to one thread, which adds in a fixed order (key
   blocks, then row blocks, then keys): the same bits for every thread count; the
   runtime sums the slices over broadcast batch axes. */
static void ef_term_gradients(const T *dsr, long first, long seen, long g, long i, long j0,
                              int nterms, T *const *term_grads, const long *grad_info) {
  for (int t = 0; t < nterms; ++t) {
    T *grad = term_grads[t];
    if (!grad) continue;
    const long *info = grad_info + 8 * t;
    const T sign = (T)info[0];
    if (info[7] == 1) {
      const T a = (T)info[4], base = (T)(info[5] * i + info[6]);
      T total = 0;      /* (the vector sum's order is fixed by the build, not threads) */
      #pragma omp simd reduction(+:total)
      for (long c = first; c < seen; ++c) total += dsr[c] * (a * (T)(j0 + c) + base);
      grad[g] += total;
      continue;
    }
    grad += g * info[3] + i * info[1];
    if (info[2] == 0) {
      T total = 0;
      #pragma omp simd reduction(+:total)
      for (long c = first; c < seen; ++c) total += dsr[c];
      grad[0] += sign * total;
    } else if (info[2] == 1) {        /* (the usual case: a vector loop) */
      T *restrict at = grad + j0;
      /* the row BQ rows on at these keys, which the next row block adds to: fetched
         for writing while this block computes (the slices' rows are NK apart, too far
         for the hardware's prefetcher, as the forward's bias rows) */
      if (info[1])
        for (long c = first; c < seen; c += 64 / sizeof(T))
          __builtin_prefetch(at + BQ * info[1] + c, 1);
      #pragma omp simd
      for (long c = first; c < seen; ++c) at[c] += sign * dsr[c];
    } else {
      T *at = grad + (j0 + first) * info[2];
      for (long c = first; c < seen; ++c) at[(c - first) * info[2]] += sign * dsr[c];
    }
  }
}

/* row i sees the keys lo <= j - i <= hi; the terms as the forward's */
int ef_attention_backward(const T *Q, const T *K, const T *V, const T *O, const T *dO,
                          const T *LSE, T *dQ, T *dK, T *dV, long G, long NQ, long NK,
                          long D, long E, double scale_in, int scale_mode, long lo, long hi,
                          int threads, int nterms, const T *const *term_data,
                          const long *term_offsets, const long *term_info,
                          int skip_hidden, T *const *term_grads, const long *grad_info) {
  const T scale = (T)scale_in;
  const double factor = ef_scale_factor(scale_in, scale_mode);
  int failed = 0;
  if (threads <= 0) threads = omp_get_max_threads();
  long *order = malloc(sizeof(long) * (size_t)(G > 0 ? G : 1));
  if (!order) return 1;
  ef_order_items(order, G, 1, nterms, term_offsets, term_info);
  #pragma omp parallel num_threads(threads)
  {
    T *kt = ef_alloc(D * BK), *vt = ef_alloc(E * BK);
    T *p = ef_alloc(BQ * BK), *ds = ef_alloc(BQ * BK);
    T *dkb = ef_alloc(BK * D), *dvb = ef_alloc(BK * E), *delta = ef_alloc(NQ);
    const int ok = kt && vt && p && ds && dkb && dvb && delta;
    if (!ok) {
      #pragma omp atomic write
      failed = 1;
    }
    #pragma omp for schedule(dynamic)
    for (long w = 0; w < G; ++w) {
      if (!ok) continue;
      const long g = order[w];
      const T *q = Q + g * NQ * D, *k = K + g * NK * D, *v = V + g * NK * E;
      const T *o = O + g * NQ * E, *go = dO + g * NQ * E, *lse = LSE + g * NQ;
      T *gq = dQ + g * NQ * D, *gk = dK + g * NK * D, *gv = dV + g * NK * E;
      for (long i = 0; i < NQ; ++i) {
        T total = 0;
        #pragma omp simd reduction(+:total)
        for (long e = 0; e < E; ++e) total += go[i * E + e] * o[i * E + e];
        delta[i] = total;
      }
      memset(gq, 0, sizeof(T) * (size_t)(NQ * D));
      for (long j0 = 0; j0 < NK; j0 += BK) {
        const long cols = ef_min(BK, NK - j0);
        /* the key and value blocks transposed, zero-padded to BK keys */
        for (long d = 0; d < D; ++d)
          for (long c = 0; c < BK; ++c) kt[d * BK + c] = c < cols ? k[(j0 + c) * D + d] : 0;
        for (long e = 0; e < E; ++e)
          for (long c = 0; c < BK; ++c) vt[e * BK + c] = c < cols ? v[(j0 + c) * E + e] : 0;
        memset(dkb, 0, sizeof(T) * (size_t)(BK * D));
        memset(dvb, 0, sizeof(T) * (size_t)(BK * E));
        /* the rows that see some of these keys */
        const long iend = ef_min(NQ, j0 + cols - lo);
        for (long i0 = ef_max(0, j0 - hi); i0 < iend; i0 += BQ) {
          const long rows = ef_min(BQ, iend - i0);
          if (skip_hidden && ef_block_hidden(g, i0, rows, j0, cols, G, nterms, term_data,
                                             term_offsets, term_info, q + i0 * D,
                                             k + j0 * D, D, factor))
            continue;       /* every weight 0: nothing to add (the forward skipped it) */
          ef_product(q + i0 * D, D, 1, kt, BK, p, BK, rows, BK, D, 1);      /* scores */
          ef_product(go + i0 * E, E, 1, vt, BK, ds, BK, rows, BK, E, 1);    /* dP */
          for (long r = 0; r < rows; ++r) {
            const long i = i0 + r;
            T *pr = p + r * BK, *dsr = ds + r * BK;
            const long seen = ef_min(cols, i + hi - j0 + 1);
            const long first = ef_max(0, i + lo - j0);
            const T top = lse[i], di = delta[i];
            int mode = scale_mode;
            if (nterms && seen > first) {      /* the scores with their terms */
              for (long c = first; c < seen; ++c) pr[c] = ef_scaled(pr[c], scale, scale_mode);
              ef_add_terms(pr + first, seen - first, g, i, j0 + first, G, nterms, term_data,
                           term_offsets, term_info, BQ);
              mode = 0;
            }
            /* a hidden key weighs 0; so does a score below top + EF_CUT (its weight
               would be subnormal: backends/c/attention_softmax.py, as the forward) */
            if (first == 0 && seen == BK) {
              /* every key seen: on whole vectors, without the loop's per-key masks
                 (ef_vexp is ef_sexp lane by lane: the same bits) */
              const vT tv = (vT){0} + top, dv = (vT){0} + di;
              #pragma GCC unroll 8
              for (int x = 0; x < BK / VW; ++x) {
                vT s = ef_load(pr + x * VW);
                if (mode == 1) s = s * scale;
                else if (mode == 2) s = s / scale;
                const vT w = ef_vexp(s - tv);
                ef_store(pr + x * VW, w);
                ef_store(dsr + x * VW, w * (ef_load(dsr + x * VW) - dv));
              }
            } else {
              #pragma omp simd
              for (long c = 0; c < BK; ++c) {
                const T s = mode == 1 ? pr[c] * scale : (mode == 2 ? pr[c] / scale : pr[c]);
                const T shown = c < seen && c >= first ? (T)1 : (T)0;
                /* (top, the row's log-sum-exp, is finite here: the runtime checks) */
                const T w = ef_sexp((shown != 0 ? s : top) - top) * shown;
                pr[c] = w;
                dsr[c] = w * (dsr[c] - di);
              }
            }
            if (term_grads)
              ef_term_gradients(dsr, first, seen, g, i, j0, nterms, term_grads, grad_info);
          }
          /* dV block += P^T dO, dK block += dS^T Q (the scale's factor at the end),
             dQ rows += dS K */
          ef_product(p, 1, BK, go + i0 * E, E, dvb, E, cols, E, rows, 0);
          ef_product(ds, 1, BK, q + i0 * D, D, dkb, D, cols, D, rows, 0);
          ef_product(ds, BK, 1, k + j0 * D, D, gq + i0 * D, D, rows, D, cols, 0);
        }
        for (long c = 0; c < cols; ++c) {
          for (long d = 0; d < D; ++d)
            gk[(j0 + c) * D + d] = ef_scaled(dkb[c * D + d], scale, scale_mode);
          memcpy(gv + (j0 + c) * E, dvb + c * E, sizeof(T) * (size_t)E);
        }
      }
      for (long t = 0; t < NQ * D; ++t) gq[t] = ef_scaled(gq[t], scale, scale_mode);
    }
    free(kt); free(vt); free(p); free(ds); free(dkb); free(dvb); free(delta);
  }
  free(order);
  return failed;
}
"""

_lock = threading.Lock()
_functions: Dict[str, object] = {}


def source(dtype: np.dtype) -> str:
    """The kernel's C source for float32 or float64 elements."""
    single = dtype == np.float32
    block = attention_block(dtype)
    declarations = ""
    if c_build.vector_math():
        declarations = c_build.vector_math_declarations("f", "float") if single else \
            c_build.vector_math_declarations("", "double")
    return _TEMPLATE % {"ctype": "float" if single else "double",
                        "lanes": block.lanes, "rows": block.rows,
                        "vectors": block.vectors, "double": int(not single),
                        "exp_source": softmax.exp_source(block.lanes),
                        "declarations": declarations, "terms": TERMS}


def backward_function(dtype: np.dtype):
    """The backward C function for this element type (compiled once)."""
    with _lock:
        found = _functions.get(dtype.name)
    if found is not None:
        return found
    function = c_build.load(source(dtype)).ef_attention_backward
    size = ctypes.c_long
    function.argtypes = [ctypes.c_void_p] * 9 + [size] * 5 + [
        ctypes.c_double, ctypes.c_int, size, size, ctypes.c_int, ctypes.c_int,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
        ctypes.c_void_p, ctypes.c_void_p]
    function.restype = ctypes.c_int
    with _lock:
        _functions[dtype.name] = function
    return function
