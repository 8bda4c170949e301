"""Fused attention under torch autograd: the forward runs as the online-softmax kernel
(backends/c/attention.py) and also keeps each row's log-sum-exp; the backward runs as
one fused kernel (backends/c/attention_grad.py) that recomputes the weights block by
block.  Neither direction holds anything N x N beyond the gradient of an added tensor
(a bias or mask needing grad: its dS summed over the axes it is broadcast along, per
batch element, then over the batch axes it lacks in a fixed order -- the same bits
for every thread count).

Taken for a normalised attention (any band of keys, any additive terms of the scores),
CPU float32/float64 tensors, a scale and bounds that need no gradient (where one
does, the statements record, and their backward gives it), and a query, key and value
without inf or NaN; any other call records the statements one by one, as before.  The
backward falls back to the same formula in torch (materialising the weights, exactly
the statements' arithmetic) where the output's gradient holds inf or NaN, where a row
sees no finite score (its log-sum-exp is -inf: the statements' NaN), where a double
backward needs a differentiable gradient (create_graph=True), and where the scores are
so large that weights recomputed from the log-sum-exp would lose
their accuracy (|L| * eps > 2**-10: float32 scores past ~8000)."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import torch

from ..errors import AllocationError
from ..rewrite.online_softmax import Attention, MaskKind, ScaleKind
from ..rewrite.attention_scores import IndexTerm, TensorTerm
from ..rewrite.attention_layout import (SCALE_MODES, Canonical, canonical,
                                        from_canonical, operand_layouts, to_canonical,
                                        to_output)
from . import attention_run
from .attention_run import term_coefficient_name, term_gradient_slices
from .attention_run import torch_inputs, triton_scale


def recording(attention: Attention, named: Dict[str, object]) -> bool:
    """Whether autograd records this call (a query, key, value, scale or one of the
    scores' terms needing grad)."""
    if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
        return False
    names = (attention.query, attention.key, attention.value, attention.scale_param) + \
        attention.term_tensors + attention.term_params
    return any(isinstance(named.get(n), torch.Tensor) and named[n].requires_grad
               for n in names if n is not None)


def run_recorded(attention: Attention, named: Dict[str, object], options) -> Optional[torch.Tensor]:
    """The output, recorded as one autograd node with a fused backward, or None where
    the values decline it (a row its band hides, a query, key or value holding inf or
    NaN): the statements then run (and record) one by one.  Asked on the route
    schedule/attention_route.py decided (C_RECORDED: normalised, on 'auto' or 'c', no
    disqualifying option, a C compiler, no constant needing a gradient)."""
    biases = _biases_needing_grad(attention, named)
    tensors = tuple(named.get(n) for n in (attention.query, attention.key, attention.value))
    with torch.no_grad():     # the views only: this call is recorded below, as one node
        views = torch_inputs(attention, named)
    arrays = canonical(attention, views) if views is not None else None
    if arrays is None or not _every_row_sees_a_key(arrays):
        return None       # (a row its band hides entirely: the statements' NaN)
    threads = options.threads or 0
    from ..backends.c import attention as c_attention
    finite = c_attention.functions(arrays.query.dtype)[1]     # (parallel, in C)
    if not all(finite(a.ctypes.data, a.size, threads) for a in (arrays.query, arrays.key)):
        return None
    lse = np.empty(arrays.query.shape[:2], arrays.query.dtype)
    out = attention_run.run_c(attention, arrays, threads, lse)
    if out is None:       # a value with inf or NaN
        return None
    saved = _Saved(attention, arrays, out, lse, threads, biases)
    return _FusedAttention.apply(saved, *tensors, *(named[n] for n in biases))


def _every_row_sees_a_key(arrays: Canonical) -> bool:
    rows, keys = arrays.query.shape[1], arrays.key.shape[1]
    i = np.arange(rows)
    return bool((np.minimum(keys - 1, i + arrays.upper) >= np.maximum(0, i + arrays.lower)).all())


def _needs_grad(value) -> bool:
    return isinstance(value, torch.Tensor) and value.requires_grad


def constants_need_grad(attention: Attention, named: Dict[str, object]) -> bool:
    """Whether the scale or a bound's parameter needs a gradient (the fused backward
    computes none for them), or a term's tensor needing one is also the query, key or
    value or is read both as an added tensor and as a coefficient (its gradients would
    have to be joined)."""
    bounds = [p for b in attention.upper + attention.lower for p, _ in b.params]
    names = ((attention.scale_param,) if attention.scale_param else ()) + tuple(bounds)
    if any(_needs_grad(named.get(n)) for n in names):
        return True
    wanted = _biases_needing_grad(attention, named)
    added = {t.tensor for t in attention.terms if isinstance(t, TensorTerm)}
    coefficients = {term_coefficient_name(t) for t in attention.terms
                    if isinstance(t, IndexTerm)}
    operands = {id(named.get(n)) for n in (attention.query, attention.key, attention.value)}
    return any(id(named.get(n)) in operands or (n in added and n in coefficients)
               for n in wanted)


def _biases_needing_grad(attention: Attention, named: Dict[str, object]) -> Tuple[str, ...]:
    """The terms' tensors (a bias, a mask, ALiBi's slopes, a 0-d slope) whose gradient
    the backward computes, in order."""
    names = [t.tensor if isinstance(t, TensorTerm) else term_coefficient_name(t)
             for t in attention.terms]
    return tuple(dict.fromkeys(n for n in names if n and _needs_grad(named.get(n))))


class _Saved:
    """What the backward needs, kept on the autograd node (NumPy arrays in canonical
    layout: autograd does not track them)."""

    def __init__(self, attention: Attention, arrays: Canonical, out: np.ndarray,
                 lse: np.ndarray, threads: int, biases: Tuple[str, ...] = ()):
        self.attention, self.arrays, self.out, self.lse = attention, arrays, out, lse
        self.threads = threads
        self.biases = biases      # the added tensors whose gradient is wanted


class _FusedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, saved: _Saved, query, key, value, *biases):
        ctx.saved = saved
        ctx.save_for_backward(query, key, value, *biases)
        result = to_output(saved.attention, saved.arrays, saved.out)
        if np.shares_memory(result, saved.out):   # the caller may modify it in place
            result = result.copy()                # (h += x); the backward reads out
        return torch.from_numpy(result)

    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved
        tensors = ctx.saved_tensors
        wanted = ctx.needs_input_grad[1:]
        if grad is None:
            return (None,) + tuple(torch.zeros_like(t) if w else None
                                   for t, w in zip(tensors, wanted))
        flowing = _canonical_output(saved, grad.detach())
        if torch.is_grad_enabled() or not np.isfinite(flowing).all() or \
                not np.isfinite(saved.lse).all() or _scores_too_large(saved.lse):
            return (None,) + _reference_gradients(saved, tensors, grad, wanted)
        grads = _fused_gradients(saved, flowing, wanted[3:])
        return (None,) + tuple(torch.from_numpy(g) if w else None
                               for g, w in zip(grads, wanted))


