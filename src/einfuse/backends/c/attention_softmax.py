"""The online softmax step of the fused attention kernels (backends/c/attention.py and
attention_grad.py) on whole vectors: an inline vector exp and the update of a group of
rows that see every key of a block.

Why: the step ran row by row through scalar-shaped loops that the compiler vectorised
one row at a time -- a pass to scale, one for the max, one for a keep mask, one calling
libmvec's exp per vector -- and cost 1.5 of 5.4 ms of a non-causal 2x4x512x64 forward
(28%; the products alone ran at 138 GFLOP/s).  Here RB rows go through each pass
together, the exp is a polynomial inlined into the loop instead of a call per vector,
the lane reductions fold by shuffles, and the denominator stays a vector per row until
the end: 0.9 ms of 4.9 ms, about what the exps themselves take (some 19 vector
operations per vector of scores, and 512-bit operations issue on two ports).

The exp: arguments are s - top <= 0 (top the running max; the backward's log-sum-exp,
which is not below any score up to rounding).  An argument below EF_CUT gives weight 0
instead of exp(EF_CUT) or less (< 1.7e-38 in float32, < 3.4e-308 in float64, against a
row maximum weighing 1: far below the rounding of any sum of weights), so that no exp
takes a subnormal path -- libmvec's does, per lane, and ALiBi's far keys (slope * (j -
i) to -255) made a 2x4x512x64 backward 3.5x slower so (27 ms, 7.7 without); a subnormal weight also slows every
multiply-add that reads it.  NaN stays NaN (a NaN argument fails the comparison and its
polynomial is NaN).  Range reduction x = n ln2 + r, |r| <= ln2 / 2, with ln2 split in
two so that n ln2's high part is exact, then exp(r) by its Taylor series (degree 7 for
float32: truncation 5e-9 relative, under half an ulp; degree 13 for float64), times 2^n
built in the exponent bits (n >= -126 / -1021 above the cut: a normal number)."""

# exp's polynomial on the reduced argument r, the same for the vector and the scalar
# form (``ty``: the type of p), so that the rows seeing part of a block get the bits of
# those seeing a whole one
_POLYNOMIAL = r"""#if EF_DOUBLE
  @ p = r * (T)(1.0 / 6227020800.0) + (T)(1.0 / 479001600.0);
  p = p * r + (T)(1.0 / 39916800.0);
  p = p * r + (T)(1.0 / 3628800.0);
  p = p * r + (T)(1.0 / 362880.0);
  p = p * r + (T)(1.0 / 40320.0);
  p = p * r + (T)(1.0 / 5040.0);
  p = p * r + (T)(1.0 / 720.0);
#else
  @ p = r * (T)(1.0 / 5040.0) + (T)(1.0 / 720.0);
#endif
  p = p * r + (T)(1.0 / 120.0);
  p = p * r + (T)(1.0 / 24.0);
  p = p * r + (T)(1.0 / 6.0);
  p = p * r + (T)0.5;
  p = p * r + (T)1;
  p = p * r + (T)1;
"""


def _polynomial(ty: str) -> str:
    return _POLYNOMIAL.replace("@", ty)


