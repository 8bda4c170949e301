"""The fused Triton attention kernel (backends/triton/attention.py): backend='triton' on
torch tensors and NumPy arrays runs it, under the Triton interpreter on CPU tensors (CI),
compiled on CUDA tensors where a GPU is there and TRITON_INTERPRET=0 (a lent GPU
machine).  Results are compared with the statements' semantics in float64
(test_attention.one_by_one, an independent NumPy mirror) and, on a tiny case, the
brute-force oracle; float16 and bfloat16 results within a tolerance of their own
precision."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.triton import backend as triton_backend
from oracle import brute_force
from test_attention import one_by_one, poison, program

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not triton_backend.available() or not (triton_backend.interpreted() or
                                           torch.cuda.is_available()),
    reason="needs triton under TRITON_INTERPRET=1, or compiled with a CUDA GPU")
# the interpreter runs on CPU tensors; compiled Triton on the GPU's
DEVICE = "cpu" if triton_backend.interpreted() else "cuda"
from einfuse.backends.triton import attention as triton_attention  # noqa: E402

MASKS = {"causal": "j <= i", "strict": "j < i", "none": None}
# float16: the weights are rounded to float16 for the weighted sum and the result is
# float16 (2**-11 relative); bfloat16 the same with 2**-8
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@pytest.fixture
def launches(monkeypatch):
    """The configurations the kernel ran with, one per launch."""
    ran = []
    original = triton_attention.launch

    def counting(*args, **kwargs):
        ran.append(original(*args, **kwargs))
        return ran[-1]
    monkeypatch.setattr(triton_attention, "launch", counting)
    return ran


def qkv(shape, dtype=torch.float32, seed=0):
    B, H, NQ, NK, D, E = shape
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(dtype).to(DEVICE)
            for s in ((B, H, NQ, D), (B, H, NK, D), (B, H, NK, E))]


def expected_of(Q, K, V, scale, mask, normalised=True):
    return one_by_one(*(t.double().cpu().numpy() for t in (Q, K, V)), scale, mask, normalised)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mask", ["causal", "strict", "none"])
@pytest.mark.parametrize("shape", [(1, 2, 70, 70, 16, 16), (2, 1, 37, 50, 5, 20)])
def test_matches_the_statements(dtype, mask, shape, launches):
    # 70 and 37 rows, 50 keys: tails of the 32-row and 16-key blocks; D=5 and E=20
    # padded to the next power of two (at least 16)
    Q, K, V = qkv(shape, dtype)
    got = ef.ein(program(MASKS[mask]), Q=Q, K=K, V=V, scale=0.3, backend="triton")
    assert len(launches) == 1
    assert got.dtype == dtype and tuple(got.shape) == shape[:3] + shape[5:]
    expected = expected_of(Q, K, V, 0.3, MASKS[mask])
    result = got.double().cpu().numpy()
    np.testing.assert_array_equal(np.isnan(result), np.isnan(expected))
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(result, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("mask", ["causal", "strict", "none"])
def test_more_rows_than_keys(mask, launches):
    # rows past the last key see every key: whole blocks without masks, then the tail
    Q, K, V = qkv((1, 1, 70, 20, 16, 8))
    got = ef.ein(program(MASKS[mask]), Q=Q, K=K, V=V, scale=0.3, backend="triton")
    assert len(launches) == 1
    expected = expected_of(Q, K, V, 0.3, MASKS[mask])
    np.testing.assert_array_equal(np.isnan(got.cpu().numpy()), np.isnan(expected))
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=2e-5, atol=2e-6)


def test_numpy_arrays_and_the_forms(launches):
    rng = np.random.default_rng(1)
    Q, K, V = (rng.standard_normal((1, 2, 40, 8)).astype(np.float32) for _ in range(3))
    got = ef.ein(program(None, normalised=False, scale="/ 3.0"), Q=Q, K=K, V=V,
                 backend="triton")
    assert type(got) is np.ndarray and got.dtype == np.float32
    np.testing.assert_allclose(got, one_by_one(Q, K, V, 1 / 3.0, None, False),
                               rtol=5e-5, atol=5e-5)
    half = ef.ein(program(scale=""), Q=Q.astype(np.float16), K=K.astype(np.float16),
                  V=V.astype(np.float16), backend="triton")
    assert half.dtype == np.float16
    np.testing.assert_allclose(half, one_by_one(Q.astype(np.float16), K.astype(np.float16),
                                                V.astype(np.float16), 1.0),
                               rtol=4e-3, atol=4e-3)
    assert len(launches) == 2
    # float64: not the kernel's; the statements run
    wide = ef.ein(program(), Q=Q.astype(np.float64), K=K, V=V, scale=0.5, backend="triton")
    assert len(launches) == 2
    np.testing.assert_allclose(wide, one_by_one(Q, K, V, 0.5), rtol=1e-5)


def test_brute_force_oracle_tiny(launches):
    rng = np.random.default_rng(2)
    Q, K, V = (rng.standard_normal((1, 2, 5, 3)).astype(np.float32) for _ in range(3))
    arrays = {"Q": Q.astype(np.float64), "K": K.astype(np.float64),
              "V": V.astype(np.float64)}
    extents = dict(b=1, h=2, i=5, j=5, d=3, e=3)
    import re
    for statement in program().split("\n"):
        used = set(re.findall(r"\b([bhijde])\b", statement))
        arrays[statement.split("[")[0]] = brute_force(
            statement, {x: (0, extents[x]) for x in used}, arrays, {"scale": 0.7})
    got = ef.ein(program(), Q=Q, K=K, V=V, scale=0.7, backend="triton")
    assert len(launches) == 1
    np.testing.assert_allclose(got, arrays["O"], rtol=2e-5, atol=2e-6)


def test_layouts_through_strides(launches):
    g = torch.Generator().manual_seed(3)
    # Q[i,b,d] a transposed view, K[d,j,b] (the keys' dot index first), V[b,j,e]; the
    # output O[b,e,i]
    Q = torch.randn(2, 33, 16, generator=g).to(DEVICE).transpose(0, 1)
    K = torch.randn(16, 33, 2, generator=g).to(DEVICE)
    V = torch.randn(2, 33, 4, generator=g).to(DEVICE)
    score = "sum[d](Q[i,b,d]*K[d,{j},b]) / 2"
    s = "where(i >= {j}, " + score + ", -inf)"
    text = (f"O[b,e,i] := sum[j](exp({s.format(j='j')} - max[k]({s.format(j='k')})) * "
            f"V[b,j,e]) / sum[j](exp({s.format(j='j')} - max[k]({s.format(j='k')})))")
    got = ef.ein(text, Q=Q, K=K, V=V, backend="triton")
    assert len(launches) == 1 and got.is_contiguous()
    expected = one_by_one(Q.permute(1, 0, 2)[:, None].double().cpu().numpy(),
                          K.permute(2, 1, 0)[:, None].double().cpu().numpy(),
                          V[:, None].double().cpu().numpy(), 0.5)[:, 0].transpose(0, 2, 1)
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=2e-5, atol=2e-5)


def batched(lead: str, out: str) -> str:
    """The attention program with batch indices ``lead`` (e.g. 'a,b,c,') and the
    output's indices ``out``."""
    return program(scale="* 0.5").replace("b,h,", lead).replace(f"O[{lead}i,e]",
                                                                f"O[{out}]")


