"""The fused attention kernels' vector softmax step (backends/c/attention_softmax.py): rows
that see a whole key block updated together with an inlined exp, a weight below
exp(-87) (float32) / exp(-708) (float64) taken as 0, NaN kept, the work items of a bias
broadcast over a batch axis reordered -- checked against a float64 NumPy mirror of the
statements and torch autograd, and for the same bits at every thread count; on the AVX2
build and the host's, each in a child process."""

import os
import subprocess
import sys

import numpy as np
import pytest

import einfuse as ef
from einfuse.analysis import machine as machine_module
from einfuse.backends.c import build as c_build

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
HOST_FLAGS = machine_module._cpu_flags()

SOFTMAX = ("\nm[b,h,i] := max[j](S[b,h,i,j])\nP[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])\n"
           "O[b,h,i,e] := sum[j](P[b,h,i,j] * V[b,h,j,e]) / sum[j](P[b,h,i,j])")
DOT = "sum[d](Q[b,h,i,d]*K[b,h,j,d]) * scale"
ALIBI = "S[b,h,i,j] := where(j <= i, " + DOT + " + slope[h] * (j - i), -inf)" + SOFTMAX
BIAS = "S[b,h,i,j] := " + DOT + " + bias[h,i,j]" + SOFTMAX
PLAIN = "S[b,h,i,j] := " + DOT + SOFTMAX


def mirror(Q, K, V, scale, slope=None, bias=None, causal=False):
    """The statements in float64 NumPy."""
    Q, K, V = (np.asarray(a, np.float64) for a in (Q, K, V))
    i = np.arange(Q.shape[2])[:, None]
    j = np.arange(K.shape[2])[None, :]
    with np.errstate(all="ignore"):
        S = np.einsum("bhid,bhjd->bhij", Q, K) * scale
        if slope is not None:
            S = S + np.asarray(slope, np.float64)[None, :, None, None] * (j - i)
        if bias is not None:
            S = S + np.asarray(bias, np.float64)[None]
        if causal:
            S = np.where(j <= i, S, -np.inf)
        P = np.exp(S - S.max(-1, keepdims=True))
        return (P @ V) / P.sum(-1)[..., None]


def arrays(B, H, N, D, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((B, H, N, D)).astype(dtype) for _ in range(3)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_far_keys_weigh_nothing_and_the_rows_agree(dtype, fused_calls):
    # ALiBi slopes of 1 and 4: keys 100 and more behind a row score below top - 87 (and
    # below top - 708 for a slope of 4 at N = 300): their weights are cut to 0, the
    # statements' subnormal or 0 weights change nothing at this precision
    Q, K, V = arrays(1, 2, 300, 16, dtype)
    slope = np.array([1.0, 4.0], dtype)
    got = ef.ein(ALIBI, Q=Q, K=K, V=V, slope=slope, scale=0.25, backend="c")
    assert fused_calls == [True]
    want = mirror(Q, K, V, 0.25, slope=slope, causal=True)
    tolerance = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


def test_far_keys_gradients_match_torch(backward_calls):
    Q, K, V = (torch.from_numpy(a).requires_grad_() for a in arrays(1, 2, 200, 16,
                                                                    np.float32, 1))
    slope = torch.tensor([1.0, 3.0])
    out = ef.ein(ALIBI, Q=Q, K=K, V=V, slope=slope, scale=0.25)
    got = torch.autograd.grad((out * out).sum(), (Q, K, V))
    assert backward_calls
    i = torch.arange(200)[:, None]
    j = torch.arange(200)[None, :]
    mask = torch.where(j <= i, slope[:, None, None] * (j - i), -torch.inf)[None]
    reference = [t.detach().double().requires_grad_() for t in (Q, K, V)]
    want_out = torch.nn.functional.scaled_dot_product_attention(
        *reference, attn_mask=mask.double(), scale=0.25)
    want = torch.autograd.grad((want_out * want_out).sum(), reference)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5)


@pytest.fixture
def backward_calls(monkeypatch):
    from einfuse.runtime import attention_autograd
    calls = []
    original = attention_autograd._fused_gradients

    def counting(*args):
        calls.append(True)
        return original(*args)
    monkeypatch.setattr(attention_autograd, "_fused_gradients", counting)
    return calls


@pytest.mark.parametrize("N", [64, 130, 257])
def test_every_exp_across_a_row_block_is_accurate(N):
    # scores spread over [-30, 30]: the polynomial exp over its whole reduced range, in
    # whole blocks (RB rows, every key seen) and in the rows and keys left over
    Q, K, V = arrays(2, 1, N, 8, np.float32, 3)
    got = ef.ein(PLAIN, Q=Q * 3, K=K * 3, V=V, scale=0.4, backend="c")
    want = mirror(Q * 3, K * 3, V, 0.4)
    np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-6)


