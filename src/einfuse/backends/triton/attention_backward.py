"""The fused Triton attention's backward (the kernels: attention_backward_kernel.py):
dQ, dK, dV and the gradients of the scores' terms that want one -- an added tensor's
(a learnable bias, a mask needing grad) summed over the axes it is broadcast along, an
index term's coefficient's (ALiBi's slopes, a 0-d slope) -- from the forward's saved
rows' log2-sum-exp2, nothing N x N held but the gradient buffer of an added tensor over
both i and j (one (i, j) slice per batch element, as backends/c/attention_grad.py
keeps).  The per-batch buffers are summed over the batch axes a term lacks by torch
reductions in a fixed order: the same bits on every run.

:class:`Saved` is what the forward keeps; :func:`fused_gradients` launches the two
kernels; :func:`formula_gradients` is the statements' formula in torch (the weights
materialised, differentiable again) for the cases the kernels' arithmetic would not
reproduce: an output gradient holding inf or NaN, a value holding inf or NaN (the
forward kernel's flags, read with the others in one host read), a row whose scores are
all -inf (its log-sum-exp is -inf: the statements' NaN), scores so large that weights
recomputed from the log-sum-exp lose their accuracy, a double backward."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Tuple

import triton

from ...rewrite.attention_scores import IndexTerm, TensorTerm
from ...rewrite.online_softmax import ScaleKind
from ...schedule.attention_blocks import attention_backward_blocks
from .attention import Config, padded_block
from .attention_backward_kernel import attention_backward_keys, attention_backward_rows
from .attention_terms import KernelTerms, as_tensor
from .launch import PreparedLaunch

# |L| * eps past this: exp(s - L) recomputed loses accuracy (runtime/attention_autograd)
_LOG_SUM_EXP_LIMIT = 2.0 ** -10
_INT32_MAX = 2 ** 31 - 1
_launchers: dict = {}


@dataclass
class Saved:
    """What the backward needs from the forward: the attention, the call's scale (the
    natural one and the kernel's log2 one), the canonical views (B1, B2, ...) of the
    query, key, value and output, the rows' log2-sum-exp2, the terms, the batch shape,
    and the names of the terms' tensors whose gradient is wanted (in the order the
    autograd node takes them); ``flags``, the forward's programs' flags (a value
    holding inf or NaN, or sums that overflowed: the formula's case), on the device."""
    attention: object
    scale: float
    score_scale: float
    views: Tuple
    lse: object
    terms: KernelTerms
    batch_shape: Tuple[int, ...]
    wanted: Tuple[str, ...]
    interpreted: bool
    flags: object = None


def grad_scale(attention, scale: float) -> float:
    """d(score)/d(dot product)."""
    if attention.scale is ScaleKind.MULTIPLY:
        return scale
    if attention.scale is ScaleKind.DIVIDE:
        return 1.0 / scale
    return 1.0


def fusable(saved: Saved, grad) -> bool:
    """Whether the kernels' arithmetic gives the statements' gradients for this output
    gradient and the kernels can address the buffers: the output gradient and the
    rows' log-sum-exp finite, the scores not too large, no value holding inf or NaN
    (the forward's flags) -- one device value, the one host read of the backward
    (it decides which kernels to launch)."""
    import torch
    lse = saved.lse
    rows, keys = saved.views[0].shape[2], saved.views[1].shape[2]
    if "both" in _buffers_needed(saved.attention, saved.wanted) and \
            rows * keys > _INT32_MAX:
        return False      # (the kernel addresses dS's (i, j) slice in int32)
    if torch.is_grad_enabled():
        return False
    eps = float(torch.finfo(torch.float32).eps)     # (the kernels' scores: float32)
    # (L is in log2 units: the natural one is L * ln 2; NaN and inf fail the test)
    limit = _LOG_SUM_EXP_LIMIT / (eps * math.log(2))
    ok = torch.isfinite(grad).all()
    if lse.numel():
        ok = ok & (lse.abs().max() <= limit)
    if saved.flags is not None and saved.flags.numel():
        ok = ok & (saved.flags.max() == 0)
    return bool(ok)


def fused_gradients(saved: Saved, grad) -> Tuple[Tuple, Dict[str, object]]:
    """(dQ, dK, dV) in the operands' own axis orders and {term tensor: its gradient}."""
    import torch
    a = saved.attention
    # (the gradients are written with the operands' strides: dense copies of operands
    # that are not, so that no two gradient elements share an address)
    q, k, v, out = (x if x.is_contiguous() else x.contiguous() for x in saved.views)
    B1, B2, rows, dot = q.shape
    keys, features = v.shape[2], v.shape[3]
    order = a.batch + (a.row, a.feature)
    do = grad.permute([a.output_indices.index(n) for n in order]) \
        .reshape(B1, B2, rows, features).to(q.dtype)
    delta = (do.float() * out.float()).sum(-1).contiguous()
    dq, dk, dv = (torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))
    needs = _buffers_needed(a, saved.wanted)
    device = q.device
    ds = torch.zeros((B1, B2, rows, keys), dtype=torch.float32, device=device) \
        if "both" in needs else delta
    cols = torch.zeros((B1, B2, keys), dtype=torch.float32, device=device) \
        if "key" in needs else delta
    sums = torch.zeros((B1, B2, 2, rows), dtype=torch.float32, device=device) \
        if "row" in needs else delta
    dtype_name = str(q.dtype).rsplit(".", 1)[-1]
    # (the launch blocks are the schedule's: schedule/attention_blocks.py)
    config = attention_backward_blocks(dtype_name, max(dot, features),
                                       saved.interpreted).config
    terms = saved.terms
    slots = [q if x is None else x for x in terms.tensor_args + terms.index_args]
    common = dict(DOT=dot, FEATURES=features, BLOCK_D=padded_block(dot),
                  BLOCK_E=padded_block(features), BLOCK_M=config.block_m,
                  BLOCK_N=config.block_n, EXACT=dtype_name == "float32",
                  UPCAST=saved.interpreted and dtype_name == "bfloat16", **terms.constants)
    strides = [*q.stride(), *k.stride(), *v.stride(), *do.stride(), delta.stride(0),
               delta.stride(1)]
    factor = grad_scale(a, saved.scale)
    _run(attention_backward_keys, (triton.cdiv(keys, config.block_n), B1, B2), config,
         dict(common, STORE_DS="both" in needs, COLUMN_SUMS="key" in needs),
         (q, k, v, do, saved.lse, delta, dk, dv, ds, cols, saved.score_scale, factor,
          *strides, ds.stride(0) if "both" in needs else 0,
          ds.stride(1) if "both" in needs else 0, cols.stride(0) if "key" in needs else 0,
          cols.stride(1) if "key" in needs else 0, rows, keys, terms.lower, terms.upper,
          *slots), device)
    _run(attention_backward_rows, (triton.cdiv(rows, config.block_m), B1, B2), config,
         dict(common, ROW_SUMS="row" in needs),
         (q, k, v, do, saved.lse, delta, dq, sums, saved.score_scale, factor,
          *strides, sums.stride(0) if "row" in needs else 0,
          sums.stride(1) if "row" in needs else 0, rows, keys, terms.lower, terms.upper,
          *slots), device)
    from ...rewrite.attention_layout import operand_layouts
    operands = tuple(_from_canonical(g, saved.batch_shape, order_, indices)
                     for g, (order_, indices) in zip((dq, dk, dv), operand_layouts(a)))
    return operands, _term_gradients(saved, ds, cols, sums)