@pytest.mark.parametrize("lead, out, shape", [
    ("", "i,e", ()), ("a,", "a,i,e", (3,)),
    # three batch axes, the output's interleaved with its rows: written in canonical
    # order and copied once
    ("a,b,c,", "a,i,b,c,e", (2, 2, 3))])
def test_batch_ranks(lead, out, shape, launches):
    g = torch.Generator().manual_seed(4)
    Q, K, V = (torch.randn(*shape, 20, 16, generator=g).to(DEVICE) for _ in range(3))
    if len(shape) == 3:      # a query whose first two batch axes do not merge (a copy)
        Q = Q.permute(0, 3, 1, 2, 4).contiguous().permute(0, 2, 3, 1, 4)
    got = ef.ein(batched(lead, out), Q=Q, K=K, V=V, backend="triton")
    assert len(launches) == 1
    flat = [t.reshape(1, -1, 20, 16).double().cpu().numpy() for t in (Q, K, V)]
    expected = one_by_one(*flat, 0.5).reshape(shape + (20, 16))
    if len(shape) == 3:
        expected = expected.transpose(0, 3, 1, 2, 4)
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=2e-5, atol=2e-5)


# -- NaN and inf, as the C kernel's tests check them ------------------------------------

@pytest.mark.parametrize("case", ["nan query row", "inf key", "-inf scores row",
                                  "-inf first block", "nan in a masked key", "huge scores"])
