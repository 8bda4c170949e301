"""The fused attention's backward as two Triton kernels (backends/triton/
attention_backward.py launches them): FlashAttention-2's backward, the weights
recomputed block by block from each row's log2-sum-exp2 ``L`` that the forward stored,
with the scores' terms and band exactly as the forward reads them
(attention_kernel._scores).  With ``P = exp2(s - L)``, ``dP = dO . V`` and
``delta_i = sum_e dO_ie O_ie``, the scores' gradient is ``dS = P (dP - delta)``:

* one program per block of keys (``attention_backward_keys``) folds every block of
  rows that sees them into ``dV = P^T dO`` and ``dK = c dS^T Q`` (``c`` the scale's
  factor), and where a term wants it writes ``dS`` (an added tensor over i and j) or
  its sums over the rows (one over j alone);
* one program per block of rows (``attention_backward_rows``) folds the keys into
  ``dQ = c dS K`` and where a term wants them the rows' sums of ``dS`` and of
  ``dS * j`` (an added tensor over i alone, an index term's coefficient).

Every output element is written by one program in a fixed order (no atomics): the same
bits on every run.  Each block's keys are read once, for the scores and the products.  Blocks outside the band are never visited; every visited block is
masked (the backward is not yet split into masked and whole blocks)."""

import triton
import triton.language as tl

from .attention_kernel import index_coefficient, key_range, load_tile, scores_of


@triton.jit
def _weights(q, k, rows_at, cols_at, rows, keys, score_scale, lower, upper,
             T0, t0_si, t0_sj, t0_f, T1, t1_si, t1_sj, t1_f,
             x0, x0_a, x0_b, x0_k, x1, x1_a, x1_b, x1_k, lse,
             BANDED: tl.constexpr, TENSOR_TERMS: tl.constexpr, INDEX_TERMS: tl.constexpr,
             EXACT: tl.constexpr, UPCAST: tl.constexpr):
    """A block's weights exp2(s - L), 0 outside the band and past the ends, from the
    block's keys ``k`` (BLOCK_N x BLOCK_D, as loaded for the gradients' products)."""
    kt = tl.trans(k)
    if UPCAST:
        kt = kt.to(tl.float32)
    s = scores_of(q, kt, rows_at, cols_at, rows, keys, score_scale, lower, upper,
                   T0, t0_si, t0_sj, t0_f, T1, t1_si, t1_sj, t1_f,
                   x0, x0_a, x0_b, x0_k, x1, x1_a, x1_b, x1_k, BANDED, TENSOR_TERMS,
                   INDEX_TERMS, True, EXACT)
    return tl.math.exp2(s - lse[:, None])


@triton.jit
def _product(a, b, EXACT: tl.constexpr, UPCAST: tl.constexpr, LOW):
    """a @ b with float32 accumulation: IEEE-exact for float32 operands, else both
    rounded to the operands' 16-bit dtype (``LOW``, a tile of it) as the forward does."""
    if EXACT:
        return tl.dot(a, b, input_precision="ieee")
    elif UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        return tl.dot(a.to(LOW.dtype), b.to(LOW.dtype))


