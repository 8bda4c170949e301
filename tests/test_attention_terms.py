"""The online-softmax attention for general scores (rewrite/attention_scores.py): additive
terms (a padding mask m[b,j] with -inf entries, a bias[h,i,j], ALiBi's slope[h] * (j - i))
and windows written as where (i - j < W), fused on the NumPy and C backends, checked
against a float64 NumPy mirror of the statements, torch's scaled_dot_product_attention
with a float attn_mask, the brute-force oracle on a tiny case, and hypothesis over small
shapes; gradients against torch autograd; forms the kernels do not take still run (one
by one) and agree."""

import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.rewrite.attention_scores import Bound, IndexTerm, TensorTerm
from einfuse.runtime import attention as attention_runtime
from oracle import brute_force

FUSED_BACKENDS = ["numpy"] + (["c"] if c_build.find_compiler() is not None else [])


def program(terms="", mask="j <= i", window=None, scale="* scale"):
    score = f"sum[d](Q[b,h,i,d]*K[b,h,j,d]) {scale}{terms}"
    s = f"where({mask}, {score}, -inf)" if mask else score
    if window:
        s = f"where({window}, {s}, -inf)"
    return (f"S[b,h,i,j] := {s}\nm[b,h,i] := max[j](S[b,h,i,j])\n"
            f"P[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])\n"
            f"O[b,h,i,e] := sum[j](P[b,h,i,j] * V[b,h,j,e]) / sum[j](P[b,h,i,j])")


PADDED = " + M[b,j]"
ALIBI = " + slope[h] * (j - i)"
BIAS = " + bias[h,i,j]"


def mirror(Q, K, V, scale, M=None, slope=None, bias=None, lower=None, upper=None):
    """The statements in float64 NumPy, step by step; the band lower <= j - i <= upper."""
    Q, K, V = (np.asarray(a, np.float64) for a in (Q, K, V))
    i = np.arange(Q.shape[2])[:, None]
    j = np.arange(K.shape[2])[None, :]
    with np.errstate(all="ignore"):
        S = np.einsum("bhid,bhjd->bhij", Q, K) * scale
        if M is not None:
            S = S + np.asarray(M, np.float64)[:, None, None, :]
        if slope is not None:
            S = S + np.asarray(slope, np.float64)[None, :, None, None] * (j - i)
        if bias is not None:
            S = S + np.asarray(bias, np.float64)[None]
        seen = np.ones(S.shape[-2:], bool)
        if lower is not None:
            seen &= j - i >= lower
        if upper is not None:
            seen &= j - i <= upper
        S = np.where(seen, S, -np.inf)
        P = np.exp(S - S.max(-1, keepdims=True))
        return (P @ V) / P.sum(-1)[..., None]


@pytest.fixture
def fused_calls(fused_calls, monkeypatch):
    """conftest's count of fused calls, with key blocks of 32 (several blocks per row)."""
    monkeypatch.setattr(attention_runtime, "KEY_BLOCK", 32)
    return fused_calls


def data(B, H, N, D, dtype, seed=0, masked=0.2):
    rng = np.random.default_rng(seed)
    Q, K, V = (rng.standard_normal((B, H, N, D)).astype(dtype) for _ in range(3))
    M = np.where(rng.random((B, N)) < masked, -np.inf, 0.0).astype(dtype)
    slope = (2.0 ** -np.arange(1, H + 1)).astype(dtype)
    bias = rng.standard_normal((H, N, N)).astype(dtype)
    return Q, K, V, M, slope, bias


# -- recognition -------------------------------------------------------------------------

def run(text, **named):
    """``ef.ein`` with the names the program takes (options pass through)."""
    takes = set(ef.compile(text).inputs)
    options = {"backend", "ranges"}
    return ef.ein(text, **{k: v for k, v in named.items() if k in takes or k in options})


def attention_of(text):
    found = ef.compile(text).attention
    assert found is not None
    return found