# The kernel recomputes each weight as exp(s - L); s (summed in another order than the
# forward's) and L carry an error of some units in the last place of L, which scales the
# weight by exp(that): past |L| * eps = 2**-10 that is more than rounding (and inf once
# it passes ~700), while the statements' exp(s - max) stays exact at the maximum.
_LOG_SUM_EXP_LIMIT = 2.0 ** -10


def _scores_too_large(lse: np.ndarray) -> bool:
    largest = float(np.abs(lse).max()) if lse.size else 0.0
    return not largest * float(np.finfo(lse.dtype).eps) <= _LOG_SUM_EXP_LIMIT


def _canonical_output(saved: _Saved, grad: torch.Tensor) -> np.ndarray:
    """The output's gradient as (G, NQ, E), C-contiguous, in the working dtype."""
    a = saved.attention
    array = grad.to(torch.from_numpy(saved.out).dtype).resolve_neg().resolve_conj().numpy()
    return to_canonical(array, a.output_indices, a.batch + (a.row, a.feature), len(a.batch))


def _fused_gradients(saved: _Saved, flowing: np.ndarray,
                     biases_wanted=()) -> Tuple[np.ndarray, ...]:
    """dQ, dK, dV and the wanted added tensors' gradients (None for the others)."""
    from ..backends.c import attention_grad as c_attention_grad
    a, arrays = saved.attention, saved.arrays
    q, k, v = arrays.query, arrays.key, arrays.value
    groups, rows, dot = q.shape
    keys, features = v.shape[1], v.shape[2]
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    backward = c_attention_grad.backward_function(q.dtype)
    pointers = [x.ctypes.data for x in (q, k, v, saved.out, flowing, saved.lse, dq, dk, dv)]
    terms = attention_run.term_arguments(arrays)
    wanted = {n for n, w in zip(saved.biases, biases_wanted) if w}
    slices = term_gradient_slices(a, arrays, wanted)
    if backward(*pointers, groups, rows, keys, dot, features, arrays.scale,
                SCALE_MODES[a.scale], arrays.lower, arrays.upper, saved.threads,
                *terms.pointers, *slices.pointers):
        raise AllocationError("the attention backward could not allocate its per-thread "
                              "blocks")
    operands = tuple(from_canonical(g, arrays.batch_shape, order, indices)
                     for g, (order, indices) in zip((dq, dk, dv), operand_layouts(a)))
    found = slices.gradients()
    return operands + tuple(found.get(n) for n in saved.biases)


