"""Attention through the online-softmax rewrite (rewrite/online_softmax.py): which forms
it recognises, and that the fused result equals the statements run one by one
(compared against an independent NumPy mirror of the statements and, on a tiny case,
the brute-force oracle), NaN and inf included, on the NumPy and C backends; Triton,
PyTorch autograd and gradients run the statements one by one and agree."""

import re

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.runtime import attention as attention_runtime
from oracle import brute_force

MASKS = {"causal": "j <= i", "strict": "j < i", "none": None}


def program(mask="j <= i", normalised=True, scale="* scale"):
    score = f"sum[d](Q[b,h,i,d]*K[b,h,j,d]) {scale}".strip()
    s = f"where({mask}, {score}, -inf)" if mask else score
    last = "sum[j](P[b,h,i,j] * V[b,h,j,e])" + (" / sum[j](P[b,h,i,j])" if normalised
                                                else "")
    return (f"S[b,h,i,j] := {s}\nm[b,h,i] := max[j](S[b,h,i,j])\n"
            f"P[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])\nO[b,h,i,e] := {last}")


def one_by_one(Q, K, V, scale=1.0, mask="j <= i", normalised=True):
    """The statements' semantics in float64 NumPy, step by step (S and P materialised)."""
    Q, K, V = (np.asarray(a, np.float64) for a in (Q, K, V))
    with np.errstate(all="ignore"):
        S = np.einsum("bhid,bhjd->bhij", Q, K) * scale
        i = np.arange(Q.shape[2])[:, None]
        j = np.arange(K.shape[2])[None, :]
        if mask == "j <= i":
            S = np.where(j <= i, S, -np.inf)
        elif mask == "j < i":
            S = np.where(j < i, S, -np.inf)
        m = S.max(-1, keepdims=True)
        P = np.exp(S - m)
        num = (P[..., None] * V[:, :, None, :, :]).sum(-2)    # 0 * inf stays NaN
        return num / P.sum(-1)[..., None] if normalised else num


@pytest.fixture(autouse=True)
def small_key_blocks(monkeypatch):
    """The NumPy executor in blocks of 32 keys, so that combining partial states (the
    monoid) is exercised at these sizes."""
    monkeypatch.setattr(attention_runtime, "KEY_BLOCK", 32)


FUSED_BACKENDS = ["numpy"] + (["c"] if c_build.find_compiler() is not None else [])
rng = np.random.default_rng(7)


def qkv(B, H, NQ, NK, D, E, dtype):
    return (rng.standard_normal((B, H, NQ, D)).astype(dtype),
            rng.standard_normal((B, H, NK, D)).astype(dtype),
            rng.standard_normal((B, H, NK, E)).astype(dtype))


# -- recognition -------------------------------------------------------------------------

SINGLE = ("O[b,h,i,e] := sum[j](exp(where(j <= i, sum[d](Q[b,h,i,d]*K[b,h,j,d]), -inf) - "
          "max[k](where(k <= i, sum[c](Q[b,h,i,c]*K[b,h,k,c]), -inf))) * V[b,h,j,e]) / "
          "sum[l](exp(where(l <= i, sum[d](Q[b,h,i,d]*K[b,h,l,d]), -inf) - "
          "max[k](where(k <= i, sum[c](Q[b,h,i,c]*K[b,h,k,c]), -inf))))")


# the probabilities normalised first, then the weighted sum
SOFTMAX_FIRST = program().replace(
    "P[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])",
    "P[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i]) / sum[k](exp(S[b,h,i,k] - m[b,h,i]))").replace(
    " / sum[j](P[b,h,i,j])", "")