def test_nonfinite_inputs(case, launches):
    Q, K, V = qkv((1, 2, 70, 70, 4, 3))
    poison(Q, K, V, case)
    got = ef.ein(program(), Q=Q, K=K, V=V, scale=1.0, backend="triton")
    assert len(launches) == 1
    expected = expected_of(Q, K, V, 1.0, "j <= i")
    if case == "huge scores":     # float32 scores, as the statements compute them
        expected = one_by_one(Q.cpu().numpy(), K.cpu().numpy(), V.cpu().numpy(), 1.0)
    np.testing.assert_array_equal(np.isnan(got.cpu().numpy()), np.isnan(expected))
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=1e-4, atol=1e-5)


def test_fully_masked_row_is_nan(launches):
    Q, K, V = qkv((1, 1, 5, 5, 2, 2))
    got = ef.ein(program("j < i"), Q=Q, K=K, V=V, scale=1.0, backend="triton")
    assert len(launches) == 1
    assert torch.isnan(got[0, 0, 0]).all() and not torch.isnan(got[0, 0, 1:]).any()


# (1 batch, 1 head, 37 rows, 40 keys, D=4, E=3): under the interpreter's 32 x 16 blocks
# the first row block weighs keys 0-31 and reads keys 32-39 only for their values'
# finiteness (a causal mask); the second weighs the tail block
VALUE_CASES = {
    "inf past the diagonal": lambda V: V[0, 0, 35, 1].fill_(np.inf),
    "nan at a weighed key": lambda V: V[0, 0, 3, 0].fill_(np.nan),
    "inf and -inf": lambda V: (V[0, 0, 10, 2].fill_(np.inf), V[0, 0, 30, 2].fill_(-np.inf)),
    "-inf in the tail": lambda V: V[0, 0, 39, 0].fill_(-np.inf),
}


