"""A gradient's scatter-add whose positions form one strided view of the target
(plan/library_patterns.strided_view: pooling's ``dx[c, 2*i+a, 2*j+b] += v[c,i,j,a,b]``),
added in place: no position arrays, no ``np.add.at`` (which took 60 ms of a 64x128x128
max-pool backward that torch does in 5 ms).  :func:`target_view` is the fact the
schedule's rule reads (schedule/library.py, Library.STRIDED_ADD); :func:`add_to_view`
runs the kernel it chose: the C kernel (backends/c/strided_add.py) on NumPy arrays,
where it takes them, else a NumPy or torch window."""

from __future__ import annotations

from typing import Mapping, Optional, Tuple

from ..plan.library_patterns import strided_view  # noqa: F401  (the pattern: plan/)

View = Tuple[Tuple[int, ...], Tuple[int, ...], int]     # (shape, steps, offset) in elements


def target_view(target, g, values, ranges: Mapping[str, range]) -> Optional[View]:
    """The view of ``target`` (a NumPy array or torch tensor) that ``values`` add into
    at ``g``'s scatter positions, or None where they form none (or, for a NumPy
    target, where it is read-only, not C-contiguous or oddly strided)."""
    import numpy as np
    indices = g.spec.output_indices
    if isinstance(target, np.ndarray):
        if target.ndim == 0 or not target.flags.writeable:
            return None
        itemsize = target.itemsize
        if any(s % itemsize or s < 0 for s in target.strides):
            return None
        strides = [s // itemsize for s in target.strides]
    else:
        strides = list(target.stride())
    view = strided_view(target.shape, strides, g.scatter, indices, ranges)
    if view is None or tuple(values.shape) != view[0]:
        return None
    if isinstance(target, np.ndarray) and not target.flags.c_contiguous:
        return None
    return view


def add_to_view(target, view: View, values) -> None:
    """``target``'s ``view`` (from :func:`target_view`) plus ``values``, in place."""
    import numpy as np
    shape, steps, offset = view
    if isinstance(target, np.ndarray):
        from ..backends.c.strided_add import strided_add
        if strided_add(target, offset, shape, steps, values):
            return
        base = target.reshape(-1)[offset:]
        window = np.lib.stride_tricks.as_strided(
            base, shape, tuple(s * target.itemsize for s in steps), writeable=True)
        window += values.astype(target.dtype, copy=False)
    else:
        window = target.as_strided(shape, steps, target.storage_offset() + offset)
        window.add_(values.to(target.dtype))
