"""The scores' additive terms and bands (rewrite/attention_scores.py) as the fused Triton
attention kernel takes them (backends/triton/attention_kernel.py): every term read in
the kernel through strides, nothing copied, computed or read back on the host, so a call
stays one launch.

* a tensor term ``sign * t[...]`` over (batch..., i, j) is its tensor with four strides
  (the two batch axes of the launch grid, the row, the key; 0 along the axes it is
  broadcast over) and the factor ``sign * log2(e)`` (the kernel's scores are in the log2
  domain);
* an index term ``c * (a*j + b*i + k)`` is (a, b, k) and its coefficient: a tensor over
  batch indices (or a 0-d tensor) read per batch element with two strides, or a number
  folded into the factor;
* the band ``lower <= j - i <= upper`` is two integers; a side the extents never reach
  is passed as ``UNBOUNDED``, and no band at all compiles the kernel without one.

Up to ``MAX_TERMS`` terms of each kind; anything the kernel does not take is a reason
(:func:`resolve` returns a string), and the statements run."""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Dict, Optional, Tuple, Union

import numpy as np

from ...rewrite.attention_layout import call_band
from ...rewrite.attention_scores import IndexTerm, TensorTerm

MAX_TERMS = 2            # of each kind (tensor, index): the kernel's argument slots
UNBOUNDED = 2 ** 30      # a band's side no row reaches
_INT32_MAX = 2 ** 31 - 1
_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class KernelTerms:
    """A call's terms and band as the kernel's arguments and constants."""
    tensor_args: Tuple          # (T, s1, s2, si, sj, factor) per slot, flattened
    index_args: Tuple           # (X, s1, s2, factor, a, b, k) per slot, flattened
    tensor_count: int
    index_count: int
    loads: Tuple[bool, bool]    # whether each index slot reads its coefficient tensor
    banded: bool
    lower: int
    upper: int

    @property
    def constants(self) -> Dict[str, object]:
        return dict(BANDED=self.banded, TENSOR_TERMS=self.tensor_count,
                    INDEX_TERMS=self.index_count, X0_LOADS=self.loads[0],
                    X1_LOADS=self.loads[1])

    @property
    def signature(self) -> Tuple:
        """What selects a compiled kernel (the launcher cache's key)."""
        return (self.banded, self.tensor_count, self.index_count, self.loads)


def plain_terms(mask: int) -> KernelTerms:
    """No terms; ``mask`` 0 none, 1 ``j <= i``, 2 ``j < i`` (the plain scores)."""
    found = _PLAIN.get(mask)
    if found is None:
        upper = {0: UNBOUNDED, 1: 0, 2: -1}[mask]
        found = _PLAIN[mask] = _assembled([], [], mask != 0, -UNBOUNDED, upper)
    return found


_PLAIN: Dict[int, KernelTerms] = {}


def band_of(lower: int, upper: int, rows: int, keys: int) -> Tuple[bool, int, int]:
    """(banded, lower, upper) for the kernel from call_band's clamped bounds."""
    lower = -UNBOUNDED if lower <= -rows else lower
    upper = UNBOUNDED if upper >= keys else upper
    return (lower, upper) != (-UNBOUNDED, UNBOUNDED), lower, upper


def resolve(attention, named: Dict[str, object], query, extents: Dict[str, int],
            batch_axes: Tuple[Tuple[str, ...], Tuple[str, ...]]) -> Union[KernelTerms, str]:
    """The call's terms and band for the kernel, or the reason it does not take them.
    ``query`` is the call's query as a torch tensor (dtype and device); ``batch_axes``
    the batch indices merged into the launch grid's first and second axes.  Resolved
    once per signature (the terms' shapes, strides, dtypes and the numbers given):
    a repeated call only puts its tensors in their slots."""
    key = _signature(attention, named, query, extents, batch_axes)
    found = _resolutions.get(key) if key is not None else None
    if found is None:
        found = _resolved(attention, named, query, extents, batch_axes)
        if key is not None:
            if len(_resolutions) >= _RESOLUTIONS_KEPT:
                _resolutions.clear()
            _resolutions[key] = found
    if isinstance(found, str):
        return found
    return _bound(found, named, query)


