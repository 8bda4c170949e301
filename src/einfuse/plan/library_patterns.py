"""The patterns of the hand-written library kernels, as facts of a statement, a gradient
statement and shapes: the embedding gather (backends/c/gather_rows.py), a gradient's
scatter-add of whole rows (backends/c/scatter.scatter_rows, JAX's windowed scatter)
and one whose positions form a strided view of the target (backends/c/strided_add.py,
a NumPy or torch window).  schedule/library.py's rules read them to choose a kernel,
one rule per (pattern, backend); the kernels run what they are handed.

A gradient's scatter-add whose positions are affine in the gradient's indices and
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

from ..lang import ast


def row_gather(spec) -> Optional[Tuple[str, str]]:
    """(table, index array) where ``spec`` is ``:=`` of the embedding
    form: the right side one access whose first subscript is exactly one index array
    read by the output's leading indices in order, the other subscripts the output's
    remaining indices in order; else None."""
    rhs = spec.rhs
    if spec.assign != ":=" or not isinstance(rhs, ast.Access) or not rhs.indices:
        return None
    first, rest = rhs.indices[0], rhs.indices[1:]
    if first.terms or first.constant or first.quasi or len(first.gathers) != 1:
        return None
    index, coefficient = first.gathers[0]
    lead = tuple(sub.plain_index for sub in index.indices)
    trailing = tuple(sub.plain_index for sub in rest)
    if coefficient != 1 or not all(lead) or not all(trailing) or \
            lead + trailing != tuple(spec.output_indices) or index.tensor == rhs.tensor:
        return None
    return rhs.tensor, index.tensor


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


def scatters_rows(g, target_shape, values_shape) -> bool:
    """Whether ``g`` scatters whole rows: the first axis of the target at gathered
    positions, its other axes the values' last axes, taken whole and in order."""
    indices = g.spec.output_indices
    rest = len(g.scatter) - 1
    if rest < 0 or any(sub.gathers for sub in g.scatter[1:]) or not g.scatter[0].gathers:
        return False
    trailing = indices[len(indices) - rest:] if rest else ()
    return tuple(sub.plain_index for sub in g.scatter[1:]) == trailing and \
        tuple(values_shape[len(values_shape) - rest:]) == tuple(target_shape[1:]) and \
        not any(name in trailing for name in g.scatter[0].index_names)
