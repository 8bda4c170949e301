"""The fused attention's Triton kernel (backends/triton/attention.py chooses its launch):
FlashAttention-2's forward over blocks of query rows, the key blocks folded into a running
max, denominator and accumulator, and the statements' inf and NaN kept (the module
docstring of attention.py lists them)."""

import triton
import triton.language as tl


# a value dtype's exponent field (all ones: inf or NaN), as an int of its width
EXPONENT_BITS = {"float16": 0x7C00, "bfloat16": 0x7F80, "float32": 0x7F800000}


@triton.jit
def load_tile(base, first, second, stride_first, stride_second, limit_first, limit_second,
               CHECK_FIRST: tl.constexpr, CHECK_SECOND: tl.constexpr):
    """A 2-d tile at offsets first x second; the bounds checked only where asked."""
    pointers = base + first[:, None] * stride_first + second[None, :] * stride_second
    if CHECK_FIRST and CHECK_SECOND:
        return tl.load(pointers, mask=(first[:, None] < limit_first)
                       & (second[None, :] < limit_second), other=0.0)
    elif CHECK_FIRST:
        return tl.load(pointers, mask=first[:, None] < limit_first, other=0.0)
    elif CHECK_SECOND:
        return tl.load(pointers, mask=second[None, :] < limit_second, other=0.0)
    else:
        return tl.load(pointers)


@triton.jit
def _add_terms(s, rows_at, cols_at, rows, keys,
               T0, t0_si, t0_sj, t0_f, T1, t1_si, t1_sj, t1_f,
               x0, x0_a, x0_b, x0_k, x1, x1_a, x1_b, x1_k,
               TENSOR_TERMS: tl.constexpr, INDEX_TERMS: tl.constexpr,
               EDGE: tl.constexpr):
    """The scores' additive terms (log2 domain: their factors carry log2(e) and the
    sign) added to a block: tensor terms read per block through their strides (0 along
    the axes they are broadcast over), index terms ``x * (a*j + b*i + k)`` with the
    batch element's coefficient ``x``.  Absolute row and key offsets."""
    if TENSOR_TERMS >= 1:
        t = load_tile(T0, rows_at, cols_at, t0_si, t0_sj, rows, keys, True, EDGE)
        s = s + t.to(tl.float32) * t0_f
    if TENSOR_TERMS >= 2:
        t = load_tile(T1, rows_at, cols_at, t1_si, t1_sj, rows, keys, True, EDGE)
        s = s + t.to(tl.float32) * t1_f
    if INDEX_TERMS >= 1:
        s = s + x0 * (x0_a * cols_at[None, :] + x0_b * rows_at[:, None]
                      + x0_k).to(tl.float32)
    if INDEX_TERMS >= 2:
        s = s + x1 * (x1_a * cols_at[None, :] + x1_b * rows_at[:, None]
                      + x1_k).to(tl.float32)
    return s


@triton.jit
def _scores(q, K, rows_at, cols_at, offs_d, stride_kn, stride_kd, rows, keys, score_scale,
            lower, upper, T0, t0_si, t0_sj, t0_f, T1, t1_si, t1_sj, t1_f,
            x0, x0_a, x0_b, x0_k, x1, x1_a, x1_b, x1_k,
            DOT: tl.constexpr, BLOCK_D: tl.constexpr, BANDED: tl.constexpr,
            TENSOR_TERMS: tl.constexpr, INDEX_TERMS: tl.constexpr,
            EDGE: tl.constexpr, EXACT: tl.constexpr, UPCAST: tl.constexpr):
    """One block's scores (rows_at x cols_at, absolute offsets; log2 domain), the keys
    read here (scores_of)."""
    # the keys transposed (BLOCK_D x BLOCK_N), read through their strides
    k = load_tile(K, offs_d, cols_at, stride_kd, stride_kn, DOT, keys,
                   BLOCK_D != DOT, EDGE)
    if UPCAST:
        k = k.to(tl.float32)
    return scores_of(q, k, rows_at, cols_at, rows, keys, score_scale, lower, upper,
                      T0, t0_si, t0_sj, t0_f, T1, t1_si, t1_sj, t1_f,
                      x0, x0_a, x0_b, x0_k, x1, x1_a, x1_b, x1_k, BANDED, TENSOR_TERMS,
                      INDEX_TERMS, EDGE, EXACT)


