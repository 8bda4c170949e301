"""argmax / argmin on the NumPy reference: the position of the first extremum, row-major
over the reduced indices (in the order the reduction lists them), counted from each
index's range start, as ``np.argmax`` of the flattened values; NaN counts as the
extremum (the first NaN wins), as in NumPy.

The reference evaluates a reduction in blocks of its indices; each block gives its own
first extremum, and blocks are merged keeping the better value and, on equal values,
the smaller position (blocks of two indices interleave in row-major order)."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

PICK = {"argmax": np.argmax, "argmin": np.argmin}


def block_extremum(op: str, value: np.ndarray, axes: Sequence[int],
                   offsets: Sequence[int], extents: Sequence[int]):
    """(values, positions) of the first extremum of ``value`` over ``axes`` (listed in
    the reduction's index order), with the reduced axes kept as length 1.  ``offsets``
    are the block's starts along those indices relative to their ranges, ``extents``
    the ranges' full lengths (for the row-major position)."""
    moved = np.moveaxis(value, list(axes), list(range(-len(axes), 0)))
    block_shape = moved.shape[-len(axes):]
    flat = moved.reshape(moved.shape[:-len(axes)] + (-1,))
    local = PICK[op](flat, axis=-1)
    best = np.take_along_axis(flat, local[..., None], axis=-1)[..., 0]
    position = np.zeros(local.shape, dtype=np.int64)
    for offset, index, extent in zip(offsets, np.unravel_index(local, block_shape), extents):
        position = position * extent + (index + offset)
    keep = sorted(axes)
    return np.expand_dims(best, keep), np.expand_dims(position, keep)


def merge(op: str, running: Optional[Tuple[np.ndarray, np.ndarray]],
          part: Tuple[np.ndarray, np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """The first extremum of two blocks' (values, positions)."""
    if running is None:
        return part
    (old, old_pos), (new, new_pos) = running, part
    with np.errstate(invalid="ignore"):
        old_nan, new_nan = old != old, new != new
        beats = (new > old) if op == "argmax" else (new < old)
        earlier = new_pos < old_pos
        better = (~old_nan & (new_nan | beats | ((new == old) & earlier))) | \
            (old_nan & new_nan & earlier)
    return np.where(better, new, old), np.where(better, new_pos, old_pos)
