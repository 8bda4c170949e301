"""What eager NumPy or PyTorch code would allocate for a statement that einfuse computes
without it (explain's "naive broadcast" line)."""

from __future__ import annotations

import math
from typing import List

from ..analysis.ranges import Bounds, subscript_span
from ..analysis.spec import Spec
from ..lang.ast import Access, Binary, Expr, IndexValue, Number, Param, Reduce, Unary, reductions


def _free_indices(expr: Expr) -> frozenset:
    """The indices ``expr``'s value depends on (those its own reductions bind excluded)."""
    if isinstance(expr, Access):
        names = {name for sub in expr.indices for name in sub.index_names}
        for gather in expr.children():
            names |= _free_indices(gather)
        return frozenset(names)
    if isinstance(expr, IndexValue):
        return frozenset((expr.name,))
    if isinstance(expr, Reduce):
        return _free_indices(expr.body) - set(expr.indices)
    return frozenset().union(*(_free_indices(c) for c in expr.children()))


def _operands(expr: Expr) -> List[Expr]:
    """The arrays eager code would compute ``expr`` from: its reads, index values and
    inner reductions (each an array of its own)."""
    if isinstance(expr, (Access, IndexValue, Reduce)):
        return [expr]
    return [leaf for child in expr.children() for leaf in _operands(child)]


def _stored(operand: Expr, bounds: Bounds) -> int:
    """Elements an operand of eager code holds in memory: a read's array as far as it
    is read (a shifted window ``img[i+a]`` is a view of img, not i*a elements; a gather
    is copied, as ``w[idx]`` is), an index's values, an inner reduction's result."""
    ranges = bounds.range_map
    if isinstance(operand, Access):
        total = 1
        for sub in operand.indices:
            if sub.gathers:
                names = set(sub.index_names).union(*(_free_indices(g) for g, _ in sub.gathers))
                total *= _size(names, bounds)
            elif sub.index_names:
                low, high = subscript_span(sub, ranges)
                total *= high - low + 1
        return total
    return _size(_free_indices(operand), bounds)


def _size(names, bounds: Bounds) -> int:
    return math.prod(bounds.extent(name) for name in names)


def _contraction(expr: Expr) -> bool:
    """A product of reads, inner reductions and numbers: what np.einsum, matmul and
    torch.einsum sum over without building the product first."""
    if isinstance(expr, Binary) and expr.op == "*":
        return _contraction(expr.left) and _contraction(expr.right)
    if isinstance(expr, Unary):
        return _contraction(expr.operand)
    return isinstance(expr, (Access, Reduce, Number, Param))


def naive_intermediate(spec: Spec, bounds: Bounds, itemsize: int) -> int:
    """Bytes of the largest broadcast eager NumPy or PyTorch would build to reduce: a
    reduction's body over more elements than any array it is computed from holds
    (``(w[k,i] - x[k,j])**2`` is k*i*j; w and x are k*i and k*j).  A sum of a product
    (a matmul, an einsum, a correlation over sliding windows) is none: einsum and
    matmul contract without one; nor a reduction of one array as it is (``max`` over
    sliding windows reduces a view), nor a body no larger than one of its arrays
    (``exp(x[i,j])``).  0 when there is none."""
    if any(bounds.extent(name) == 0 for name in bounds.range_map):
        return 0       # nothing is computed
    biggest = 0
    for node in reductions(spec.rhs):
        if node.op == "sum" and _contraction(node.body) or len(_operands(node.body)) == 1 \
                and node.body is _operands(node.body)[0]:
            continue    # einsum's product, or one array (a view) reduced as it is
        space = _size(_free_indices(node.body), bounds)
        largest = max((_stored(leaf, bounds) for leaf in _operands(node.body)), default=1)
        if space > largest:
            biggest = max(biggest, space)
    return biggest * itemsize
