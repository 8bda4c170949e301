"""The fused Triton attention kernel with general scores (rewrite/attention_scores.py): a
padding mask m[b,j], a bias[h,i,j], ALiBi's slope[h] * (j - i), windows written as where,
read by the kernel itself (backends/triton/attention_terms.py) in one launch, forward
and fused backward.  Under TRITON_INTERPRET=1 on CPU tensors (compiled on a GPU where
one is lent).  Results against a float64 NumPy mirror of the statements
(test_attention_terms.mirror), the statements on the NumPy backend, torch SDPA with a
float mask, the brute-force oracle on a tiny case; gradients against torch autograd in
float64; what the kernel does not take runs the statements, with explain's reason."""

import re

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.triton import backend as triton_backend
from oracle import brute_force
from test_attention_terms import ALIBI, BIAS, PADDED, data, mirror, program

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not triton_backend.available() or not (triton_backend.interpreted() or
                                           torch.cuda.is_available()),
    reason="needs triton under TRITON_INTERPRET=1, or compiled with a CUDA GPU")
DEVICE = "cpu" if triton_backend.interpreted() else "cuda"
from einfuse.backends.triton import attention_backward  # noqa: E402
from einfuse.backends.triton import launch as triton_launch  # noqa: E402

FORWARD = "attention_forward"
BACKWARD = {"attention_backward_keys", "attention_backward_rows"}

CASES = {
    "padding mask": dict(terms=PADDED, mask=None),
    "causal padding mask": dict(terms=PADDED),
    "alibi": dict(terms=ALIBI),
    "bias": dict(terms=BIAS, mask=None),
    "window": dict(window="i - j < W"),
    "window without causal": dict(mask=None, window="i - j < W"),
    "everything": dict(terms=PADDED + ALIBI + BIAS, window="j >= i - W"),
}


def reference(case, Q, K, V, M, slope, bias, W, scale=0.3):
    spec = CASES[case]
    terms = spec.get("terms", "")
    window = spec.get("window")
    lower = None if window is None else 1 - W if window == "i - j < W" else -W
    return mirror(Q, K, V, scale, M=M if "M[" in terms else None,
                  slope=slope if "slope" in terms else None,
                  bias=bias if "bias" in terms else None, lower=lower,
                  upper=0 if spec.get("mask", "j <= i") else None)


def call(text, backend="triton", **named):
    takes = set(ef.compile(text).inputs)
    return ef.ein(text, backend=backend, **{k: v for k, v in named.items() if k in takes})


def tensors(*arrays, dtype=torch.float32):
    return [torch.from_numpy(np.asarray(a)).to(dtype).to(DEVICE) for a in arrays]


def launched(seen):
    return [record.kernel for record in seen]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("N, W", [(40, 9), (21, 30)])
def test_forward_matches_the_statements(case, N, W):
    # 40 rows: two blocks of 32 rows (one a tail), keys in blocks of 16; a window of 9
    # skips whole key blocks; W=30 past N=21 hides nothing
    Q, K, V, M, slope, bias = data(1, 2, N, 8, np.float32, seed=N)
    M[0, 0] = 0.0
    text = program(**CASES[case])
    args = dict(zip("QKV", tensors(Q, K, V)), M=tensors(M)[0], slope=tensors(slope)[0],
                bias=tensors(bias)[0], scale=0.3, W=W)
    with triton_launch.observed() as seen:
        got = call(text, **args)
    assert launched(seen) == [FORWARD], "one launch, nothing else"
    assert got.dtype == torch.float32
    got = got.cpu().numpy()
    want = reference(case, Q, K, V, M, slope, bias, W)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-5)
    # the statements on the NumPy backend (float64), the same values
    on_numpy = call(text, backend="numpy", Q=Q.astype(np.float64), K=K.astype(np.float64),
                    V=V.astype(np.float64), M=M.astype(np.float64),
                    slope=slope.astype(np.float64), bias=bias.astype(np.float64),
                    scale=0.3, W=W)
    np.testing.assert_allclose(got, on_numpy, rtol=3e-5, atol=3e-5)


