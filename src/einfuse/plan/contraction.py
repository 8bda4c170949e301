"""Recognising pure multiply-add contractions of two tensors, which run best as one BLAS
call (``matmul`` after the needed transposes and reshapes).

A statement qualifies when its right side is ``[sum[K](] c * A[...] * B[...] [)]``:
two accesses by distinct plain indices, optional scalar factors ``c`` (numbers and
parameters), and every index used by at least two of {output, A, B} -- batch indices
(all three), M (output and A), N (output and B) and K (A and B, summed).  Matmul, batched
matmul with the batch axes anywhere, tensordot and outer products all have this form.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

from ..analysis.ranges import points
from ..lang import ast


@dataclass(frozen=True)
class Contraction:
    left: str
    right: str
    left_indices: Tuple[str, ...]
    right_indices: Tuple[str, ...]
    batch: Tuple[str, ...]
    m: Tuple[str, ...]
    n: Tuple[str, ...]
    k: Tuple[str, ...]
    scale: Tuple[ast.Expr, ...]        # scalar factors (numbers, parameters)

    def describe(self) -> str:
        def names(group):
            return ",".join(group) or "-"
        return (f"one BLAS matmul: {self.left} as (batch {names(self.batch)}, M {names(self.m)}, "
                f"K {names(self.k)}) times {self.right} as (batch {names(self.batch)}, "
                f"K {names(self.k)}, N {names(self.n)})")


def product_factors(expr: ast.Expr) -> Optional[List[ast.Expr]]:
    """The factors of a product of accesses, numbers and parameters, else None."""
    if isinstance(expr, ast.Binary) and expr.op == "*":
        left, right = product_factors(expr.left), product_factors(expr.right)
        return None if left is None or right is None else left + right
    if isinstance(expr, (ast.Access, ast.Number, ast.Param)):
        return [expr]
    return None


@functools.lru_cache(maxsize=512)
def match_contraction(spec) -> Optional[Contraction]:
    if spec.assign != ":=" and any(a.tensor == spec.output for a in ast.accesses(spec.rhs)):
        return None
    body, summed = spec.rhs, ()
    if isinstance(body, ast.Reduce):
        if body.op != "sum":
            return None
        body, summed = body.body, body.indices
    factors = product_factors(body)
    if factors is None:
        return None
    accesses = [f for f in factors if isinstance(f, ast.Access)]
    scale = tuple(f for f in factors if not isinstance(f, ast.Access))
    if len(accesses) != 2:
        return None
    indices = []
    for access in accesses:
        names = tuple(sub.plain_index for sub in access.indices)
        if not all(names) or len(set(names)) != len(names):
            return None
        indices.append(names)
    left, right = indices
    groups = index_groups(spec.output_indices, left, right, summed)
    if groups is None:
        return None
    if not (groups["m"] and groups["n"]) and (not groups["k"] or all(
            names[-1] in groups["k"] for names in indices if len(names) >= 2)):
        # elementwise products, and dot products along the operands' last axes
        # (batched, or a matrix times a vector): one pass over the operands, where BLAS
        # reuses nothing from cache (an elementwise product was a matmul of 1x1
        # matrices, 20x slower); a loop nest reads them as fast and can join its
        # neighbours' fused kernel (a gradient's row sums sum[j](P[i,j] * dP[i,j]) and
        # sum[j](dy[i,j] * g[j]) then read each row once).  A sum down the columns
        # (W[i,o] * v[i] over i) stays with BLAS.
        return None
    return Contraction(accesses[0].tensor, accesses[1].tensor, left, right,
                       *(tuple(groups[g]) for g in ("batch", "m", "n", "k")), scale)


def index_groups(out, left, right, summed) -> Optional[dict]:
    """The indices of a product of two operands by role, in first-use order: ``batch``
    (output and both operands), ``m`` (output and left), ``n`` (output and right), ``k``
    (both operands, summed: exactly ``summed``); None where an index has no such role
    (it is used by one of the three alone, or an operand index is neither kept nor
    summed)."""
    groups = {"batch": [], "m": [], "n": [], "k": []}
    for name in dict.fromkeys(tuple(out) + tuple(left) + tuple(right)):
        where = (name in out, name in left, name in right)
        group = {(True, True, True): "batch", (True, True, False): "m",
                 (True, False, True): "n", (False, True, True): "k"}.get(where)
        if group is None:
            return None
        if group == "k" and name not in summed:
            return None
        groups[group].append(name)
    if set(summed) != set(groups["k"]):
        return None
    return groups


def run_contraction(c: Contraction, call) -> np.ndarray:
    """The contraction on NumPy arrays in the working dtype, via one ``np.matmul``."""
    return prepare_contraction(c, call)(call.arrays, call.params)


@dataclass(frozen=True)
class _Operand:
    tensor: str
    window: Tuple[slice, ...]      # explicit ranges may select part of an axis
    order: Tuple[int, ...]         # to (batch, rows, cols)
    sizes: Tuple[int, int, int]


@dataclass(frozen=True)
class PreparedContraction:
    """A contraction's shape-dependent steps for one signature of its arguments:
    ``self(arrays, params)`` is the result in the working dtype."""
    contraction: Contraction
    working: np.dtype
    left: _Operand
    right: _Operand
    shape: Tuple[int, ...]         # the (batch, m, n) grid, unflattened
    order: Tuple[int, ...]         # grid -> the output's index order

    def __call__(self, arrays, params) -> np.ndarray:
        left, right = (arrays[o.tensor].astype(self.working, copy=False)[o.window]
                       .transpose(o.order).reshape(o.sizes) for o in (self.left, self.right))
        product = np.matmul(left, right)
        for factor in self.contraction.scale:
            value = factor.value if isinstance(factor, ast.Number) else params[factor.name]
            product *= np.asarray(value).astype(self.working)
        return product.reshape(self.shape).transpose(self.order)


def prepare_contraction(c: Contraction, call) -> PreparedContraction:
    ranges = call.bounds.range_map

    def operand(tensor: str, names: Tuple[str, ...], rows, cols) -> _Operand:
        order = tuple(names.index(n) for n in c.batch + rows + cols)
        sizes = (points(c.batch, ranges), points(rows, ranges), points(cols, ranges))
        return _Operand(tensor, tuple(slice(*ranges[n]) for n in names), order, sizes)

    grid = c.batch + c.m + c.n
    return PreparedContraction(
        c, call.dtypes.working, operand(c.left, c.left_indices, c.m, c.k),
        operand(c.right, c.right_indices, c.k, c.n),
        tuple(ranges[n][1] - ranges[n][0] for n in grid),
        tuple(grid.index(n) for n in call.spec.output_indices))