def test_a_nan_score_makes_its_row_nan_as_the_statements_do(fused_calls):
    Q, K, V = arrays(1, 1, 130, 8, np.float32, 4)
    Q[0, 0, 5, 2] = np.nan       # row 5's scores all NaN, in a whole row group
    Q[0, 0, 128, 0] = np.nan     # and row 128's, in the rows left over
    got = ef.ein(PLAIN, Q=Q, K=K, V=V, scale=0.5, backend="c")
    assert fused_calls == [True]
    statements = ef.ein(PLAIN, Q=Q, K=K, V=V, scale=0.5, backend="c", ranges={"i": 130})
    nan_rows = np.isnan(got[0, 0]).any(axis=-1)
    assert nan_rows.tolist() == np.isnan(statements[0, 0]).any(axis=-1).tolist()
    assert np.flatnonzero(nan_rows).tolist() == [5, 128]
    np.testing.assert_allclose(got[0, 0, ~nan_rows], statements[0, 0, ~nan_rows],
                               rtol=2e-5, atol=2e-6)


def test_a_row_blocks_first_keys_all_masked_then_seen():
    # bias -inf for the first block of keys in every row, then finite: the whole-block
    # update meets rows whose max is still -inf (and skips those blocks: skip_hidden)
    Q, K, V = arrays(1, 2, 200, 8, np.float32, 5)
    bias = np.random.default_rng(6).standard_normal((2, 200, 200)).astype(np.float32)
    bias[:, :, :70] = -np.inf
    bias[1, 7, 70:] = -np.inf          # one row sees no key: NaN, as the statements
    got = ef.ein(BIAS, Q=Q, K=K, V=V, bias=bias, scale=0.3, backend="c")
    want = mirror(Q, K, V, 0.3, bias=bias)
    assert np.isnan(got[0, 1, 7]).all() and np.isnan(want[0, 1, 7]).all()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_bias_broadcast_over_the_batch_same_bits_for_every_thread_count():
    # the work items of batch elements sharing a bias run next to each other: only the
    # order changes, each output row's value does not
    Q, K, V = arrays(3, 2, 150, 8, np.float32, 7)
    bias = np.random.default_rng(8).standard_normal((2, 150, 150)).astype(np.float32)
    found = [ef.ein(BIAS, Q=Q, K=K, V=V, bias=bias, scale=0.3, backend="c",
                    threads=threads) for threads in (1, 2, 3)]
    for other in found[1:]:
        assert np.array_equal(found[0], other)
    np.testing.assert_allclose(found[0], mirror(Q, K, V, 0.3, bias=bias), rtol=2e-5,
                               atol=2e-6)


