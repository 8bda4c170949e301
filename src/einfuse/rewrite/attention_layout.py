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
from .online_softmax import Attention, MaskKind, ScaleKind


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@dataclasses.dataclass(frozen=True)
class Canonical:
    """A call's arrays in the kernel's layout: query (G, NQ, D), key (G, NK, D), value
    (G, NK, E); the batch extents (in the output's batch order) and the scale."""
    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    batch_shape: Tuple[int, ...]
    scale: float


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
    shaped = [to_canonical(array, indices, order, len(batch))
              for array, (order, indices) in zip(arrays, operand_layouts(attention))]
    return Canonical(*shaped, tuple(extents[b] for b in batch), scale)


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
MASK_MODES = {MaskKind.NONE: 0, MaskKind.CAUSAL: 1, MaskKind.STRICT_CAUSAL: 2}
