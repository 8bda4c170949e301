"""C source of the layernorm row kernel (spliced into rows_source.TEMPLATE, after the
helpers it shares with the softmax kernel): a row's mean and its sum of squares about
it, each a compensated sum past one block of EF_BLOCK values, then the normalised row,
streamed past the caches where the output is larger than them (row_streams.py)."""

SOURCE = r"""/* The row's compensated sum of (x - mu)**k, k = 1 (mu = 0) or 2. */
static inline void ef_sum_block(const T *x, int64_t b, int64_t end, T mu, int square,
                                vT *sum0, vT *sum1, const T *ahead) {
  const vT mv = ef_splat(mu);
  vT t0 = {}, t1 = {}, t2 = {}, t3 = {};
  int64_t j = b;
  if (square) {
    for (; j + 4 * VW <= end; j += 4 * VW) {
      ef_prefetch4(ahead, j);
      vT d0 = ef_load(x + j) - mv, d1 = ef_load(x + j + VW) - mv;
      vT d2 = ef_load(x + j + 2 * VW) - mv, d3 = ef_load(x + j + 3 * VW) - mv;
      t0 += d0 * d0; t1 += d1 * d1; t2 += d2 * d2; t3 += d3 * d3;
    }
    for (; j + VW <= end; j += VW) { vT d = ef_load(x + j) - mv; t0 += d * d; }
    if (j < end) {
      vT d = ef_load_part(x + j, end - j, 0) - mv;
      t1 += ef_sel(ef_lanes() < (T)(end - j), d * d, (vT){});
    }
  } else {
    for (; j + 4 * VW <= end; j += 4 * VW) {
      t0 += ef_load(x + j); t1 += ef_load(x + j + VW);
      t2 += ef_load(x + j + 2 * VW); t3 += ef_load(x + j + 3 * VW);
    }
    for (; j + VW <= end; j += VW) t0 += ef_load(x + j);
    if (j < end) t1 += ef_load_part(x + j, end - j, 0);
  }
  *sum0 += t0 + t2;
  *sum1 += t1 + t3;
}

/* The row's sum of (x - mu)**k, k = 1 (mu = 0) or 2; compensated past one block. */
static inline T ef_row_sum(const T *x, int64_t n, T mu, int square, const T *ahead) {
  if (n <= EF_BLOCK) {
    vT t0 = {}, t1 = {};
    ef_sum_block(x, 0, n, mu, square, &t0, &t1, ahead);
    return ef_hsum(t0 + t1);
  }
  vT s0 = {}, s1 = {}, c0 = {}, c1 = {};
  for (int64_t b = 0; b < n; b += EF_BLOCK) {
    vT t0 = {}, t1 = {};
    ef_sum_block(x, b, ef_min(n, b + EF_BLOCK), mu, square, &t0, &t1, 0);
    ef_vfold(&s0, &c0, t0);
    ef_vfold(&s1, &c1, t1);
  }
  return ef_total(s0 + s1, c0 + c1);
}

/* A row longer than a block: its mean's sum (the same compensated sum as
   ef_row_sum's) and its sum of squares about that mean, reading the row once: each
   block's squares are taken about the block's own mean while the block is in the L1
   cache, and the blocks are combined as Chan et al.'s parallel variance does.  Where
   that sum of squares is not finite (inf or NaN values, overflow) it is taken again
   as written, sum((x - mu)**2), so that such rows give the statements' values. */
static inline void ef_row_moments(const T *x, int64_t n, T d1, T *mu, T *squares) {
  vT s0 = {}, s1 = {}, c0 = {}, c1 = {};
  T count = 0, mean = 0, m2 = 0;
  for (int64_t b = 0; b < n; b += EF_BLOCK) {
    const int64_t end = ef_min(n, b + EF_BLOCK);
    vT u0 = {}, u1 = {}, q0 = {}, q1 = {};
    ef_sum_block(x, b, end, 0, 0, &u0, &u1, 0);
    const T size = (T)(end - b), block_mean = ef_hsum(u0 + u1) / size;
    ef_sum_block(x, b, end, block_mean, 1, &q0, &q1, 0);
    const T delta = block_mean - mean, total = count + size;
    mean += delta * (size / total);
    m2 += ef_hsum(q0 + q1) + delta * delta * (count * (size / total));
    count = total;
    ef_vfold(&s0, &c0, u0);
    ef_vfold(&s1, &c1, u1);
  }
  *mu = ef_total(s0 + s1, c0 + c1) / d1;
  const T shift = mean - *mu;
  *squares = m2 + count * shift * shift;
  if (!isfinite(*squares)) *squares = ef_row_sum(x, n, *mu, 1, 0);
}

/* MU[i] = sum(X[i,:]) / n1, V[i] = sum((X[i,:] - MU[i])**2) / n2,
   Y[i,j] = (X[i,j] - MU[i]) / sqrt(V[i] + eps) * G[j] + B[j] */
void ef_layernorm_rows(const T *X, const T *G, const T *B, T *Y, T *MU, T *V,
                       int64_t rows, int64_t n, int64_t ldx, int64_t ldy,
                       double n1, double n2, double eps, int nthreads) {
  const int nth = nthreads > 0 ? nthreads : omp_get_max_threads();
  const T d1 = (T)n1, d2 = (T)n2, e = (T)eps;
  const int stream = ef_streams(rows, n);
  #pragma omp parallel num_threads(nth)
  {
  const int64_t parts = omp_get_num_threads(), part = omp_get_thread_num();
  const int64_t lo = rows / parts * part + (part < rows % parts ? part : rows % parts);
  const int64_t hi = lo + rows / parts + (part < rows % parts);
  for (int64_t i = lo; i < hi; ++i) {
    const T *x = X + i * ldx;
    T *y = Y + i * ldy;
    T mu, squares;
    if (n <= EF_BLOCK) {     /* the sum reads the row; the squares prefetch as they go */
      mu = ef_row_sum(x, n, 0, 0, 0) / d1;
      squares = ef_row_sum(x, n, mu, 1, ef_ahead_row(X, i, hi, ldx, n));
    } else {
      ef_row_moments(x, n, d1, &mu, &squares);
    }
    const T v = squares / d2;
    MU[i] = mu;
    V[i] = v;
    const T d = EF_SQRT(v + e);
    const T r = (T)1 / d;
    const vT mv = ef_splat(mu);
    int64_t j = 0;
    if (isnormal(r)) {
      const vT rv = ef_splat(r);
      if (stream) {
        for (const int64_t head = ef_unaligned(y, n); j < head; ++j)
          y[j] = (x[j] - mu) * r * G[j] + B[j];
        for (; j + VW <= n; j += VW)
          ef_stream_store(y + j, (ef_load(x + j) - mv) * rv * ef_load(G + j) + ef_load(B + j));
      } else {
        for (; j + VW <= n; j += VW)
          ef_store(y + j, (ef_load(x + j) - mv) * rv * ef_load(G + j) + ef_load(B + j));
      }
      for (; j < n; ++j) y[j] = (x[j] - mu) * r * G[j] + B[j];
    } else {
      for (; j < n; ++j) y[j] = (x[j] - mu) / d * G[j] + B[j];
    }
  }
  if (stream) ef_stream_fence();
  }
}
"""
