"""The layout of a recognised attention pattern (rewrite/online_softmax.py's Attention):
its canonical operand order ([batch..., row, feature]), the extents a call binds, the
scale a call passes, and the modes the hand-written kernels take.  Facts the kernels
(backends/c/attention.py, triton_attention.py) and the runtime read alike."""

from __future__ import annotations

import dataclasses
import numbers
from typing import Dict, Optional, Tuple

import numpy as np

from ..analysis.options import INT64_MAX
from .attention_scores import TensorTerm
from .online_softmax import Attention, ScaleKind


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@dataclasses.dataclass(frozen=True)
class CallTerm:
    """One additive term of the scores for a call, as the kernels read it: the value
    at (g, i, j) is ``sign * data[offsets[g] + row_stride * i + key_stride * j]`` for a
    tensor (``kind`` 0; strides in elements, 0 where it is broadcast), and
    ``data[offsets[g]] * (a j + b i + k)`` for an index term (``kind`` 1)."""
    kind: int
    data: np.ndarray          # the tensor itself (a view), or the G coefficients
    offsets: np.ndarray       # (G,) int64
    sign: int = 1
    row_stride: int = 0
    key_stride: int = 0
    affine: Tuple[int, int, int] = (0, 0, 0)
    view: Optional[np.ndarray] = None    # a tensor's broadcast view (batch..., NQ, NK)

    def info(self) -> Tuple[int, ...]:
        return (self.kind, self.sign, self.row_stride, self.key_stride) + self.affine

    def block(self, j0: int, j1: int, rows: int) -> np.ndarray:
        """The term's values for keys j0..j1-1, (G, NQ, j1 - j0)."""
        if self.kind == 0:
            part = self.view[..., j0:j1]
            block = part.reshape((-1,) + part.shape[-2:])
            return -block if self.sign < 0 else block
        a, b, k = self.affine
        index = (a * np.arange(j0, j1)[None, :] + b * np.arange(rows)[:, None] + k)
        coefficients = self.data[self.offsets]
        return coefficients[:, None, None] * index.astype(self.data.dtype)[None]


@dataclasses.dataclass(frozen=True)
class Canonical:
    """A call's arrays in the kernel's layout: query (G, NQ, D), key (G, NK, D), value
    (G, NK, E); the batch extents (in the output's batch order) and the scale; the band
    ``lower <= j - i <= upper`` of keys each row sees and the scores' terms."""
    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    batch_shape: Tuple[int, ...]
    scale: float
    lower: int = 0
    upper: int = 0
    terms: Tuple[CallTerm, ...] = ()
    # whether the kernels may skip a block where an added tensor is all -inf (they check
    # that no other part of the block's scores can be +inf or NaN: hidden_blocks_skippable)
    skip_hidden: bool = False


def float_extents(attention: Attention, arrays) -> Optional[Dict[str, int]]:
    """Each index's extent, or None unless the three arrays are NumPy arrays of one
    float dtype whose extents agree and are not zero (only their shapes are read)."""
    if not all(type(a) is np.ndarray for a in arrays):
        return None
    dtype = arrays[0].dtype
    if dtype not in _FLOATS or any(a.dtype != dtype for a in arrays):
        return None
    return shape_extents(attention, arrays)


def shape_extents(attention: Attention, arrays) -> Optional[Dict[str, int]]:
    """Each index's extent from the shapes of query, key and value (any framework's
    arrays), or None where a rank or two extents of one index disagree, or one is 0."""
    extents: Dict[str, int] = {}
    for array, indices in zip(arrays, (attention.query_indices, attention.key_indices,
                                       attention.value_indices)):
        if array.ndim != len(indices):
            return None
        for index, extent in zip(indices, array.shape):
            if extents.setdefault(index, extent) != extent:
                return None
    if any(extent == 0 for extent in extents.values()):
        return None
    return extents


