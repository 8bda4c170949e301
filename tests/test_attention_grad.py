"""Fused attention under torch autograd (runtime/attention_autograd.py): the forward
runs as the online-softmax kernel and the backward as one fused kernel; gradients must
equal the statements' (checked against torch's own attention, torch.autograd.gradcheck
in float64 and the statements run one by one), and every call the fused path does not
cover must still record the statements."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.runtime import attention_run

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="the fused backward is a C kernel")


def program(mask="j <= i", scale="* scale", layout=("b,h,i,d", "b,h,j,d", "b,h,j,e"),
            out="b,h,i,e"):
    q, k, v = layout
    score = f"sum[d](Q[{q}]*K[{k}]) {scale}".strip()
    s = f"where({mask}, {score}, -inf)" if mask else score
    return (f"S[b,h,i,j] := {s}\nm[b,h,i] := max[j](S[b,h,i,j])\n"
            f"P[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])\n"
            f"O[{out}] := sum[j](P[b,h,i,j] * V[{v}]) / sum[j](P[b,h,i,j])")


def naive(Q, K, V, scale=1.0, mask="j <= i", divide=False):
    """The statements' formula in torch, weights materialised (b, h, i, d layout)."""
    S = Q @ K.transpose(-1, -2)
    S = S / scale if divide else S * scale
    i = torch.arange(Q.shape[-2])[:, None]
    j = torch.arange(K.shape[-2])[None, :]
    if mask == "j <= i":
        S = torch.where(j <= i, S, torch.tensor(-torch.inf, dtype=S.dtype))
    P = torch.exp(S - S.amax(-1, keepdim=True))
    return (P @ V) / P.sum(-1, keepdim=True)




def tensors(shapes, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, dtype=dtype, generator=generator, requires_grad=True)
            for s in shapes]


@pytest.mark.parametrize("mask, NQ, NK", [("j <= i", 9, 9), ("j <= i", 70, 70),
                                           ("j <= i", 5, 131), (None, 70, 70),
                                           (None, 5, 131), (None, 131, 3),
                                           ("j <= i", 130, 130), (None, 77, 77)])
@pytest.mark.parametrize("scale, divide", [("* scale", False), ("/ scale", True), ("", False)])
def test_gradients_match_the_formula(backward_calls, mask, scale, divide, NQ, NK):
    Q, K, V = tensors([(2, 3, NQ, 5), (2, 3, NK, 5), (2, 3, NK, 4)])
    value = 0.7 if scale else 1.0
    named = {"Q": Q, "K": K, "V": V}
    if scale:
        named["scale"] = value
    out = ef.ein(program(mask, scale), **named)
    seed = torch.randn_like(out)
    got = torch.autograd.grad(out, (Q, K, V), seed)
    ref = naive(Q, K, V, value, mask, divide)
    want = torch.autograd.grad(ref, (Q, K, V), seed)
    assert len(backward_calls) == 1
    for a, b in zip((out,) + got, (ref,) + want):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-10,
                                   atol=1e-12)


def test_causal_with_more_rows_than_keys_and_float32(backward_calls):
    Q, K, V = tensors([(1, 2, 140, 16), (1, 2, 67, 16), (1, 2, 67, 8)], torch.float32)
    out = ef.ein(program(), Q=Q, K=K, V=V, scale=0.25)
    seed = torch.randn_like(out)
    got = torch.autograd.grad(out, (Q, K, V), seed)
    ref = naive(Q.double(), K.double(), V.double(), 0.25)
    want = torch.autograd.grad(ref, (Q, K, V), seed.double())
    assert backward_calls == [np.dtype(np.float32)]
    for a, b in zip(got, want):
        assert a.dtype == torch.float32
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-4, atol=2e-5)


def attention_and_inputs():
    def f(Q, K, V):
        return ef.ein(program(), Q=Q, K=K, V=V, scale=0.9)
    return f, tensors([(1, 2, 6, 3), (1, 2, 6, 3), (1, 2, 6, 2)])


def test_gradcheck():
    f, inputs = attention_and_inputs()
    assert torch.autograd.gradcheck(f, inputs)


@pytest.mark.slow
def test_gradgradcheck():
    f, inputs = attention_and_inputs()
    # the double backward goes through the formula (differentiable), not the kernel
    assert torch.autograd.gradgradcheck(f, inputs)


