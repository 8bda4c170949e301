"""GPU cases of programs and ``ef.jit`` (issue 15's second half): softmax and layernorm
(issue 10's programs) against torch eager and torch.compile, attention written in index
notation against torch's SDPA (FlashAttention kernels) at float16, and the seed scan-MLP of
issue 12 on JAX GPU arrays against ``jax.jit`` on the same GPU.

The attention statements are the CPU bench's (bench/cases.py), with and without the
causal mask; einfuse gets torch CUDA tensors of the case's dtype.  The seed cases are
bench/jit_cases.py's, with their arrays placed on JAX's default device (the GPU on a
GPU machine): what ``ef.jit`` does with them is what a user gets."""

from __future__ import annotations

from typing import List

import numpy as np

from .cases import ATTENTION, attention_inputs, sdpa_attention
from .frontend_cases import (LAYERNORM, SOFTMAX, SOFTMAX_STATEMENT, row_inputs,
                             torch_layer_norm, torch_softmax)
from .gpu import GpuCase, Peer, Target, einfuse_forward, to_torch, torch_peer
from .jit_cases import seed_case

PLAIN_ATTENTION = ATTENTION.replace("where(j <= i, sum[d](Q[b,h,i,d]*K[b,h,j,d]) * {scale}, "
                                    "-inf)", "sum[d](Q[b,h,i,d]*K[b,h,j,d]) * {scale}")


def attention_case(device: str, B: int, H: int, N: int, D: int, dtype: str,
                   causal: bool) -> GpuCase:
    """softmax(Q K^T * scale [causal]) V: the fused kernel against torch's
    scaled_dot_product_attention (FlashAttention-2 on an H100 at float16)."""
    scale = float(1.0 / np.sqrt(D))
    statement = (ATTENTION if causal else PLAIN_ATTENTION).format(scale=repr(scale))

    inputs, sdpa = attention_inputs(B, H, N, D), sdpa_attention(scale, causal)
    goal = Target("torch SDPA", "within", 1.25) if dtype == "float16" else None
    return GpuCase(f"{'causal ' if causal else ''}attention B={B} H={H} N={N} D={D} {dtype}",
                   statement, inputs, [torch_peer("torch SDPA", sdpa, device, dtype)],
                   einfuse_call=einfuse_forward(statement, device, dtype), dtype=dtype,
                   target=goal)


def row_program_cases(device: str, rows: int, cols: int) -> List[GpuCase]:
    """Softmax as a program and as one statement, and layernorm, on float32 rows: issue
    10 asks for at least torch.compile's speed on a GPU."""
    goal = Target("torch.compile", "faster", 1.0)
    size = f"{rows}x{cols}"
    x_only, with_affine = row_inputs(rows, cols), row_inputs(rows, cols, affine=True)
    cases = []
    for name, source, inputs, fn in (
            (f"softmax program {size}", SOFTMAX, x_only, torch_softmax),
            (f"softmax statement {size}", SOFTMAX_STATEMENT, x_only, torch_softmax),
            (f"layernorm program {size}", LAYERNORM.replace("N", str(cols)), with_affine,
             torch_layer_norm)):
        cases.append(GpuCase(name, source, inputs,
                             [torch_peer("torch eager", fn, device),
                              torch_peer("torch.compile", fn, device, compiled=True)],
                             einfuse_call=einfuse_forward(source, device, "float32"),
                             target=goal))
    return cases


def row_training_cases(device: str, rows: int, cols: int) -> List[GpuCase]:
    """Softmax and layernorm programs, forward and backward (every input's gradient for
    a fixed output gradient), against torch eager and torch.compile: einfuse's is one
    autograd node whose forward and backward run their row groups as one Triton kernel
    each (program/triton_autograd.py)."""
    size = f"{rows}x{cols}"
    x_only, with_affine = row_inputs(rows, cols), row_inputs(rows, cols, affine=True)

    def step(fn, leaves, seed):
        for tensor in leaves.values():
            tensor.grad = None
        out = fn(**leaves)
        out.backward(seed)
        return (out.detach(), *(tensor.grad for tensor in leaves.values()))

    def seeded(arrays, make_fn):
        import torch
        leaves = to_torch(arrays, device, grad=True)
        shape = leaves["X"].shape
        # a fixed output gradient that is not constant along rows (a ones seed makes
        # softmax's input gradient exactly 0)
        seed = torch.cos(torch.arange(shape[0] * shape[1], device=device,
                                      dtype=torch.float32)).reshape(shape)
        fn = make_fn()
        return lambda: step(fn, leaves, seed)

    def ours(source):
        def make(arrays, backend):
            import einfuse as ef
            kernel = ef.compile(source, backend=backend)
            return seeded(arrays, lambda: lambda **t: kernel(**t))
        return make

    def peer(name, fn, compiled):
        def make(arrays):
            import torch
            return seeded(arrays, lambda: torch.compile(fn) if compiled else fn)
        return Peer(name, make, "torch")
    cases = []
    for name, source, inputs, fn in (
            (f"fwd+bwd softmax program {size}", SOFTMAX, x_only, torch_softmax),
            (f"fwd+bwd layernorm program {size}", LAYERNORM.replace("N", str(cols)),
             with_affine, torch_layer_norm)):
        cases.append(GpuCase(name, source, inputs,
                             [peer("torch eager", fn, False),
                              peer("torch.compile", fn, True)],
                             einfuse_call=ours(source)))
    return cases


def seed_gpu_case(steps: int, hidden: int, chains: int = 0,
                  kind: str = "forward") -> GpuCase:
    """bench/jit_cases.py's case as a GPU case (float64 results, compared at float32's
    tolerance)."""
    case = seed_case(steps, hidden, chains, kind)
    return GpuCase(case.name, case.statement, case.inputs, case.peers,
                   einfuse_call=case.einfuse_call,
                   target=Target("jax.jit(lax.scan)", "faster", 20.0)
                   if kind == "forward" and not chains else None)


def program_cases(device: str, quick: bool) -> List[GpuCase]:
    B, H, N, D = (1, 2, 64, 16) if quick else (4, 8, 4096, 64)
    dtype = "float32" if quick else "float16"
    cases = [attention_case(device, B, H, N, D, dtype, causal) for causal in (False, True)]
    cases += row_program_cases(device, *((48, 40) if quick else (8192, 8192)))
    cases += row_training_cases(device, *((48, 40) if quick else (8192, 8192)))
    if quick:
        return cases
    return cases + [seed_gpu_case(8000, 12), seed_gpu_case(2000, 32, chains=256),
                    seed_gpu_case(8000, 12, kind="grad")]