@pytest.mark.parametrize("mask", ["causal", "strict", "none"])
@pytest.mark.parametrize("case", list(VALUE_CASES))
def test_nonfinite_values_are_the_kernels(case, mask, launches):
    """A value holding inf or NaN gives the statements' result from the kernel alone (a
    masked key's inf weighs 0 * inf = NaN there): one launch, nothing run beside it."""
    Q, K, V = qkv((1, 1, 37, 40, 4, 3))
    VALUE_CASES[case](V)
    got = ef.ein(program(MASKS[mask]), Q=Q, K=K, V=V, scale=0.3, backend="triton")
    assert len(launches) == 1
    expected = expected_of(Q, K, V, 0.3, MASKS[mask])
    assert not np.isfinite(expected).all()
    np.testing.assert_array_equal(np.isnan(got.cpu().numpy()), np.isnan(expected))
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=2e-5, atol=2e-6)
    unnormalised = ef.ein(program(MASKS[mask], normalised=False), Q=Q, K=K, V=V,
                          scale=0.3, backend="triton")
    want = expected_of(Q, K, V, 0.3, MASKS[mask], normalised=False)
    np.testing.assert_array_equal(np.isnan(unnormalised.cpu().numpy()), np.isnan(want))
    np.testing.assert_allclose(unnormalised.cpu().numpy(), want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", ["inf past the diagonal", "-inf in the tail"])
def test_nonfinite_half_values(case, dtype, launches):
    # the causal mask's unweighed keys read as bits: each 16-bit format's exponent field
    Q, K, V = qkv((1, 1, 37, 40, 4, 3), dtype)
    VALUE_CASES[case](V)
    got = ef.ein(program(MASKS["causal"]), Q=Q, K=K, V=V, scale=0.3, backend="triton")
    assert len(launches) == 1
    expected = expected_of(Q, K, V, 0.3, MASKS["causal"])
    result = got.double().cpu().numpy()
    np.testing.assert_array_equal(np.isnan(result), np.isnan(expected))
    np.testing.assert_allclose(result, expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def test_values_whose_sums_overflow(launches):
    # finite values whose float32 sums overflow: the block's sums are taken again with
    # the final maxima, as the statements take them (inf past row 0)
    Q, K, _ = qkv((1, 1, 6, 6, 2, 2))
    V = torch.full((1, 1, 6, 2), 3e38, device=DEVICE)
    huge = ef.ein(program(), Q=Q, K=K, V=V, scale=1.0, backend="triton")
    assert len(launches) == 1
    one_by_one_f32, _ = ef.ein(program(), Q=Q, K=K, V=V, scale=1.0, backend="numpy",
                               outputs=("O", "S"))      # float32 sums: inf past row 0
    assert np.isinf(one_by_one_f32.cpu().numpy()).any()
    np.testing.assert_allclose(huge.cpu().numpy(), one_by_one_f32.cpu().numpy(), rtol=1e-6)


# -- what the kernel leaves to the statements --------------------------------------------

def test_scales_and_errors(launches):
    Q, K, V = qkv((1, 1, 6, 6, 2, 2))
    tensor_scale = ef.ein(program(), Q=Q, K=K, V=V,
                          scale=torch.tensor(0.25, device=DEVICE), backend="triton")
    assert len(launches) == 1
    np.testing.assert_allclose(tensor_scale.cpu().numpy(), expected_of(Q, K, V, 0.25, "j <= i"),
                               rtol=2e-5, atol=2e-6)
    # a scale whose product with log2(e) overflows float32: the statements run
    ef.ein(program(), Q=Q, K=K, V=V, scale=3e38, backend="triton")
    assert len(launches) == 1
    with pytest.raises(ef.EinfuseError, match="j"):
        ef.ein(program(), Q=Q, K=K, V=V[:, :, :5], scale=1.0, backend="triton")
    with pytest.raises(ef.EinfuseError, match="scale"):
        ef.ein(program(), Q=Q, K=K, V=V, backend="triton")
    assert len(launches) == 1
    big = qkv((1, 1, 4, 4, 130, 2))     # a head dimension past 128
    ef.ein(program(), Q=big[0], K=big[1], V=big[2], scale=1.0, backend="triton")
    assert len(launches) == 1


def test_forced_configuration(launches):
    Q, K, V = qkv((1, 1, 40, 40, 16, 16))
    config = triton_attention.Config(16, 32, 2, 1)
    with triton_attention.forced_config(config):
        got = ef.ein(program(), Q=Q, K=K, V=V, scale=0.5, backend="triton")
    assert launches == [config]
    np.testing.assert_allclose(got.cpu().numpy(), expected_of(Q, K, V, 0.5, "j <= i"),
                               rtol=2e-5, atol=2e-6)
    with pytest.raises(ef.EinfuseError, match="Config"):
        with triton_attention.forced_config((16, 32, 2, 1)):
            pass
    assert all(isinstance(c, triton_attention.Config)
               for c in triton_attention.candidates("bfloat16", 100))


@pytest.mark.parametrize("dtype, mask", [(torch.float32, "j <= i"),
                                         (torch.float16, None)])
def test_gradients_under_autograd(dtype, mask, launches):
    # the forward is the kernel; the backward the statements' formula in torch
    g = torch.Generator().manual_seed(5)
    Q, K, V = (torch.randn(1, 2, 20, 16, generator=g).to(dtype).to(DEVICE).requires_grad_()
               for _ in range(3))
    out = ef.ein(program(mask), Q=Q, K=K, V=V, scale=0.4, backend="triton")
    assert len(launches) == 1 and out.dtype == dtype
    wide = [t.detach().double().requires_grad_() for t in (Q, K, V)]
    expected = torch.nn.functional.scaled_dot_product_attention(
        *wide, is_causal=mask is not None, scale=0.4)
    seed = torch.randn(out.shape, generator=g).to(DEVICE)
    got = torch.autograd.grad(out, (Q, K, V), seed.to(dtype))
    want = torch.autograd.grad(expected, wide, seed.double())
    tol = TOLERANCE[dtype]
    for a, b in zip(got, want):
        assert a.dtype == dtype
        np.testing.assert_allclose(a.double().cpu().numpy(), b.cpu().numpy(), rtol=tol, atol=tol)


def test_double_backward_and_what_records_the_statements(launches):
    g = torch.Generator().manual_seed(6)
    Q, K, V = (torch.randn(1, 1, 12, 16, generator=g).to(DEVICE).requires_grad_()
               for _ in range(3))
    out = ef.ein(program(), Q=Q, K=K, V=V, scale=0.5, backend="triton")
    (dq,) = torch.autograd.grad((out ** 2).sum(), (Q,), create_graph=True)
    (ddq,) = torch.autograd.grad(dq.sum(), (Q,))
    wide = [t.detach().double().requires_grad_() for t in (Q, K, V)]
    S = (wide[0] @ wide[1].transpose(-1, -2) * 0.5).masked_fill(
        ~torch.ones(12, 12, dtype=torch.bool, device=DEVICE).tril(), -torch.inf)
    ref = torch.softmax(S, -1) @ wide[2]
    (rdq,) = torch.autograd.grad((ref ** 2).sum(), (wide[0],), create_graph=True)
    (rddq,) = torch.autograd.grad(rdq.sum(), (wide[0],))
    np.testing.assert_allclose(ddq.double().cpu().numpy(), rddq.cpu().numpy(), rtol=1e-3,
                               atol=1e-4)
    assert len(launches) == 1
    # j < i (its first row sees no key) and a scale needing a gradient: the statements
    ef.ein(program("j < i"), Q=Q, K=K, V=V, scale=0.5, backend="triton")
    ef.ein(program(), Q=Q, K=K, V=V,
           scale=torch.tensor(0.5, requires_grad=True, device=DEVICE), backend="triton")
    assert len(launches) == 1


def test_explain_says_where_the_kernel_runs():
    shape = (2, 3, 100, 16)
    shapes = {"Q": shape, "K": shape, "V": shape}
    text = str(ef.explain(program(), shapes=shapes, scale=0.5, backend="triton"))
    assert "Triton kernel" in text
    assert ("TRITON_INTERPRET=1" in text) == (DEVICE == "cpu")
    assert "nothing N x N" in text
    wide = (2, 3, 100, 200)
    text = str(ef.explain(program(), shapes={"Q": wide, "K": wide, "V": shape},
                          scale=0.5, backend="triton"))
    assert "head dimension of 200" in text
    single = ("O[i,e] := sum[j](exp(sum[d](Q[i,d]*K[j,d]) - max[k](sum[d](Q[i,d]*K[k,d])))"
              " * V[j,e]) / sum[j](exp(sum[d](Q[i,d]*K[j,d]) - "
              "max[k](sum[d](Q[i,d]*K[k,d]))))")
    text = str(ef.explain(single, shapes={"Q": (50, 32), "K": (50, 32), "V": (50, 32)},
                          backend="triton"))
    assert "Triton kernel" in text


def test_recorded_with_a_nonfinite_value_gives_the_statements(launches):
    """Recorded by autograd, a value holding inf is the kernel's (one launch, its result
    kept; its flags send the backward to the statements' formula, the shift without a
    gradient as in the statements): output and gradients equal the statements' on the
    NumPy backend, NaN and inf included (test_triton_attention_device_flag.py: more)."""
    g = torch.Generator().manual_seed(3)
    base = [torch.randn(1, 1, 12, 4, generator=g) for _ in range(3)]
    base[2][0, 0, 8, 1] = torch.inf
    seed = torch.randn(1, 1, 12, 4, generator=g)
    found = {}
    for backend in ("triton", "numpy"):
        Q, K, V = (t.clone().to(DEVICE).requires_grad_() for t in base)
        out = ef.ein(program(), Q=Q, K=K, V=V, scale=0.5, backend=backend)
        assert len(launches) == 1
        out.backward(seed.to(DEVICE))
        found[backend] = [out.detach()] + [t.grad for t in (Q, K, V)]
    for got, want in zip(found["triton"], found["numpy"]):
        got, want = got.cpu().numpy(), want.cpu().numpy()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