def test_numpy_arrays_float16_and_more_rows_than_keys():
    rng = np.random.default_rng(4)
    Q = rng.standard_normal((2, 2, 37, 8)).astype(np.float32)
    K, V = (rng.standard_normal((2, 2, 50, 8)).astype(np.float32) for _ in range(2))
    bias = rng.standard_normal((2, 37, 50)).astype(np.float32)
    M = np.where(rng.random((2, 50)) < 0.3, -np.inf, 0.0).astype(np.float32)
    text = program(PADDED + BIAS, mask=None)
    with triton_launch.observed() as seen:
        got = call(text, Q=Q, K=K, V=V, M=M, bias=bias, scale=0.3)
        half = call(text, **dict(zip("QKV", tensors(Q, K, V, dtype=torch.float16))),
                    M=tensors(M, dtype=torch.float16)[0],
                    bias=tensors(bias, dtype=torch.float16)[0], scale=0.3)
    assert launched(seen) == [FORWARD, FORWARD]
    assert type(got) is np.ndarray and got.dtype == np.float32
    want = mirror(Q, K, V, 0.3, M=M, bias=bias)
    np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-5)
    assert half.dtype == torch.float16
    np.testing.assert_allclose(half.float().cpu().numpy(), want, rtol=6e-3, atol=6e-3)


def test_against_sdpa_with_a_float_mask():
    g = torch.Generator().manual_seed(2)
    Q, K, V = (torch.randn(2, 2, 33, 16, generator=g, dtype=torch.float64)
               for _ in range(3))
    M = torch.where(torch.rand(2, 33, generator=g) < 0.25, -torch.inf, 0.0)
    M[:, 0] = 0.0
    slope = torch.tensor([0.5, 0.25], dtype=torch.float64)
    i, j = torch.arange(33)[:, None], torch.arange(33)[None, :]
    float_mask = M[:, None, None, :] + slope[None, :, None, None] * (j - i)
    float_mask = float_mask.masked_fill(~((j <= i) & (i - j < 7)), -torch.inf)
    want = torch.nn.functional.scaled_dot_product_attention(Q, K, V, attn_mask=float_mask,
                                                             scale=0.25)
    text = program(PADDED + ALIBI, window="i - j < W")
    got = call(text, **dict(zip("QKV", (t.float().to(DEVICE) for t in (Q, K, V)))),
               M=M.float().to(DEVICE), slope=slope.float().to(DEVICE), scale=0.25, W=7)
    np.testing.assert_allclose(got.double().cpu().numpy(), want.numpy(), rtol=3e-5,
                               atol=3e-5)


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
    with triton_launch.observed() as seen:
        got = call(text, **dict(zip("QKV", tensors(Q, K, V))), M=tensors(M)[0],
                   slope=tensors(slope)[0], scale=0.3, W=2)
    assert launched(seen) == [FORWARD]
    got = got.cpu().numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(arrays["O"]))
    np.testing.assert_allclose(got, arrays["O"], rtol=2e-5, atol=2e-6)


def test_fully_masked_rows_and_empty_windows_are_nan():
    Q, K, V, M, slope, bias = data(2, 2, 40, 4, np.float32, masked=0.0)
    M[1, :] = -np.inf                   # batch element 1 sees no key at all
    M[0, :3] = -np.inf                  # rows 0-2 of element 0 see only masked keys
    q, k, v, m = tensors(Q, K, V, M)
    with triton_launch.observed() as seen:
        got = call(program(PADDED), Q=q, K=k, V=v, M=m, scale=0.3).cpu().numpy()
        empty = call(program(window="i - j < W"), Q=q, K=k, V=v, scale=0.3, W=0)
        strict = call(program(mask="j < i", window="i - j < W"), Q=q, K=k, V=v, scale=0.3,
                      W=3)
    assert launched(seen) == [FORWARD] * 3
    want = mirror(Q, K, V, 0.3, M=M, upper=0)
    assert np.isnan(got[1]).all() and np.isnan(got[0, :, :3]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-5)
    assert torch.isnan(empty).all()
    want = mirror(Q, K, V, 0.3, lower=-2, upper=-1)       # row 0 sees nothing: NaN
    np.testing.assert_array_equal(np.isnan(strict.cpu().numpy()), np.isnan(want))
    np.testing.assert_allclose(strict.cpu().numpy(), want, rtol=3e-5, atol=3e-5)


@pytest.mark.parametrize("poison", ["inf value outside every band", "nan bias in band",
                                    "nan bias outside band", "inf bias"])
