"""Convolutions with channels written as statements (issue 31 item 4): the windowed
contraction route (plan/windowed_contraction.py) against torch's convolutions, forward
and forward + backward (torch autograd on torch tensors through einfuse)."""

from __future__ import annotations

from typing import List

import numpy as np

from .cases import Case, torch_peer, training_case

CONV2D = "y[b,o,i,j] := x[b,c,2*i+p-1,2*j+q-1] * w[o,c,p,q]"
CONV1D = "y[b,o,i] := x[b,c,i+p-1] * w[o,c,p]"


def _conv2d(B, C, H, O, K):
    def inputs(rng):
        return {"x": rng.standard_normal((B, C, H, H), dtype=np.float32),
                "w": rng.standard_normal((O, C, K, K), dtype=np.float32)}

    def torch_conv(x, w):
        import torch.nn.functional as F
        return F.conv2d(x, w, stride=2, padding=1)
    out = (H + 2 - K) // 2 + 1
    options = {"pad": 0, "ranges": {"i": out, "j": out}}
    name = f"conv2d {B}x{C}x{H}x{H} * {O}x{C}x{K}x{K} stride 2 pad 1"
    return (Case(name, CONV2D, inputs, [torch_peer("torch conv2d", torch_conv)], options),
            training_case(name, CONV2D, inputs, torch_conv, compiled=False, **options))


def _conv1d(B, C, L, O, K):
    def inputs(rng):
        return {"x": rng.standard_normal((B, C, L), dtype=np.float32),
                "w": rng.standard_normal((O, C, K), dtype=np.float32)}

    def torch_conv(x, w):
        import torch.nn.functional as F
        return F.conv1d(x, w, padding=1)
    options = {"pad": 0, "ranges": {"i": L + 2 - K + 1}}
    name = f"conv1d {B}x{C}x{L} * {O}x{C}x{K} pad 1"
    return (Case(name, CONV1D, inputs, [torch_peer("torch conv1d", torch_conv)], options),
            training_case(name, CONV1D, inputs, torch_conv, compiled=False, **options))


def conv_cases(quick: bool = False) -> List[Case]:
    """The issue's conv2d (8x16x64x64 * 32x16x3x3, stride 2, pad 1) and a conv1d,
    forward and forward + backward."""
    if quick:
        return [*_conv2d(2, 4, 16, 8, 3), *_conv1d(2, 4, 64, 8, 3)]
    return [*_conv2d(8, 16, 64, 32, 3), *_conv1d(8, 64, 1024, 64, 3)]