@triton.jit
def scores_of(q, k, rows_at, cols_at, rows, keys, score_scale,
               lower, upper, T0, t0_si, t0_sj, t0_f, T1, t1_si, t1_sj, t1_f,
               x0, x0_a, x0_b, x0_k, x1, x1_a, x1_b, x1_k, BANDED: tl.constexpr,
               TENSOR_TERMS: tl.constexpr, INDEX_TERMS: tl.constexpr,
               EDGE: tl.constexpr, EXACT: tl.constexpr):
    """The scores of a block from its keys transposed (``k``, BLOCK_D x BLOCK_N): the
    scaled dot product plus the terms.  ``EDGE``: the block may hold keys past the end
    or outside the band ``lower <= j - i <= upper``, which are -inf (whatever the terms
    hold there: the statements' where)."""
    if EXACT:
        s = tl.dot(q, k, input_precision="ieee")
    else:
        s = tl.dot(q, k)
    s = s * score_scale
    s = _add_terms(s, rows_at, cols_at, rows, keys, T0, t0_si, t0_sj, t0_f,
                   T1, t1_si, t1_sj, t1_f, x0, x0_a, x0_b, x0_k, x1, x1_a, x1_b, x1_k,
                   TENSOR_TERMS, INDEX_TERMS, EDGE)
    if EDGE:
        seen = cols_at[None, :] < keys
        if BANDED:
            offset = cols_at[None, :] - rows_at[:, None]
            seen = seen & (offset >= lower) & (offset <= upper)
        s = tl.where(seen, s, float("-inf"))
    return s