def test_nonfinite_entries_as_the_statements(poison):
    """The statements weigh every key (0 outside the band), so an inf value anywhere is
    NaN everywhere; a NaN score is NaN for its row; where(c, NaN, -inf) hides a NaN
    outside the band; a +inf score is exp(inf - inf) = NaN for its row."""
    Q, K, V, M, slope, bias = data(1, 2, 40, 4, np.float32)
    bias = np.array(bias)
    if poison == "inf value outside every band":
        V[0, 1, 39, 2] = np.inf        # key 39: no row sees it (j < i); row 0 sees none
        text = program(BIAS, mask="j < i", window="i - j < W")
        W = 5
    else:
        text = program(BIAS, window="i - j < W")
        W = 5
        where = {"nan bias in band": (1, 20, 18, np.nan),
                 "nan bias outside band": (1, 20, 2, np.nan),
                 "inf bias": (0, 9, 9, np.inf)}[poison]
        bias[where[:3]] = where[3]
    q, k, v, b = tensors(Q, K, V, bias)
    with triton_launch.observed() as seen:
        got = call(text, Q=q, K=k, V=v, bias=b, scale=0.3, W=W).cpu().numpy()
    assert launched(seen) == [FORWARD]
    want = call(text, backend="numpy", Q=Q.astype(np.float64), K=K.astype(np.float64),
                V=V.astype(np.float64), bias=bias.astype(np.float64), scale=0.3, W=W)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-5)
    assert np.isnan(got).any() == (poison != "nan bias outside band")


BANDS = [(-3, 0), (0, 20), (5, 9), (-40, -33), (-60, 60), (17, 17), (-2, -2), (30, 80),
         (-80, -37), (1, 0)]


def test_bands_of_every_placement():
    """Bands above, below and across the diagonal, past either end, of one key, empty:
    the key blocks visited (masked at the band's edges, whole inside) against the
    mirror, 37 rows (a tail of the 32-row blocks) and 50 keys (of the 16-key blocks)."""
    rng = np.random.default_rng(11)
    Q = rng.standard_normal((1, 2, 37, 8)).astype(np.float32)
    K, V = (rng.standard_normal((1, 2, 50, 8)).astype(np.float32) for _ in range(2))
    slope = np.array([0.5, 0.25], np.float32)
    text = program(ALIBI, mask="j - i <= U", window="j - i >= L")
    q, k, v, s = tensors(Q, K, V, slope)
    for lower, upper in BANDS:
        with triton_launch.observed() as seen:
            got = call(text, Q=q, K=k, V=v, slope=s, scale=0.3, L=lower, U=upper)
        assert launched(seen) == [FORWARD], (lower, upper)
        got = got.cpu().numpy()
        want = mirror(Q, K, V, 0.3, slope=slope, lower=lower, upper=upper)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=str((lower, upper)))
        np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-5, err_msg=str((lower, upper)))


def test_gradients_of_a_band_off_the_diagonal():
    g = torch.Generator().manual_seed(12)
    wide = [torch.randn(1, 2, n, 8, generator=g, dtype=torch.float64).requires_grad_()
            for n in (37, 50, 50)]
    bias = torch.randn(2, 37, 50, generator=g, dtype=torch.float64).requires_grad_()
    narrow = [t.detach().float().to(DEVICE).requires_grad_() for t in wide + [bias]]
    text = program(BIAS, mask="j - i <= U", window="j - i >= L")
    out = call(text, Q=narrow[0], K=narrow[1], V=narrow[2], bias=narrow[3], scale=0.3,
               L=5, U=21)
    seed = torch.randn(out.shape, generator=g, dtype=torch.float64)
    with triton_launch.observed() as seen:
        got = torch.autograd.grad(out, narrow, seed.float().to(DEVICE))
    assert set(launched(seen)) == BACKWARD
    i, j = torch.arange(37)[:, None], torch.arange(50)[None, :]
    S = (wide[0] @ wide[1].transpose(-1, -2) * 0.3 + bias[None]).masked_fill(
        ~((j - i <= 21) & (j - i >= 5)), -torch.inf)
    want = torch.autograd.grad(torch.softmax(S, -1) @ wide[2], wide + [bias], seed)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.double().cpu().numpy(), b.numpy(), rtol=1e-4,
                                   atol=1e-5 * max(float(b.abs().max()), 1.0))


# -- gradients ---------------------------------------------------------------------------