def test_terms_and_bands_as_data():
    found = attention_of(program(PADDED + ALIBI, window="i - j < W"))
    assert found.terms == (TensorTerm("M", ("b", "#1")),
                           IndexTerm(found.terms[1].coefficient, 1, -1, 0))
    assert found.terms[1].coefficient.tensor == "slope"
    assert found.upper == (Bound(0),) and found.lower == (Bound(1, (("W", -1),)),)
    assert found.mask.value == "band" and found.term_tensors == ("M", "slope")
    # the same window written as a lower bound, with the causal mask in one where
    found = attention_of(program(mask="(j <= i) & (j >= i - 7)"))
    assert found.upper == (Bound(0),) and found.lower == (Bound(-7),)
    # subtracted terms, a literal coefficient, no mask
    found = attention_of(program(" - M[b,j] - 0.5 * (i - j)", mask=None))
    assert found.terms[0] == TensorTerm("M", ("b", "#1"), -1)
    assert (found.terms[1].key, found.terms[1].row) == (1, -1)
    assert found.terms[1].coefficient.value == -0.5 or \
        (found.terms[1].coefficient.value == 0.5 and found.terms[1].key == 1)


@pytest.mark.parametrize("text", [
    program(" + M[b,j] * M[b,j]"),                  # a product of tensors
    program(" + exp(M[b,j])"),                       # a function of a tensor
    program(mask="j * 2 <= i"),                      # not a band of j - i
    # (a mask added, `+ where(j <= i, 0, -inf)`, is the mask applied under
    # rewrite/rules.py's additive-mask-as-where: tests/test_spelling_audit.py)
])
def test_other_scores_are_not_fused(text):
    assert ef.compile(text).attention is None


# -- results -----------------------------------------------------------------------------

CASES = {
    "padding mask": dict(terms=PADDED, mask=None),
    "causal padding mask": dict(terms=PADDED),
    "alibi": dict(terms=ALIBI),
    "bias": dict(terms=BIAS, mask=None),
    "window": dict(window="i - j < W"),
    "window without causal": dict(mask=None, window="i - j < W"),
    "everything": dict(terms=PADDED + ALIBI + BIAS, window="j >= i - W"),
}


def mirror_of(case, Q, K, V, M, slope, bias, W):
    spec = CASES[case]
    terms = spec.get("terms", "")
    lower = None
    if spec.get("window") == "i - j < W":
        lower = 1 - W
    elif spec.get("window"):
        lower = -W
    return mirror(Q, K, V, 0.3, M=M if "M[" in terms else None,
                  slope=slope if "slope" in terms else None,
                  bias=bias if "bias" in terms else None, lower=lower,
                  upper=0 if spec.get("mask", "j <= i") else None)


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("N, W", [(70, 9), (129, 64), (5, 1)])
def test_matches_the_statements(backend, dtype, case, N, W, fused_calls):
    Q, K, V, M, slope, bias = data(2, 3, N, 8, dtype, seed=N)
    text = program(**CASES[case])
    got = run(text, Q=Q, K=K, V=V, M=M, slope=slope, bias=bias, scale=0.3, W=W,
              backend=backend)
    assert fused_calls == [True]
    want = mirror_of(case, Q, K, V, M, slope, bias, W)
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    tol = 3e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    # the statements one by one (the fused path declined by a pad of nothing)
    one_by_one = run(text, Q=Q, K=K, V=V, M=M, slope=slope, bias=bias, scale=0.3,
                     W=W, backend=backend, ranges={"i": N})
    assert fused_calls == [True]
    np.testing.assert_allclose(got, one_by_one, rtol=tol, atol=tol)


