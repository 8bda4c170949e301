"""The fixed C text every rendered statement kernel starts with: the includes and
the kernel's scalar type, then the float or integer helpers its expressions call
(backends/c/render.py prints the kernels after them)."""

PRELUDE = """\
#include <stdint.h>
#include <math.h>
#include <omp.h>
typedef {T} T;
static inline int64_t ef_clip(int64_t p, int64_t n) {{ return p < 0 ? 0 : (p >= n ? n - 1 : p); }}
static inline int64_t ef_wrap(int64_t p, int64_t n) {{ int64_t r = p % n; return r < 0 ? r + n : r; }}
static inline int ef_in(int64_t p, int64_t n) {{ return p >= 0 && p < n; }}
/* Python's // and % by a positive constant d (quasi-affine subscripts), dividing
   non-negative values only: -1 - a is exact for |a| < 2**63 (checked per call) */
static inline int64_t ef_qdiv(int64_t a, int64_t d) {{ return a >= 0 ? a / d : -1 - (-1 - a) / d; }}
static inline int64_t ef_qmod(int64_t a, int64_t d) {{ return a >= 0 ? a % d : d - 1 - (-1 - a) % d; }}
/* bounds='check'/'promise': never read out of bounds; raise the flag instead */
static inline int ef_ok(int64_t p, int64_t n, int32_t *err) {{
  if (p >= 0 && p < n) return 1;
  #pragma omp atomic write
  *err = 1;
  return 0;
}}
/* NaN propagates as in NumPy's maximum/minimum */
static inline T ef_max(T a, T b) {{ return (a > b || a != a) ? a : b; }}
static inline T ef_min(T a, T b) {{ return (a < b || a != a) ? a : b; }}
/* a function, so that both branches are evaluated like NumPy's where */
static inline T ef_where(T c, T a, T b) {{ return c != 0 ? a : b; }}
static inline T ef_sq(T a) {{ return a * a; }}
#define ef_likely(c) __builtin_expect(!!(c), 1)
"""

FLOAT_HELPERS = """\
static inline T ef_sigmoid(T x) {{ return (T)1 / ((T)1 + exp{f}(-x)); }}
static inline T ef_softplus(T x) {{ return (x > 0 ? x : (T)0) + log1p{f}(exp{f}(-fabs{f}(x))); }}
static inline T ef_pow(T a, T b) {{ return pow{f}(a, b); }}
/* pow(a, 0.5), which GCC's vectoriser turns into sqrt(a): that differs at -inf (pow:
   inf) and -0 (pow: +0), as C's pow does and so NumPy's np.power element by element */
static inline T ef_pow_half(T a) {{ return a == -INFINITY ? INFINITY : sqrt{f}(a) + (T)0; }}
/* Neumaier's compensated addition of a block's partial sum x into s, the rounding
   error kept in c; the total is s + c (s alone once it is inf or NaN, where the
   compensation is meaningless) */
static inline void ef_fold(T *s, T *c, T x) {{
  T t = *s + x;
  *c += fabs{f}(*s) >= fabs{f}(x) ? (*s - t) + x : (x - t) + *s;
  *s = t;
}}
static inline T ef_total(T s, T c) {{ return isfinite(s) ? s + c : s; }}
static inline T ef_abs(T a) {{ return fabs{f}(a); }}
/* one-pass logsumexp: running maximum m, sum s of exp(v - m); result m + log(s).
   Branch-free so that SIMD lanes can each keep their own (m, s): where v equals m
   (both -inf, or both +inf) the exponential would be nan and is replaced; a NaN v
   makes s NaN, which the result keeps. */
static inline void ef_lse(T *m, T *s, T v) {{
  T e = (v == *m) ? (*m == -INFINITY ? (T)0 : (T)1) : exp{f}(-fabs{f}(v - *m));
  *s = (v > *m) ? *s * e + (T)1 : *s + e;
  *m = (v > *m) ? v : *m;
}}
/* merge two partial logsumexps (m, s) and (m2, s2) */
static inline void ef_lse_merge(T *m, T *s, T m2, T s2) {{
  if (m2 == *m) {{ *s += s2; return; }}
  if (m2 > *m) {{ *s = *s * exp{f}(*m - m2) + s2; *m = m2; }}
  else {{ *s += s2 * exp{f}(m2 - *m); }}
}}
"""

INT_HELPERS = """\
static inline T ef_pow(T a, T b) { T r = 1; while (b > 0) { if (b & 1) r = (T)(r * a); a = (T)(a * a); b >>= 1; } return r; }
static inline T ef_abs(T a) { return a < 0 ? (T)(-a) : a; }
"""


__all__ = ["FLOAT_HELPERS", "INT_HELPERS", "PRELUDE"]
