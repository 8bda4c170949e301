"""Running a recognised attention pattern's hand-written kernels, the pieces the fused
path (attention.py) and the recorded one (attention_autograd.py) share: torch inputs
as the kernels take them, the Triton call's scale, the C kernel's call."""

from __future__ import annotations

import ctypes
from typing import Dict, Optional

import numpy as np

from ..analysis.frameworks import to_numpy
from ..errors import AllocationError
from ..rewrite.attention_layout import SCALE_MODES, Canonical, call_scale
from ..rewrite.attention_scores import IndexTerm, TensorTerm
from ..rewrite.online_softmax import Attention


def torch_inputs(attention: Attention, named: Dict[str, object]) -> Optional[Dict[str, object]]:
    """``named`` with the query, key, value and the scores' term tensors as NumPy views
    of CPU torch tensors (and a 0-d tensor scale or term parameter as a number), or
    None: a tensor on a device, or one autograd must record (its gradient needs the
    statements), runs the statements one by one."""
    import torch
    views = dict(named)
    recording = torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    for name in (attention.query, attention.key, attention.value) + attention.term_tensors:
        tensor = named.get(name)
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu" or \
                tensor.layout != torch.strided or tensor.is_nested or \
                torch._C._functorch.is_functorch_wrapped_tensor(tensor) or \
                tensor.dtype not in (torch.float32, torch.float64) or \
                (recording and tensor.requires_grad):
            return None     # (sparse, nested, torch.func: the statements say why not)
        views[name] = to_numpy(tensor)      # (a negative-bit view: its values)
    scalars = ((attention.scale_param,) if attention.scale_param else ()) + \
        attention.term_params
    for name in scalars:
        scale = named.get(name)
        if isinstance(scale, torch.Tensor):
            if scale.ndim != 0 or scale.device.type != "cpu" or (recording and
                                                                   scale.requires_grad) \
                    or scale.dtype != named[attention.query].dtype:
                return None
            views[name] = scale.item()
    return views


def triton_scale(attention: Attention, named: Dict[str, object], query) -> Optional[float]:
    """call_scale for a torch query: a 0-d tensor scale of the query's dtype is read as
    a number (autograd does not record it: recording calls never get here)."""
    import torch
    from ..analysis.frameworks import numpy_dtype
    value = named.get(attention.scale_param) if attention.scale_param else None
    if isinstance(value, torch.Tensor):
        if value.ndim != 0 or value.dtype != query.dtype:
            return None
        named = {**named, attention.scale_param: value.item()}
    return call_scale(attention, named, numpy_dtype(query))