def test_brute_force_oracle_tiny():
    Q, K, V, M, slope, bias = data(1, 2, 5, 3, np.float64, masked=0.3)
    text = program(PADDED + ALIBI, window="i - j < W")
    arrays = {"Q": Q, "K": K, "V": V, "M": M, "slope": slope}
    extents = {"b": 1, "h": 2, "i": 5, "j": 5, "d": 3, "e": 3}
    for statement in text.split("\n"):
        name = statement.split("[")[0]
        used = set(re.findall(r"\b([bhijde])\b", statement))
        arrays[name] = brute_force(statement, {x: (0, extents[x]) for x in used}, arrays,
                                   {"scale": 0.3, "W": 2})
    got = ef.ein(text, Q=Q, K=K, V=V, M=M, slope=slope, scale=0.3, W=2)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(arrays["O"]))
    np.testing.assert_allclose(got, arrays["O"], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
def test_rows_with_every_key_masked_are_nan(backend, fused_calls):
    Q, K, V, M, slope, bias = data(2, 2, 40, 4, np.float64, masked=0.0)
    M[1, :] = -np.inf                   # batch element 1 sees no key at all
    M[0, :3] = -np.inf                  # rows 0-2 of element 0 see only masked keys
    got = ef.ein(program(PADDED), Q=Q, K=K, V=V, M=M, scale=0.3, backend=backend)
    want = mirror(Q, K, V, 0.3, M=M, upper=0)
    assert np.isnan(got[1]).all() and np.isnan(got[0, :, :3]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # a window of nothing: every row NaN
    got = ef.ein(program(window="i - j < W"), Q=Q, K=K, V=V, scale=0.3, W=0,
                 backend=backend)
    assert np.isnan(got).all() and fused_calls == [True, True]


@pytest.mark.parametrize("case", ["float64 mask", "fractional window", "bool window"])
def test_calls_the_kernel_does_not_take_run_one_by_one(case, fused_calls):
    Q, K, V, M, slope, bias = data(1, 2, 20, 4, np.float32)
    W = 5
    if case == "float64 mask":
        M = M.astype(np.float64)
    elif case == "fractional window":
        W = 4.5
    elif case == "bool window":
        W = True                # (the statements read it as 1)
    text = program(PADDED, window="i - j < W")
    got = ef.ein(text, Q=Q, K=K, V=V, M=M, scale=0.3, W=W)
    assert fused_calls == [] or fused_calls == [False]
    i, j = np.arange(20)[:, None], np.arange(20)[None, :]
    with np.errstate(all="ignore"):
        S = np.einsum("bhid,bhjd->bhij", Q.astype(float), K.astype(float)) * 0.3 + \
            M.astype(float)[:, None, None, :]
        S = np.where((j <= i) & (i - j < W), S, -np.inf)
        P = np.exp(S - S.max(-1, keepdims=True))
        want = (P @ V.astype(float)) / P.sum(-1)[..., None]
    np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-5)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 80), st.integers(1, 9),
       st.integers(0, 90), st.sampled_from(sorted(CASES)), st.sampled_from(FUSED_BACKENDS),
       st.integers(0, 2 ** 16))
def test_hypothesis_small_shapes(B, H, N, D, W, case, backend, seed):
    Q, K, V, M, slope, bias = data(B, H, N, D, np.float64, seed=seed)
    got = run(program(**CASES[case]), Q=Q, K=K, V=V, M=M, slope=slope, bias=bias,
              scale=0.3, W=W, backend=backend)
    want = mirror_of(case, Q, K, V, M, slope, bias, W)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


def test_explain_counts_the_band():
    text = program(PADDED + ALIBI, window="i - j < W")
    Q, K, V, M, slope, bias = data(1, 1, 100, 4, np.float64)
    report = str(ef.explain(text, Q=Q, K=K, V=V, M=M, slope=slope, scale=0.3, W=10))
    assert "online softmax" in report and "outside the band" in report
    # 100 rows, each sees min(i + 1, 10) keys: 955 pairs
    assert "955" in report.replace(",", "")


# -- torch: SDPA with a float mask, and gradients -----------------------------------------

torch = pytest.importorskip("torch")


def float_mask(M, slope, N, lower=None):
    """The scores' terms and the causal band as one float attn_mask (B, H, N, N)."""
    i = torch.arange(N)[:, None]
    j = torch.arange(N)[None, :]
    mask = M[:, None, None, :] + slope[None, :, None, None] * (j - i)
    seen = j <= i if lower is None else (j <= i) & (j - i >= lower)
    return mask.masked_fill(~seen, -torch.inf)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_sdpa_with_a_float_mask(dtype, fused_calls):
    Q, K, V, M, slope, bias = (torch.from_numpy(a) for a in data(2, 4, 100, 16,
                                                                 np.float64, masked=0.1))
    Q, K, V, M, slope = (t.to(dtype) for t in (Q, K, V, M, slope))
    M[:, 0] = 0.0                        # every row sees key 0
    got = ef.ein(program(PADDED + ALIBI, window="i - j < W"), Q=Q, K=K, V=V, M=M,
                 slope=slope, scale=0.25, W=30)
    assert fused_calls == [True] and isinstance(got, torch.Tensor)
    want = torch.nn.functional.scaled_dot_product_attention(
        Q, K, V, attn_mask=float_mask(M, slope, 100, lower=-29), scale=0.25)
    tol = 2e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)