@pytest.mark.parametrize("text, mask, scale, normalised", [
    (program(), "j <= i", "*", True),
    (program(mask="i >= j"), "j <= i", "*", True),
    (program(mask="j < i"), "j < i", "*", True),
    (program(mask=None), "none", "*", True),
    (program(scale="/ 8.0"), "j <= i", "/", True),
    (program(scale=""), "j <= i", "none", True),
    (program(normalised=False), "j <= i", "*", False),
    (program().replace("sum[d](Q[b,h,i,d]*K[b,h,j,d]) * scale",
                       "scale * sum[d](K[b,h,j,d]*Q[b,h,i,d])"), "j <= i", "*", True),
    (SINGLE, "j <= i", "none", True),
    (SOFTMAX_FIRST, "j <= i", "*", True),
])
def test_recognised_forms(text, mask, scale, normalised):
    compiled = ef.compile(text)
    found = compiled.attention if hasattr(compiled, "attention") else \
        attention_runtime.statement_attention(compiled.statement)
    assert found is not None
    assert (found.mask.value, found.scale.value, found.normalised) == (mask, scale, normalised)


@pytest.mark.parametrize("text, outputs", [
    (program(), ("O", "S")),            # the caller wants the scores: they must exist
    (program(), ("P", "O")),
    (program().replace("max[j](S[b,h,i,j])", "max[j](S[b,h,j,i])"), None),
    (program().replace("* V[b,h,j,e]", "* V[b,h,i,e]"), None),   # V read at the row
    (program().replace("/ sum[j](P[b,h,i,j])", "/ sum[j](P[b,h,i,j] * 2)"), None),
    (program().replace("exp(S[b,h,i,j] - m[b,h,i])", "exp(S[b,h,i,j] - m[b,h,i] + 1)"),
     None),
])
def test_not_recognised(text, outputs):
    # (the row max read transposed has no consistent ranges when NQ != NK, but the
    # match is decided on the text alone)
    compiled = ef.compile(text, outputs=outputs)
    assert compiled.attention is None


def test_intermediate_output_runs_one_by_one(fused_calls):
    Q, K, V = qkv(1, 2, 9, 9, 3, 4, np.float64)
    O, S = ef.ein(program(), Q=Q, K=K, V=V, scale=0.5, outputs=("O", "S"))
    assert not fused_calls
    np.testing.assert_allclose(O, one_by_one(Q, K, V, 0.5), rtol=1e-12, atol=1e-12)
    assert S.shape == (1, 2, 9, 9) and S[0, 0, 0, 1] == -np.inf


# -- results -----------------------------------------------------------------------------

@pytest.mark.parametrize("backend", FUSED_BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mask", ["causal", "strict", "none"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1, 1), (2, 3, 70, 70, 17, 5),
                                   (1, 2, 129, 129, 64, 64)])
def test_matches_one_by_one(backend, dtype, mask, shape, fused_calls):
    B, H, NQ, NK, D, E = shape
    Q, K, V = qkv(B, H, NQ, NK, D, E, dtype)
    text = program(MASKS[mask])
    got = ef.ein(text, Q=Q, K=K, V=V, scale=0.3, backend=backend)
    assert fused_calls == [True]
    assert got.dtype == dtype and got.shape == (B, H, NQ, E)
    expected = one_by_one(Q, K, V, 0.3, MASKS[mask])
    tol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
