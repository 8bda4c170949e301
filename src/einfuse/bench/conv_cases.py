"""Convolutions with channels written as statements (issue 31 item 4): the windowed
contraction route (plan/windowed_contraction.py) against torch's convolutions, forward
and forward + backward (torch autograd on torch tensors through einfuse)."""

from __future__ import annotations

from typing import List

import numpy as np

from .cases import Case, torch_peer, training_case

CONV2D = "y[b,o,i,j] := x[b,c,2*i+p-1,2*j+q-1] * w[o,c,p,q]"
CONV1D = "y[b,o,i] := x[b,c,i+p-1] * w[o,c,p]"


def _case(name, statement, xshape, wshape, options, torch_conv):
    """The forward case and the forward + backward one of one convolution."""
    def inputs(rng):
        return {"x": rng.standard_normal(xshape, dtype=np.float32),
                "w": rng.standard_normal(wshape, dtype=np.float32)}
    return (Case(name, statement, inputs, [torch_peer(f"torch conv{len(xshape) - 2}d",
                                                      torch_conv)], options),
            training_case(name, statement, inputs, torch_conv, compiled=False, **options))


def _conv2d(B, C, H, O, K):
    def torch_conv(x, w):
        import torch.nn.functional as F
        return F.conv2d(x, w, stride=2, padding=1)
    out = (H + 2 - K) // 2 + 1
    return _case(f"conv2d {B}x{C}x{H}x{H} * {O}x{C}x{K}x{K} stride 2 pad 1", CONV2D,
                 (B, C, H, H), (O, C, K, K), {"pad": 0, "ranges": {"i": out, "j": out}},
                 torch_conv)


def _conv2d_same(B, C, H, O):
    """Stride 1, 'same' padding: its input gradient is the scatter form's."""
    def torch_conv(x, w):
        import torch.nn.functional as F
        return F.conv2d(x, w, padding=1)
    return _case(f"conv2d {B}x{C}x{H}x{H} * {O}x{C}x3x3 pad 1",
                 "y[b,o,i,j] := x[b,c,i+p-1,j+q-1] * w[o,c,p,q]", (B, C, H, H),
                 (O, C, 3, 3), {"pad": 0, "ranges": {"i": H, "j": H}}, torch_conv)


def _conv2d_dilated(B, C, H, O):
    def torch_conv(x, w):
        import torch.nn.functional as F
        return F.conv2d(x, w, padding=2, dilation=2)
    return _case(f"conv2d {B}x{C}x{H}x{H} * {O}x{C}x3x3 dilation 2 pad 2",
                 "y[b,o,i,j] := x[b,c,i+2*p-2,j+2*q-2] * w[o,c,p,q]", (B, C, H, H),
                 (O, C, 3, 3), {"pad": 0, "ranges": {"i": H, "j": H}}, torch_conv)


def _conv1d(B, C, L, O, K):
    def torch_conv(x, w):
        import torch.nn.functional as F
        return F.conv1d(x, w, padding=1)
    return _case(f"conv1d {B}x{C}x{L} * {O}x{C}x{K} pad 1", CONV1D, (B, C, L), (O, C, K),
                 {"pad": 0, "ranges": {"i": L + 2 - K + 1}}, torch_conv)


def _conv1d_strided(B, C, L, O, K):
    def torch_conv(x, w):
        import torch.nn.functional as F
        return F.conv1d(x, w, stride=2)
    return _case(f"conv1d {B}x{C}x{L} * {O}x{C}x{K} stride 2 valid",
                 "y[b,o,i] := x[b,c,2*i+p] * w[o,c,p]", (B, C, L), (O, C, K), {},
                 torch_conv)


def conv_cases(quick: bool = False) -> List[Case]:
    """The issue's conv2d (8x16x64x64 * 32x16x3x3, stride 2, pad 1), stride-1 and
    dilated conv2ds and two conv1ds, forward and forward + backward."""
    if quick:
        return [*_conv2d(2, 4, 16, 8, 3), *_conv1d(2, 4, 64, 8, 3)]
    return [*_conv2d(8, 16, 64, 32, 3), *_conv2d_same(8, 32, 32, 64),
            *_conv2d_dilated(4, 16, 64, 32), *_conv1d(8, 64, 1024, 64, 3),
            *_conv1d_strided(8, 32, 512, 32, 5)]