def _run(kernel, grid, config: Config, constants, args, device) -> None:
    import torch
    from ...errors import BackendError
    key = (kernel.fn.__name__ if hasattr(kernel, "fn") else id(kernel), grid, config,
           tuple(sorted(constants.items())), str(args[0].dtype), device)
    launcher = _launchers.get(key)
    if launcher is None:
        if len(_launchers) >= 256:
            _launchers.clear()
        launcher = _launchers[key] = PreparedLaunch(
            kernel, grid, dict(num_warps=config.warps, num_stages=config.stages),
            constants, device.index if device.type == "cuda" else None)
    try:
        with torch.cuda.device(device) if device.type == "cuda" else _nothing():
            launcher(*args)
    except Exception as error:     # compilation or resources: the kernel's fault
        raise BackendError(f"the fused Triton attention backward failed: "
                           f"{type(error).__name__}: {error}") from error


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *_):
        return False


def _buffers_needed(attention, wanted) -> set:
    """Which of the kernels' sums the wanted terms read: "both" (dS itself), "key"
    (its sums over the rows), "row" (its sums, and of dS * j, over the keys)."""
    needs = set()
    for term in attention.terms:
        if isinstance(term, TensorTerm) and term.tensor in wanted:
            has_row = attention.row in term.indices
            has_key = attention.key_index in term.indices
            needs.add("both" if has_row and has_key else "key" if has_key else "row")
        elif isinstance(term, IndexTerm) and \
                (term.coefficient.tensor or term.coefficient.param) in wanted:
            needs.add("row")
    return needs