def test_other_layouts_and_the_single_statement(backward_calls):
    text = program(layout=("i,b,h,d", "h,j,b,d", "b,j,h,e"), out="i,h,e,b")
    Q, K, V = tensors([(7, 2, 3, 4), (3, 9, 2, 4), (2, 9, 3, 5)])
    out = ef.ein(text, Q=Q, K=K, V=V, scale=0.5)
    seed = torch.randn_like(out)
    got = torch.autograd.grad(out, (Q, K, V), seed)
    ref = naive(Q.permute(1, 2, 0, 3), K.permute(2, 0, 1, 3), V.permute(0, 2, 1, 3), 0.5)
    ref = ref.permute(2, 1, 3, 0)
    want = torch.autograd.grad(ref, (Q, K, V), seed)
    for a, b in zip((out,) + got, (ref,) + want):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-10,
                                   atol=1e-12)
    single = ("O[b,h,i,e] := sum[j](exp(where(j <= i, sum[d](Q[b,h,i,d]*K[b,h,j,d]), -inf) - "
              "max[k](where(k <= i, sum[c](Q[b,h,i,c]*K[b,h,k,c]), -inf))) * V[b,h,j,e]) / "
              "sum[l](exp(where(l <= i, sum[d](Q[b,h,i,d]*K[b,h,l,d]), -inf) - "
              "max[k](where(k <= i, sum[c](Q[b,h,i,c]*K[b,h,k,c]), -inf))))")
    Q, K, V = tensors([(1, 2, 11, 3), (1, 2, 11, 3), (1, 2, 11, 2)], seed=1)
    out = ef.ein(single, Q=Q, K=K, V=V)
    seed = torch.randn_like(out)
    got = torch.autograd.grad(out, (Q, K, V), seed)
    want = torch.autograd.grad(naive(Q, K, V), (Q, K, V), seed)
    assert len(backward_calls) == 2
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-12)


def test_only_some_inputs_need_gradients(backward_calls):
    Q, K, V = tensors([(1, 1, 8, 3), (1, 1, 8, 3), (1, 1, 8, 3)])
    K = K.detach()
    out = ef.ein(program(), Q=Q, K=K, V=V, scale=1.0)
    out.sum().backward()
    assert Q.grad is not None and V.grad is not None and K.grad is None
    Q2, V2 = Q.detach().requires_grad_(), V.detach().requires_grad_()
    naive(Q2, K, V2).sum().backward()
    np.testing.assert_allclose(Q.grad.numpy(), Q2.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(V.grad.numpy(), V2.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_nonfinite_output_gradient_takes_the_formula(backward_calls):
    Q, K, V = tensors([(1, 1, 6, 2), (1, 1, 6, 2), (1, 1, 6, 2)])
    out = ef.ein(program(), Q=Q, K=K, V=V, scale=1.0)
    seed = torch.ones_like(out)
    seed[0, 0, 3, 1] = torch.nan
    got = torch.autograd.grad(out, (Q, K, V), seed)
    want = torch.autograd.grad(naive(Q, K, V), (Q, K, V), seed)
    assert not backward_calls
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.isnan(a.numpy()), np.isnan(b.numpy()))
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", ["inf query", "strict mask", "scale needs grad"])
def test_calls_outside_the_fused_path_record_the_statements(backward_calls, case):
    Q, K, V = tensors([(1, 1, 5, 2), (1, 1, 5, 2), (1, 1, 5, 2)])
    scale = 0.5
    text = program()
    if case == "inf query":
        Q = Q.detach().clone()
        Q[0, 0, 2, 0] = torch.inf
        Q.requires_grad_()
    elif case == "strict mask":
        text = program("j < i")
    else:
        scale = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    calls = []
    original = attention_run.run_c
    try:
        attention_run.run_c = lambda *a: calls.append(1) or original(*a)
        out = ef.ein(text, Q=Q, K=K, V=V, scale=scale)
    finally:
        attention_run.run_c = original
    assert not calls and out.grad_fn is not None
    out.nan_to_num().sum().backward()
    assert not backward_calls
    if case == "scale needs grad":
        assert scale.grad is not None and torch.isfinite(scale.grad)


def test_output_modified_in_place_before_backward(backward_calls):
    # a residual added in place (h += x) must not change what the backward reads: the
    # returned tensor may not share memory with the output the kernel kept
    Q, K, V = tensors([(1, 2, 9, 5), (1, 2, 9, 5), (1, 2, 9, 4)], seed=3)
    out = ef.ein(program(), Q=Q, K=K, V=V, scale=0.5)
    out.mul_(2.0)
    out.add_(1.0)
    seed = torch.randn_like(out)
    got = torch.autograd.grad(out, (Q, K, V), seed)
    want = torch.autograd.grad(naive(Q, K, V, 0.5) * 2.0 + 1.0, (Q, K, V), seed)
    assert len(backward_calls) == 1
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype, scale", [(torch.float64, 1e300), (torch.float32, 1e30)])
def test_scores_too_large_for_the_log_sum_exp_take_the_formula(backward_calls, dtype, scale):
    # finite scores so large that one unit in the last place of exp(s - L) is past 1:
    # weights recomputed from the log-sum-exp would be inf (NaN gradients); the statements
    # give finite ones
    Q, K, V = tensors([(1, 1, 5, 3), (1, 1, 5, 3), (1, 1, 5, 2)], dtype, seed=5)
    out = ef.ein(program(), Q=Q, K=K, V=V, scale=scale)
    seed = torch.ones_like(out)
    got = torch.autograd.grad(out, (Q, K, V), seed)
    want = torch.autograd.grad(naive(Q, K, V, scale), (Q, K, V), seed)
    assert not backward_calls
    for a, b in zip(got, want):
        assert torch.isfinite(b).all()
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