VECTOR_EXP = r"""
#if EF_DOUBLE
typedef unsigned long long ef_bits;
typedef long long ef_mask_lane;
#define EF_CUT (-708.0)
#define EF_SHIFTER 6755399441055744.0           /* 1.5 * 2^52: adding it rounds to an integer */
#define EF_MANTISSA 52
#define EF_ONE_BITS 0x3FF0000000000000ULL
#define EF_LN2_HI 6.93147180369123816490e-01
#define EF_LN2_LO 1.90821492927058770002e-10
#else
typedef unsigned int ef_bits;
typedef int ef_mask_lane;
#define EF_CUT (-87.0f)
#define EF_SHIFTER 12582912.0f                  /* 1.5 * 2^23 */
#define EF_MANTISSA 23
#define EF_ONE_BITS 0x3F800000U
#define EF_LN2_HI 0.693359375f
#define EF_LN2_LO (-2.12194440e-4f)
#endif
#define EF_LOG2E 1.44269504088896340736
typedef ef_bits vB __attribute__((vector_size(VW * sizeof(T))));
typedef ef_mask_lane vM __attribute__((vector_size(VW * sizeof(T))));

/* exp(x) for x >= EF_CUT (or NaN) */
static inline vT ef_vexp_in_range(vT x) {
  const vT t = x * (T)EF_LOG2E + (T)EF_SHIFTER;
  const vT n = t - (T)EF_SHIFTER;
  const vT r = (x - n * (T)EF_LN2_HI) - n * (T)EF_LN2_LO;
""" + _polynomial("vT") + r"""  /* t's low bits hold n (two's complement): shifted into the exponent of 1.0 */
  const vB power = ((vB)t << EF_MANTISSA) + EF_ONE_BITS;
  return p * (vT)power;
}

/* exp(x) where x >= EF_CUT or x is NaN, else 0 (see attention_softmax.py) */
static inline vT ef_vexp(vT x) {
  const vM low = x < (T)EF_CUT;
  const vT cut = (vT){0} + (T)EF_CUT;
  const vT safe = (vT)(((vB)x & ~(vB)low) | ((vB)cut & (vB)low));
  return (vT)((vB)ef_vexp_in_range(safe) & ~(vB)low);
}

/* b > a ? b : a and b < a ? b : a lane by lane (a NaN in b is dropped: exp(NaN - top)
   still gives NaN).  That is what the x86 max and min instructions compute with b
   first (they return the second operand where either is NaN), one instruction where
   GCC's form of the select took three (a compare, a masked move, a blend) */
#if defined(__AVX512F__) && VW * (1 + EF_DOUBLE) == 16
#include <immintrin.h>
#define EF_MAXMIN(op) (EF_DOUBLE ? (vT)_mm512_##op##_pd((__m512d)b, (__m512d)a) \
                                 : (vT)_mm512_##op##_ps((__m512)b, (__m512)a))
#elif defined(__AVX__) && VW * (1 + EF_DOUBLE) == 8
#include <immintrin.h>
#define EF_MAXMIN(op) (EF_DOUBLE ? (vT)_mm256_##op##_pd((__m256d)b, (__m256d)a) \
                                 : (vT)_mm256_##op##_ps((__m256)b, (__m256)a))
#endif
static inline vT ef_vmax(vT a, vT b) {
#ifdef EF_MAXMIN
  return EF_MAXMIN(max);
#else
  const vM more = b > a;
  return (vT)(((vB)b & (vB)more) | ((vB)a & ~(vB)more));
#endif
}
static inline vT ef_vmin(vT a, vT b) {
#ifdef EF_MAXMIN
  return EF_MAXMIN(min);
#else
  const vM less = b < a;
  return (vT)(((vB)b & (vB)less) | ((vB)a & ~(vB)less));
#endif
}
"""