def by_torch(text_case, Q, K, V, named, scale=0.3):
    """The scores as torch autograd computes them (float64)."""
    terms, mask, window, W = text_case
    N = Q.shape[2]
    S = Q @ K.transpose(-1, -2) * scale
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    if "M[b,j]" in terms:
        S = S + named["M"][:, None, None, :]
    if "bias[h,i,j]" in terms:
        S = S + named["bias"][None]
    if "bias[b,j]" in terms:
        S = S + named["bias"][:, None, None, :]
    if "bias[i,j]" in terms:
        S = S + named["bias"][None, None]
    if "bias[h,i]" in terms:
        S = S + named["bias"][None, :, :, None]
    if "slope[h]" in terms:
        S = S + named["slope"][None, :, None, None] * (j - i)
    if "tilt" in terms:
        S = S - named["tilt"] * (i - j)
    seen = torch.ones(N, N, dtype=torch.bool)
    if mask:
        seen &= j <= i
    if window:
        seen &= i - j < W
    return torch.softmax(S.masked_fill(~seen, -torch.inf), -1) @ V


GRADIENT_CASES = {
    "bias over b": (BIAS, "j <= i", None, None),
    "bias over b and h": (" + bias[i,j]", None, None, None),
    "mask [b,j] needing grad": (" + bias[b,j]", None, None, None),
    "per row": (" + bias[h,i]", "j <= i", None, None),
    "alibi slopes": (ALIBI, "j <= i", None, None),
    "a 0-d slope": (" - tilt * (i - j)", None, "i - j < W", 6),
    "padding mask, bias, window": (PADDED + BIAS, "j <= i", "i - j < W", 6),
}
SHAPES = {"bias[h,i,j]": lambda B, H, N: (H, N, N), "bias[i,j]": lambda B, H, N: (N, N),
          "bias[b,j]": lambda B, H, N: (B, N), "bias[h,i]": lambda B, H, N: (H, N)}


@pytest.mark.parametrize("case", sorted(GRADIENT_CASES))
def test_gradients_against_torch_autograd(case):
    B, H, N, D = 2, 2, 37, 8
    terms, mask, window, W = GRADIENT_CASES[case]
    g = torch.Generator().manual_seed(len(case))
    wide = {n: torch.randn(B, H, N, D, generator=g, dtype=torch.float64) for n in "QKV"}
    shape = next((f(B, H, N) for key, f in SHAPES.items() if key in terms), None)
    if shape is not None:
        wide["bias"] = torch.randn(shape, generator=g, dtype=torch.float64)
    wide["slope"] = torch.tensor([0.5, 0.25], dtype=torch.float64)
    wide["tilt"] = torch.tensor(0.3, dtype=torch.float64)
    M = torch.where(torch.rand(B, N, generator=g) < 0.2, -torch.inf, 0.0)
    M[:, 0] = 0.0
    wide["M"] = M.double()
    learned = [n for n in ("bias", "slope", "tilt") if n in terms]
    for n in list("QKV") + learned:
        wide[n].requires_grad_()
    narrow = {n: t.detach().float().to(DEVICE).requires_grad_(t.requires_grad)
              for n, t in wide.items()}
    text = program(terms, mask=mask, window=window)
    with triton_launch.observed() as seen:
        out = call(text, **narrow, scale=0.3, W=W)
    assert launched(seen) == [FORWARD]
    seed = torch.randn(out.shape, generator=g, dtype=torch.float64)
    chosen = list("QKV") + learned
    with triton_launch.observed() as seen:
        got = torch.autograd.grad(out, [narrow[n] for n in chosen], seed.float().to(DEVICE),
                                  retain_graph=True)
    assert set(launched(seen)) == BACKWARD and len(seen) == 2, "the fused backward ran"
    want = torch.autograd.grad(by_torch((terms, mask, window, W), wide["Q"], wide["K"],
                                        wide["V"], wide), [wide[n] for n in chosen], seed)
    for name, a, b in zip(chosen, got, want):
        assert a.shape == b.shape and a.dtype == torch.float32, name
        scale = max(float(b.abs().max()), 1.0)
        np.testing.assert_allclose(a.double().cpu().numpy(), b.numpy(), rtol=1e-4,
                                   atol=1e-5 * scale, err_msg=name)
    again = torch.autograd.grad(out, [narrow[n] for n in chosen], seed.float().to(DEVICE))
    for a, b in zip(got, again):
        assert torch.equal(a, b), "the same bits on every run"