def run_c(attention: Attention, arrays: Canonical, threads: int,
           lse: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
    """The output in canonical layout, or None for a value with inf or NaN; ``lse``
    (G, NQ), when given, receives each row's log-sum-exp of its scores."""
    from ..backends.c import attention as c_attention     # (built on first use)
    q, k, v = arrays.query, arrays.key, arrays.value
    attend, finite = c_attention.functions(q.dtype)
    if not finite(v.ctypes.data, v.size, threads):
        return None
    groups, rows, dot = q.shape
    keys, features = v.shape[1], v.shape[2]
    out = np.empty((groups, rows, features), q.dtype)
    terms = term_arguments(arrays)
    failed = attend(q.ctypes.data, k.ctypes.data, v.ctypes.data, out.ctypes.data,
                    None if lse is None else lse.ctypes.data, groups,
                    rows, keys, dot, features, arrays.scale, SCALE_MODES[attention.scale],
                    arrays.lower, arrays.upper, int(attention.normalised), threads,
                    *terms.pointers)
    if failed:
        raise AllocationError("the attention kernel could not allocate its per-thread "
                              "blocks")
    return out


class TermArguments:
    """The scores' terms as the C kernels take them (backends/c/attention_terms.TERMS): the
    count, the data pointers, the batch offsets (nterms, G), the info (nterms, 7) and
    whether blocks a term hides may be skipped; the arrays kept alive while the call
    runs."""

    def __init__(self, arrays: Canonical):
        terms = arrays.terms
        groups = arrays.query.shape[0]
        self.data = (ctypes.c_void_p * max(1, len(terms)))(
            *[t.data.ctypes.data for t in terms])
        self.offsets = np.ascontiguousarray(
            np.stack([t.offsets for t in terms]) if terms else np.zeros((1, groups)),
            np.int64)
        self.info = np.ascontiguousarray([t.info() for t in terms] or [[0] * 7], np.int64)
        self.keep = [t.data for t in terms]
        self.skip_hidden = int(arrays.skip_hidden)
        # (addresses of the arrays above, which this object keeps alive)
        self.pointers = (len(self.keep), ctypes.cast(self.data, ctypes.c_void_p),
                         self.offsets.ctypes.data, self.info.ctypes.data,
                         self.skip_hidden)


# the arguments of scores without terms, by batch size: the same on every such call
_NO_TERMS: Dict[int, TermArguments] = {}


def term_arguments(arrays: Canonical) -> TermArguments:
    if arrays.terms:
        return TermArguments(arrays)
    groups = arrays.query.shape[0]
    found = _NO_TERMS.get(groups)
    if found is None:
        if len(_NO_TERMS) >= 64:
            _NO_TERMS.clear()
        found = _NO_TERMS[groups] = TermArguments(arrays)
    return found


class TermGradientSlices:
    """Where the backward kernel adds the gradient of each term that wants one
    (backends/c/attention_grad.ef_term_gradients): a zeroed buffer per such term -- (G,
    NQ or 1, NK or 1) for an added tensor, (G,) for an index term's coefficient --
    one slice per batch element, so each slice is written by one thread in a fixed
    order; and the info (sign, row stride, key stride, slice size, a, b, k, kind) per
    term.  ``gradients`` sums the slices over the batch axes a tensor lacks (NumPy, one
    thread: the same bits for every thread count of the kernel) and puts the axes in
    the tensor's own order."""

    def __init__(self, attention: Attention, arrays: Canonical, wanted):
        self.attention, self.batch_shape = attention, arrays.batch_shape
        groups, rows = arrays.query.shape[:2]
        keys = arrays.key.shape[1]
        dtype = arrays.query.dtype
        self.buffers = []         # (term, buffer) per term whose gradient is wanted
        grads, info = [], []
        for term in attention.terms:
            buffer, fields = None, (0,) * 8
            if isinstance(term, TensorTerm) and term.tensor in wanted:
                has_row = attention.row in term.indices
                has_key = attention.key_index in term.indices
                buffer = np.zeros((groups, rows if has_row else 1, keys if has_key else 1),
                                  dtype)
                fields = (term.sign, buffer.shape[2] if has_row else 0, int(has_key),
                          buffer.shape[1] * buffer.shape[2], 0, 0, 0, 0)
            elif isinstance(term, IndexTerm) and term_coefficient_name(term) in wanted:
                buffer = np.zeros(groups, dtype)
                fields = (1, 0, 0, 1, term.key, term.row, term.constant, 1)
            if buffer is not None:
                self.buffers.append((term, buffer))
            grads.append(buffer)
            info.append(fields)
        self.grads = (ctypes.c_void_p * max(1, len(grads)))(
            *[None if b is None else b.ctypes.data for b in grads])
        self.info = np.ascontiguousarray(info or [(0,) * 8], np.int64)

    @property
    def pointers(self):
        if not self.buffers:
            return (None, None)
        return (ctypes.cast(self.grads, ctypes.c_void_p), self.info.ctypes.data)

    def gradients(self) -> Dict[str, np.ndarray]:
        found: Dict[str, np.ndarray] = {}
        for term, buffer in self.buffers:
            if isinstance(term, TensorTerm):
                name, grad = term.tensor, self._tensor_gradient(term, buffer)
            else:
                name, grad = term_coefficient_name(term), self._coefficient_gradient(term,
                                                                                 buffer)
            found[name] = grad if name not in found else found[name] + grad
        return found

    def _tensor_gradient(self, term: TensorTerm, buffer: np.ndarray) -> np.ndarray:
        a = self.attention
        shaped = buffer.reshape(tuple(self.batch_shape) + buffer.shape[1:])
        kept = [b for b in a.batch if b in term.indices]
        summed = tuple(n for n, b in enumerate(a.batch) if b not in term.indices)
        if summed:
            shaped = shaped.sum(axis=summed)
        dropped = tuple(len(kept) + n for n, name in enumerate((a.row, a.key_index))
                        if name not in term.indices)
        shaped = shaped.reshape([e for n, e in enumerate(shaped.shape) if n not in dropped])
        order = [name for name in kept + [a.row, a.key_index] if name in term.indices]
        return np.ascontiguousarray(shaped.transpose([order.index(n)
                                                      for n in term.indices]))

    def _coefficient_gradient(self, term: IndexTerm, buffer: np.ndarray) -> np.ndarray:
        """d/d c of value * c * (a j + b i + k), c the coefficient tensor or parameter."""
        a, coefficient = self.attention, term.coefficient
        shaped = buffer.reshape(self.batch_shape)
        indices = coefficient.indices if coefficient.tensor is not None else ()
        summed = tuple(n for n, b in enumerate(a.batch) if b not in indices)
        if summed:
            shaped = shaped.sum(axis=summed)
        order = [b for b in a.batch if b in indices]
        shaped = np.asarray(shaped).transpose([order.index(n) for n in indices])
        # (np.array keeps a 0-d result 0-d, as a 0-d parameter's gradient must be)
        return np.array(shaped * buffer.dtype.type(coefficient.value), buffer.dtype)


def term_coefficient_name(term: IndexTerm) -> Optional[str]:
    """The tensor or parameter an index term's coefficient reads, or None (a constant)."""
    return term.coefficient.tensor or term.coefficient.param


def term_gradient_slices(attention: Attention, arrays: Canonical,
                         wanted) -> TermGradientSlices:
    return TermGradientSlices(attention, arrays, wanted)