def _term_gradients(saved: Saved, ds, cols, sums) -> Dict[str, object]:
    import torch
    a, shape = saved.attention, tuple(saved.batch_shape)
    found: Dict[str, object] = {}
    for term in a.terms:
        if isinstance(term, TensorTerm) and term.tensor in saved.wanted:
            has_row = a.row in term.indices
            has_key = a.key_index in term.indices
            if has_row and has_key:
                per_batch, inner = ds.reshape(shape + ds.shape[2:]), (a.row, a.key_index)
            elif has_key:
                per_batch, inner = cols.reshape(shape + cols.shape[2:]), (a.key_index,)
            else:
                per_batch, inner = sums[:, :, 0].reshape(shape + sums.shape[3:]), (a.row,)
                if not has_row:
                    per_batch, inner = per_batch.sum(-1), ()
            grad = _summed(per_batch, a.batch + inner, term.indices) * term.sign
            name = term.tensor
        elif isinstance(term, IndexTerm) and \
                (term.coefficient.tensor or term.coefficient.param) in saved.wanted:
            c = term.coefficient
            rows = sums.shape[3]
            i = torch.arange(rows, dtype=torch.float32, device=sums.device)
            moments = term.key * sums[:, :, 1].sum(-1) + \
                term.row * (sums[:, :, 0] * i).sum(-1) + term.constant * sums[:, :, 0].sum(-1)
            per_batch = moments.reshape(shape) * c.value
            grad = _summed(per_batch, a.batch, c.indices if c.tensor is not None else ())
            name = c.tensor or c.param
        else:
            continue
        found[name] = grad if name not in found else found[name] + grad
    return found


def _summed(per_batch, axes, indices):
    """``per_batch`` (axes named ``axes``) summed over the axes not in ``indices`` (in
    a fixed order), then with its axes in ``indices``' order."""
    summed = tuple(n for n, name in enumerate(axes) if name not in indices)
    kept = [name for name in axes if name in indices]
    if summed:
        per_batch = per_batch.sum(dim=summed)
    return per_batch.permute([kept.index(n) for n in indices]) if indices else per_batch


def _from_canonical(grad, batch_shape, order, indices):
    shaped = grad.reshape(tuple(batch_shape) + tuple(grad.shape[2:]))
    return shaped.permute([order.index(n) for n in indices])


def formula_gradients(saved: Saved, named_terms: Dict[str, object], tensors, grad, wanted):
    """The gradients by the statements' formula in torch: ``tensors`` the query, key,
    value and then the wanted terms' tensors (``saved.wanted``); ``named_terms`` every
    term's tensor or number as the call gave it.  Differentiable again under
    create_graph; NaN and inf where the statements give them."""
    import torch
    a = saved.attention
    create = torch.is_grad_enabled()
    inputs = tensors if create else \
        tuple(t.detach().requires_grad_(w) for t, w in zip(tensors, wanted))
    with torch.enable_grad():
        q, k, v = inputs[:3]
        given = dict(named_terms)
        given.update(zip(saved.wanted, inputs[3:]))
        full = a.batch + (a.row, a.key_index)
        qc = q.permute([a.query_indices.index(n) for n in a.batch + (a.row, a.dot_index)])
        kc = k.permute([a.key_indices.index(n) for n in a.batch + (a.key_index, a.dot_index)])
        vc = v.permute([a.value_indices.index(n) for n in a.batch + (a.key_index, a.feature)])
        wide = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        qc, kc, vc = qc.to(wide), kc.to(wide), vc.to(wide)
        scores = qc @ kc.transpose(-1, -2)
        if a.scale is ScaleKind.MULTIPLY:
            scores = scores * saved.scale
        elif a.scale is ScaleKind.DIVIDE:
            scores = scores / saved.scale
        rows, keys = scores.shape[-2:]
        extents = dict(zip(a.batch, saved.batch_shape), **{a.row: rows, a.key_index: keys})
        for term in a.terms:
            scores = scores + _term_values(term, given, full, extents, q).to(scores)
        offset = torch.arange(keys, device=q.device)[None, :] - \
            torch.arange(rows, device=q.device)[:, None]
        terms = saved.terms
        seen = (offset >= terms.lower) & (offset <= terms.upper)
        # (every key seen: decided from the bounds, not read back from the device)
        if terms.lower > 1 - rows or terms.upper < keys - 1:
            scores = torch.where(seen, scores, torch.tensor(-torch.inf, dtype=scores.dtype,
                                                            device=scores.device))
        # the shift's gradient is exactly zero in the statements (autodiff/shift.py: a
        # normalised softmax does not depend on it), so it gets none here either: with
        # it, an inf in a row's dS would reach the row's maximum as NaN
        weights = torch.exp(scores - scores.amax(-1, keepdim=True).detach())
        out = (weights @ vc) / weights.sum(-1, keepdim=True)
        order = a.batch + (a.row, a.feature)
        out = out.permute([order.index(n) for n in a.output_indices])
        chosen = [t for t, w in zip(inputs, wanted) if w]
        found = iter(torch.autograd.grad(out, chosen, grad.to(out.dtype),
                                         create_graph=create))
    return tuple(next(found) if w else None for w in wanted)


