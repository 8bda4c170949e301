"""Hoisting the expensive factors of a reduction's body that do not move with all of
its loops (part of rewrite/hoist.py's pass).

A gradient statement typically multiplies a factor of the forward's grid by one of the
gradient's own position.  cdist's::

    dx[i,d] := sum[j](dD[i,j] / (2 * sqrt(sum[d2]((x[i,d2] - y[j,d2])**2)))
                      * (2 * (x[i,d] - y[j,d])))

evaluates ``dD[i,j] / (2 * sqrt(...))`` -- a division and a square root -- for every
``(i, d, j)`` although it depends on ``(i, j)`` only.  Computed once into a temporary
``h1[i,j]`` (its inner sum fused into it), the statement left is
``sum[j](h1[i,j] * (2 * (x[i,d] - y[j,d])))``, a multiply-add per point, whose lanes run
over ``d``: 6x faster at 1024 x 1024, d=64.  gauss's gradient hoists
``do[i] * b[j] * exp(-sum[d2](...))`` the same way (one exponential per pair instead of
one per pair and coordinate).

A factor is hoisted only where that cannot change a result or grow memory unboundedly:

* it is *costly* outside its reductions (a function other than abs/min/max/where and
  the like, a division by something other than a number, a power other than by an
  integer number): hoisting cheap arithmetic would trade a few operations for a load
  from a temporary;
* its temporary is no larger than one it replaces: its indices are those of a
  reduction inside it (which would have been a temporary of its own), or all appear
  as plain subscripts of one access in it (the temporary is at most that array's size);
* the range conditions of rewrite/hoist.py's ``_hoistable`` hold for it (its indices
  range over exactly what the statement uses);
* the same expression tree is evaluated, so each element is bitwise what the statement
  computes at that point (the reduction's own order of additions is unchanged)."""

from __future__ import annotations

from typing import Set, Tuple

from ..lang.ast import Access, Binary, Call, Expr, Number, Reduce, map_children
from ..lang.rewrite import free_indices

# Functions costing about as much as the load of a temporary would
CHEAP_CALLS = frozenset({"abs", "min", "max", "where", "relu", "floor", "ceil", "sign"})


def factors(rewriter, body: Expr, loops: Tuple[str, ...]) -> Expr:
    """``body`` (running inside ``loops``) with each largest costly subexpression that
    does not depend on every one of ``loops`` read from a temporary of ``rewriter``
    (rewrite/hoist.py's ``_Rewriter``).  Reductions inside ``body`` are left to the
    rewriter's own visit."""
    loop_set = set(loops)

    def walk(expr: Expr) -> Expr:
        if isinstance(expr, (Reduce, Access)) or not expr.children():
            return expr
        free = free_indices(expr)
        if free and free < loop_set and _costly(expr) and _bounded(expr, free) and \
                rewriter._hoistable(expr, free):
            order = _layout(expr, free) or tuple(i for i in loops if i in free)
            return rewriter.temporary(rewriter.visit(expr, order), order)
        return map_children(expr, walk)

    return walk(body)


def _outside_reductions(expr: Expr):
    yield expr
    if isinstance(expr, Reduce):
        return
    for child in expr.children():
        yield from _outside_reductions(child)


def _costly(expr: Expr) -> bool:
    for node in _outside_reductions(expr):
        if isinstance(node, Call) and node.func not in CHEAP_CALLS:
            return True
        if isinstance(node, Binary) and node.op in ("/", "//", "%") and \
                not isinstance(node.right, Number):
            return True
        if isinstance(node, Binary) and node.op == "**" and not (
                isinstance(node.right, Number) and float(node.right.value).is_integer()):
            return True
    return False


def _layout(expr: Expr, free: Set[str]):
    """The order of ``free`` in the first access that reads all of them as plain
    subscripts (``dD[i,j]``), or None: the temporary then has that array's layout,
    so computing it walks the array in memory order (dy's ``h1[j,i]`` from ``dD[i,j]``
    would be a transpose, 5x slower at 1024 x 1024)."""
    for node in expr.walk():
        if isinstance(node, Access):
            plain = tuple(sub.plain_index for sub in node.indices)
            if free <= set(plain):
                return tuple(dict.fromkeys(i for i in plain if i in free))
    return None


def _bounded(expr: Expr, free: Set[str]) -> bool:
    for node in expr.walk():
        if isinstance(node, Reduce) and free_indices(node) == free:
            return True
        if isinstance(node, Access) and free <= {sub.plain_index for sub in node.indices}:
            return True
    return False