def canonical(attention: Attention, named: Dict[str, object]) -> Optional[Canonical]:
    """The call's arrays in canonical layout, or None when the call must run statement
    by statement."""
    arrays = [named.get(name) for name in (attention.query, attention.key, attention.value)]
    extents = float_extents(attention, arrays)
    if extents is None:
        return None
    scale = call_scale(attention, named, arrays[0].dtype)
    if scale is None:
        return None
    batch = attention.batch
    batch_shape = tuple(extents[b] for b in batch)
    band = call_band(attention, named, extents)
    terms = call_terms(attention, named, extents, arrays[0].dtype)
    if band is None or terms is None:
        return None
    shaped = [to_canonical(array, indices, order, len(batch))
              for array, (order, indices) in zip(arrays, operand_layouts(attention))]
    skip = hidden_blocks_skippable(terms)
    return Canonical(*shaped, batch_shape, scale, band[0], band[1], terms, skip)


def hidden_blocks_skippable(terms) -> bool:
    """Whether the kernels may look for blocks an added tensor term hides (-inf at every
    row and key of the block) and skip them: where some tensor term is added.  Whether
    the block's scores are then -inf as the statements compute them (no part of a score
    +inf or NaN) the kernels decide block by block from the block's own query and key
    rows and terms (backends/c/attention.ef_block_bounded), so the call reads none of
    its arrays for it: the global maxima of Q, K and a bias[h,i,j] that this took were
    0.5 ms of a 2x4x512x64 bias forward's 7.8."""
    return any(t.kind == 0 and t.sign > 0 for t in terms)


def call_band(attention: Attention, named: Dict[str, object],
              extents: Dict[str, int]) -> Optional[Tuple[int, int]]:
    """(lower, upper): row i sees the keys j with lower <= j - i <= upper, clamped to
    what the extents allow; None where a bound's parameter is not an integer."""
    rows, keys = extents[attention.row], extents[attention.key_index]
    lower, upper = -rows, keys           # no bound: every key
    for bound in attention.lower:
        value = bound.value(named)
        if value is None:
            return None
        lower = max(lower, value)
    for bound in attention.upper:
        value = bound.value(named)
        if value is None:
            return None
        upper = min(upper, value)
    return min(max(lower, -rows), keys), max(min(upper, keys), -rows)