def _term_values(term, given, full, extents, query):
    """A term's values broadcast over (batch..., i, j), differentiable in its tensor."""
    import torch
    if isinstance(term, TensorTerm):
        tensor = as_tensor(given[term.tensor], query) if not isinstance(
            given[term.tensor], torch.Tensor) else given[term.tensor]
        moved = tensor.permute([term.indices.index(n) for n in full if n in term.indices])
        shaped = moved.reshape([extents[n] if n in term.indices else 1 for n in full])
        return shaped * term.sign
    c = term.coefficient
    batch = full[:-2]
    if c.tensor is not None:
        tensor = given[c.tensor]
        tensor = tensor if isinstance(tensor, torch.Tensor) else as_tensor(tensor, query)
        coefficient = tensor.permute([c.indices.index(n) for n in batch if n in c.indices])
        coefficient = coefficient.reshape([extents[n] if n in c.indices else 1
                                           for n in batch])
    elif c.param is not None:
        value = given[c.param]
        coefficient = value if isinstance(value, torch.Tensor) else \
            torch.tensor(float(value), dtype=query.dtype, device=query.device)
    else:
        coefficient = torch.tensor(1.0, dtype=query.dtype, device=query.device)
    i = torch.arange(extents[full[-2]], device=query.device)[:, None]
    j = torch.arange(extents[full[-1]], device=query.device)[None, :]
    index = (term.key * j + term.row * i + term.constant).to(query.dtype)
    return (coefficient * c.value)[..., None, None] * index


def record(attention, named, scale: float, route, wanted: Tuple[str, ...]):
    """The forward of a call autograd records: (its output, the :class:`Saved` for its
    backward), or None where the kernel declines the call or a row sees no key (the
    statements record: their NaN and its gradient, as on the C route).  A value holding
    inf or NaN is the kernel's (its result is the statements'); the kernel's flags say
    so to the backward, which then takes the statements' formula (nothing is read on
    the host here)."""
    from . import attention as triton_attention
    if not _every_row_sees_a_key(attention, named):
        return None
    kept: list = []
    out = triton_attention.run(attention, named, lambda query: scale, route, lse=kept)
    if out is None or not kept:
        return None
    lse, views, terms, flags = kept
    score_scale = triton_attention.folded_scale(attention, scale)
    query = named[attention.query]
    batch_shape = tuple(query.shape[attention.query_indices.index(b)]
                        for b in attention.batch)
    from .backend import interpreted
    return out, Saved(attention, scale, score_scale, views, lse, terms, batch_shape,
                      wanted, interpreted(), flags)


def _every_row_sees_a_key(attention, named) -> bool:
    """Whether the band leaves every row a key (from the extents and bounds alone)."""
    from ...rewrite.attention_layout import call_band
    query, key = named.get(attention.query), named.get(attention.key)
    rows = query.shape[attention.query_indices.index(attention.row)]
    keys = key.shape[attention.key_indices.index(attention.key_index)]
    band = call_band(attention, named, {attention.row: rows, attention.key_index: keys})
    if band is None:
        return False
    lower, upper = band
    return lower <= upper and upper >= 0 and rows - 1 + lower <= keys - 1