def leaves(arrays, grad):
    return [torch.from_numpy(a).requires_grad_(g) for a, g in zip(arrays, grad)]


@pytest.mark.skipif(c_build.find_compiler() is None, reason="the fused backward is C")
@pytest.mark.parametrize("case", ["causal padding mask", "alibi", "window", "everything",
                                  "window without causal"])
@pytest.mark.parametrize("N", [9, 70, 131])
def test_gradients_match_torch_autograd(case, N, backward_calls):
    Q, K, V, M, slope, bias = data(2, 3, N, 5, np.float64, seed=N, masked=0.1)
    M[:, 0] = 0.0                        # every row sees a key
    Q, K, V = leaves((Q, K, V), (True,) * 3)
    M, slope, bias = (torch.from_numpy(a) for a in (M, slope, bias))
    W = 12
    out = run(program(**CASES[case]), Q=Q, K=K, V=V, M=M, slope=slope, bias=bias,
              scale=0.3, W=W)
    seed = torch.randn(out.shape, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(1))
    got = torch.autograd.grad(out, (Q, K, V), seed)
    assert backward_calls, "the fused backward ran"
    # torch's own formula: weights materialised
    spec = CASES[case]
    terms = spec.get("terms", "")
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    S = Q @ K.transpose(-1, -2) * 0.3
    if "M[" in terms:
        S = S + M[:, None, None, :]
    if "slope" in terms:
        S = S + slope[None, :, None, None] * (j - i)
    if "bias" in terms:
        S = S + bias[None]
    seen = torch.ones(N, N, dtype=torch.bool)
    if spec.get("mask", "j <= i"):
        seen &= j <= i
    if spec.get("window") == "i - j < W":
        seen &= i - j < W
    elif spec.get("window"):
        seen &= j >= i - W
    S = S.masked_fill(~seen, -torch.inf)
    P = torch.exp(S - S.amax(-1, keepdim=True))
    want = torch.autograd.grad((P @ V) / P.sum(-1, keepdim=True), (Q, K, V), seed)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


@pytest.mark.skipif(c_build.find_compiler() is None, reason="the fused backward is C")
def test_a_scale_needing_its_gradient_records_the_statements(fused_calls, backward_calls):
    """(The terms' gradients come from the fused backward: test_attention_bias_grad.py.)"""
    Q, K, V, M, slope, bias = data(1, 2, 12, 3, np.float64)
    Q, K, V, slope, bias = leaves((Q, K, V, slope, bias), (True, True, True, True, False))
    scale = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    out = ef.ein(program(BIAS + ALIBI), Q=Q, K=K, V=V, slope=slope, bias=bias, scale=scale)
    assert not any(fused_calls) and not backward_calls
    got = torch.autograd.grad(out.sum(), (Q, slope, scale))
    i, j = torch.arange(12)[:, None], torch.arange(12)[None, :]
    S = Q @ K.transpose(-1, -2) * scale + bias[None] + slope[None, :, None, None] * (j - i)
    S = S.masked_fill(~(j <= i), -torch.inf)
    P = torch.softmax(S, -1)
    want = torch.autograd.grad((P @ V).sum(), (Q, slope, scale))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