def test_formula_fallbacks_give_the_terms_their_gradients():
    g = torch.Generator().manual_seed(9)
    Q, K, V = (torch.randn(1, 2, 12, 8, generator=g, dtype=torch.float64).requires_grad_()
               for _ in range(3))
    bias = torch.randn(2, 12, 12, generator=g, dtype=torch.float64).requires_grad_()
    narrow = [t.detach().float().to(DEVICE).requires_grad_() for t in (Q, K, V, bias)]
    text = program(BIAS)
    out = call(text, Q=narrow[0], K=narrow[1], V=narrow[2], bias=narrow[3], scale=0.3)
    ref = by_torch((BIAS, "j <= i", None, None), Q, K, V, {"bias": bias})
    # a double backward: the statements' formula, differentiable again
    with triton_launch.observed() as seen:
        (db,) = torch.autograd.grad((out ** 2).sum(), (narrow[3],), create_graph=True)
    assert not seen, "no kernel: the formula in torch"
    # (through the incoming gradient 2 * out, the first-order backward runs too)
    (dq,) = torch.autograd.grad(db.sum(), (narrow[0],), retain_graph=True)
    (rdb,) = torch.autograd.grad((ref ** 2).sum(), (bias,), create_graph=True)
    (rdq,) = torch.autograd.grad(rdb.sum(), (Q,), retain_graph=True)
    np.testing.assert_allclose(db.detach().double().cpu().numpy(), rdb.detach().numpy(),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dq.double().cpu().numpy(), rdq.numpy(), rtol=1e-3, atol=1e-4)
    # an output gradient holding NaN: the formula's NaN where the statements put it
    seed = torch.ones(out.shape, dtype=torch.float64)
    seed[0, 1, 5, 2] = torch.nan
    got = torch.autograd.grad(out, narrow, seed.float().to(DEVICE))
    want = torch.autograd.grad(ref, (Q, K, V, bias), seed)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.isnan(a.cpu().numpy()), np.isnan(b.numpy()))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_gradients(dtype):
    g = torch.Generator().manual_seed(13)
    wide = [torch.randn(1, 2, 40, 16, generator=g, dtype=torch.float64).requires_grad_()
            for _ in range(3)]
    bias = torch.randn(2, 40, 40, generator=g, dtype=torch.float64).requires_grad_()
    slope = torch.tensor([0.5, 0.25], dtype=torch.float64).requires_grad_()
    narrow = [t.detach().to(dtype).to(DEVICE).requires_grad_() for t in wide + [bias, slope]]
    text = program(BIAS + ALIBI)
    out = call(text, Q=narrow[0], K=narrow[1], V=narrow[2], bias=narrow[3],
               slope=narrow[4], scale=0.25)
    assert out.dtype == dtype
    seed = torch.randn(out.shape, generator=g, dtype=torch.float64)
    with triton_launch.observed() as seen:
        got = torch.autograd.grad(out, narrow, seed.to(dtype).to(DEVICE))
    assert set(launched(seen)) == BACKWARD
    # the reference from the rounded inputs, in float64
    rounded = [t.detach().double().cpu().requires_grad_() for t in narrow]
    q, k, v, b, s = rounded
    i, j = torch.arange(40)[:, None], torch.arange(40)[None, :]
    S = (q @ k.transpose(-1, -2) * 0.25 + b[None] + s[None, :, None, None] * (j - i))
    ref = torch.softmax(S.masked_fill(~(j <= i), -torch.inf), -1) @ v
    want = torch.autograd.grad(ref, rounded, seed)
    tol = 2e-2 if dtype == torch.float16 else 8e-2
    for a, w in zip(got, want):
        assert a.dtype == dtype
        np.testing.assert_allclose(a.double().cpu().numpy(), w.numpy(), rtol=tol,
                                   atol=tol * max(float(w.abs().max()), 1.0))