def call_terms(attention: Attention, named: Dict[str, object], extents: Dict[str, int],
               dtype: np.dtype) -> Optional[Tuple[CallTerm, ...]]:
    """The scores' terms for a call, or None where one is not a NumPy array of the
    working dtype with the extents of the query, key and value (or its scalar is not
    a real number that keeps the dtype): the statements then judge the call."""
    if not attention.terms:
        return ()       # (the plain scores: nothing to resolve, on every call)
    batch = attention.batch
    batch_shape = tuple(extents[b] for b in batch)
    full = batch + (attention.row, attention.key_index)
    groups = int(np.prod(batch_shape, dtype=np.int64))
    found = []
    for term in attention.terms:
        if isinstance(term, TensorTerm):
            view = _broadcast(named.get(term.tensor), term.indices, full, extents, dtype)
            if view is None:
                return None
            strides = [s // dtype.itemsize for s in view.strides]
            found.append(CallTerm(0, view, _offsets(batch_shape, strides[:len(batch)]),
                                  term.sign, strides[-2], strides[-1], view=view))
            continue
        coefficient = term.coefficient
        if coefficient.tensor is not None:
            view = _broadcast(named.get(coefficient.tensor), coefficient.indices, batch,
                              extents, dtype)
            if view is None:
                return None
            values = np.ascontiguousarray(view).reshape(groups)
        else:
            value = 1.0
            if coefficient.param is not None:
                value = _real(named.get(coefficient.param), dtype)
                if value is None:
                    return None
            values = np.full(groups, value, dtype)
        if coefficient.value != 1.0:
            values = (values * dtype.type(coefficient.value)).astype(dtype)
        found.append(CallTerm(1, np.ascontiguousarray(values, dtype),
                              np.arange(groups, dtype=np.int64),
                              affine=(term.key, term.row, term.constant)))
    return tuple(found)


def _broadcast(array, indices, order, extents: Dict[str, int],
               dtype: np.dtype) -> Optional[np.ndarray]:
    """``array`` (axes named ``indices``) as a view with the axes ``order``, broadcast
    where it lacks one; None unless it is a NumPy array of ``dtype`` whose extents are
    the call's and whose strides are whole elements."""
    if type(array) is not np.ndarray or array.dtype != dtype or \
            array.ndim != len(indices) or \
            any(array.shape[n] != extents[name] for n, name in enumerate(indices)) or \
            any(s % dtype.itemsize for s in array.strides):
        return None
    moved = array.transpose([indices.index(n) for n in order if n in indices])
    shape = tuple(extents[n] if n in indices else 1 for n in order)
    return np.broadcast_to(moved.reshape(shape), tuple(extents[n] for n in order))


def _offsets(batch_shape, strides) -> np.ndarray:
    """Each batch element's offset (elements) for these strides of the batch axes."""
    offsets = np.zeros(batch_shape or (), np.int64)
    for axis, stride in enumerate(strides):
        shape = [1] * len(batch_shape)
        shape[axis] = batch_shape[axis]
        offsets = offsets + np.arange(batch_shape[axis], dtype=np.int64).reshape(shape) * \
            stride
    return np.ascontiguousarray(offsets, np.int64).reshape(-1)


def _real(value, dtype: np.dtype) -> Optional[float]:
    """A scalar parameter as a float (call_scale's rules), or None."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return None
    if isinstance(value, numbers.Integral) and not -INT64_MAX <= int(value) <= INT64_MAX:
        return None
    if isinstance(value, np.generic) and np.result_type(value.dtype, dtype) != dtype:
        return None
    return float(value)


def call_scale(attention: Attention, named: Dict[str, object], dtype: np.dtype) -> Optional[float]:
    """The call's scale as a float (1.0 without one), or None where the statements must
    judge it: not a real number, an integer past int64, or a NumPy scalar whose dtype
    would change the result's (working ``dtype``)."""
    if attention.scale_param is None:
        return attention.scale_value if attention.scale_value is not None else 1.0
    value = named.get(attention.scale_param)
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return None
    if isinstance(value, numbers.Integral) and not -INT64_MAX <= int(value) <= INT64_MAX:
        return None     # the statements refuse it (programs run fused before binding)
    if isinstance(value, np.generic) and np.result_type(value.dtype, dtype) != dtype:
        return None     # a NumPy float64 scale makes the statements' result float64
    return float(value)


def operand_layouts(attention: Attention):
    """(canonical axis order, the call's own axis names) of the query, key and value."""
    batch, j = attention.batch, attention.key_index
    return ((batch + (attention.row, attention.dot_index), attention.query_indices),
            (batch + (j, attention.dot_index), attention.key_indices),
            (batch + (j, attention.feature), attention.value_indices))


def to_canonical(array: np.ndarray, indices, order, batch_rank: int) -> np.ndarray:
    """``array`` (axes named by ``indices``) with its axes in ``order``, the leading
    ``batch_rank`` of them flattened into one, C-contiguous."""
    moved = np.ascontiguousarray(array.transpose([indices.index(n) for n in order]))
    return moved.reshape((-1,) + moved.shape[batch_rank:])


def from_canonical(array: np.ndarray, batch_shape, order, indices) -> np.ndarray:
    """The inverse of :func:`to_canonical`: the batch axis unflattened into
    ``batch_shape``, the axes from ``order`` back to ``indices``, C-contiguous."""
    shaped = array.reshape(tuple(batch_shape) + array.shape[1:])
    return np.ascontiguousarray(shaped.transpose([order.index(n) for n in indices]))


def to_output(attention: Attention, arrays: Canonical, out: np.ndarray) -> np.ndarray:
    return from_canonical(out, arrays.batch_shape,
                          attention.batch + (attention.row, attention.feature),
                          attention.output_indices)


SCALE_MODES = {ScaleKind.NONE: 0, ScaleKind.MULTIPLY: 1, ScaleKind.DIVIDE: 2}
