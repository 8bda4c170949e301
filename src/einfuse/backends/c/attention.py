"""Attention as one C kernel with online softmax (rewrite/online_softmax.py).

The arrays come in canonical layout: query (G, NQ, D), key (G, NK, D), value (G, NK, E)
and the output (G, NQ, E), all C-contiguous, where G is the product of the batch
extents.  The work is split over (g, block of BQ rows) with OpenMP (dynamic schedule:
causal blocks near the diagonal cost less).  For each row block the kernel walks the
key blocks of BK keys that some row of the block may see (the band lo <= j - i <= hi
the masks set: a causal mask stops at the block's last row, a window starts at its
first row's lower bound; key blocks outside the band are never computed), and per key
block

1. copies the key block transposed and the value block (zero-padded to whole vectors)
   into per-thread buffers, so the inner loops read unit-stride, aligned, cached data;
2. computes the scores block Q K^T with register blocking (RB rows x CV vectors of
   accumulators, the d loop innermost over a broadcast query value; RB and CV chosen
   from the machine's register file by plan/blocking.py);
3. applies the scale (as the scores are stored), adds the scores' terms (a padding
   mask or bias read in place per block, its next block prefetched; ALiBi-like index
   terms; ``TERMS``) -- for a row group that sees the whole block and terms that are
   tensors along the keys, to the tile while it is in registers, taking each row's
   largest and smallest score there too, so the softmax step does not read the block
   once more for its max nor cut exponents that cannot fall below the cut -- hides
   the keys outside the band and updates the running max, the running denominator
   and the rescaled accumulator (the softmax-weighted-sum monoid of
   rewrite/monoids.py) -- RB rows at a time on whole vectors where each sees the
   whole block, else row by row (attention_softmax.py, which also says why a weight
   under exp(-87) is 0): a score of -inf weighs 0 until the end, and a row whose max is
   -inf at the end (no finite score, every key masked) is NaN, as one-by-one is;
4. adds the weights times the value block to the accumulator (register-blocked again).

The extra memory is per thread (a few blocks), never N x N.  The source is a fixed
template: only the element type, the vector width and the block sizes vary, and every
size, scale, bound, term and flag is a runtime argument.  A value array with an inf or NaN is left
to the statements run one by one (its masked entries would make 0 * inf = NaN there):
``values_finite`` checks that first, in parallel."""

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
#define EF_EXP %(exp)s
/* BQ rows per block, a multiple of RB; BK keys, a multiple of CV vectors (64 or more:
   the per-block work of the online softmax is paid per BK keys) */
#define BQ (RB * ((64 + RB - 1) / RB))
#define BK (CV * VW * ((64 + CV * VW - 1) / (CV * VW)))
typedef T vT __attribute__((vector_size(VW * sizeof(T))));
%(declarations)s
static inline vT ef_load(const T *p) { vT v; memcpy(&v, p, sizeof v); return v; }
/* Keeps a loaded vector in a register: otherwise GCC folds the load into each of the
   RB multiply-adds that use it, and the loop is bound by loads instead of FMAs. */
#if defined(__x86_64__) && defined(__AVX512F__)
#define EF_KEEP(v) __asm__("" : "+v"(v))
#elif defined(__x86_64__) && defined(__SSE2__)
#define EF_KEEP(v) __asm__("" : "+x"(v))
#else
#define EF_KEEP(v) ((void)0)
#endif
static inline void ef_store(T *p, vT v) { memcpy(p, &v, sizeof v); }
%(softmax)s
static inline long ef_min(long a, long b) { return a < b ? a : b; }
static inline long ef_max(long a, long b) { return a > b ? a : b; }
static inline long ef_round(long n) { return (n + VW - 1) / VW * VW; }
/* n elements, 64-byte aligned (aligned_alloc wants a size that is a multiple of 64) */
static inline T *ef_alloc(long n) {
  return aligned_alloc(64, ((size_t)n * sizeof(T) + 63) / 64 * 64);
}

int ef_attention_finite(const T *v, long n, int threads) {
  int bad = 0;
  if (threads <= 0) threads = omp_get_max_threads();
  #pragma omp parallel for reduction(|:bad) num_threads(threads) schedule(static)
  for (long b = 0; b < n; b += 4096) {
    long end = ef_min(n, b + 4096);
    int here = 0;
    #pragma omp simd reduction(|:here)
    for (long t = b; t < end; ++t) here |= !(v[t] - v[t] == 0);
    bad |= here;
  }
  return !bad;
}

