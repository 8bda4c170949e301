"""The gradient of an added tensor of the attention scores (a learnable bias, a padding
mask that requires grad) from the fused backward kernel: float64 gradcheck through the
fused path, torch autograd of the same scores, the statements' own backward, bias
broadcast over the batch, over the heads, over rows and heads, with either sign and
transposed axes; the same bits for every thread count; the formula fallbacks (double
backward, a non-finite output gradient) give the bias its gradient too."""

import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="the fused backward is C")


def program(term, causal=True):
    score = f"sum[d](Q[b,h,i,d]*K[b,h,j,d]) * scale {term}"
    s = f"where(j <= i, {score}, -inf)" if causal else score
    return (f"S[b,h,i,j] := {s}\nm[b,h,i] := max[j](S[b,h,i,j])\n"
            f"P[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])\n"
            f"O[b,h,i,e] := sum[j](P[b,h,i,j] * V[b,h,j,e]) / sum[j](P[b,h,i,j])")


# term as written, the bias's shape from (B, H, N), and it as (B, H, N, N) in torch
BROADCASTS = {
    "over b": (" + bias[h,i,j]", lambda B, H, N: (H, N, N), lambda t: t[None]),
    "over h": (" + bias[b,i,j]", lambda B, H, N: (B, N, N), lambda t: t[:, None]),
    "over b and h": (" + bias[i,j]", lambda B, H, N: (N, N), lambda t: t[None, None]),
    "mask [b,j]": (" + bias[b,j]", lambda B, H, N: (B, N),
                   lambda t: t[:, None, None, :]),
    "full": (" + bias[b,h,i,j]", lambda B, H, N: (B, H, N, N), lambda t: t),
    "subtracted": (" - bias[h,i,j]", lambda B, H, N: (H, N, N), lambda t: -t[None]),
    "transposed": (" + bias[j,h,i]", lambda B, H, N: (N, H, N),
                   lambda t: t.permute(1, 2, 0)[None]),
    "per row": (" + bias[h,i]", lambda B, H, N: (H, N), lambda t: t[None, :, :, None]),
}




def inputs(case, B, H, N, D, dtype=torch.float64, seed=0, masked=0.0):
    generator = torch.Generator().manual_seed(seed)
    Q, K, V = (torch.randn(B, H, N, D, dtype=dtype, generator=generator)
               for _ in range(3))
    shape = BROADCASTS[case][1](B, H, N)
    bias = torch.randn(shape, dtype=dtype, generator=generator)
    if masked:           # some -inf entries (a padding mask), never the first key
        hidden = torch.rand(shape, generator=generator) < masked
        if case == "mask [b,j]":
            hidden[:, 0] = False
        bias = bias.masked_fill(hidden, -torch.inf)
    return [t.requires_grad_() for t in (Q, K, V, bias)]


def by_torch(case, Q, K, V, bias, scale=0.3, causal=True):
    N = Q.shape[2]
    S = Q @ K.transpose(-1, -2) * scale + BROADCASTS[case][2](bias)
    if causal:
        i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
        S = S.masked_fill(~(j <= i), -torch.inf)
    return torch.softmax(S, -1) @ V


# float64 gradcheck costs seconds per case (hundreds of calls, one per perturbed element):
# the default run checks the broadcasts whose bias gradient is a reduction (over b, over
# b and h, a [b,j] mask); the slow run adds the rest.  test_matches_torch_autograd checks
# every case's gradients against torch in both runs.
GRADCHECKED = ("mask [b,j]", "over b", "over b and h")


@pytest.mark.parametrize("case", [case if case in GRADCHECKED else
                                  pytest.param(case, marks=pytest.mark.slow)
                                  for case in sorted(BROADCASTS)])
def test_gradcheck_through_the_fused_path(case, backward_calls):
    Q, K, V, bias = inputs(case, 2, 2, 5, 3)
    text = program(BROADCASTS[case][0])

    def attend(Q, K, V, bias):
        return ef.ein(text, Q=Q, K=K, V=V, bias=bias, scale=0.3)
    assert torch.autograd.gradcheck(attend, (Q, K, V, bias), eps=1e-6, atol=1e-8)
    assert backward_calls, "the fused backward ran"