def test_batch_ranks_with_terms():
    rng = np.random.default_rng(14)
    # one batch axis
    Q, K, V = (rng.standard_normal((3, 20, 8)).astype(np.float32) for _ in range(3))
    bias = rng.standard_normal((3, 20, 20)).astype(np.float32)
    one = ("S[h,i,j] := where(j <= i, sum[d](Q[h,i,d]*K[h,j,d]) * scale + bias[h,i,j], "
           "-inf)\nm[h,i] := max[j](S[h,i,j])\nP[h,i,j] := exp(S[h,i,j] - m[h,i])\n"
           "O[h,i,e] := sum[j](P[h,i,j] * V[h,j,e]) / sum[j](P[h,i,j])")
    with triton_launch.observed() as seen:
        got = call(one, **dict(zip("QKV", tensors(Q, K, V))), bias=tensors(bias)[0],
                   scale=0.3)
    assert launched(seen) == [FORWARD]
    want = mirror(Q[None], K[None], V[None], 0.3, bias=bias, upper=0)[0]
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=3e-5, atol=3e-5)
    # three batch axes (b and g merged on the grid): a bias over h alone merges (its
    # stride 0 along both), a mask over b alone does not (the statements run)
    Q, K, V = (rng.standard_normal((2, 2, 2, 20, 8)).astype(np.float32) for _ in range(3))
    bias = rng.standard_normal((2, 20, 20)).astype(np.float32)
    M = np.where(rng.random((2, 20)) < 0.2, -np.inf, 0.0).astype(np.float32)
    M[:, 0] = 0.0
    three = ("S[b,g,h,i,j] := where(j <= i, sum[d](Q[b,g,h,i,d]*K[b,g,h,j,d]) * scale "
             "+ TERM, -inf)\nm[b,g,h,i] := max[j](S[b,g,h,i,j])\n"
             "P[b,g,h,i,j] := exp(S[b,g,h,i,j] - m[b,g,h,i])\n"
             "O[b,g,h,i,e] := sum[j](P[b,g,h,i,j] * V[b,g,h,j,e]) / sum[j](P[b,g,h,i,j])")
    S = np.einsum("bghid,bghjd->bghij", Q.astype(np.float64), K.astype(np.float64)) * 0.3
    i, j = np.arange(20)[:, None], np.arange(20)[None, :]
    for term, added, kernels in (("bias[h,i,j]", bias[None, None], [FORWARD]),
                                 ("M[b,j]", M[:, None, None, None, :], [])):
        with triton_launch.observed() as seen:
            got = call(three.replace("TERM", term), **dict(zip("QKV", tensors(Q, K, V))),
                       bias=tensors(bias)[0], M=tensors(M)[0], scale=0.3)
        assert [r for r in launched(seen) if r == FORWARD] == kernels
        scores = np.where(j <= i, S + added, -np.inf)
        P = np.exp(scores - scores.max(-1, keepdims=True))
        want = (P @ V.astype(np.float64)) / P.sum(-1)[..., None]
        np.testing.assert_allclose(got.cpu().numpy(), want, rtol=3e-5, atol=3e-5)


def test_one_statement_spelling_with_a_bias():
    """The attention written as one statement (run before the call is bound,
    schedule/early.py) takes its terms too."""
    s = "sum[d](Q[h,i,d]*K[h,j,d]) * 0.3 + bias[h,i,j]"
    sk = s.replace(",j", ",k").replace("j]", "k]")
    weights = f"exp(where(j <= i, {s}, -inf) - max[k](where(k <= i, {sk}, -inf)))"
    single = f"O[h,i,e] := sum[j]({weights} * V[h,j,e]) / sum[j]({weights})"
    rng = np.random.default_rng(15)
    Q, K, V = (rng.standard_normal((2, 20, 8)).astype(np.float32) for _ in range(3))
    bias = rng.standard_normal((2, 20, 20)).astype(np.float32)
    with triton_launch.observed() as seen:
        got = ef.ein(single, **dict(zip("QKV", tensors(Q, K, V))), bias=tensors(bias)[0],
                     backend="triton")
    assert launched(seen) == [FORWARD]
    want = mirror(Q[None], K[None], V[None], 0.3, bias=bias, upper=0)[0]
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=3e-5, atol=3e-5)


