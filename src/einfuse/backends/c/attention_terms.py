"""The C source the fused attention kernels (attention.py, attention_grad.py) share for
the scores' terms: adding them to a row of scores, whether the forward may add them to a
tile in registers instead, the work items' order where batch elements share a bias, and
whether a block a padding mask hides may be skipped (and is -inf as the statements
compute it)."""

# The scores' additive terms (rewrite/attention_scores.py), added to n scores of row i
# from key j0 on.  Term t reads term_data[t] + term_offsets[t * G + g] (its batch element
# g's offset) and term_info[7 t ...] = kind, sign, row stride, key stride, a, b, k:
# kind 0 a tensor, sign * x[i * row stride + j * key stride] (a stride 0 where it is
# broadcast); kind 1 an index term, coefficient * (a j + b i + k), the coefficient the
# one value at the offset.  Terms are added in the order written, after the scale, as
# the statements add them.
TERMS = r"""
/* The work items, g * blocks + ib (the backward's: blocks = 1), in the order the
   threads take them: g by g, but the batch elements that read the same data of the first added tensor (a bias[h,i,j]
   broadcast over b) next to each other, row block by row block, so that the second
   finds the bias tile the first brought into the cache (a 2x4x512x64 bias forward read
   8 MB from L3, now 4).  Only the order: each item's values are the same. */
typedef struct { long offset, g; } ef_keyed;
static int ef_keyed_order(const void *a, const void *b) {
  const ef_keyed *x = a, *y = b;
  return x->offset != y->offset ? (x->offset < y->offset ? -1 : 1)
                                : (x->g < y->g ? -1 : x->g > y->g);
}
static void ef_order_items(long *items, const long G, const long blocks, const int nterms,
                           const long *term_offsets, const long *term_info) {
  int t = 0;
  while (t < nterms && term_info[7 * t] != 0) ++t;
  ef_keyed *keyed = t < nterms && G > 1 ? malloc(sizeof(ef_keyed) * (size_t)G) : NULL;
  if (!keyed) {
    for (long w = 0; w < G * blocks; ++w) items[w] = w;
    return;
  }
  for (long g = 0; g < G; ++g) keyed[g] = (ef_keyed){term_offsets[t * G + g], g};
  qsort(keyed, (size_t)G, sizeof(ef_keyed), ef_keyed_order);
  long w = 0;
  for (long start = 0, end; start < G; start = end) {
    for (end = start + 1; end < G && keyed[end].offset == keyed[start].offset; ++end) {}
    for (long ib = 0; ib < blocks; ++ib)
      for (long k = start; k < end; ++k) items[w++] = keyed[k].g * blocks + ib;
  }
  free(keyed);
}

/* Whether the forward may add the terms to a tile of scores in registers: every term
   a tensor read along the keys at unit stride or broadcast along them (a bias, a
   padding mask), the index terms left to ef_add_terms. */
static int ef_terms_in_tile(const int nterms, const long *term_info) {
  for (int t = 0; t < nterms; ++t)
    if (term_info[7 * t] != 0 || (term_info[7 * t + 3] != 0 && term_info[7 * t + 3] != 1))
      return 0;
  return 1;
}

static void ef_add_terms(T *restrict sr, const long n, const long g, const long i,
                         const long j0, const long G, const int nterms,
                         const T *const *term_data, const long *term_offsets,
                         const long *term_info, const long ahead_rows) {
  for (int t = 0; t < nterms; ++t) {
    const long *f = term_info + 7 * t;
    const T *base = term_data[t] + term_offsets[t * G + g];
    if (f[0] == 0) {
      const T *x = base + f[2] * i + f[3] * j0;
      const long sj = f[3];
      /* the same row's next key block (the forward's order), or the row ahead_rows
         further on at these keys (the backward's): fetched while this block computes,
         as a tensor's rows are too far apart for the hardware's prefetcher (a
         bias[h,i,j] block is BQ rows of BK keys, N apart).  Not for a term broadcast
         along that axis: its data is the same and already cached. */
      const long ahead = ahead_rows ? ahead_rows * f[2] : BK * sj;
      if (ahead && sj == 1)
        for (long c = 0; c < n; c += 64 / sizeof(T)) __builtin_prefetch(x + ahead + c);
      if (f[1] > 0 && sj == 1) {
        #pragma omp simd
        for (long c = 0; c < n; ++c) sr[c] += x[c];
      } else if (f[1] > 0) {
        for (long c = 0; c < n; ++c) sr[c] += x[c * sj];
      } else {
        for (long c = 0; c < n; ++c) sr[c] -= x[c * sj];
      }
    } else {
      const T coefficient = base[0];
      const long a = f[4], start = f[4] * j0 + f[5] * i + f[6];
      #pragma omp simd
      for (long c = 0; c < n; ++c) sr[c] += coefficient * (T)(start + a * c);
    }
  }
}

/* The largest |x| of n rows of ``width`` values, ``stride`` apart; infinite where one
   is not finite (NaN included). */
static double ef_largest(const T *x, const long n, const long width, const long stride) {
  T most = 0;
  int finite = 1;
  for (long r = 0; r < n; ++r) {
    const T *row = x + r * stride;
    #pragma omp simd reduction(max:most) reduction(&:finite)
    for (long c = 0; c < width; ++c) {
      const T a = row[c] < 0 ? -row[c] : row[c];
      finite &= a - a == 0;
      most = a > most ? a : most;
    }
  }
  return finite ? (double)most : INFINITY;
}

/* Whether every score of the block (rows i0.., keys j0..) is -inf as the statements
   compute it, where term ``hidden`` is -inf at each of them: -inf plus anything but
   +inf and NaN is -inf, and a sum reaches +inf only by overflowing upwards, so it is
   enough that the block's query rows ``q`` and key rows ``k`` are finite, no other
   term is NaN or +inf there, and the largest positive part of each score's addends
   sums to well below the type's maximum.  Asked only for a block some term hides, so
   its scans (rows x D, cols x D and the other terms' block) cost a fraction of the
   block's products that a skip saves; per block, so a NaN elsewhere in the arrays
   does not stop the blocks it cannot reach from being skipped. */
static int ef_block_bounded(const int hidden, const long g, const long i0, const long rows,
                            const long j0, const long cols, const long G, const int nterms,
                            const T *const *term_data, const long *term_offsets,
                            const long *term_info, const T *q, const T *k, const long D,
                            const double factor) {
  double total = ef_largest(q, rows, D, D) * ef_largest(k, cols, D, D) * (double)D * factor;
  for (int t = 0; t < nterms && total == total; ++t) {
    if (t == hidden) continue;
    const long *f = term_info + 7 * t;
    const T *base = term_data[t] + term_offsets[t * G + g];
    if (f[0] == 0) {
      const T *x = base + f[2] * i0 + f[3] * j0;
      const long n = f[2] == 0 ? 1 : rows, m = f[3] == 0 ? 1 : cols;
      T most = 0;
      for (long r = 0; r < n; ++r)
        for (long c = 0; c < m; ++c) {
          const T v = f[1] > 0 ? x[r * f[2] + c * f[3]] : -x[r * f[2] + c * f[3]];
          if (v != v || v == INFINITY) return 0;
          most = v > most ? v : most;
        }
      total += (double)most;
    } else {
      const double coefficient = (double)base[0];
      total += (coefficient < 0 ? -coefficient : coefficient) *
               (double)(labs(f[4]) * (j0 + cols) + labs(f[5]) * (i0 + rows) + labs(f[6]));
    }
  }
  return total < (EF_DOUBLE ? DBL_MAX : FLT_MAX) / 4;
}

/* Whether an added tensor term is -inf for every (row, key) of the block rows i0..,
   keys j0.. and the block's scores are -inf with it (ef_block_bounded): every weight
   there is 0, so the block is skipped.  ``q`` and ``k``: the block's first query and
   key rows (D values each); ``factor``: how much the scale multiplies a dot product. */
static int ef_block_hidden(const long g, const long i0, const long rows, const long j0,
                           const long cols, const long G, const int nterms,
                           const T *const *term_data, const long *term_offsets,
                           const long *term_info, const T *q, const T *k, const long D,
                           const double factor) {
  for (int t = 0; t < nterms; ++t) {
    const long *f = term_info + 7 * t;
    if (f[0] != 0 || f[1] < 0) continue;
    const T *x = term_data[t] + term_offsets[t * G + g] + f[2] * i0 + f[3] * j0;
    const long checked = f[2] == 0 ? 1 : rows;     /* broadcast over rows: one is all */
    int hidden = 1;
    for (long r = 0; r < checked && hidden; ++r)
      for (long c = 0; c < cols; ++c)
        if (x[r * f[2] + c * f[3]] != -INFINITY) { hidden = 0; break; }
    if (hidden)
      return ef_block_bounded(t, g, i0, rows, j0, cols, G, nterms, term_data, term_offsets,
                              term_info, q, k, D, factor);
  }
  return 0;
}

/* How much scale_mode's scale multiplies a dot product's magnitude (infinite or NaN
   for a scale that is not finite or a divisor of 0: no block bound holds then). */
static inline double ef_scale_factor(const double scale, const int scale_mode) {
  const double a = scale < 0 ? -scale : scale;
  return scale_mode == 1 ? a : scale_mode == 2 ? 1 / a : 1;
}
"""