%(terms)s

/* One row of a scores block (scaled, terms added), its first ``seen`` keys visible:
   replaced by the weights exp(s - top) (0 for a score of -inf or below top + EF_CUT,
   backends/c/attention_softmax.py, and for the keys not seen); returns top, the running
   max after these keys (from ``old``), and their weights' sum. */
static inline __attribute__((always_inline)) T ef_weights(
    T *restrict sr, const long seen, const T old, T *sum) {
  T top = old;
  /* (a vector max may drop a NaN score; exp(NaN - top) below still makes the row NaN,
     as max[j] would) */
  #pragma omp simd reduction(max:top)
  for (long c = 0; c < seen; ++c) top = sr[c] > top ? sr[c] : top;
  T total = 0;
  if (top == -INFINITY) {      /* every score so far -inf (or NaN, which stays NaN) */
    for (long c = 0; c < seen; ++c) {
      const T p = sr[c] == -INFINITY ? (T)0 : %(exp)s(sr[c] - top);
      sr[c] = p;
      total += p;
    }
  } else {
    #pragma omp simd reduction(+:total)
    for (long c = 0; c < seen; ++c) {
      const T p = ef_sexp(sr[c] - top);
      sr[c] = p;
      total += p;
    }
  }
  for (long c = seen; c < BK; ++c) sr[c] = 0;
  *sum = total;
  return top;
}

/* The online softmax update of row r of the block, its keys first <= c < seen visible
   (0 <= first < seen): the others hidden, the weights, the running state, the
   accumulator's row rescaled. */
static inline void ef_row_update(T *restrict sr, const long first, const long seen,
                                 T *restrict mr, vT *restrict lr, T *restrict ar,
                                 const long EP) {
  for (long c = 0; c < first; ++c) sr[c] = -INFINITY;
  T total;
  const T top = seen == BK ? ef_weights(sr, BK, *mr, &total)
                           : ef_weights(sr, seen, *mr, &total);
  const T rescale = top == *mr ? (T)1 : ef_sexp(*mr - top);
  *lr = *lr * rescale;        /* (the denominator's lanes: ef_group_update) */
  (*lr)[0] += total;
  *mr = top;
  if (rescale != 1)
    for (long e = 0; e < EP; ++e) ar[e] *= rescale;
}

/* scale_mode: 0 none, 1 multiply, 2 divide; row i sees the keys j with lo <= j - i <= hi;
   the terms: see TERMS */
/* LSE, when not NULL: each row's log-sum-exp of its scores, m + log(l) (G, NQ), which
   the backward (c_attention_grad.py) recomputes the weights from */