GROUP_UPDATE = r"""
/* The online softmax update of the RB rows of the scores block ``s`` (BK keys a row,
   scaled and their terms added), every key of the block seen by each: each row's
   running max m and denominator l (a vector per row: its lanes are summed once, at
   the end) updated, its scores replaced by the weights exp(s - top) and its
   accumulator row rescaled.  Returns 0, changing nothing, where a row's max is -inf
   (every score so far -inf or NaN: the row by row path handles it).  A row's vectors
   are unrolled, the rows are not: RB x BK / VW exps in flight at once spilled the
   polynomial's constants, and rows in sequence still overlap out of order.
   ``most`` and ``least``, where not NULL: each row's largest and smallest score of
   the block, taken while the scores were in registers (ef_vmax and ef_vmin: NaN
   dropped, as this pass drops it), so the block is not read once more for them; a
   row whose every exponent s - top is then at or above EF_CUT takes the exp without
   its cut (ef_vexp_in_range: the same bits). */
static inline __attribute__((always_inline)) int ef_group_update(
    T *restrict s, T *restrict m, vT *restrict l, T *restrict acc, const long EP,
    const T *most, const T *least) {
  T top[RB];
  int finite = 1;
  for (int rr = 0; rr < RB; ++rr) {
    T t;
    if (most) {
      t = most[rr];
    } else {
      vT v = ef_load(s + rr * BK);
      #pragma GCC unroll 8
      for (int x = 1; x < BK / VW; ++x) v = ef_vmax(v, ef_load(s + rr * BK + x * VW));
      t = ef_hmax(v);
    }
    top[rr] = t > m[rr] ? t : m[rr];
    finite &= top[rr] != -INFINITY;
  }
  if (!finite) return 0;
  for (int rr = 0; rr < RB; ++rr) {
    vT total = (vT){0};
    T *sr = s + rr * BK;
    if (least && least[rr] - top[rr] >= (T)EF_CUT) {
      #pragma GCC unroll 8
      for (int x = 0; x < BK / VW; ++x) {
        const vT p = ef_vexp_in_range(ef_load(sr + x * VW) - top[rr]);
        ef_store(sr + x * VW, p);
        total += p;
      }
    } else {
      #pragma GCC unroll 8
      for (int x = 0; x < BK / VW; ++x) {
        const vT p = ef_vexp(ef_load(sr + x * VW) - top[rr]);
        ef_store(sr + x * VW, p);
        total += p;
      }
    }
    const T rescale = top[rr] == m[rr] ? (T)1 : ef_sexp(m[rr] - top[rr]);
    l[rr] = l[rr] * rescale + total;
    m[rr] = top[rr];
    if (rescale != 1) {
      T *ar = acc + rr * EP;
      for (long e = 0; e < EP; ++e) ar[e] *= rescale;
    }
  }
  return 1;
}
"""

SCALAR_EXP = r"""
/* ef_vexp's arithmetic on one value (the same bits lane by lane), for the loops the
   compiler vectorises itself (the rows that see part of a block) */
static inline T ef_sexp(T x) {
  const T safe = x < (T)EF_CUT ? (T)EF_CUT : x;
  const T t = safe * (T)EF_LOG2E + (T)EF_SHIFTER;
  const T n = t - (T)EF_SHIFTER;
  const T r = (safe - n * (T)EF_LN2_HI) - n * (T)EF_LN2_LO;
""" + _polynomial("T") + r"""  ef_bits bits;
  memcpy(&bits, &t, sizeof bits);
  bits = (bits << EF_MANTISSA) + EF_ONE_BITS;
  T power;
  memcpy(&power, &bits, sizeof power);
  return x < (T)EF_CUT ? (T)0 : p * power;
}
"""


def exp_source(lanes: int) -> str:
    """The vector and scalar exp and the lane reductions, for vectors of ``lanes``
    elements (they need T, VW, vT, ef_load and EF_DOUBLE defined)."""
    return VECTOR_EXP + reductions(lanes) + SCALAR_EXP


def reductions(lanes: int) -> str:
    """ef_hmax, ef_hmin and ef_hsum: a vector's largest and smallest lane and its lanes'
    sum, by folding it onto itself rotated by half, a quarter, ... of its lanes
    (log2(lanes) shuffles and operations, not lanes - 1 dependent scalar ones; the
    sum's order is fixed by the build).  Generated: a shuffle's lane indices must be
    constants."""
    steps = []
    width = lanes // 2
    while width:
        steps.append("(vM){" + ", ".join(str((u + width) % lanes) for u in range(lanes)) +
                     "}")
        width //= 2
    fold_max = "".join(f"  v = ef_vmax(v, __builtin_shuffle(v, {m}));\n" for m in steps)
    fold_min = "".join(f"  v = ef_vmin(v, __builtin_shuffle(v, {m}));\n" for m in steps)
    fold_sum = "".join(f"  v += __builtin_shuffle(v, {m});\n" for m in steps)
    return (f"static inline T ef_hmax(vT v) {{\n{fold_max}  return v[0];\n}}\n"
            f"static inline T ef_hmin(vT v) {{\n{fold_min}  return v[0];\n}}\n"
            f"static inline T ef_hsum(vT v) {{\n{fold_sum}  return v[0];\n}}\n")
