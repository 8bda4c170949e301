"""Pieces of a program's recorded call that the C node (program_autograd.py) and the
Triton node (program_triton_autograd.py) share: which inputs it differentiates, the
placeholders of intermediates whose shapes the backward needs, and the owner's cache
of prepared calls."""

from __future__ import annotations

from typing import Dict

import torch

from ..analysis.frameworks import has_tangent, is_functorch_tensor, placeholder
from .program_backward import PLANS_KEPT, output_placeholder

_FLOATS = (torch.float32, torch.float64)


def shaped_like(kernels, env: Dict[str, object], names) -> Dict[str, object]:
    """Placeholders of ``names`` (intermediates the backward needs the shape of).  The
    forward ran keeping only outputs and saved names, so an intermediate of a fused
    group (a per-thread row) never reached ``env``: its shape and dtype come from
    binding its statement on placeholders of what it reads, as the statement's own
    run would have given them."""
    shapes = {name: placeholder(value) for name, value in env.items()}
    for kernel in kernels:
        if all(name in shapes for name in names):
            break
        if kernel.spec.output not in shapes:
            shapes[kernel.spec.output] = output_placeholder(kernel, shapes)
    return {name: shapes[name] for name in names}


def differentiable_inputs(env: Dict[str, object]):
    """The names of the float32/float64 tensors of ``env`` that require a gradient, or
    None where a value keeps the statement-by-statement path: a tensor that is not
    strided (sparse, nested), a torch.func wrapper or dual tensor, complex or of
    another float dtype, or a value that is neither a tensor nor a number.  (The
    caller checks the devices.)"""
    names = []
    for name, value in env.items():
        if isinstance(value, torch.Tensor):
            if value.layout != torch.strided or value.is_nested or \
                    is_functorch_tensor(value) or value.is_complex() or \
                    has_tangent(value) or \
                    (value.dtype.is_floating_point and value.dtype not in _FLOATS):
                return None
            if value.requires_grad and value.dtype in _FLOATS:
                names.append(name)
        elif not isinstance(value, (int, float)):
            return None
    return names


def remember_call(owner, signature, call) -> None:
    """Keep ``call`` (a PreparedCall, or program/triton_autograd's TritonCall) for
    calls of ``signature``: the holder's fast path."""
    if signature is not None:
        if len(owner.calls) >= PLANS_KEPT:
            owner.calls.clear()
        owner.calls[signature] = call
