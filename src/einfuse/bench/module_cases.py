"""einfuse inside a torch model (issue 32): the training step of a 2-block MLP (RMSNorm,
Linear, GELU, Linear, residual; one einfuse program per block) as an eager module and
under torch.compile, against its pure-torch twin eager and compiled; and small layers
at 256x256 float32 (softmax, layernorm, cross-entropy as programs), forward and
forward + backward, against torch eager, where the time is mostly per-call cost.
benchmarks/torch_compile_mlp.py measures the same with the revision before for
comparison."""

from __future__ import annotations

from typing import List

import numpy as np

from .cases import Case, Peer, training_case
from .frontend_cases import (LAYERNORM, SOFTMAX, layernorm_case, row_inputs, softmax_case,
                             torch_layer_norm, torch_softmax)

BATCH, WIDTH, HIDDEN = 64, 128, 512


def _block_source(width: int) -> str:
    return (f"r[b] := sqrt(sum[d](X[b,d]**2) / {width} + 0.000001)\n"
            "n[b,d] := X[b,d] / r[b] * G[d]\n"
            "h[b,f] := sum[d](n[b,d] * W1[d,f])\n"
            "g[b,f] := 0.5 * h[b,f] * (1 + erf(h[b,f] * 0.7071067811865476))\n"
            "y[b,e] := X[b,e] + sum[f](g[b,f] * W2[f,e])")


def _mlp(arrays, ours: bool):
    """The 2-block MLP on the case's weights; ``ours``: its blocks as einfuse programs."""
    import torch

    import einfuse as ef
    program = ef.compile(_block_source(arrays["X"].shape[1]), outputs=("y",)) if ours \
        else None

    class Block(torch.nn.Module):
        def __init__(self, number: int):
            super().__init__()
            for name in ("G", "W1", "W2"):
                setattr(self, name, torch.nn.Parameter(
                    torch.from_numpy(arrays[f"{name}{number}"].copy())))

        def forward(self, x):
            if program is not None:
                return program(X=x, G=self.G, W1=self.W1, W2=self.W2)
            r = torch.sqrt((x * x).mean(1, keepdim=True) + 1e-6)
            return x + torch.nn.functional.gelu((x / r * self.G) @ self.W1) @ self.W2

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(0), Block(1)])

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x.square().mean()
    return MLP()


def _step_of(model, x):
    def step():
        for parameter in model.parameters():
            parameter.grad = None
        loss = model(x)
        loss.backward()
        return loss.detach()
    return step


def _mlp_inputs(batch: int, width: int, hidden: int):
    def inputs(rng):
        found = {"X": rng.standard_normal((batch, width), dtype=np.float32)}
        for number in range(2):
            found[f"G{number}"] = np.ones(width, np.float32)
            found[f"W1{number}"] = (rng.standard_normal((width, hidden)) /
                                    width ** 0.5).astype(np.float32)
            found[f"W2{number}"] = (rng.standard_normal((hidden, width)) /
                                    hidden ** 0.5).astype(np.float32)
        return found
    return inputs


def module_step_case(compiled: bool, batch: int = BATCH, width: int = WIDTH,
                     hidden: int = HIDDEN) -> Case:
    """The MLP's training step, einfuse's blocks eager (or under torch.compile), against
    the torch twin eager and compiled."""
    def make(ours: bool, compile_it: bool):
        def build(arrays, backend=None):
            import torch
            model = _mlp(arrays, ours)
            run = torch.compile(model) if compile_it else model
            return _step_of(run, torch.from_numpy(arrays["X"]))
        return build
    form = "torch.compile" if compiled else "eager"
    return Case(f"module step mlp {form} b={batch} d={width} h={hidden}",
                _block_source(width).replace("\n", "; "), _mlp_inputs(batch, width, hidden),
                [Peer("torch eager", make(False, False), "torch"),
                 Peer("torch.compile", make(False, True), "torch")],
                einfuse_call=make(True, compiled))


CROSS_ENTROPY = """m[i] := max[j](X[i,j])
l[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - X[i, t[i]]
L := sum[i](l[i]) / N"""


def _cross_entropy_inputs(rows: int, cols: int):
    def inputs(rng):
        return {"X": rng.standard_normal((rows, cols), dtype=np.float32),
                "t": rng.integers(0, cols, rows).astype(np.int64)}
    return inputs


def _torch_cross_entropy(X, t):
    import torch
    return torch.nn.functional.cross_entropy(X, t)


def small_layer_cases(size: int = 256) -> List[Case]:
    """Softmax, layernorm and cross-entropy at ``size`` x ``size``: forward, and forward +
    backward, against torch eager (per-call cost at this size)."""
    ce = CROSS_ENTROPY.replace("N", str(size))
    layernorm = LAYERNORM.replace("N", str(size))
    shape = f"{size}x{size}"
    return [softmax_case(size, size), layernorm_case(size, size),
            training_case(f"softmax program {shape}", SOFTMAX, row_inputs(size, size),
                          torch_softmax, compiled=False),
            training_case(f"layernorm program {shape}", layernorm,
                          row_inputs(size, size, affine=True), torch_layer_norm,
                          compiled=False),
            training_case(f"cross-entropy program {shape}", ce,
                          _cross_entropy_inputs(size, size), _torch_cross_entropy,
                          compiled=False)]


def module_cases(quick: bool = False) -> List[Case]:
    if quick:
        return [module_step_case(False, 16, 32, 64)] + small_layer_cases(64)
    return [module_step_case(False), module_step_case(True)] + small_layer_cases()