@triton.jit
def attention_backward_keys(Q, K, V, DO, LSE, DELTA, DK, DV, DS, COLS, score_scale,
                             grad_scale,
                             stride_q1, stride_q2, stride_qm, stride_qd,
                             stride_k1, stride_k2, stride_kn, stride_kd,
                             stride_v1, stride_v2, stride_vn, stride_ve,
                             stride_o1, stride_o2, stride_om, stride_oe,
                             stride_l1, stride_l2, stride_s1, stride_s2, stride_c1,
                             stride_c2, rows, keys, lower, upper,
                             T0, t0_s1, t0_s2, t0_si, t0_sj, t0_f,
                             T1, t1_s1, t1_s2, t1_si, t1_sj, t1_f,
                             X0, x0_s1, x0_s2, x0_f, x0_a, x0_b, x0_k,
                             X1, x1_s1, x1_s2, x1_f, x1_a, x1_b, x1_k,
                             DOT: tl.constexpr, FEATURES: tl.constexpr,
                             BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BANDED: tl.constexpr, TENSOR_TERMS: tl.constexpr,
                             INDEX_TERMS: tl.constexpr, X0_LOADS: tl.constexpr,
                             X1_LOADS: tl.constexpr, STORE_DS: tl.constexpr,
                             COLUMN_SUMS: tl.constexpr, EXACT: tl.constexpr,
                             UPCAST: tl.constexpr):
    block = tl.program_id(0)
    b1 = tl.program_id(1).to(tl.int64)
    b2 = tl.program_id(2).to(tl.int64)
    Q += b1 * stride_q1 + b2 * stride_q2
    K += b1 * stride_k1 + b2 * stride_k2
    V += b1 * stride_v1 + b2 * stride_v2
    DO += b1 * stride_o1 + b2 * stride_o2
    LSE += b1 * stride_l1 + b2 * stride_l2
    DELTA += b1 * stride_l1 + b2 * stride_l2
    DK += b1 * stride_k1 + b2 * stride_k2
    DV += b1 * stride_v1 + b2 * stride_v2
    DS += b1 * stride_s1 + b2 * stride_s2
    COLS += b1 * stride_c1 + b2 * stride_c2
    T0 += b1 * t0_s1 + b2 * t0_s2
    T1 += b1 * t1_s1 + b2 * t1_s2
    x0 = index_coefficient(X0, b1 * x0_s1 + b2 * x0_s2, x0_f, X0_LOADS)
    x1 = index_coefficient(X1, b1 * x1_s1 + b2 * x1_s2, x1_f, X1_LOADS)
    first_key = block * BLOCK_N
    cols_at = first_key + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    k = load_tile(K, cols_at, offs_d, stride_kn, stride_kd, keys, DOT, True,
                   BLOCK_D != DOT)
    v = load_tile(V, cols_at, offs_e, stride_vn, stride_ve, keys, FEATURES, True,
                   BLOCK_E != FEATURES)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_E], tl.float32)
    column_sums = tl.zeros([BLOCK_N], tl.float32)
    # the rows that see these keys: lower <= j - i <= upper
    if BANDED:
        first = (tl.maximum(first_key - upper, 0) // BLOCK_M) * BLOCK_M
        last = tl.minimum(first_key + BLOCK_N - 1 - lower + 1, rows)
    else:
        first = 0
        last = rows
    for start in range(first, last, BLOCK_M):
        rows_at = start + offs_m
        q = load_tile(Q, rows_at, offs_d, stride_qm, stride_qd, rows, DOT, True,
                       BLOCK_D != DOT)
        if UPCAST:
            q = q.to(tl.float32)
        # (a row past the end: L = +inf, so its weights are 0)
        lse = tl.load(LSE + rows_at, mask=rows_at < rows, other=float("inf"))
        delta = tl.load(DELTA + rows_at, mask=rows_at < rows, other=0.0)
        p = _weights(q, k, rows_at, cols_at, rows, keys, score_scale, lower, upper,
                     T0, t0_si, t0_sj, t0_f, T1, t1_si, t1_sj, t1_f,
                     x0, x0_a, x0_b, x0_k, x1, x1_a, x1_b, x1_k, lse, BANDED,
                     TENSOR_TERMS, INDEX_TERMS, EXACT, UPCAST)
        do = load_tile(DO, rows_at, offs_e, stride_om, stride_oe, rows, FEATURES, True,
                        BLOCK_E != FEATURES)
        dv += _product(tl.trans(p), do, EXACT, UPCAST, v)
        dp = _product(do, tl.trans(v), EXACT, UPCAST, v)
        ds = p * (dp - delta[:, None])
        dk += _product(tl.trans(ds), q, EXACT, UPCAST, k)
        if COLUMN_SUMS:
            column_sums += tl.sum(ds, 0)
        if STORE_DS:
            pointers = DS + rows_at[:, None] * keys + cols_at[None, :]
            tl.store(pointers, ds, mask=(rows_at[:, None] < rows) & (cols_at[None, :] < keys))
    dk = dk * grad_scale
    tl.store(DK + cols_at[:, None] * stride_kn + offs_d[None, :] * stride_kd,
             dk.to(DK.dtype.element_ty),
             mask=(cols_at[:, None] < keys) & (offs_d[None, :] < DOT))
    tl.store(DV + cols_at[:, None] * stride_vn + offs_e[None, :] * stride_ve,
             dv.to(DV.dtype.element_ty),
             mask=(cols_at[:, None] < keys) & (offs_e[None, :] < FEATURES))
    if COLUMN_SUMS:
        tl.store(COLS + cols_at, column_sums, mask=cols_at < keys)


@triton.jit
def attention_backward_rows(Q, K, V, DO, LSE, DELTA, DQ, SUMS, score_scale, grad_scale,
                             stride_q1, stride_q2, stride_qm, stride_qd,
                             stride_k1, stride_k2, stride_kn, stride_kd,
                             stride_v1, stride_v2, stride_vn, stride_ve,
                             stride_o1, stride_o2, stride_om, stride_oe,
                             stride_l1, stride_l2, stride_r1, stride_r2,
                             rows, keys, lower, upper,
                             T0, t0_s1, t0_s2, t0_si, t0_sj, t0_f,
                             T1, t1_s1, t1_s2, t1_si, t1_sj, t1_f,
                             X0, x0_s1, x0_s2, x0_f, x0_a, x0_b, x0_k,
                             X1, x1_s1, x1_s2, x1_f, x1_a, x1_b, x1_k,
                             DOT: tl.constexpr, FEATURES: tl.constexpr,
                             BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BANDED: tl.constexpr, TENSOR_TERMS: tl.constexpr,
                             INDEX_TERMS: tl.constexpr, X0_LOADS: tl.constexpr,
                             X1_LOADS: tl.constexpr, ROW_SUMS: tl.constexpr,
                             EXACT: tl.constexpr, UPCAST: tl.constexpr):
    block = tl.program_id(0)
    b1 = tl.program_id(1).to(tl.int64)
    b2 = tl.program_id(2).to(tl.int64)
    Q += b1 * stride_q1 + b2 * stride_q2
    K += b1 * stride_k1 + b2 * stride_k2
    V += b1 * stride_v1 + b2 * stride_v2
    DO += b1 * stride_o1 + b2 * stride_o2
    LSE += b1 * stride_l1 + b2 * stride_l2
    DELTA += b1 * stride_l1 + b2 * stride_l2
    DQ += b1 * stride_q1 + b2 * stride_q2
    SUMS += b1 * stride_r1 + b2 * stride_r2
    T0 += b1 * t0_s1 + b2 * t0_s2
    T1 += b1 * t1_s1 + b2 * t1_s2
    x0 = index_coefficient(X0, b1 * x0_s1 + b2 * x0_s2, x0_f, X0_LOADS)
    x1 = index_coefficient(X1, b1 * x1_s1 + b2 * x1_s2, x1_f, X1_LOADS)
    first_row = block * BLOCK_M
    rows_at = first_row + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    q = load_tile(Q, rows_at, offs_d, stride_qm, stride_qd, rows, DOT, True,
                   BLOCK_D != DOT)
    if UPCAST:
        q = q.to(tl.float32)
    lse = tl.load(LSE + rows_at, mask=rows_at < rows, other=float("inf"))
    delta = tl.load(DELTA + rows_at, mask=rows_at < rows, other=0.0)
    do = load_tile(DO, rows_at, offs_e, stride_om, stride_oe, rows, FEATURES, True,
                    BLOCK_E != FEATURES)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    sums = tl.zeros([BLOCK_M], tl.float32)
    weighted = tl.zeros([BLOCK_M], tl.float32)
    lo, inner, outer, hi = key_range(first_row, keys, lower, upper, BLOCK_M, BLOCK_N,
                                      BANDED)
    for start in range(lo, hi, BLOCK_N):
        cols_at = start + offs_n
        k = load_tile(K, cols_at, offs_d, stride_kn, stride_kd, keys, DOT, True,
                       BLOCK_D != DOT)
        p = _weights(q, k, rows_at, cols_at, rows, keys, score_scale, lower, upper,
                     T0, t0_si, t0_sj, t0_f, T1, t1_si, t1_sj, t1_f,
                     x0, x0_a, x0_b, x0_k, x1, x1_a, x1_b, x1_k, lse, BANDED,
                     TENSOR_TERMS, INDEX_TERMS, EXACT, UPCAST)
        v = load_tile(V, cols_at, offs_e, stride_vn, stride_ve, keys, FEATURES, True,
                       BLOCK_E != FEATURES)
        dp = _product(do, tl.trans(v), EXACT, UPCAST, v)
        ds = p * (dp - delta[:, None])
        dq += _product(ds, k, EXACT, UPCAST, k)
        if ROW_SUMS:
            sums += tl.sum(ds, 1)
            weighted += tl.sum(ds * cols_at[None, :].to(tl.float32), 1)
    dq = dq * grad_scale
    tl.store(DQ + rows_at[:, None] * stride_qm + offs_d[None, :] * stride_qd,
             dq.to(DQ.dtype.element_ty),
             mask=(rows_at[:, None] < rows) & (offs_d[None, :] < DOT))
    if ROW_SUMS:        # (2, rows): the sums of dS, then of dS * j
        tl.store(SUMS + rows_at, sums, mask=rows_at < rows)
        tl.store(SUMS + rows + rows_at, weighted, mask=rows_at < rows)