def test_softmax_first_form(backend, fused_calls):
    Q, K, V = qkv(2, 2, 45, 45, 8, 8, np.float64)
    got = ef.ein(SOFTMAX_FIRST, Q=Q, K=K, V=V, scale=0.5, backend=backend)
    assert fused_calls == [True]
    np.testing.assert_allclose(got, one_by_one(Q, K, V, 0.5), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
def test_more_rows_than_keys_and_no_mask(backend, fused_calls):
    Q, K, V = qkv(2, 1, 100, 37, 8, 3, np.float32)
    got = ef.ein(program(None, normalised=False, scale="/ 3.0"), Q=Q, K=K, V=V,
                 backend=backend)
    assert fused_calls == [True]
    np.testing.assert_allclose(got, one_by_one(Q, K, V, 1 / 3.0, None, False),
                               rtol=5e-5, atol=5e-5)


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
def test_single_statement_and_other_layouts(backend, fused_calls):
    Q = rng.standard_normal((33, 2, 6))      # Q[i,b,d]
    K = rng.standard_normal((33, 2, 6))      # K[j,b,d]
    V = rng.standard_normal((2, 33, 4))      # V[b,j,e]
    text = ("O[b,e,i] := sum[j](exp(where(i >= j, sum[d](Q[i,b,d]*K[j,b,d]) / 2, -inf) - "
            "max[k](where(i >= k, sum[d](Q[i,b,d]*K[k,b,d]) / 2, -inf))) * V[b,j,e]) / "
            "sum[j](exp(where(i >= j, sum[d](Q[i,b,d]*K[j,b,d]) / 2, -inf) - "
            "max[k](where(i >= k, sum[d](Q[i,b,d]*K[k,b,d]) / 2, -inf))))")
    got = ef.ein(text, Q=Q, K=K, V=V, backend=backend)
    assert fused_calls == [True]
    expected = one_by_one(Q.transpose(1, 0, 2)[:, None], K.transpose(1, 0, 2)[:, None],
                          V[:, None], 0.5)[:, 0].transpose(0, 2, 1)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_brute_force_oracle_tiny():
    Q, K, V = qkv(1, 2, 4, 4, 3, 2, np.float64)
    arrays = {"Q": Q, "K": K, "V": V}
    extents = {"b": 1, "h": 2, "i": 4, "j": 4, "d": 3, "e": 2}
    for statement in program().split("\n"):
        name = statement.split("[")[0]
        used = set(re.findall(r"\b([bhijde])\b", statement))
        ranges = {x: (0, extents[x]) for x in used}
        arrays[name] = brute_force(statement, ranges, arrays, {"scale": 0.7})
    got = ef.ein(program(), Q=Q, K=K, V=V, scale=0.7)
    np.testing.assert_allclose(got, arrays["O"], rtol=1e-12, atol=1e-12)


# -- NaN and inf ---------------------------------------------------------------------------

def poison(Q, K, V, case: str) -> None:
    """Non-finite values placed in (1, 2, 70, 70, 4, 3)-shaped Q, K, V (NumPy arrays or
    torch tensors), in place, for the named case."""
    if case == "nan query row":
        Q[0, 1, 5, 2] = np.nan
    elif case == "inf key":
        K[0, 0, 3, 1] = np.inf
    elif case == "-inf scores row":
        Q[0, 0, 10] = np.inf
        K[0, 0, :11] = -1.0            # every score row 10 sees is -inf
    elif case == "-inf first block":
        # scores -inf for keys below 20 (more than a first block of keys), finite after:
        # rows below 20 see only -inf (NaN), the later ones must not be poisoned
        Q[0, 0, :, 0] = abs(Q[0, 0, :, 0]) + 0.1
        K[0, 0, :20, 0] = -np.inf
    elif case == "nan in a masked key":
        K[0, 0, 69, 0] = np.nan        # seen only by the last row
    else:
        Q *= 1e18                       # scores overflow to +-inf


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
@pytest.mark.parametrize("case", ["nan query row", "inf key", "-inf scores row",
                                  "nan in a masked key", "huge scores"])
def test_nonfinite_inputs(backend, case, fused_calls):
    Q, K, V = qkv(1, 2, 70, 70, 4, 3, np.float32)
    poison(Q, K, V, case)
    got = ef.ein(program(), Q=Q, K=K, V=V, scale=1.0, backend=backend)
    assert fused_calls == [True]
    expected = one_by_one(Q, K, V, 1.0)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
def test_fully_masked_row_is_nan(backend, fused_calls):
    # with j < i the first row sees no key: max is -inf and every weight exp(-inf - -inf)
    # is NaN, as the statements run one by one give
    Q, K, V = qkv(1, 1, 5, 5, 2, 2, np.float64)
    got = ef.ein(program("j < i"), Q=Q, K=K, V=V, scale=1.0, backend=backend)
    assert fused_calls == [True]
    assert np.isnan(got[0, 0, 0]).all() and not np.isnan(got[0, 0, 1:]).any()
    np.testing.assert_allclose(got, one_by_one(Q, K, V, 1.0, "j < i"), rtol=1e-12)


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
def test_nonfinite_value_runs_one_by_one(backend, fused_calls):
    # a masked key's inf value gives 0 * inf = NaN one by one; the fused pass would skip
    # it, so such calls run as written
    Q, K, V = qkv(1, 1, 6, 6, 2, 2, np.float64)
    V[0, 0, 4, 1] = np.inf
    got = ef.ein(program(), Q=Q, K=K, V=V, scale=1.0, backend=backend)
    assert not any(fused_calls)
    expected = one_by_one(Q, K, V, 1.0)
    assert np.isnan(got[0, 0, :4, 1]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got, expected, rtol=1e-12)


# -- what runs one by one ---------------------------------------------------------------

def test_mismatched_extents_raise_the_statements_error():
    Q, K, V = qkv(1, 1, 6, 6, 2, 2, np.float64)
    with pytest.raises(ef.EinfuseError, match="j"):
        ef.ein(program(), Q=Q, K=K, V=V[:, :, :5], scale=1.0)
    with pytest.raises(ef.EinfuseError, match="scale"):
        ef.ein(program(), Q=Q, K=K, V=V)


def test_mixed_dtypes_and_threads(fused_calls):
    Q, K, V = qkv(1, 2, 20, 20, 3, 3, np.float64)
    mixed = ef.ein(program(), Q=Q.astype(np.float32), K=K, V=V, scale=1.0)
    assert not fused_calls
    np.testing.assert_allclose(mixed, one_by_one(Q.astype(np.float32), K, V), rtol=1e-6)
    one = ef.ein(program(), Q=Q, K=K, V=V, scale=1.0, threads=1)
    assert fused_calls == [True]
    np.testing.assert_allclose(one, one_by_one(Q, K, V), rtol=1e-12)


@pytest.mark.parametrize("scale", [0.3, np.float32(0.3), np.float64(0.3), np.array(2.0), 2])
def test_result_dtype_as_one_by_one(scale):
    Q, K, V = qkv(1, 2, 30, 30, 4, 4, np.float32)
    fused = ef.ein(program(), Q=Q, K=K, V=V, scale=scale)
    O, S = ef.ein(program(), Q=Q, K=K, V=V, scale=scale, outputs=("O", "S"))
    assert fused.dtype == O.dtype
    np.testing.assert_allclose(fused, O, rtol=2e-5, atol=2e-6)


def test_triton_runs_one_by_one():
    from einfuse.backends.triton import backend as triton_backend
    if not triton_backend.available():
        pytest.skip("triton is not installed")
    Q, K, V = qkv(1, 1, 5, 5, 2, 3, np.float32)
    got = ef.ein(program(), Q=Q, K=K, V=V, scale=0.5, backend="triton")
    np.testing.assert_allclose(got, one_by_one(Q, K, V, 0.5), rtol=1e-5, atol=1e-6)


def test_torch_autograd_matches_naive_attention(fused_calls):
    torch = pytest.importorskip("torch")
    Q, K, V = (torch.tensor(a, requires_grad=True) for a in qkv(1, 2, 7, 7, 3, 3, np.float64))
    out = ef.ein(program(), Q=Q, K=K, V=V, scale=0.4)
    # one autograd node: the fused forward, and the fused backward (test_attention_grad.py)
    assert fused_calls == [True]
    expected = torch.nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=True,
                                                                 scale=0.4)
    seed = torch.randn_like(out)
    grads = torch.autograd.grad(out, (Q, K, V), seed)
    want = torch.autograd.grad(expected, (Q, K, V), seed)
    for got, ref in zip((out,) + grads, (expected,) + want):
        np.testing.assert_allclose(got.detach().numpy(), ref.detach().numpy(), rtol=1e-9,
                                   atol=1e-11)