@pytest.mark.parametrize("seed", range(12))
def test_random_shapes_bands_and_terms(seed):
    """Random extents (1 to 45 rows and keys: single rows, single keys, tails), a random
    band and random terms: the forward against the mirror, the gradients (of the
    bias and the slopes too) against torch autograd in float64, where every row sees a
    key (else the statements record, and only the forward is compared)."""
    rng = np.random.default_rng(100 + seed)
    B, H = 1, 2
    NQ, NK, D = int(rng.integers(1, 46)), int(rng.integers(1, 46)), int(rng.integers(1, 20))
    lower, upper = sorted(int(x) for x in rng.integers(-50, 50, size=2))
    g = torch.Generator().manual_seed(seed)
    wide = {"Q": torch.randn(B, H, NQ, D, generator=g, dtype=torch.float64),
            "K": torch.randn(B, H, NK, D, generator=g, dtype=torch.float64),
            "V": torch.randn(B, H, NK, 5, generator=g, dtype=torch.float64),
            "bias": torch.randn(H, NQ, NK, generator=g, dtype=torch.float64),
            "slope": torch.tensor([0.5, -0.25], dtype=torch.float64)}
    terms = "".join(t for t, keep in ((BIAS, rng.random() < 0.6), (ALIBI, rng.random() < 0.6))
                    if keep)
    for t in wide.values():
        t.requires_grad_()
    narrow = {n: t.detach().float().to(DEVICE).requires_grad_() for n, t in wide.items()}
    text = program(terms, mask="j - i <= U", window="j - i >= L")
    with triton_launch.observed() as seen:
        out = call(text, **narrow, scale=0.3, L=lower, U=upper)
    i, j = torch.arange(NQ)[:, None], torch.arange(NK)[None, :]
    S = wide["Q"] @ wide["K"].transpose(-1, -2) * 0.3
    if "bias" in terms:
        S = S + wide["bias"][None]
    if "slope" in terms:
        S = S + wide["slope"][None, :, None, None] * (j - i)
    S = S.masked_fill(~((j - i >= lower) & (j - i <= upper)), -torch.inf)
    P = torch.exp(S - S.amax(-1, keepdim=True))
    ref = (P @ wide["V"]) / P.sum(-1, keepdim=True)
    np.testing.assert_array_equal(torch.isnan(out).cpu().numpy(), torch.isnan(ref).numpy())
    np.testing.assert_allclose(out.detach().double().cpu().numpy(), ref.detach().numpy(),
                               rtol=3e-5, atol=3e-5)
    if FORWARD not in launched(seen):
        assert torch.isnan(ref).any(), "only a row that sees no key records the statements"
        return
    assert launched(seen) == [FORWARD]
    names = list("QKV") + [n for n in ("bias", "slope") if n in terms]
    seed_grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(out, [narrow[n] for n in names], seed_grad.float().to(DEVICE))
    want = torch.autograd.grad(ref, [wide[n] for n in names], seed_grad)
    for name, a, b in zip(names, got, want):
        np.testing.assert_allclose(a.double().cpu().numpy(), b.numpy(), rtol=1e-4,
                                   atol=1e-5 * max(float(b.abs().max()), 1.0), err_msg=name)


# -- what the kernel does not take ------------------------------------------------------------

def test_what_the_kernel_declines_runs_the_statements_and_explain_says_why():
    Q, K, V, M, slope, bias = data(1, 2, 20, 4, np.float32)
    q, k, v, m, b = tensors(Q, K, V, M, bias)
    m[0, 0] = 0.0
    # three added tensors: more than the kernel's slots
    text = program(PADDED + BIAS + " + extra[h,i,j]", mask=None)
    with triton_launch.observed() as seen:
        got = call(text, Q=q, K=k, V=v, M=m, bias=b, extra=b, scale=0.3)
    assert not any(r.kernel == FORWARD for r in seen)
    want = mirror(Q, K, V, 0.3, M=m.numpy(), bias=2 * bias.astype(np.float64))
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=3e-5, atol=3e-5)
    text_explained = str(ef.explain(text, Q=q, K=k, V=v, M=m, bias=b, extra=b, scale=0.3,
                                    backend="triton"))
    assert "more than 2 added tensors" in text_explained
    # a window whose bound is not an integer: the statements compare as written
    text = program(window="i - j < W")
    with triton_launch.observed() as seen:
        got = call(text, Q=q, K=k, V=v, scale=0.3, W=2.5)
    assert not any(r.kernel == FORWARD for r in seen)
    np.testing.assert_allclose(got.cpu().numpy(), mirror(Q, K, V, 0.3, lower=-2, upper=0),
                               rtol=3e-5, atol=3e-5)
    # float64: not the kernel's dtype; the statements, in float64
    wide = tensors(Q, K, V, M, dtype=torch.float64)
    with triton_launch.observed() as seen:
        got = call(program(PADDED), Q=wide[0], K=wide[1], V=wide[2], M=wide[3], scale=0.3)
    assert not any(r.kernel == FORWARD for r in seen) and got.dtype == torch.float64
    np.testing.assert_allclose(got.cpu().numpy(), mirror(Q, K, V, 0.3, M=M, upper=0),
                               rtol=1e-12, atol=1e-12)
    assert "kernel does not take float64" in str(ef.explain(
        program(PADDED), Q=wide[0], K=wide[1], V=wide[2], M=wide[3], scale=0.3,
        backend="triton"))
    # a bias of another dtype than the query's
    with triton_launch.observed() as seen:
        got = call(program(BIAS), Q=q, K=k, V=v, bias=b.double(), scale=0.3)
    assert not any(r.kernel == FORWARD for r in seen)
    assert "not of the query's dtype" in str(ef.explain(
        program(BIAS), Q=q, K=k, V=v, bias=b.double(), scale=0.3, backend="triton"))