@pytest.mark.skipif(c_build.find_compiler() is None, reason="the fused backward is C")
def test_a_row_masked_by_the_tensor_takes_the_formula_backward(backward_calls):
    Q, K, V, M, slope, bias = data(1, 1, 20, 3, np.float64, masked=0.0)
    M[0, :2] = -np.inf                   # rows 0 and 1 see only masked keys: NaN
    Q, K, V = leaves((Q, K, V), (True,) * 3)
    out = ef.ein(program(PADDED), Q=Q, K=K, V=V, M=torch.from_numpy(M), scale=0.3)
    assert torch.isnan(out[0, 0, :2]).all() and torch.isfinite(out[0, 0, 2:]).all()
    got = torch.autograd.grad(out[0, 0, 2:].sum(), (Q, K, V))
    assert not backward_calls          # the log-sum-exp of rows 0, 1 is -inf
    # the statements one by one (ranges= declines the fused path), recorded by autograd
    Qd, Kd, Vd = (t.detach().requires_grad_() for t in (Q, K, V))
    statements = ef.ein(program(PADDED), Q=Qd, K=Kd, V=Vd, M=torch.from_numpy(M),
                        scale=0.3, ranges={"i": 20})
    want = torch.autograd.grad(statements[0, 0, 2:].sum(), (Qd, Kd, Vd))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(torch.isnan(a), torch.isnan(b))
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11, equal_nan=True)


# -- blocks a padding mask hides entirely -------------------------------------------------

def block_masked(N=300, dtype=np.float64):
    Q, K, V, M, slope, bias = data(2, 2, N, 8, dtype, seed=3, masked=0.0)
    M[0, 64:200] = -np.inf               # whole key blocks of element 0
    M[1, 100:] = -np.inf
    return Q, K, V, M


def skippable(Q, K, V, M, scale=0.3):
    from einfuse.rewrite.attention_layout import canonical
    attention = attention_of(program(PADDED, mask=None))
    return canonical(attention, {"Q": Q, "K": K, "V": V, "M": M, "scale": scale}).skip_hidden


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_hidden_blocks_are_skipped_exactly(backend, dtype, fused_calls):
    Q, K, V, M = block_masked(dtype=dtype)
    assert skippable(Q, K, V, M)
    got = run(program(PADDED, mask=None), Q=Q, K=K, V=V, M=M, scale=0.3, backend=backend)
    want = mirror(Q, K, V, 0.3, M=M)
    tol = 3e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