def test_torch_without_autograd_runs_fused(fused_calls):
    torch = pytest.importorskip("torch")
    Q, K, V = (torch.tensor(a) for a in qkv(2, 2, 40, 40, 8, 8, np.float32))
    out = ef.ein(program(), Q=Q, K=K, V=V, scale=torch.tensor(0.3))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    want = torch.nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=True,
                                                            scale=0.3)
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=2e-5, atol=2e-6)
    leaves = [t.clone().requires_grad_() for t in (Q, K, V)]
    with torch.no_grad():
        single = ef.ein(SINGLE, Q=leaves[0], K=leaves[1], V=leaves[2])
    assert isinstance(single, torch.Tensor) and not single.requires_grad
    assert fused_calls == [True, True]
    want = torch.nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=True,
                                                            scale=1.0)
    np.testing.assert_allclose(single.numpy(), want.numpy(), rtol=2e-5, atol=2e-6)


def test_jax_grad_runs_one_by_one(fused_calls):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    Q, K, V = qkv(1, 1, 6, 6, 2, 2, np.float32)

    def loss(q):
        return ef.ein(program(), Q=q, K=jnp.asarray(K), V=jnp.asarray(V), scale=0.5).sum()

    def naive(q):
        s = jnp.where(jnp.tri(6, dtype=bool), jnp.einsum("bhid,bhjd->bhij", q, K) * 0.5,
                      -jnp.inf)
        return (jax.nn.softmax(s, axis=-1) @ V).sum()
    got = jax.grad(loss)(jnp.asarray(Q))
    assert not fused_calls
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.grad(naive)(jnp.asarray(Q))),
                               rtol=1e-4, atol=1e-5)