@pytest.mark.parametrize("case", sorted(BROADCASTS))
@pytest.mark.parametrize("N,causal", [(9, True), (70, False), (131, True)])
def test_matches_torch_autograd(case, N, causal, backward_calls):
    Q, K, V, bias = inputs(case, 2, 3, N, 5, seed=N, masked=0.1 if case == "mask [b,j]"
                           else 0.0)
    out = ef.ein(program(BROADCASTS[case][0], causal), Q=Q, K=K, V=V, bias=bias,
                 scale=0.3)
    seed = torch.randn(out.shape, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(1))
    got = torch.autograd.grad(out, (Q, K, V, bias), seed, allow_unused=True)
    assert backward_calls, "the fused backward ran"
    want = torch.autograd.grad(by_torch(case, Q, K, V, bias, causal=causal),
                               (Q, K, V, bias), seed)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("case", ["over b", "mask [b,j]", "over b and h"])
def test_matches_the_statements_backward(case, backward_calls):
    Q, K, V, bias = inputs(case, 2, 2, 100, 8, dtype=torch.float32, seed=4)
    text = program(BROADCASTS[case][0])
    out = ef.ein(text, Q=Q, K=K, V=V, bias=bias, scale=0.3)
    got = torch.autograd.grad(out.square().sum(), (Q, K, V, bias))
    assert backward_calls
    # ranges= declines the fused path: the statements run one by one under autograd
    plain = [t.detach().requires_grad_() for t in (Q, K, V, bias)]
    statements = ef.ein(text, Q=plain[0], K=plain[1], V=plain[2], bias=plain[3],
                        scale=0.3, ranges={"i": 100})
    assert len(backward_calls) == 1
    want = torch.autograd.grad(statements.square().sum(), plain)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("case", ["over b", "mask [b,j]", "over b and h"])
def test_same_bits_for_every_thread_count(case):
    found = []
    for threads in (1, 2, 3):
        Q, K, V, bias = inputs(case, 3, 2, 150, 8, dtype=torch.float32, seed=2)
        out = ef.ein(program(BROADCASTS[case][0]), Q=Q, K=K, V=V, bias=bias, scale=0.3,
                     threads=threads)
        found.append(torch.autograd.grad(out.sum(), (bias, Q)))
    for other in found[1:]:
        for a, b in zip(found[0], other):
            assert torch.equal(a, b)


def test_only_the_bias_wanted(backward_calls):
    Q, K, V, bias = inputs("over b", 1, 2, 40, 4)
    out = ef.ein(program(BROADCASTS["over b"][0]), Q=Q.detach(), K=K.detach(),
                 V=V.detach(), bias=bias, scale=0.3)
    got, = torch.autograd.grad(out.sum(), bias)
    assert backward_calls
    want, = torch.autograd.grad(by_torch("over b", Q.detach(), K.detach(), V.detach(),
                                         bias).sum(), bias)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11)


def test_double_backward_takes_the_formula(backward_calls):
    Q, K, V, bias = inputs("mask [b,j]", 1, 2, 12, 3)
    out = ef.ein(program(BROADCASTS["mask [b,j]"][0]), Q=Q, K=K, V=V, bias=bias, scale=0.3)
    first = torch.autograd.grad(out.square().sum(), bias, create_graph=True)[0]
    assert first.requires_grad and not backward_calls    # the torch formula's gradient
    # (its graph reads d(out^2)/d out = 2 out: that part of the second backward is the
    # fused kernel's, legitimately)
    got = torch.autograd.grad(first.square().sum(), (Q, bias))
    ref = by_torch("mask [b,j]", Q, K, V, bias)
    first = torch.autograd.grad(ref.square().sum(), bias, create_graph=True)[0]
    want = torch.autograd.grad(first.square().sum(), (Q, bias))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


def test_a_non_finite_output_gradient_takes_the_formula(backward_calls):
    Q, K, V, bias = inputs("over h", 2, 1, 10, 3)
    out = ef.ein(program(BROADCASTS["over h"][0]), Q=Q, K=K, V=V, bias=bias, scale=0.3)
    seed = torch.ones_like(out)
    seed[0, 0, 3, 1] = torch.inf
    got = torch.autograd.grad(out, (Q, bias), seed)
    assert not backward_calls
    want = torch.autograd.grad(by_torch("over h", Q, K, V, bias), (Q, bias), seed)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11, equal_nan=True)


def test_a_bias_that_is_also_an_operand_runs_the_statements(backward_calls):
    generator = torch.Generator().manual_seed(0)
    Q, K, V = (torch.randn(1, 1, 6, 6, dtype=torch.float64, generator=generator)
               .requires_grad_() for _ in range(3))
    text = program(" + bias[b,h,i,j]")
    out = ef.ein(text, Q=Q, K=K, V=V, bias=V, scale=0.3)
    got = torch.autograd.grad(out.sum(), (Q, V))
    assert not backward_calls
    want = torch.autograd.grad(by_torch("full", Q, K, V, V).sum(), (Q, V))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


