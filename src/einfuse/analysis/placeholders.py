"""Placeholder arrays for ``shapes=``: arrays of the given shapes whose contents are never
read, so that a call can be bound (ranges, dtypes, the plan) without the user's data."""

from __future__ import annotations

import math
import numbers
from typing import Dict, Tuple

import numpy as np

from ..errors import ShapeError
from .options import shown
from .spec import Spec


# Above this, placeholder arrays are zero-stride broadcasts (no memory at all) and the plan
# is the one for that layout; below it they are uninitialised C-contiguous arrays, which
# the OS maps lazily, so the plan sees real strides.
_PLACEHOLDER_BYTES = 1 << 30


def statement_placeholders(spec: Spec, shapes: Dict[str, tuple]) -> Dict[str, np.ndarray]:
    """Arrays of the given shapes (float32 values, int64 index arrays) for binding ranges,
    dtypes and the plan; their contents are never read."""
    result = {}
    names = {t.name: t for t in spec.tensors}
    for name, shape in shapes.items():
        if name not in names and name != spec.output:
            raise ShapeError(f"shapes= names {name!r}, which is not a tensor of the statement")
        info = names.get(name)
        dtype = np.dtype(np.int64 if info is not None and info.as_index else np.float32)
        shape = checked_shape(name, shape, dtype.itemsize)
        if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize <= _PLACEHOLDER_BYTES:
            result[name] = np.empty(shape, dtype)
        else:
            result[name] = np.broadcast_to(np.zeros((), dtype=dtype), shape)
    for name in spec.params:
        result.setdefault(name, 1.0)
    return result


def checked_shape(name, shape, itemsize: int = 1) -> Tuple[int, ...]:
    """An entry of ``shapes=`` as a tuple of ints: non-negative, their product (times
    ``itemsize``, its bytes) within int64 (what an array can hold); a ShapeError naming
    the array otherwise."""
    extents = None
    if not isinstance(shape, (str, bytes)):
        try:
            extents = tuple(shape)
        except TypeError:
            pass
    if extents is None or not all(isinstance(e, numbers.Integral) and
                                  not isinstance(e, (bool, np.bool_)) and e >= 0
                                  for e in extents):
        raise ShapeError(f"shapes= gives {name} the shape {shown(shape)}; a shape is a "
                         "tuple of non-negative ints, such as (100, 50)")
    extents = tuple(int(e) for e in extents)
    if math.prod(extents) * itemsize > np.iinfo(np.int64).max:
        raise ShapeError(f"shapes= gives {name} the shape {extents}: "
                         f"{math.prod(extents):,} elements of {itemsize} bytes, more than "
                         "an array can hold")
    return extents


# Placeholder arrays (never read) up to this size are real allocations; larger ones are
# broadcast views of one zero, so explaining a huge program allocates nothing.
_PROGRAM_REAL_BYTES = 1 << 24


def program_placeholder(shape, dtype) -> np.ndarray:
    """A program's placeholder: zeros, or a broadcast view of one zero when large."""
    shape, dtype = tuple(int(s) for s in shape), np.dtype(dtype)
    if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize <= _PROGRAM_REAL_BYTES:
        return np.zeros(shape, dtype)
    return np.broadcast_to(np.zeros((), dtype), shape)


def program_placeholders(program, shapes) -> Dict[str, np.ndarray]:
    """shapes= as arrays: int64 for names some statement uses as an index array or
    computes an index array from (``J[b] := idx[b] + 1`` before ``T[J[b], d]``), float32
    otherwise."""
    index_names = {t.name for s in program.statements for t in s.kernel.spec.tensors
                   if t.as_index}
    for statement in reversed(program.statements):   # a definition precedes its reads
        if statement.assign == ":=" and statement.output in index_names:
            index_names |= {t.name for t in statement.kernel.spec.tensors}
    values = {}
    for name, shape in shapes.items():
        if name not in program.inputs:
            raise ShapeError(f"shapes= names {name!r}, which is not an input of the program "
                             f"(its inputs are {', '.join(program.inputs)})")
        dtype = np.dtype(np.int64 if name in index_names else np.float32)
        values[name] = program_placeholder(checked_shape(name, shape, dtype.itemsize), dtype)
    return values
