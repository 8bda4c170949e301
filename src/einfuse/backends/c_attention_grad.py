"""The gradient of fused attention (c_attention.py) as one C kernel: dQ, dK and dV from
the query, key, value, output, the output's gradient dO and each row's log-sum-exp L of
its scores (written by the forward), in the forward's canonical layout -- query (G, NQ,
D), key (G, NK, D), value (G, NK, E), C-contiguous.

With s = q_i . k_j (scaled as the forward scales it), the weights are recomputed per
block as p_ij = exp(s_ij - L_i) (0 where the mask hides key j from row i), and

    dv_j += p_ij do_i          dp_ij = do_i . v_j          ds_ij = p_ij (dp_ij - delta_i)
    dq_i += c ds_ij k_j        dk_j += c ds_ij q_i          delta_i = do_i . o_i

with c the scale's derivative (scale, 1/scale or 1).  Each thread owns whole batch
elements g (so dQ needs no atomics); for each block of BK keys it walks the row blocks
that see them (a causal mask starts at the block's first key), and keeps the key block
and value block transposed and their gradients in per-thread buffers: the extra memory
is a few blocks per thread and one row of delta per batch element, never N x N.  The
forward's condition holds here too: values without inf or NaN (the runtime checks the
query and key as well, and dO, before calling)."""

from __future__ import annotations

import ctypes
import threading
from typing import Dict

import numpy as np

from . import c_build

_TEMPLATE = r"""
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
typedef %(ctype)s T;
#define BQ 64
#define BK 64
%(declarations)s
static inline long ef_min(long a, long b) { return a < b ? a : b; }
static inline T *ef_alloc(long n) {
  return aligned_alloc(64, ((size_t)(n > 0 ? n : 1) * sizeof(T) + 63) / 64 * 64);
}
/* the scale's derivative applied to x: scale_mode 0 none, 1 multiply, 2 divide */
static inline T ef_scaled(T x, T scale, int scale_mode) {
  return scale_mode == 1 ? x * scale : (scale_mode == 2 ? x / scale : x);
}

/* mask: 0 none, 1 j <= i */
int ef_attention_backward(const T *Q, const T *K, const T *V, const T *O, const T *dO,
                          const T *LSE, T *dQ, T *dK, T *dV, long G, long NQ, long NK,
                          long D, long E, double scale_in, int scale_mode, int mask,
                          int threads) {
  const T scale = (T)scale_in;
  int failed = 0;
  if (threads <= 0) threads = omp_get_max_threads();
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
    for (long g = 0; g < G; ++g) {
      if (!ok) continue;
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
        for (long d = 0; d < D; ++d)
          for (long c = 0; c < BK; ++c) kt[d * BK + c] = c < cols ? k[(j0 + c) * D + d] : 0;
        for (long e = 0; e < E; ++e)
          for (long c = 0; c < BK; ++c) vt[e * BK + c] = c < cols ? v[(j0 + c) * E + e] : 0;
        memset(dkb, 0, sizeof(T) * (size_t)(BK * D));
        memset(dvb, 0, sizeof(T) * (size_t)(BK * E));
        /* under the causal mask, rows before j0 see none of these keys */
        for (long i0 = mask == 1 ? j0 : 0; i0 < NQ; i0 += BQ) {
          const long rows = ef_min(BQ, NQ - i0);
          for (long r = 0; r < rows; ++r) {
            const long i = i0 + r;
            T *pr = p + r * BK, *dsr = ds + r * BK;
            const T *qr = q + i * D, *gor = go + i * E;
            #pragma omp simd
            for (long c = 0; c < BK; ++c) { pr[c] = 0; dsr[c] = 0; }
            for (long d = 0; d < D; ++d) {
              const T x = qr[d];
              const T *kd = kt + d * BK;
              #pragma omp simd
              for (long c = 0; c < BK; ++c) pr[c] += x * kd[c];
            }
            for (long e = 0; e < E; ++e) {
              const T x = gor[e];
              const T *ve = vt + e * BK;
              #pragma omp simd
              for (long c = 0; c < BK; ++c) dsr[c] += x * ve[c];
            }
            const long seen = mask == 1 ? ef_min(cols, i - j0 + 1) : cols;
            const T top = lse[i], di = delta[i];
            #pragma omp simd
            for (long c = 0; c < BK; ++c) {
              const T s = scale_mode == 1 ? pr[c] * scale
                                          : (scale_mode == 2 ? pr[c] / scale : pr[c]);
              const T w = c < seen ? %(exp)s(s - top) : (T)0;
              pr[c] = w;
              dsr[c] = c < seen ? w * (dsr[c] - di) : (T)0;
            }
          }
          for (long r = 0; r < rows; ++r) {
            const long i = i0 + r;
            const T *pr = p + r * BK, *dsr = ds + r * BK;
            const T *qr = q + i * D, *gor = go + i * E;
            T *gqr = gq + i * D;
            for (long c = 0; c < cols; ++c) {
              const T w = pr[c], x = dsr[c];
              T *dvc = dvb + c * E, *dkc = dkb + c * D;
              const T *kc = k + (j0 + c) * D;
              #pragma omp simd
              for (long e = 0; e < E; ++e) dvc[e] += w * gor[e];
              #pragma omp simd
              for (long d = 0; d < D; ++d) { dkc[d] += x * qr[d]; gqr[d] += x * kc[d]; }
            }
          }
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
  return failed;
}
"""

_lock = threading.Lock()
_functions: Dict[str, object] = {}


def source(dtype: np.dtype) -> str:
    """The kernel's C source for float32 or float64 elements."""
    single = dtype == np.float32
    declarations = ""
    if c_build.vector_math():
        declarations = c_build.vector_math_declarations("f", "float") if single else \
            c_build.vector_math_declarations("", "double")
    return _TEMPLATE % {"ctype": "float" if single else "double",
                        "declarations": declarations, "exp": "expf" if single else "exp"}


def backward_function(dtype: np.dtype):
    """The backward C function for this element type (compiled once)."""
    with _lock:
        found = _functions.get(dtype.name)
    if found is not None:
        return found
    function = c_build.load(source(dtype)).ef_attention_backward
    size = ctypes.c_long
    function.argtypes = [ctypes.c_void_p] * 9 + [size] * 5 + [
        ctypes.c_double, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    function.restype = ctypes.c_int
    with _lock:
        _functions[dtype.name] = function
    return function