def test_explain_names_the_terms_and_the_fused_backward():
    Q, K, V, M, slope, bias = data(1, 2, 20, 4, np.float32)
    q, k, v, m, s = tensors(Q, K, V, M, slope)
    text = str(ef.explain(program(PADDED + ALIBI, window="i - j < W"), Q=q, K=k, V=v,
                          M=m, slope=s, scale=0.3, W=4, backend="triton"))
    assert "Triton kernel" in text and "additive term" in text
    assert "key blocks outside the band are never computed" in text
    assert "backward is fused too" in text


def test_recorded_call_whose_band_hides_a_row_records_the_statements():
    g = torch.Generator().manual_seed(1)
    Q, K, V = (torch.randn(1, 1, 12, 4, generator=g).to(DEVICE).requires_grad_()
               for _ in range(3))
    with triton_launch.observed() as seen:
        out = call(program(mask="j < i", window="i - j < W"), Q=Q, K=K, V=V, scale=0.5,
                   W=3)
    assert not any(r.kernel == FORWARD for r in seen)
    assert torch.isnan(out[0, 0, 0]).all() and not torch.isnan(out[0, 0, 1:]).any()
    assert attention_backward is not None


# -- compiled for a GPU (no GPU needed: Triton's CUDA compiler, as test_triton_compiles) ---

BACKWARD_SCRIPT = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from einfuse.backends.triton import attention_backward_kernel as kernels
from einfuse.schedule.attention_blocks import attention_backward_blocks

dtype = sys.argv[1]
exact = dtype == "fp32"
config = attention_backward_blocks("float32" if exact else "float16", 64, False).config
common = dict(DOT=64, FEATURES=64, BLOCK_D=64, BLOCK_E=64, BLOCK_M=config.block_m,
              BLOCK_N=config.block_n, EXACT=exact, UPCAST=False, BANDED=True,
              TENSOR_TERMS=2, INDEX_TERMS=2, X0_LOADS=True, X1_LOADS=False)
for kernel, extra in ((kernels.attention_backward_keys,
                       dict(STORE_DS=True, COLUMN_SUMS=True)),
                      (kernels.attention_backward_rows, dict(ROW_SUMS=True))):
    constants = dict(common, **extra)
    signature = {}
    for param in kernel.params:
        name = param.name
        if param.is_constexpr:
            signature[name] = "constexpr"
        elif name in ("Q", "K", "V", "DO", "DK", "DV", "DQ", "T0", "T1", "X0", "X1"):
            signature[name] = "*" + dtype
        elif name in ("LSE", "DELTA", "DS", "COLS", "SUMS"):
            signature[name] = "*fp32"
        elif name in ("score_scale", "grad_scale") or name.endswith("_f"):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constants),
                              target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=config.warps, num_stages=config.stages))
    assert compiled.asm["cubin"]
print("compiled")
"""


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_backward_kernels_compile_for_sm90(dtype, tmp_path):
    from test_triton_compiles import _compiled_elsewhere, _has_cuda_compiler
    if not _has_cuda_compiler():
        pytest.skip("Triton's CUDA compiler is absent")
    assert "compiled" in _compiled_elsewhere(BACKWARD_SCRIPT, (dtype,), tmp_path)
