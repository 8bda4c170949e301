"""A gradient's scatter-add whose positions are affine in the gradient's indices and
never collide -- pooling's ``dx[c, 2*i+a, 2*j+b] += v[c,i,j,a,b]`` with ``a, b`` in
``range(2)``, a strided convolution's input gradient with its stride at least its
kernel -- is one strided view of the target, added in place: no position arrays, no
``np.add.at`` (which took 60 ms of a 64x128x128 max-pool backward that torch does in
5 ms).

Decided from the index expressions and ranges alone (nothing is read from the data):
every scatter subscript affine with non-negative coefficients and no gathers; every
position in bounds, from each subscript's smallest and largest value; and no two
points on one address, by the mixed-radix test on the view's strides (sorted, each at
least the span of the smaller ones plus one)."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Tuple


def strided_view(target_shape: Sequence[int], target_strides: Sequence[int],
                 scatter, indices: Sequence[str], ranges: Mapping[str, range]
                 ) -> Optional[Tuple[Tuple[int, ...], Tuple[int, ...], int]]:
    """(shape, strides, offset), in elements, of the view of the target that the values
    (axes ``indices``) add into, or None where the scatter is not such a view."""
    if len(scatter) != len(target_shape):
        return None
    strides = {name: 0 for name in indices}
    offset = 0
    for sub, extent, step in zip(scatter, target_shape, target_strides):
        if sub.gathers or getattr(sub, "quasi", ()):
            return None
        low = high = sub.constant
        for name, coefficient in sub.terms:
            rng = ranges.get(name)
            if name not in strides or coefficient < 0 or rng is None or rng.step != 1:
                return None
            if len(rng) == 0:
                return None
            low += coefficient * rng.start
            high += coefficient * (rng.stop - 1)
            strides[name] += coefficient * step
        if low < 0 or high >= extent:
            return None
        offset += low * step
    shape = tuple(len(ranges[name]) for name in indices)
    # each index starts at its range's start: the offset already counts it
    spans = sorted((strides[name], len(ranges[name])) for name in indices
                   if len(ranges[name]) > 1)
    covered = 0
    for stride, count in spans:
        if stride <= covered:
            return None
        covered += stride * (count - 1)
    return shape, tuple(strides[name] for name in indices), offset


def add_strided(target, g, values, ranges: Mapping[str, range]) -> bool:
    """``target`` (a NumPy array or torch tensor) plus ``values`` at ``g``'s scatter
    positions, in place, when they form a strided view; False (nothing done) else."""
    import numpy as np
    indices = g.spec.output_indices
    if isinstance(target, np.ndarray):
        if target.ndim == 0 or not target.flags.writeable:
            return False
        itemsize = target.itemsize
        if any(s % itemsize or s < 0 for s in target.strides):
            return False
        strides = [s // itemsize for s in target.strides]
    else:
        strides = list(target.stride())
    view = strided_view(target.shape, strides, g.scatter, indices, ranges)
    if view is None or tuple(values.shape) != view[0]:
        return False
    shape, steps, offset = view
    if isinstance(target, np.ndarray):
        if not target.flags.c_contiguous:
            return False
        from ..backends.c.strided_add import strided_add
        if strided_add(target, offset, shape, steps, values):
            return True
        base = target.reshape(-1)[offset:]
        window = np.lib.stride_tricks.as_strided(
            base, shape, tuple(s * target.itemsize for s in steps), writeable=True)
        window += values.astype(target.dtype, copy=False)
    else:
        window = target.as_strided(shape, steps, target.storage_offset() + offset)
        window.add_(values.to(target.dtype))
    return True