_resolutions: dict = {}
_RESOLUTIONS_KEPT = 256


def _signature(attention, named, query, extents, batch_axes) -> Optional[Tuple]:
    """What a resolution depends on, or None where it is not to be kept (a value of
    another kind, a bound read from a tensor)."""
    import torch
    bounds = {p for b in attention.upper + attention.lower for p, _ in b.params}
    parts = [attention, query.dtype, query.device, tuple(sorted(extents.items())),
             batch_axes]
    for name in attention.term_tensors + attention.term_params:
        value = named.get(name)
        if isinstance(value, torch.Tensor) and name not in bounds:
            parts.append((value.shape, value.stride(), value.dtype, value.device))
        elif type(value) is np.ndarray and name not in bounds:
            parts.append((value.shape, value.strides, value.dtype))
        elif type(value) in (int, float) and value == value:
            parts.append((type(value), value))
        else:
            return None
    return tuple(parts)


def _bound(terms: KernelTerms, named, query) -> KernelTerms:
    """``terms`` with each slot that names a tensor holding this call's tensor."""
    def bind(args):
        return tuple(as_tensor(named[a], query) if type(a) is str else a for a in args)
    return dataclasses.replace(terms, tensor_args=bind(terms.tensor_args),
                               index_args=bind(terms.index_args))


def _resolved(attention, named, query, extents, batch_axes) -> Union[KernelTerms, str]:
    """resolve's answer, each tensor slot holding the name of its tensor."""
    band = call_band(attention, named, extents)
    if band is None:
        return "a band whose bound is not an integer"
    rows, keys = extents[attention.row], extents[attention.key_index]
    banded, lower, upper = band_of(band[0], band[1], rows, keys)
    tensors, indexed = [], []
    for term in attention.terms:
        if isinstance(term, TensorTerm):
            found = _tensor_term(attention, term, named, query, extents, batch_axes)
            if isinstance(found, str):
                return found
            tensors.append(found)
        else:
            found = _index_term(term, named, query, extents, batch_axes, rows, keys)
            if isinstance(found, str):
                return found
            indexed.append(found)
    if len(tensors) > MAX_TERMS or len(indexed) > MAX_TERMS:
        return (f"more than {MAX_TERMS} added tensors or {MAX_TERMS} index terms in the "
                "scores")
    return _assembled(tensors, indexed, banded, lower, upper)


def _assembled(tensors, indexed, banded, lower, upper) -> KernelTerms:
    """The kernel's arguments; an unused slot's pointer is None (the launch passes an
    operand there, which the kernel never reads)."""
    tensor_args, index_args, loads = [], [], []
    for slot in range(MAX_TERMS):
        tensor_args += list(tensors[slot]) if slot < len(tensors) else \
            [None, 0, 0, 0, 0, 0.0]
        if slot < len(indexed):
            loads.append(indexed[slot][0] is not None)
            index_args += list(indexed[slot])
        else:
            loads.append(False)
            index_args += [None, 0, 0, 0.0, 0, 0, 0]
    return KernelTerms(tuple(tensor_args), tuple(index_args), len(tensors), len(indexed),
                       tuple(loads), banded, lower, upper)


def as_tensor(value, query):
    """A term's array as a torch tensor on the query's device, or None: a NumPy array
    (a NumPy caller's) is wrapped without copying where it is on the CPU."""
    import torch
    if type(value) is np.ndarray:
        value = torch.from_numpy(value) if query.device.type == "cpu" else \
            torch.from_numpy(np.ascontiguousarray(value)).to(query.device)
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided or \
            value.is_nested or torch._C._functorch.is_functorch_wrapped_tensor(value):
        return None
    return value.detach()


