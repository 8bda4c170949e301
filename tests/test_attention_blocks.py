"""The fused Triton attention kernel's launch blocks are the schedule's
(schedule/attention_blocks.attention_blocks): the rule's answer per signature, and the
configuration the backend launches is the one the rule returned; the same for the
backward's two kernels (attention_backward_blocks)."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.triton import backend as triton_backend
from einfuse.schedule import attention_blocks as blocks
from test_attention import one_by_one, program

torch = pytest.importorskip("torch")
needs_triton = pytest.mark.skipif(
    not triton_backend.available() or not (triton_backend.interpreted() or
                                           torch.cuda.is_available()),
    reason="needs triton under TRITON_INTERPRET=1, or compiled with a CUDA GPU")
DEVICE = "cpu" if triton_backend.interpreted() else "cuda"


def test_the_rule():
    Source = blocks.AttentionBlockSource
    for dtype in ("float16", "bfloat16", "float32"):
        for head in (1, 5, 16, 64, 65, 100, 128):
            chosen = blocks.attention_blocks(dtype, head, interpreted=True)
            assert chosen == blocks.AttentionBlockChoice(Source.INTERPRETER,
                                                         blocks.INTERPRETED_CONFIG)
            chosen = blocks.attention_blocks(dtype, head, interpreted=False)
            width = "float32" if dtype == "float32" else "16-bit"
            assert chosen.source is Source.MEASURED and chosen.reason
            assert chosen.config == blocks.CANDIDATES[(width, 64 if head <= 64 else 128)][0]
    forced = blocks.AttentionConfig(16, 32, 2, 1)
    assert blocks.attention_blocks("float32", 64, False, forced) == \
        blocks.AttentionBlockChoice(Source.FORCED, forced)
    with pytest.raises(Exception):
        blocks.INTERPRETED_CONFIG.block_m = 1        # frozen


@needs_triton
def test_the_backend_launches_the_decided_blocks(monkeypatch):
    from einfuse.backends.triton import attention as triton_attention
    decided = blocks.AttentionConfig(16, 16, 2, 1)      # not what the rule would give
    asked = []

    def rule(dtype_name, head_dim, interpreted, forced=None):
        asked.append((dtype_name, head_dim, interpreted, forced))
        return blocks.AttentionBlockChoice(blocks.AttentionBlockSource.MEASURED, decided)
    monkeypatch.setattr(triton_attention, "attention_blocks", rule)
    ran = []
    original = triton_attention.launch
    monkeypatch.setattr(triton_attention, "launch",
                        lambda *a, **k: ran.append(original(*a, **k)) or ran[-1])
    g = torch.Generator().manual_seed(3)
    Q, K, V = (torch.randn(1, 2, 37, 8, generator=g).to(DEVICE) for _ in range(3))
    got = ef.ein(program(), Q=Q, K=K, V=V, scale=0.5, backend="triton")
    assert ran == [decided]
    assert asked == [("float32", 8, triton_backend.interpreted(), None)]
    expected = one_by_one(*(t.double().cpu().numpy() for t in (Q, K, V)), 0.5, "j <= i",
                          True)
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=2e-5, atol=2e-6)


def test_the_backward_rule():
    Source = blocks.AttentionBlockSource
    for dtype in ("float16", "bfloat16", "float32"):
        for head in (4, 64, 128):
            assert blocks.attention_backward_blocks(dtype, head, interpreted=True) == \
                blocks.AttentionBlockChoice(Source.INTERPRETER, blocks.INTERPRETED_CONFIG)
            chosen = blocks.attention_backward_blocks(dtype, head, interpreted=False)
            assert chosen.source is Source.UNTUNED and chosen.reason
            # (the configurations the backward launched before the rule was the schedule's)
            assert chosen.config == (blocks.AttentionConfig(32, 32, 4, 2)
                                     if dtype == "float32" else
                                     blocks.AttentionConfig(64, 64, 4, 2))


@needs_triton
def test_the_backward_launches_the_decided_blocks(monkeypatch):
    from einfuse.backends.triton import attention_backward
    decided = blocks.AttentionConfig(16, 16, 2, 1)      # not what the rule would give
    asked, launched = [], []

    def rule(dtype_name, head_dim, interpreted):
        asked.append((dtype_name, head_dim, interpreted))
        return blocks.AttentionBlockChoice(blocks.AttentionBlockSource.UNTUNED, decided)
    monkeypatch.setattr(attention_backward, "attention_backward_blocks", rule)
    original = attention_backward._run
    monkeypatch.setattr(attention_backward, "_run",
                        lambda kernel, grid, config, *rest: launched.append(config) or
                        original(kernel, grid, config, *rest))
    g = torch.Generator().manual_seed(5)
    Q, K, V = (torch.randn(1, 2, 37, 8, generator=g, dtype=torch.float32).to(DEVICE)
               .requires_grad_() for _ in range(3))
    out = ef.ein(program(), Q=Q, K=K, V=V, scale=0.5, backend="triton")
    seed = torch.randn_like(out)
    got = torch.autograd.grad(out, (Q, K, V), seed)
    assert launched == [decided, decided]       # the two kernels: keys, then rows
    assert asked == [("float32", 8, triton_backend.interpreted())]
    reference = [t.detach().double().cpu().requires_grad_() for t in (Q, K, V)]
    want = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(
        *reference, is_causal=True, scale=0.5), reference, seed.double().cpu())
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.cpu().numpy(), b.numpy(), rtol=1e-4, atol=1e-5)