def poisoned_bias(H, N, dtype, seed):
    """A bias whose rows take each of the vector step's paths: finite and near (every
    exponent above the cut: the exp without it), spread below top - 708 (the cut),
    -inf at some keys, one row NaN at a key, one row -inf at every key."""
    bias = np.random.default_rng(seed).standard_normal((H, N, N)).astype(dtype)
    bias[0, 10:20, 5:40] = -800.0
    bias[0, 30:40, ::3] = -np.inf
    bias[1, 3, N // 2] = np.nan
    bias[1, N - 2, :] = -np.inf
    return bias


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("N", [77, 130])
def test_terms_added_to_the_tile_give_the_row_by_row_bits(dtype, N, fused_calls):
    # a bias read along the keys at unit stride is added to the scores while they are
    # in registers (and the rows' extremes taken there); the same bias stored
    # transposed is added row by row after the scores are stored: the same bits, and
    # the statements' values, at partial row groups and key blocks too
    Q, K, V = arrays(2, 2, N, 8, dtype, 10)
    bias = poisoned_bias(2, N, dtype, 11)
    tiled = ef.ein(BIAS, Q=Q, K=K, V=V, bias=bias, scale=0.3, backend="c")
    by_rows = ef.ein("S[b,h,i,j] := " + DOT + " + bt[h,j,i]" + SOFTMAX, Q=Q, K=K, V=V,
                     bt=np.ascontiguousarray(bias.transpose(0, 2, 1)), scale=0.3,
                     backend="c")
    assert fused_calls == [True, True]
    assert np.array_equal(tiled, by_rows, equal_nan=True)
    want = mirror(Q, K, V, 0.3, bias=bias)
    assert np.isnan(want[:, 1, 3]).all() and np.isnan(want[:, 1, N - 2]).all()
    np.testing.assert_array_equal(np.isnan(tiled), np.isnan(want))
    tolerance = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(tiled, want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_padding_mask_and_a_row_term_in_the_tile(dtype, fused_calls):
    # M[b,j] (broadcast over the rows) and c[h,i] (broadcast over the keys, one value
    # a row) added in registers; the mask hides whole key blocks and parts of others
    N = 130
    Q, K, V = arrays(2, 2, N, 8, dtype, 12)
    M = np.zeros((2, N), dtype)
    M[0, 64:128] = -np.inf
    M[1, 70:] = -np.inf
    c = np.random.default_rng(13).standard_normal((2, N)).astype(dtype) * 50
    text = "S[b,h,i,j] := " + DOT + " + M[b,j] + c[h,i]" + SOFTMAX
    got = ef.ein(text, Q=Q, K=K, V=V, M=M, c=c, scale=0.3, backend="c")
    assert fused_calls == [True]
    with np.errstate(all="ignore"):
        S = np.einsum("bhid,bhjd->bhij", Q.astype(np.float64), K.astype(np.float64)) * 0.3
        S = S + M.astype(np.float64)[:, None, None, :] + c.astype(np.float64)[None, :, :, None]
        P = np.exp(S - S.max(-1, keepdims=True))
        want = (P @ V.astype(np.float64)) / P.sum(-1)[..., None]
    tolerance = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


CHILD = r"""
import numpy as np, torch
import einfuse as ef
from einfuse.plan.blocking import attention_block
data = dict(np.load(IN))
out = {"lanes": attention_block(np.dtype(np.float32)).lanes}
for dtype in ("float32", "float64"):
    Q, K, V = (data[n].astype(dtype) for n in "QKV")
    out[f"plain_{dtype}"] = ef.ein(PLAIN, Q=Q, K=K, V=V, scale=0.4, backend="c")
    out[f"alibi_{dtype}"] = ef.ein(ALIBI, Q=Q, K=K, V=V, slope=data["slope"].astype(dtype),
                                   scale=0.25, backend="c")
    out[f"bias_{dtype}"] = ef.ein(BIAS, Q=Q, K=K, V=V, bias=data["bias"].astype(dtype),
                                  scale=0.3, backend="c")
tensors = [torch.from_numpy(data[n]).requires_grad_() for n in "QKV"]
result = ef.ein(ALIBI, Q=tensors[0], K=tensors[1], V=tensors[2],
                slope=torch.from_numpy(data["slope"]), scale=0.25)
for name, grad in zip("QKV", torch.autograd.grad((result * result).sum(), tensors)):
    out[f"grad_{name}"] = grad.numpy()
np.savez(OUT, **out)
"""


@pytest.mark.slow      # (a child process per target, each compiling its kernels cold)
@pytest.mark.parametrize("target", [
    pytest.param("avx2", marks=pytest.mark.skipif(not {"avx2", "fma", "bmi2"} <= HOST_FLAGS,
                                                  reason="the host runs no AVX2")),
    "native"])
def test_the_vector_step_on_each_instruction_set(target, tmp_path):
    # the vector width decides the reductions' shuffles, the row groups and BK's
    # vectors: the AVX2 build (8 float32 lanes) and the host's, each in a child process
    rng = np.random.default_rng(9)
    Q, K, V = (rng.standard_normal((1, 2, 140, 16)).astype(np.float32) for _ in range(3))
    slope = np.array([1.0, 4.0], np.float32)
    bias = rng.standard_normal((2, 140, 140)).astype(np.float32)
    bias[:, :, :70] = -np.inf
    source, found = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(source, Q=Q, K=K, V=V, slope=slope, bias=bias)
    script = (f"IN = {str(source)!r}\nOUT = {str(found)!r}\nPLAIN = {PLAIN!r}\n"
              f"ALIBI = {ALIBI!r}\nBIAS = {BIAS!r}\n" + CHILD)
    env = dict(os.environ, EINFUSE_CPU=target, OMP_NUM_THREADS="2")
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=900)
    out = np.load(found)
    if target == "avx2":
        assert int(out["lanes"]) == 8
    for dtype, tolerance in (("float32", 2e-5), ("float64", 1e-12)):
        for name, want in (("plain", mirror(Q, K, V, 0.4)),
                           ("alibi", mirror(Q, K, V, 0.25, slope=slope, causal=True)),
                           ("bias", mirror(Q, K, V, 0.3, bias=bias))):
            np.testing.assert_allclose(out[f"{name}_{dtype}"], want, rtol=tolerance,
                                       atol=tolerance)
    reference = [torch.from_numpy(a).double().requires_grad_() for a in (Q, K, V)]
    i, j = np.arange(140)[:, None], np.arange(140)[None, :]
    mask = torch.from_numpy(np.where(j <= i, slope[:, None, None].astype(np.float64) *
                                     (j - i), -np.inf)[None])
    result = torch.nn.functional.scaled_dot_product_attention(*reference, attn_mask=mask,
                                                              scale=0.25)
    want = torch.autograd.grad((result * result).sum(), reference)
    for name, grad in zip("QKV", want):
        np.testing.assert_allclose(out[f"grad_{name}"], grad.numpy(), rtol=1e-4, atol=1e-5)