@triton.jit
def key_range(first_row, keys, lower, upper, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BANDED: tl.constexpr):
    """The key blocks a block of rows visits: [lo, inner) and [outer, hi) masked,
    [inner, outer) whole blocks inside every row's band (no masks); all three start
    on block boundaries and cover exactly the keys some row of the block sees."""
    whole = (keys // BLOCK_N) * BLOCK_N
    if BANDED:
        last_row = first_row + BLOCK_M - 1
        lo = (tl.maximum(first_row + lower, 0) // BLOCK_N) * BLOCK_N
        hi = tl.maximum(tl.minimum(last_row + upper + 1, keys), lo)
        inner = tl.cdiv(tl.maximum(last_row + lower, 0), BLOCK_N) * BLOCK_N
        inner = tl.maximum(tl.minimum(inner, tl.cdiv(hi, BLOCK_N) * BLOCK_N), lo)
        outer = (tl.minimum(tl.maximum(first_row + upper + 1, 0), whole) // BLOCK_N) * \
            BLOCK_N
        outer = tl.maximum(outer, inner)
    else:
        lo = 0
        inner = 0
        outer = whole
        hi = keys
    return lo, inner, outer, hi


@triton.jit
def index_coefficient(X, offset, factor, LOADS: tl.constexpr):
    """An index term's coefficient for this batch element: the coefficient tensor's
    entry times ``factor``, or ``factor`` alone (a number given to the call)."""
    if LOADS:
        return tl.load(X + offset).to(tl.float32) * factor
    else:
        return factor


@triton.jit
def _key_block(q, m_i, l_i, acc, K, V, rows_at, start, offs_n, offs_d, offs_e,
               stride_kn, stride_kd, stride_vn, stride_ve, rows, keys, score_scale,
               lower, upper, T0, t0_si, t0_sj, t0_f, T1, t1_si, t1_sj, t1_f,
               x0, x0_a, x0_b, x0_k, x1, x1_a, x1_b, x1_k,
               DOT: tl.constexpr, FEATURES: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_E: tl.constexpr, BANDED: tl.constexpr, TENSOR_TERMS: tl.constexpr,
               INDEX_TERMS: tl.constexpr, EDGE: tl.constexpr,
               EXACT: tl.constexpr, UPCAST: tl.constexpr):
    """The block of keys starting at ``start`` folded into the running state (m_i,
    l_i, acc).  ``EDGE``: the block may hold keys past the end or outside the band."""
    cols_at = start + offs_n
    s = _scores(q, K, rows_at, cols_at, offs_d, stride_kn, stride_kd, rows, keys,
                score_scale, lower, upper, T0, t0_si, t0_sj, t0_f, T1, t1_si, t1_sj, t1_f,
                x0, x0_a, x0_b, x0_k, x1, x1_a, x1_b, x1_k, DOT, BLOCK_D, BANDED,
                TENSOR_TERMS, INDEX_TERMS, EDGE, EXACT, UPCAST)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # while every score seen is -inf the weights are 0 (not exp2(-inf + inf) = NaN):
    # a row that sees a finite score later must not be poisoned
    m_base = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_base[:, None])
    alpha = tl.math.exp2(m_i - m_base)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = load_tile(V, cols_at, offs_e, stride_vn, stride_ve, keys, FEATURES,
                   EDGE, BLOCK_E != FEATURES)
    acc = acc * alpha[:, None]
    if EXACT:
        acc = tl.dot(p, v, acc, input_precision="ieee")
    elif UPCAST:
        acc = tl.dot(p, v.to(tl.float32), acc)
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return m_new, l_i, acc


@triton.jit
def _unweighed_exponents(worst, V, begin, end, offs_n, offs_e, stride_vn, stride_ve,
                         keys, FEATURES: tl.constexpr, BLOCK_E: tl.constexpr,
                         BLOCK_N: tl.constexpr, EXACT: tl.constexpr,
                         EXPONENT: tl.constexpr):
    """``worst`` raised to the largest exponent field of the value rows [begin, end)
    (read as bits: a non-finite value's exponent is all ones; two integer operations
    an element, the reduction once after the loop)."""
    for start in range(begin, end, BLOCK_N):
        v = load_tile(V, start + offs_n, offs_e, stride_vn, stride_ve, keys, FEATURES,
                       True, BLOCK_E != FEATURES)
        if EXACT:
            field = v.to(tl.int32, bitcast=True) & EXPONENT
        else:
            field = (v.to(tl.int16, bitcast=True) & EXPONENT).to(tl.int32)
        worst = tl.maximum(worst, field)
    return worst


@triton.jit
def attention_forward(Q, K, V, O, LSE, FLAGS, score_scale,
                       stride_q1, stride_q2, stride_qm, stride_qd,
                       stride_k1, stride_k2, stride_kn, stride_kd,
                       stride_v1, stride_v2, stride_vn, stride_ve,
                       stride_o1, stride_o2, stride_om, stride_oe,
                       stride_l1, stride_l2, rows, keys, lower, upper,
                       T0, t0_s1, t0_s2, t0_si, t0_sj, t0_f,
                       T1, t1_s1, t1_s2, t1_si, t1_sj, t1_f,
                       X0, x0_s1, x0_s2, x0_f, x0_a, x0_b, x0_k,
                       X1, x1_s1, x1_s2, x1_f, x1_a, x1_b, x1_k,
                       DOT: tl.constexpr, FEATURES: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BANDED: tl.constexpr, NORMALISED: tl.constexpr,
                       TENSOR_TERMS: tl.constexpr, INDEX_TERMS: tl.constexpr,
                       X0_LOADS: tl.constexpr, X1_LOADS: tl.constexpr,
                       STORE_LSE: tl.constexpr,
                       EXACT: tl.constexpr, UPCAST: tl.constexpr,
                       EXPONENT: tl.constexpr):
    block = tl.program_id(0)
    if BANDED:        # the longest programs (the last rows, under a causal band) first
        block = tl.num_programs(0) - 1 - block
    b1 = tl.program_id(1).to(tl.int64)
    b2 = tl.program_id(2).to(tl.int64)
    Q += b1 * stride_q1 + b2 * stride_q2
    K += b1 * stride_k1 + b2 * stride_k2
    V += b1 * stride_v1 + b2 * stride_v2
    O += b1 * stride_o1 + b2 * stride_o2
    T0 += b1 * t0_s1 + b2 * t0_s2
    T1 += b1 * t1_s1 + b2 * t1_s2
    x0 = index_coefficient(X0, b1 * x0_s1 + b2 * x0_s2, x0_f, X0_LOADS)
    x1 = index_coefficient(X1, b1 * x1_s1 + b2 * x1_s2, x1_f, X1_LOADS)
    first_row = block * BLOCK_M
    offs_m = first_row + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    q = load_tile(Q, offs_m, offs_d, stride_qm, stride_qd, rows, DOT, True, BLOCK_D != DOT)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_E], tl.float32)
    # keys [inner, outer) are seen by every row of the block and all exist: no masks;
    # [lo, inner) and [outer, hi) are the band's edges and the tail's blocks, masked;
    # blocks outside [lo, hi) are never visited
    lo, inner, outer, hi = key_range(first_row, keys, lower, upper, BLOCK_M, BLOCK_N,
                                      BANDED)
    for start in range(lo, inner, BLOCK_N):
        m_i, l_i, acc = _key_block(q, m_i, l_i, acc, K, V, offs_m, start, offs_n, offs_d,
                                   offs_e, stride_kn, stride_kd, stride_vn, stride_ve,
                                   rows, keys, score_scale, lower, upper,
                                   T0, t0_si, t0_sj, t0_f, T1, t1_si, t1_sj, t1_f,
                                   x0, x0_a, x0_b, x0_k, x1, x1_a, x1_b, x1_k,
                                   DOT, FEATURES, BLOCK_D, BLOCK_E, BANDED, TENSOR_TERMS,
                                   INDEX_TERMS, True, EXACT, UPCAST)
    for start in range(inner, outer, BLOCK_N):
        m_i, l_i, acc = _key_block(q, m_i, l_i, acc, K, V, offs_m, start, offs_n, offs_d,
                                   offs_e, stride_kn, stride_kd, stride_vn, stride_ve,
                                   rows, keys, score_scale, lower, upper,
                                   T0, t0_si, t0_sj, t0_f, T1, t1_si, t1_sj, t1_f,
                                   x0, x0_a, x0_b, x0_k, x1, x1_a, x1_b, x1_k,
                                   DOT, FEATURES, BLOCK_D, BLOCK_E, BANDED, TENSOR_TERMS,
                                   INDEX_TERMS, False, EXACT, UPCAST)
    for start in range(outer, hi, BLOCK_N):
        m_i, l_i, acc = _key_block(q, m_i, l_i, acc, K, V, offs_m, start, offs_n, offs_d,
                                   offs_e, stride_kn, stride_kd, stride_vn, stride_ve,
                                   rows, keys, score_scale, lower, upper,
                                   T0, t0_si, t0_sj, t0_f, T1, t1_si, t1_sj, t1_f,
                                   x0, x0_a, x0_b, x0_k, x1, x1_a, x1_b, x1_k,
                                   DOT, FEATURES, BLOCK_D, BLOCK_E, BANDED, TENSOR_TERMS,
                                   INDEX_TERMS, True, EXACT, UPCAST)
    # The value's inf and NaN, answered here (no check the host waits for): the
    # statements weigh every key, a hidden one by 0, and 0 * inf is NaN.  A non-finite
    # value at a key this block weighed has reached the accumulator (p * inf is inf,
    # 0 * inf NaN, and neither turns finite again); under a band the keys outside the
    # blocks it weighed are read for it here.  Then (or where the running rescaling
    # overflowed) the block's sums are taken again with the final maxima, every key
    # weighed as the statements weigh it, in float32 IEEE products.
    bad = tl.max(tl.max(tl.where((acc == acc) & (tl.abs(acc) != float("inf")), 0, 1),
                        1), 0)
    if BANDED:
        weighed = tl.maximum(outer + tl.cdiv(hi - outer, BLOCK_N) * BLOCK_N, lo)
        worst = tl.zeros([BLOCK_N, BLOCK_E], tl.int32)
        worst = _unweighed_exponents(worst, V, 0, lo, offs_n, offs_e, stride_vn,
                                     stride_ve, keys, FEATURES, BLOCK_E, BLOCK_N, EXACT,
                                     EXPONENT)
        worst = _unweighed_exponents(worst, V, weighed, keys, offs_n, offs_e, stride_vn,
                                     stride_ve, keys, FEATURES, BLOCK_E, BLOCK_N, EXACT,
                                     EXPONENT)
        bad = tl.maximum(bad, (tl.max(tl.max(worst, 1), 0) == EXPONENT).to(tl.int32))
    if bad > 0:
        # (keys 16 at a time: the float32 products' tiles stay small, so that this
        # rare branch does not raise the kernel's registers for the usual one)
        m_base = tl.where(m_i == float("-inf"), 0.0, m_i)
        acc = tl.zeros([BLOCK_M, BLOCK_E], tl.float32)
        offs_k = tl.arange(0, 16)
        for start in range(0, keys, 16):
            s = _scores(q, K, offs_m, start + offs_k, offs_d, stride_kn, stride_kd, rows,
                        keys, score_scale, lower, upper,
                        T0, t0_si, t0_sj, t0_f, T1, t1_si, t1_sj, t1_f,
                        x0, x0_a, x0_b, x0_k, x1, x1_a, x1_b, x1_k, DOT, BLOCK_D,
                        BANDED, TENSOR_TERMS, INDEX_TERMS, True, EXACT, UPCAST)
            p = tl.math.exp2(s - m_base[:, None])
            v = load_tile(V, start + offs_k, offs_e, stride_vn, stride_ve,
                           keys, FEATURES, True, BLOCK_E != FEATURES)
            acc = tl.dot(p, v.to(tl.float32), acc, input_precision="ieee")
    if NORMALISED:
        result = acc / l_i[:, None]
    else:
        result = acc
    # a row that saw no finite score: the statements' exp(-inf - -inf) is NaN
    result = tl.where((m_i == float("-inf"))[:, None], float("nan"), result)
    pointers = O + offs_m[:, None] * stride_om + offs_e[None, :] * stride_oe
    if BLOCK_E != FEATURES:
        stored = (offs_m[:, None] < rows) & (offs_e[None, :] < FEATURES)
    else:
        stored = offs_m[:, None] < rows
    tl.store(pointers, result.to(O.dtype.element_ty), mask=stored)
    if STORE_LSE:     # each row's log2-sum-exp2 of its scores, for the backward
        tl.store(LSE + b1 * stride_l1 + b2 * stride_l2 + offs_m,
                 m_i + tl.math.log2(l_i), mask=offs_m < rows)
        # and this program's answer (1: a value of its batch element holds inf or NaN,
        # or its sums overflowed) for the backward to read with its own flags: one int
        # per program, every program writing its own (no atomics, no zeroing launch)
        program = (tl.program_id(1) * tl.num_programs(2) + tl.program_id(2)) * \
            tl.num_programs(0) + tl.program_id(0)
        tl.store(FLAGS + program, bad)
