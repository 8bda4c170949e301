"""The fused attention's Triton kernel (backends/triton/attention.py chooses its launch):
FlashAttention-2's forward over blocks of query rows, the key blocks folded into a running
max, denominator and accumulator, and the statements' inf and NaN kept (the module
docstring of attention.py lists them)."""

import triton
import triton.language as tl


# a value dtype's exponent field (all ones: inf or NaN), as an int of its width
EXPONENT_BITS = {"float16": 0x7C00, "bfloat16": 0x7F80, "float32": 0x7F800000}


@triton.jit
def _load_tile(base, first, second, stride_first, stride_second, limit_first, limit_second,
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
def _scores(q, K, offs_m, offs_n, offs_d, stride_kn, stride_kd, keys, score_scale,
            DOT: tl.constexpr, BLOCK_D: tl.constexpr, MASK: tl.constexpr,
            EDGE: tl.constexpr, EXACT: tl.constexpr, UPCAST: tl.constexpr):
    """One block's scores (BLOCK_M x BLOCK_N, log2 domain).  ``EDGE``: the block may
    hold keys past the end or past the diagonal, which are masked to -inf.  K points at
    the block's first key; ``offs_m`` and ``keys`` are relative to it."""
    cols = offs_n
    # the keys transposed (BLOCK_D x BLOCK_N), read through their strides
    k = _load_tile(K, offs_d, cols, stride_kd, stride_kn, DOT, keys,
                   BLOCK_D != DOT, EDGE)
    if UPCAST:
        k = k.to(tl.float32)
    if EXACT:
        s = tl.dot(q, k, input_precision="ieee")
    else:
        s = tl.dot(q, k)
    s = s * score_scale
    if EDGE:
        seen = cols[None, :] < keys
        if MASK == 1:
            seen = seen & (cols[None, :] <= offs_m[:, None])
        elif MASK == 2:
            seen = seen & (cols[None, :] < offs_m[:, None])
        s = tl.where(seen, s, float("-inf"))
    return s


@triton.jit
def _key_block(q, m_i, l_i, acc, K, V, offs_m, offs_n, offs_d, offs_e,
               stride_kn, stride_kd, stride_vn, stride_ve, keys, score_scale,
               DOT: tl.constexpr, FEATURES: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_E: tl.constexpr, MASK: tl.constexpr, EDGE: tl.constexpr,
               EXACT: tl.constexpr, UPCAST: tl.constexpr):
    """One block of keys folded into the running state (m_i, l_i, acc).  ``EDGE``: the
    block may hold keys past the end or past the diagonal, which are masked to -inf.
    K and V point at the block's first key; ``offs_m`` and ``keys`` are relative to it."""
    cols = offs_n
    s = _scores(q, K, offs_m, offs_n, offs_d, stride_kn, stride_kd, keys, score_scale,
                DOT, BLOCK_D, MASK, EDGE, EXACT, UPCAST)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # while every score seen is -inf the weights are 0 (not exp2(-inf + inf) = NaN):
    # a row that sees a finite score later must not be poisoned
    m_base = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_base[:, None])
    alpha = tl.math.exp2(m_i - m_base)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = _load_tile(V, cols, offs_e, stride_vn, stride_ve, keys, FEATURES,
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
def _attention_forward(Q, K, V, O, score_scale,
                       stride_q1, stride_q2, stride_qm, stride_qd,
                       stride_k1, stride_k2, stride_kn, stride_kd,
                       stride_v1, stride_v2, stride_vn, stride_ve,
                       stride_o1, stride_o2, stride_om, stride_oe,
                       rows, keys,
                       DOT: tl.constexpr, FEATURES: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       MASK: tl.constexpr, NORMALISED: tl.constexpr,
                       EXACT: tl.constexpr, UPCAST: tl.constexpr,
                       EXPONENT: tl.constexpr):
    block = tl.program_id(0)
    if MASK != 0:        # the longest programs (the last rows) first
        block = tl.num_programs(0) - 1 - block
    b1 = tl.program_id(1).to(tl.int64)
    b2 = tl.program_id(2).to(tl.int64)
    Q += b1 * stride_q1 + b2 * stride_q2
    K += b1 * stride_k1 + b2 * stride_k2
    V += b1 * stride_v1 + b2 * stride_v2
    O += b1 * stride_o1 + b2 * stride_o2
    first_row = block * BLOCK_M
    offs_m = first_row + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_E)
    q = _load_tile(Q, offs_m, offs_d, stride_qm, stride_qd, rows, DOT, True, BLOCK_D != DOT)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_E], tl.float32)
    # keys [0, inner) are seen by every row of the block and all exist: no masks;
    # keys [inner, outer) are the diagonal's and the tail's blocks, masked
    whole = (keys // BLOCK_N) * BLOCK_N
    if MASK == 0:
        inner = whole
        outer = keys
    else:
        shift = 1 if MASK == 1 else 0          # j <= i sees key i, j < i does not
        inner = tl.minimum(((first_row + shift) // BLOCK_N) * BLOCK_N, whole)
        outer = tl.minimum(first_row + BLOCK_M - 1 + shift, keys)
    for start in range(0, inner, BLOCK_N):
        m_i, l_i, acc = _key_block(q, m_i, l_i, acc, K + start * stride_kn,
                                   V + start * stride_vn, offs_m - start, offs_n,
                                   offs_d, offs_e, stride_kn, stride_kd, stride_vn,
                                   stride_ve, keys - start, score_scale, DOT, FEATURES,
                                   BLOCK_D, BLOCK_E, MASK, False, EXACT, UPCAST)
    for start in range(inner, outer, BLOCK_N):
        m_i, l_i, acc = _key_block(q, m_i, l_i, acc, K + start * stride_kn,
                                   V + start * stride_vn, offs_m - start, offs_n,
                                   offs_d, offs_e, stride_kn, stride_kd, stride_vn,
                                   stride_ve, keys - start, score_scale, DOT, FEATURES,
                                   BLOCK_D, BLOCK_E, MASK, True, EXACT, UPCAST)
    # The value's inf and NaN, answered here (no check the host waits for): the
    # statements weigh every key, a masked one by 0, and 0 * inf is NaN.  A non-finite
    # value at a key this block weighed has reached the accumulator (p * inf is inf,
    # 0 * inf NaN, and neither turns finite again); under a causal mask the keys past
    # the last block it weighed are read for it here.  Then (or where the running
    # rescaling overflowed) the block's sums are taken again with the final maxima, every
    # key weighed as the statements weigh it, in float32 IEEE products.
    bad = tl.max(tl.max(tl.where((acc == acc) & (tl.abs(acc) != float("inf")), 0, 1),
                        1), 0)
    if MASK != 0:
        # (read as bits: a non-finite value's exponent is all ones, so the tile's
        # largest exponent field says it; two integer operations an element, the
        # reduction once after the loop)
        weighed = inner + tl.cdiv(outer - inner, BLOCK_N) * BLOCK_N
        worst = tl.zeros([BLOCK_N, BLOCK_E], tl.int32)
        for start in range(weighed, keys, BLOCK_N):
            v = _load_tile(V + start * stride_vn, offs_n, offs_e, stride_vn, stride_ve,
                           keys - start, FEATURES, True, BLOCK_E != FEATURES)
            if EXACT:
                field = v.to(tl.int32, bitcast=True) & EXPONENT
            else:
                field = (v.to(tl.int16, bitcast=True) & EXPONENT).to(tl.int32)
            worst = tl.maximum(worst, field)
        bad = tl.maximum(bad, (tl.max(tl.max(worst, 1), 0) == EXPONENT).to(tl.int32))
    if bad > 0:
        # (keys 16 at a time: the float32 products' tiles stay small, so that this
        # rare branch does not raise the kernel's registers for the usual one)
        m_base = tl.where(m_i == float("-inf"), 0.0, m_i)
        acc = tl.zeros([BLOCK_M, BLOCK_E], tl.float32)
        offs_k = tl.arange(0, 16)
        for start in range(0, keys, 16):
            s = _scores(q, K + start * stride_kn, offs_m - start, offs_k, offs_d,
                        stride_kn, stride_kd, keys - start, score_scale, DOT, BLOCK_D,
                        MASK, True, EXACT, UPCAST)
            p = tl.math.exp2(s - m_base[:, None])
            v = _load_tile(V + start * stride_vn, offs_k, offs_e, stride_vn, stride_ve,
                           keys - start, FEATURES, True, BLOCK_E != FEATURES)
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