def grid_strides(tensor, indices, batch_axes, extents):
    """The strides of ``tensor`` (axes ``indices``) along the launch grid's two batch
    axes (each a run of batch indices merged into one), 0 along those it lacks; None
    where a merged axis is not one stride of the tensor (it would need a copy)."""
    found = []
    for axes in batch_axes:
        stride, span = None, 1
        for name in reversed(axes):      # the last axis of the run moves fastest
            if extents[name] == 1:
                continue
            own = tensor.stride(indices.index(name)) if name in indices else 0
            if stride is None:
                stride = own
            elif own != stride * span:
                return None
            span *= extents[name]
        found.append(stride or 0)
    return tuple(found)


def _tensor_term(attention, term: TensorTerm, named, query, extents, batch_axes):
    tensor = as_tensor(named.get(term.tensor), query)
    reason = _operand_reason(tensor, term.tensor, term.indices, query, extents)
    if reason:
        return reason
    strides = grid_strides(tensor, term.indices, batch_axes, extents)
    if strides is None:
        return f"the added tensor {term.tensor}, whose batch axes do not merge"
    inner = [tensor.stride(term.indices.index(n)) if n in term.indices else 0
             for n in (attention.row, attention.key_index)]
    if not _fits(tensor):
        return f"the added tensor {term.tensor}, whose offsets pass int32"
    return (term.tensor,) + strides + tuple(inner) + (term.sign * _LOG2E,)


def _index_term(term: IndexTerm, named, query, extents, batch_axes, rows, keys):
    if abs(term.key) * keys + abs(term.row) * rows + abs(term.constant) > _INT32_MAX:
        return "an index term whose values pass int32"
    coefficient = term.coefficient
    factor = coefficient.value * _LOG2E
    if coefficient.tensor is not None:
        tensor = as_tensor(named.get(coefficient.tensor), query)
        reason = _operand_reason(tensor, coefficient.tensor, coefficient.indices, query,
                                 extents)
        if reason:
            return reason
        strides = grid_strides(tensor, coefficient.indices, batch_axes, extents)
        if strides is None or not _fits(tensor):
            return f"the coefficient tensor {coefficient.tensor}, whose batch axes do " \
                "not merge"
        return (coefficient.tensor,) + strides + (factor, term.key, term.row, term.constant)
    if coefficient.param is not None:
        value = named.get(coefficient.param)
        tensor = as_tensor(value, query) if not isinstance(value, numbers.Real) else None
        if tensor is not None:
            if tensor.ndim != 0 or tensor.dtype != query.dtype or \
                    tensor.device != query.device:
                return f"the parameter {coefficient.param} (not a 0-d tensor of the " \
                    "query's dtype and device)"
            return (coefficient.param, 0, 0, factor, term.key, term.row, term.constant)
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or \
                not math.isfinite(float(value)) or \
                (isinstance(value, np.generic) and
                 np.result_type(value.dtype, _numpy_dtype(query)) != _numpy_dtype(query)):
            return f"the parameter {coefficient.param} (not a finite real number that " \
                "keeps the query's dtype)"
        factor *= float(value)
    return (None, 0, 0, factor, term.key, term.row, term.constant)


def _numpy_dtype(query):
    from ...analysis.frameworks import numpy_dtype
    return numpy_dtype(query)


def _operand_reason(tensor, name, indices, query, extents) -> Optional[str]:
    if tensor is None:
        return f"{name} (not a strided torch tensor or NumPy array)"
    if tensor.dtype != query.dtype or tensor.device != query.device:
        return f"{name} (not of the query's dtype and device)"
    if tensor.ndim != len(indices) or any(tensor.shape[n] != extents.get(name_, -1)
                                          for n, name_ in enumerate(indices)):
        return f"{name} (its shape is not the call's extents)"
    return None


def _fits(tensor) -> bool:
    return sum((e - 1) * abs(s) for e, s in zip(tensor.shape, tensor.stride())) <= _INT32_MAX