@pytest.mark.parametrize("poison", ["nan key", "inf key", "+inf bias", "huge query"])
def test_a_hidden_block_that_is_nan_in_the_statements_is_not_skipped(backend, poison,
                                                                     fused_calls):
    Q, K, V, M = block_masked()
    text, named = program(PADDED, mask=None), {}
    if poison == "nan key":
        K[0, 1, 100, 3] = np.nan         # a key the mask hides: NaN + -inf is NaN
    elif poison == "inf key":
        K[0, 1, 100, 3] = np.inf
    elif poison == "+inf bias":
        text = program(PADDED + BIAS, mask=None)
        named["bias"] = np.zeros((2, 300, 300))
        named["bias"][1, 5, 150] = np.inf
    else:
        Q[0, 0, 7] = 1e308               # its dot products overflow to +-inf
    # (the call still lets the kernel look for hidden blocks: whether a block's scores
    # are -inf with its mask the kernel decides per block, from that block's rows)
    assert skippable(Q, K, V, M)
    got = run(text, Q=Q, K=K, V=V, M=M, scale=0.3, backend=backend, **named)
    want = mirror(Q, K, V, 0.3, M=M, bias=named.get("bias"))
    assert np.isnan(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(c_build.find_compiler() is None, reason="the fused backward is C")
def test_gradients_with_hidden_blocks(backward_calls):
    Q, K, V, M = block_masked(N=200)
    Q, K, V = leaves((Q, K, V), (True,) * 3)
    out = run(program(PADDED, mask=None), Q=Q, K=K, V=V, M=torch.from_numpy(M), scale=0.3)
    got = torch.autograd.grad(out.sum(), (Q, K, V))
    assert backward_calls
    S = Q @ K.transpose(-1, -2) * 0.3 + torch.from_numpy(M)[:, None, None, :]
    want = torch.autograd.grad((torch.softmax(S, -1) @ V).sum(), (Q, K, V))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
def test_a_window_on_the_weights_is_the_same_band(backend, fused_calls):
    text = ("S[b,h,i,j] := sum[d](Q[b,h,i,d]*K[b,h,j,d]) * scale + M[b,j]\n"
            "m[b,h,i] := max[j](S[b,h,i,j])\n"
            "P[b,h,i,j] := where((j <= i) & (i - j < W), exp(S[b,h,i,j] - m[b,h,i]), 0)\n"
            "O[b,h,i,e] := sum[j](P[b,h,i,j] * V[b,h,j,e]) / sum[j](P[b,h,i,j])")
    found = attention_of(text)
    assert found.upper == (Bound(0),) and found.lower == (Bound(1, (("W", -1),)),)
    Q, K, V, M, slope, bias = data(2, 2, 90, 8, np.float64, masked=0.0)
    got = ef.ein(text, Q=Q, K=K, V=V, M=M, scale=0.3, W=20, backend=backend)
    assert fused_calls == [True]
    np.testing.assert_allclose(got, mirror(Q, K, V, 0.3, M=M, lower=-19, upper=0),
                               rtol=1e-12, atol=1e-12)


GRADIENT_CASES = (st.integers(1, 70), st.integers(1, 6), st.integers(1, 80),
                  st.sampled_from(["causal padding mask", "alibi", "window", "everything"]),
                  st.integers(0, 2 ** 16))


# each example compiles the statements' kernels for its N (about 1 s of CPU, cold): the
# default run draws 4, the slow run 12 more
@pytest.mark.skipif(c_build.find_compiler() is None, reason="the fused backward is C")
@settings(max_examples=4, deadline=None)
@given(*GRADIENT_CASES)
def test_hypothesis_gradients(N, D, W, case, seed):
    check_gradients(N, D, W, case, seed)


@pytest.mark.slow
@pytest.mark.skipif(c_build.find_compiler() is None, reason="the fused backward is C")
@settings(max_examples=12, deadline=None)
@given(*GRADIENT_CASES)
def test_more_hypothesis_gradients(N, D, W, case, seed):
    check_gradients(N, D, W, case, seed)


def check_gradients(N, D, W, case, seed):
    Q, K, V, M, slope, bias = data(1, 2, N, D, np.float64, seed=seed, masked=0.3)
    M[:, 0] = 0.0                        # every row sees key 0 (the fused backward)
    spec = CASES[case]
    text = program(**spec)
    leaves_ = leaves((Q, K, V), (True,) * 3)
    named = dict(M=torch.from_numpy(M), slope=torch.from_numpy(slope),
                 bias=torch.from_numpy(bias), scale=0.3, W=W)
    got = torch.autograd.grad(run(text, Q=leaves_[0], K=leaves_[1], V=leaves_[2],
                                  **named).sum(), leaves_)
    plain = [torch.from_numpy(a).requires_grad_() for a in (Q, K, V)]
    want = torch.autograd.grad(run(text, Q=plain[0], K=plain[1], V=plain[2],
                                   ranges={"i": N}, **named).sum(), plain)
    for a, b in zip(got, want):
        # (a window can hide key 0 from a row whose keys are all masked: that row is
        # NaN in both, at the same places -- the statements' own semantics)
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, equal_nan=True)


def test_scores_not_fused_still_run_as_written(fused_calls):
    Q, K, V, M, slope, bias = data(1, 2, 30, 4, np.float64, masked=0.0)
    M = np.random.default_rng(2).standard_normal(M.shape)
    got = run(program(" + M[b,j] * M[b,j]"), Q=Q, K=K, V=V, M=M, scale=0.3)
    assert not any(fused_calls)
    np.testing.assert_allclose(got, mirror(Q, K, V, 0.3, M=M * M, upper=0),
                               rtol=1e-12, atol=1e-12)
    got = run(program(" + exp(M[b,j])", mask="j * 2 <= i"), Q=Q, K=K, V=V, M=M, scale=0.3)
    i, j = np.arange(30)[:, None], np.arange(30)[None, :]
    S = np.einsum("bhid,bhjd->bhij", Q, K) * 0.3 + np.exp(M)[:, None, None, :]
    with np.errstate(all="ignore"):
        S = np.where(j * 2 <= i, S, -np.inf)
        P = np.exp(S - S.max(-1, keepdims=True))
        want = (P @ V) / P.sum(-1)[..., None]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