def _reference_gradients(saved: _Saved, tensors, grad, wanted):
    return formula_gradients(saved.attention, saved.arrays.scale, saved.arrays.batch_shape,
                             tensors, grad, wanted, saved.arrays, saved.biases)


def formula_gradients(attention: Attention, scale: float, batch_shape, tensors, grad, wanted,
                      arrays: Optional[Canonical] = None, biases: Tuple[str, ...] = ()):
    """The gradients by the statements' formula in torch (weights materialised, on the
    tensors' device; float16/bfloat16 computed in float32 as the statements are):
    differentiable again under create_graph, and NaN/inf where the statements give
    them.  ``arrays``: the call's band and terms, where it has any; ``biases``: the
    added tensors among them that are ``tensors`` after the query, key and value (in
    this order), differentiated too; the other terms are constants."""
    a = attention
    create = torch.is_grad_enabled()      # backward(create_graph=True)
    inputs = tensors if create else \
        tuple(t.detach().requires_grad_(w) for t, w in zip(tensors, wanted))
    with torch.enable_grad():
        q, k, v = (_canonical_tensor(t, order, indices)
                   for t, (order, indices) in zip(inputs, operand_layouts(a)))
        if q.dtype in (torch.float16, torch.bfloat16):
            q, k, v = q.float(), k.float(), v.float()
        scores = q @ k.transpose(-1, -2)
        if a.scale is ScaleKind.MULTIPLY:
            scores = scores * scale
        elif a.scale is ScaleKind.DIVIDE:
            scores = scores / scale
        rows, keys = scores.shape[-2:]
        for term, call_term in zip(a.terms, arrays.terms if arrays is not None else ()):
            if isinstance(term, TensorTerm) and term.tensor in biases:
                added = _broadcast_term(inputs[3 + biases.index(term.tensor)], term, a,
                                        batch_shape, rows, keys).to(scores)
                scores = scores + added if term.sign > 0 else scores - added
            elif isinstance(term, IndexTerm) and term_coefficient_name(term) in biases:
                scores = scores + _index_term(
                    inputs[3 + biases.index(term_coefficient_name(term))], term, a,
                    batch_shape, rows, keys).to(scores)
            else:
                scores = scores + torch.from_numpy(
                    np.array(call_term.block(0, keys, rows))).to(scores)
        if arrays is not None:
            lower, upper = arrays.lower, arrays.upper
        else:     # (the Triton kernel's plain masks)
            lower, upper = -rows, {MaskKind.CAUSAL: 0, MaskKind.STRICT_CAUSAL: -1}.get(
                a.mask, keys)
        offset = torch.arange(keys, device=scores.device)[None, :] - \
            torch.arange(rows, device=scores.device)[:, None]
        seen = (offset >= lower) & (offset <= upper)
        if not bool(seen.all()):
            scores = torch.where(seen, scores, torch.tensor(-torch.inf, dtype=scores.dtype,
                                                            device=scores.device))
        weights = torch.exp(scores - scores.amax(-1, keepdim=True))
        out = (weights @ v) / weights.sum(-1, keepdim=True)
        order = a.batch + (a.row, a.feature)
        out = out.reshape(tuple(batch_shape) + out.shape[1:]).permute(
            [order.index(n) for n in a.output_indices])
        chosen = [t for t, w in zip(inputs, wanted) if w]
        found = iter(torch.autograd.grad(out, chosen, grad.to(out.dtype),
                                         create_graph=create))
    return tuple(next(found) if w else None for w in wanted)