def test_derive_of_the_attention_program():
    torch = pytest.importorskip("torch")
    Q, K, V = qkv(1, 1, 6, 6, 2, 2, np.float64)
    dO = rng.standard_normal((1, 1, 6, 2))
    grad = ef.derive(program(), "Q")
    dQ = grad.run({"Q": Q, "K": K, "V": V, "scale": 0.4, "dO": dO})
    tq = torch.tensor(Q, requires_grad=True)
    out = torch.nn.functional.scaled_dot_product_attention(
        tq, torch.tensor(K), torch.tensor(V), is_causal=True, scale=0.4)
    (want,) = torch.autograd.grad(out, tq, torch.tensor(dO))
    np.testing.assert_allclose(dQ, want.numpy(), rtol=1e-9, atol=1e-11)


# -- explain -------------------------------------------------------------------------------

def test_explain_says_fused_and_counts_flops():
    shape = (2, 3, 100, 16)
    text = str(ef.explain(program(), shapes={"Q": shape, "K": shape, "V": shape},
                          scale=0.5))
    assert "online softmax" in text and "nothing N x N" in text
    pairs = 6 * 100 * 101 // 2
    flops = pairs * (2 * 16 + 2 * 16 + 1 + 3) + 6 * 100 * 16
    assert f"{flops:,}" in text
    plain = str(ef.explain(program(), shapes={"Q": shape, "K": shape, "V": shape},
                           scale=0.5, outputs=("O", "P")))
    assert "online softmax" not in plain and "materialised intermediates" in plain
    single = str(ef.explain(SINGLE, shapes={"Q": shape, "K": shape, "V": shape}))
    assert "fused as attention with online softmax" in single


def test_a_scale_beyond_int64_is_refused_as_the_statements_refuse_it(fused_calls):
    # the program runs fused before any statement binds: an int scale that the
    # statements refuse (it does not fit in int64) must not give a result
    Q, K, V = qkv(1, 1, 4, 4, 2, 2, np.float32)
    with pytest.raises(ef.EinfuseError, match="scale=1000"):
        ef.ein(program(), Q=Q, K=K, V=V, scale=10**30)
    assert not any(fused_calls)