int ef_attention(const T *Q, const T *K, const T *V, T *O, T *LSE, long G, long NQ, long NK,
                 long D, long E, double scale_in, int scale_mode, long lo, long hi,
                 int normalise, int threads, int nterms, const T *const *term_data,
                 const long *term_offsets, const long *term_info, int skip_hidden) {
  const T scale = (T)scale_in;
  const double factor = ef_scale_factor(scale_in, scale_mode);
  const int in_tile = ef_terms_in_tile(nterms, term_info);
  const long EP = ef_round(E);
  const long blocks = (NQ + BQ - 1) / BQ;
  int failed = 0;
  if (threads <= 0) threads = omp_get_max_threads();
  const long kblocks = (NK + BK - 1) / BK;
  /* every key block transposed once, zero-padded to BK keys: (G, kblocks, D, BK) */
  T *kt_all = ef_alloc(G * kblocks * D * BK);
  long *items = malloc(sizeof(long) * (size_t)(G * blocks));
  if (!kt_all || !items) { free(kt_all); free(items); return 1; }
  ef_order_items(items, G, blocks, nterms, term_offsets, term_info);
  #pragma omp parallel num_threads(threads)
  {
    #pragma omp for collapse(2) schedule(static)
    for (long g = 0; g < G; ++g)
      for (long jb = 0; jb < kblocks; ++jb) {
        const long j0 = jb * BK, cols = ef_min(BK, NK - j0);
        const T *k = K + (g * NK + j0) * D;
        T *kt = kt_all + (g * kblocks + jb) * D * BK;
        for (long c = 0; c < cols; ++c)
          for (long d = 0; d < D; ++d) kt[d * BK + c] = k[c * D + d];
        for (long d = 0; d < D; ++d)
          for (long c = cols; c < BK; ++c) kt[d * BK + c] = 0;
      }
    T *qb = ef_alloc(BQ * D);
    T *vb = ef_alloc(BK * EP);
    T *s = ef_alloc(BQ * BK);
    T *acc = ef_alloc(BQ * EP);
    T m[BQ], most[BQ], least[BQ];
    vT l[BQ], tile_most[RB], tile_least[RB];
    int ok = qb && vb && s && acc;
    if (!ok) {
      #pragma omp atomic write
      failed = 1;
    }
    #pragma omp for schedule(dynamic)
    for (long w = 0; w < G * blocks; ++w) {
        if (!ok) continue;
        const long g = items[w] / blocks, ib = items[w] %% blocks;
        const long i0 = ib * BQ, rows = ef_min(BQ, NQ - i0);
        const T *q = Q + (g * NQ + i0) * D;
        memcpy(qb, q, sizeof(T) * (size_t)(rows * D));
        memset(qb + rows * D, 0, sizeof(T) * (size_t)((BQ - rows) * D));
        for (long r = 0; r < BQ; ++r) { m[r] = -INFINITY; l[r] = (vT){0}; }
        memset(acc, 0, sizeof(T) * (size_t)(BQ * EP));
        /* the key blocks some row of the block sees */
        const long jend = ef_min(NK, i0 + rows + hi);
        const long jstart = ef_max(0, i0 + lo) / BK * BK;
        const long padded_rows = (rows + RB - 1) / RB * RB;
        for (long j0 = jstart; j0 < jend; j0 += BK) {
          const long cols = ef_min(BK, NK - j0);
          if (skip_hidden && ef_block_hidden(g, i0, rows, j0, cols, G, nterms, term_data,
                                             term_offsets, term_info, q,
                                             K + (g * NK + j0) * D, D, factor))
            continue;       /* a padding mask's keys: every weight 0 */
          const T *kt = kt_all + (g * kblocks + j0 / BK) * D * BK;
          /* the value block as whole vectors: read in place when it is, else copied
             zero-padded */
          const T *vrows = V + (g * NK + j0) * E;
          if (E != EP || cols != BK) {
            for (long c = 0; c < BK; ++c) {
              if (c < cols) memcpy(vb + c * EP, vrows + c * E, sizeof(T) * (size_t)E);
              else memset(vb + c * EP, 0, sizeof(T) * (size_t)E);
              memset(vb + c * EP + E, 0, sizeof(T) * (size_t)(EP - E));
            }
            vrows = vb;
          }
          /* scores: s[r][c] = sum_d q[r][d] * k[c][d] */
          for (long r0 = 0; r0 < padded_rows; r0 += RB) {
            /* whether each of the group's rows sees every key of the block; where the
               terms can be added to the tile in registers too (``in_tile``), they are,
               and the rows' largest and smallest scores are taken there */
            const int whole = r0 + RB <= rows && cols == BK &&
                              i0 + r0 + hi - j0 + 1 >= BK && i0 + r0 + RB - 1 + lo - j0 <= 0;
            const int tiled = whole && in_tile;
            for (long x0 = 0; x0 < BK; x0 += CV * VW) {
              vT a[RB][CV];
              #pragma GCC unroll 16
              for (int rr = 0; rr < RB; ++rr)
                #pragma GCC unroll 8
                for (int x = 0; x < CV; ++x) a[rr][x] = (vT){0};
              for (long d = 0; d < D; ++d) {
                vT k[CV];
                #pragma GCC unroll 8
                for (int x = 0; x < CV; ++x) { k[x] = ef_load(kt + d * BK + x0 + x * VW); EF_KEEP(k[x]); }
                #pragma GCC unroll 16
                for (int rr = 0; rr < RB; ++rr) {
                  const T qv = qb[(r0 + rr) * D + d];
                  #pragma GCC unroll 8
                  for (int x = 0; x < CV; ++x) a[rr][x] += qv * k[x];
                }
              }
              /* scaled as the statements scale (the same operation, once) */
              if (scale_mode == 1) {
                #pragma GCC unroll 16
                for (int rr = 0; rr < RB; ++rr)
                  #pragma GCC unroll 8
                  for (int x = 0; x < CV; ++x) a[rr][x] = a[rr][x] * scale;
              } else if (scale_mode == 2) {
                #pragma GCC unroll 16
                for (int rr = 0; rr < RB; ++rr)
                  #pragma GCC unroll 8
                  for (int x = 0; x < CV; ++x) a[rr][x] = a[rr][x] / scale;
              }
              if (tiled) {
                /* the terms in the order written, as ef_add_terms adds them (the same
                   bits); each row's next key block of a tensor prefetched */
                for (int t = 0; t < nterms; ++t) {
                  const long *f = term_info + 7 * t;
                  const T *x = term_data[t] + term_offsets[t * G + g] + f[2] * (i0 + r0) +
                               f[3] * (j0 + x0);
                  #pragma GCC unroll 16
                  for (int rr = 0; rr < RB; ++rr) {
                    const T *xr = x + rr * f[2];
                    if (x0 == 0 && f[3] && (rr == 0 || f[2]))
                      for (long c = 0; c < BK; c += 64 / sizeof(T))
                        __builtin_prefetch(xr + BK + c);
                    #pragma GCC unroll 8
                    for (int v = 0; v < CV; ++v) {
                      const vT b = f[3] ? ef_load(xr + v * VW) : (vT){0} + xr[0];
                      a[rr][v] = f[1] > 0 ? a[rr][v] + b : a[rr][v] - b;
                    }
                  }
                }
                #pragma GCC unroll 16
                for (int rr = 0; rr < RB; ++rr) {
                  vT hi_v = a[rr][0], lo_v = a[rr][0];
                  #pragma GCC unroll 8
                  for (int x = 1; x < CV; ++x) {
                    hi_v = ef_vmax(hi_v, a[rr][x]);
                    lo_v = ef_vmin(lo_v, a[rr][x]);
                  }
                  if (x0) {
                    hi_v = ef_vmax(tile_most[rr], hi_v);
                    lo_v = ef_vmin(tile_least[rr], lo_v);
                  }
                  tile_most[rr] = hi_v;
                  tile_least[rr] = lo_v;
                }
              }
              #pragma GCC unroll 16
              for (int rr = 0; rr < RB; ++rr)
                #pragma GCC unroll 8
                for (int x = 0; x < CV; ++x) ef_store(s + (r0 + rr) * BK + x0 + x * VW, a[rr][x]);
            }
            if (tiled)
              for (int rr = 0; rr < RB; ++rr) {
                most[r0 + rr] = ef_hmax(tile_most[rr]);
                least[r0 + rr] = ef_hmin(tile_least[rr]);
              }
          }
          /* the online softmax update of each row: RB rows together where each sees
             every key of the block, else row by row */
          for (long r0 = 0; r0 < padded_rows; r0 += RB) {
            const long top_row = i0 + r0 + RB - 1;
            const int whole = r0 + RB <= rows && cols == BK &&
                              i0 + r0 + hi - j0 + 1 >= BK && top_row + lo - j0 <= 0;
            if (whole) {
              int done;
              if (in_tile) {
                done = ef_group_update(s + r0 * BK, m + r0, l + r0, acc + r0 * EP, EP,
                                       most + r0, least + r0);
              } else {
                for (long r = r0; r < r0 + RB; ++r)
                  ef_add_terms(s + r * BK, BK, g, i0 + r, j0, G, nterms, term_data,
                               term_offsets, term_info, 0);
                done = ef_group_update(s + r0 * BK, m + r0, l + r0, acc + r0 * EP, EP,
                                       NULL, NULL);
              }
              if (done) continue;
            }
            for (long r = r0; r < r0 + RB; ++r) {
              T *sr = s + r * BK;
              const long i = i0 + r;
              /* the keys c of the block row i sees: first <= c < seen */
              const long seen = r < rows ? ef_min(cols, i + hi - j0 + 1) : 0;
              const long first = ef_max(0, i + lo - j0);
              if (seen <= first) { memset(sr, 0, sizeof(T) * BK); continue; }
              if (nterms && !whole)
                ef_add_terms(sr + first, seen - first, g, i, j0 + first, G, nterms,
                             term_data, term_offsets, term_info, 0);
              ef_row_update(sr, first, seen, m + r, l + r, acc + r * EP, EP);
            }
          }
          /* acc[r][e] += sum_c p[r][c] * v[c][e] */
          for (long r0 = 0; r0 < padded_rows; r0 += RB) {
            /* outside the keys the group's rows see every weight is 0 */
            const long cend = ef_min(BK, i0 + r0 + RB + hi - j0);
            const long cstart = ef_max(0, i0 + r0 + lo - j0);
            long e0 = 0;
            for (; e0 + CV * VW <= EP; e0 += CV * VW) {
              vT a[RB][CV];
              #pragma GCC unroll 16
              for (int rr = 0; rr < RB; ++rr)
                #pragma GCC unroll 8
                for (int x = 0; x < CV; ++x) a[rr][x] = ef_load(acc + (r0 + rr) * EP + e0 + x * VW);
              for (long c = cstart; c < cend; ++c) {
                const T *vr = vrows + c * EP + e0;
                vT v[CV];
                #pragma GCC unroll 8
                for (int x = 0; x < CV; ++x) { v[x] = ef_load(vr + x * VW); EF_KEEP(v[x]); }
                #pragma GCC unroll 16
                for (int rr = 0; rr < RB; ++rr) {
                  const T pv = s[(r0 + rr) * BK + c];
                  #pragma GCC unroll 8
                  for (int x = 0; x < CV; ++x) a[rr][x] += pv * v[x];
                }
              }
              #pragma GCC unroll 16
              for (int rr = 0; rr < RB; ++rr)
                #pragma GCC unroll 8
                for (int x = 0; x < CV; ++x) ef_store(acc + (r0 + rr) * EP + e0 + x * VW, a[rr][x]);
            }
            for (; e0 < EP; e0 += VW) {
              vT a[RB];
              #pragma GCC unroll 16
              for (int rr = 0; rr < RB; ++rr) a[rr] = ef_load(acc + (r0 + rr) * EP + e0);
              for (long c = cstart; c < cend; ++c) {
                const vT v0 = ef_load(vrows + c * EP + e0);
                #pragma GCC unroll 16
                for (int rr = 0; rr < RB; ++rr) a[rr] += s[(r0 + rr) * BK + c] * v0;
              }
              #pragma GCC unroll 16
              for (int rr = 0; rr < RB; ++rr) ef_store(acc + (r0 + rr) * EP + e0, a[rr]);
            }
          }
        }
        for (long r = 0; r < rows; ++r) {
          const T denominator = ef_hsum(l[r]);
          if (LSE) LSE[g * NQ + i0 + r] = m[r] + %(log)s(denominator);
          T *o = O + (g * NQ + i0 + r) * E;
          const T *ar = acc + r * EP;
          if (m[r] == -INFINITY) {       /* every weight exp(-inf - -inf) is NaN */
            for (long e = 0; e < E; ++e) o[e] = NAN;
          } else if (normalise) {
            for (long e = 0; e < E; ++e) o[e] = ar[e] / denominator;
          } else {
            for (long e = 0; e < E; ++e) o[e] = ar[e];
          }
        }
      }
    free(qb); free(vb); free(s); free(acc);
  }
  free(kt_all);
  free(items);
  return failed;
}
"""

_lock = threading.Lock()
_functions: Dict[str, tuple] = {}


def source(dtype: np.dtype) -> str:
    """The kernel's C source for float32 or float64 elements."""
    single = dtype == np.float32
    block = attention_block(dtype)
    vector_math = c_build.vector_math()
    declarations = ""
    if vector_math:
        declarations = c_build.vector_math_declarations("f", "float") if single else \
            c_build.vector_math_declarations("", "double")
    return _TEMPLATE % {"ctype": "float" if single else "double", "lanes": block.lanes,
                        "rows": block.rows, "vectors": block.vectors,
                        "double": int(not single), "softmax": softmax.exp_source(block.lanes) +
                        softmax.GROUP_UPDATE,
                        "declarations": declarations, "exp": "expf" if single else "exp",
                        "log": "logf" if single else "log", "terms": TERMS}


def functions(dtype: np.dtype):
    """(attention, values_finite) C functions for this element type (compiled once)."""
    with _lock:
        found = _functions.get(dtype.name)
    if found is not None:
        return found
    library = c_build.load(source(dtype))
    attention, finite = library.ef_attention, library.ef_attention_finite
    size = ctypes.c_long
    attention.argtypes = [ctypes.c_void_p] * 5 + [size] * 5 + [
        ctypes.c_double, ctypes.c_int, size, size, ctypes.c_int, ctypes.c_int,
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    attention.restype = ctypes.c_int
    finite.argtypes = [ctypes.c_void_p, size, ctypes.c_int]
    finite.restype = ctypes.c_int
    with _lock:
        _functions[dtype.name] = (attention, finite)
    return attention, finite