def test_an_expanded_bias_gets_its_gradient_through_the_expand(backward_calls):
    """A bias of stride 0 along b (an expand of a (H, N, N) parameter, written as
    bias[b,h,i,j]): read in place, its gradient flows back through the expand."""
    Q, K, V, parameter = inputs("over b", 2, 2, 30, 4, seed=5)
    out = ef.ein(program(" + bias[b,h,i,j]"), Q=Q, K=K, V=V,
                 bias=parameter.expand(2, -1, -1, -1), scale=0.3)
    got = torch.autograd.grad(out.square().sum(), (K, parameter))
    assert backward_calls
    want = torch.autograd.grad(by_torch("over b", Q, K, V, parameter).square().sum(),
                               (K, parameter))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


# -- an index term's coefficient: ALiBi's slope[h] * (j - i), a 0-d parameter ------------

def slope_inputs(B=2, H=3, N=6, D=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    Q, K, V = (torch.randn(B, H, N, D, dtype=torch.float64, generator=generator)
               for _ in range(3))
    slope = torch.rand(H, dtype=torch.float64, generator=generator)
    return [t.requires_grad_() for t in (Q, K, V, slope)]


def alibi_by_torch(Q, K, V, slope, scale=0.3, factor=1.0, bias=None):
    N = Q.shape[2]
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    slope = slope[None, :, None, None] if slope.ndim else slope
    S = Q @ K.transpose(-1, -2) * scale + factor * slope * (j - i)
    if bias is not None:
        S = S + bias[None]
    return torch.softmax(S.masked_fill(~(j <= i), -torch.inf), -1) @ V


# (B, H, N, D): the default run's case has 5x fewer elements to perturb than the slow one
@pytest.mark.parametrize("sizes", [(1, 2, 5, 2),
                                   pytest.param((2, 3, 6, 3), marks=pytest.mark.slow)])
def test_gradcheck_of_a_slope(sizes, backward_calls):
    Q, K, V, slope = slope_inputs(*sizes)
    text = program(" + slope[h] * (j - i)")

    def attend(Q, K, V, slope):
        return ef.ein(text, Q=Q, K=K, V=V, slope=slope, scale=0.3)
    assert torch.autograd.gradcheck(attend, (Q, K, V, slope), eps=1e-6, atol=1e-8)
    assert backward_calls


@pytest.mark.parametrize("N", [9, 131])
def test_slope_bias_and_a_scalar_slope_match_torch(N, backward_calls):
    Q, K, V, slope = slope_inputs(2, 3, N, 5, seed=N)
    bias = torch.randn(3, N, N, dtype=torch.float64).requires_grad_()
    out = ef.ein(program(" + bias[h,i,j] + slope[h] * (j - i)"), Q=Q, K=K, V=V,
                 slope=slope, bias=bias, scale=0.3)
    got = torch.autograd.grad(out.square().sum(), (Q, slope, bias))
    assert len(backward_calls) == 1
    want = torch.autograd.grad(alibi_by_torch(Q, K, V, slope, bias=bias).square().sum(),
                               (Q, slope, bias))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    p = torch.tensor(0.25, dtype=torch.float64, requires_grad=True)
    out = ef.ein(program(" - p * (j - i)"), Q=Q, K=K, V=V, p=p, scale=0.3)
    got, = torch.autograd.grad(out.square().sum(), p)
    assert len(backward_calls) == 2 and got.shape == ()
    want, = torch.autograd.grad(alibi_by_torch(Q, K, V, p, factor=-1.0).square().sum(),
                                p)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_a_slope_through_the_formula_fallback(backward_calls):
    Q, K, V, slope = slope_inputs()
    out = ef.ein(program(" + slope[h] * (j - i)"), Q=Q, K=K, V=V, slope=slope, scale=0.3)
    seed = torch.ones_like(out)
    seed[1, 2, 3, 0] = torch.nan
    got = torch.autograd.grad(out, (Q, slope), seed)
    assert not backward_calls
    want = torch.autograd.grad(alibi_by_torch(Q, K, V, slope), (Q, slope), seed)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11, equal_nan=True)


def test_slope_same_bits_for_every_thread_count():
    found = []
    for threads in (1, 2, 3):
        Q, K, V, slope = slope_inputs(3, 2, 150, 8, seed=2)
        Q, K, V, slope = (t.detach().float().requires_grad_() for t in (Q, K, V, slope))
        out = ef.ein(program(" + slope[h] * (j - i)"), Q=Q, K=K, V=V, slope=slope,
                     scale=0.3, threads=threads)
        found.append(torch.autograd.grad(out.sum(), slope)[0])
    assert all(torch.equal(found[0], other) for other in found[1:])