def run_recorded_triton(attention: Attention, named: Dict[str, object], options, route):
    """The output of the fused Triton kernel (backends/triton/attention.py), recorded as
    one autograd node whose backward is the fused Triton backward
    (backends/triton/attention_backward.py: dQ, dK, dV and the gradients of the scores'
    terms that want one), or the statements' formula in torch where its arithmetic
    would not be the statements'; None where the statements must run and record one by
    one (the values decline it).  Asked on the route schedule/attention_route.py
    decided (TRITON_RECORDED: normalised, no constant needing a gradient)."""
    tensors = tuple(named.get(n) for n in (attention.query, attention.key, attention.value))
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    scale_value = triton_scale(attention, named, tensors[0])
    if scale_value is None:
        return None
    biases = _biases_needing_grad(attention, named)
    from ..backends.triton import attention_backward as triton_backward
    with torch.no_grad():
        recorded = triton_backward.record(attention, named, scale_value, route, biases)
    if recorded is None:
        return None
    out, saved = recorded
    terms = {n: named.get(n) for n in attention.term_tensors + attention.term_params}
    return _TritonAttention.apply((saved, terms), out, *tensors,
                                  *(named[n] for n in biases))


class _TritonAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, how, out, *tensors):
        ctx.how = how
        ctx.save_for_backward(*tensors)
        return out

    @staticmethod
    def backward(ctx, grad):
        from ..backends.triton import attention_backward as triton_backward
        tensors = ctx.saved_tensors
        wanted = ctx.needs_input_grad[2:]
        if grad is None:
            return (None, None) + tuple(torch.zeros_like(t) if w else None
                                        for t, w in zip(tensors, wanted))
        saved, terms = ctx.how
        on = saved.views[0].device
        if not triton_backward.fusable(saved, grad.to(on)):
            found = triton_backward.formula_gradients(saved, terms, tensors, grad, wanted)
            return (None, None) + found
        operands, term_grads = triton_backward.fused_gradients(saved, grad.to(on))
        found = operands + tuple(term_grads.get(n) for n in saved.wanted)
        return (None, None) + tuple(
            g.to(device=t.device, dtype=t.dtype) if w and g is not None else
            (torch.zeros_like(t) if w else None)
            for g, t, w in zip(found, tensors, wanted))


def _broadcast_term(tensor: torch.Tensor, term: TensorTerm, attention: Attention,
                    batch_shape, rows: int, keys: int) -> torch.Tensor:
    """An added tensor (axes ``term.indices``) as the scores' shape (G, NQ, NK),
    broadcast along the axes it lacks (differentiable: its gradient sums over them)."""
    full = attention.batch + (attention.row, attention.key_index)
    extents = tuple(batch_shape) + (rows, keys)
    moved = tensor.permute([term.indices.index(n) for n in full if n in term.indices])
    shaped = moved.reshape([e if n in term.indices else 1 for n, e in zip(full, extents)])
    return shaped.expand(extents).reshape((-1, rows, keys))


def _index_term(coefficient: torch.Tensor, term: IndexTerm, attention: Attention,
                batch_shape, rows: int, keys: int) -> torch.Tensor:
    """value * c * (a j + b i + k) as (G, NQ, NK), differentiable in the coefficient c
    (a tensor over batch indices, or a 0-d parameter)."""
    c = term.coefficient
    if c.tensor is not None:
        moved = coefficient.permute([c.indices.index(n) for n in attention.batch
                                     if n in c.indices])
        coefficient = moved.reshape([e if n in c.indices else 1
                                     for n, e in zip(attention.batch, batch_shape)])
    per_group = (coefficient * c.value).expand(tuple(batch_shape)).reshape(-1)
    i = torch.arange(rows, device=coefficient.device)[:, None]
    j = torch.arange(keys, device=coefficient.device)[None, :]
    index = (term.key * j + term.row * i + term.constant).to(per_group.dtype)
    return per_group[:, None, None] * index


def _canonical_tensor(tensor: torch.Tensor, order, indices) -> torch.Tensor:
    moved = tensor.permute([indices.index(n) for n in order])
    return moved.reshape((-1,) + tuple(moved.shape[-2:]))
