"""Reverse-mode chain rule over one right-hand side.

:func:`occurrences` walks the tree from the root with the multiplier ``g`` (the seed
``dOUT[...]`` times every local derivative on the way down) and yields, for each read
of the differentiated name, ``(leaf, g, bound)``: ``bound`` are the reduction indices
enclosing the leaf, so the leaf's contribution lives on the grid
``output indices + bound`` and is ``g`` there.  ``g`` is always linear in the seed
(products, negations and ``where`` gates of it), which the caller relies on: a zero
seed gives a zero contribution.

Reductions (the rule for ``op[K](body)``, ``R`` the reduction itself, re-evaluated
inline where needed, ``K2`` fresh copies of ``K``):

* sum: ``g``
* prod: ``g`` times the product of the *other* factors, from the count of zero factors
  and the product of the non-zero ones (``_product_of_others``): correct with zeros,
  linear in the reduced length;
* logsumexp: ``g * exp(body - R)`` (the softmax weight);
* max / min: ``where(k == min[k2](where(body[k2] == R, k2, BIG)), g, 0)`` -- the
  gradient goes to the first arg-extremum in index order (NumPy's argmax; one position,
  never split among ties); for several
  indices ``k, l`` lexicographically: ``k`` is the first row holding an extremum and
  ``l`` the first column of row ``k`` holding one.  Each ``min[...]`` is free of the
  index it locates, so rewrite/hoist.py computes it once per output point: the
  backward pass is linear in the reduced length, not quadratic.
"""

from __future__ import annotations

from typing import Iterator, List, Tuple

from ..lang.ast import (COMPARISON_OPS, LOGICAL_OPS, POSITION_REDUCTIONS, Access, Binary,
                        Call, Expr, IndexValue, Number, Param, Reduce, Unary)
from .exprs import Names, add, call, cmp, div, mentions, mul, neg, num, rename, sub, \
    where

TWO_OVER_SQRT_PI = 1.1283791670955126


def occurrences(expr: Expr, wrt: str, g: Expr, names: Names,
                bound: Tuple[str, ...] = ()) -> Iterator[Tuple[Expr, Expr, Tuple[str, ...]]]:
    if not mentions(expr, wrt):
        return
    if isinstance(expr, Access):
        if expr.tensor == wrt:
            yield expr, g, bound
        return  # an access's subscripts are integer gathers: no gradient through them
    if isinstance(expr, Param):
        yield expr, g, bound
        return
    inner = bound + expr.indices if isinstance(expr, Reduce) else bound
    for child, local in partials(expr, g, names):
        yield from occurrences(child, wrt, local, names, inner)


def partials(expr: Expr, g: Expr, names: Names) -> List[Tuple[Expr, Expr]]:
    """The children of an inner node, each with ``g`` times the node's derivative with
    respect to it (reverse mode passes the multiplier down; forward mode, see
    forward.py, passes the child's own differential as ``g``).  For a reduction ``g``
    and the result live inside the reduction's indices.  Leaves have none."""
    if isinstance(expr, (Access, Param, Number, IndexValue)):
        return []
    if isinstance(expr, Unary):
        return [(expr.operand, neg(g) if expr.op == "-" else g)]
    if isinstance(expr, Binary):
        return _binary(expr, g)
    if isinstance(expr, Call):
        return _call(expr, g)
    if isinstance(expr, Reduce):
        if expr.op in POSITION_REDUCTIONS:
            return []     # integer positions: no gradient (derive.NO_GRADIENT)
        return [(expr.body, _reduction(expr, g, names))]
    raise TypeError(type(expr).__name__)


def _binary(e: Binary, g: Expr) -> List[Tuple[Expr, Expr]]:
    a, b = e.left, e.right
    if e.op in COMPARISON_OPS or e.op in LOGICAL_OPS or e.op in ("//", "%"):
        return []  # piecewise constant (or, for %, defined to pass none): no gradient
    if e.op == "+":
        return [(a, g), (b, g)]
    if e.op == "-":
        return [(a, g), (b, neg(g))]
    if e.op == "*":
        return [(a, mul(g, b)), (b, mul(g, a))]
    if e.op == "/":
        return [(a, div(g, b)), (b, neg(div(mul(g, a), Binary("**", b, num(2)))))]
    if e.op == "**":
        return _power(a, b, g)
    raise TypeError(e.op)


def _power(a: Expr, b: Expr, g: Expr) -> List[Tuple[Expr, Expr]]:
    if isinstance(b, Number):
        n = b.value
        if n == 2:
            local = mul(num(b.value), a)            # x**2 -> 2*x
        elif n == 1:
            local = num(1)
        else:
            local = mul(num(n), Binary("**", a, num(n - 1)))
        return [(a, mul(g, local))]
    return [(a, mul(g, mul(b, Binary("**", a, sub(b, num(1)))))),
            (b, mul(g, mul(Binary("**", a, b), call("log", a))))]


def _call(e: Call, g: Expr) -> List[Tuple[Expr, Expr]]:
    f, args = e.func, e.args
    zero = num(0)
    if f == "where":
        c, a, b = args
        return [(a, where(c, g, zero)), (b, where(c, zero, g))]
    if f in ("min", "max") and len(args) == 2:
        a, b = args
        first = cmp("<=" if f == "min" else ">=", a, b)   # ties go to the first argument
        return [(a, where(first, g, zero)), (b, where(first, zero, g))]
    if f == "pow":
        return _power(args[0], args[1], g)
    if f == "atan2":   # d atan2(a, b) = (b da - a db) / (a**2 + b**2)
        a, b = args
        norm = add(Binary("**", a, num(2)), Binary("**", b, num(2)))
        return [(a, div(mul(g, b), norm)), (b, neg(div(mul(g, a), norm)))]
    (x,) = args
    if f in ("floor", "ceil", "sign"):
        return []
    if f == "relu":
        return [(x, where(cmp(">", x, zero), g, zero))]
    local = {
        "exp": lambda: call("exp", x),
        "expm1": lambda: call("exp", x),
        "sin": lambda: call("cos", x),
        "cos": lambda: neg(call("sin", x)),
        "tan": lambda: add(num(1), Binary("**", call("tan", x), num(2))),
        "tanh": lambda: sub(num(1), Binary("**", call("tanh", x), num(2))),
        "sigmoid": lambda: mul(call("sigmoid", x), sub(num(1), call("sigmoid", x))),
        "softplus": lambda: call("sigmoid", x),
        "erf": lambda: mul(num(TWO_OVER_SQRT_PI), call("exp", neg(Binary("**", x, num(2))))),
        "abs": lambda: sub(cmp(">", x, zero), cmp("<", x, zero)),   # sign(x)
    }
    if f in local:
        return [(x, mul(g, local[f]()))]
    if f == "log":
        return [(x, div(g, x))]
    if f == "log1p":
        return [(x, div(g, add(num(1), x)))]
    if f == "sqrt":
        return [(x, div(g, mul(num(2), call("sqrt", x))))]
    raise TypeError(f"no derivative rule for {f}")


def _copy_body(r: Reduce, names: Names):
    """The body with fresh names K2 for the reduction's indices K."""
    fresh = {k: names.fresh(k) for k in r.indices}
    return fresh, rename(r.body, fresh, names)


# Larger than any position, so a row without an extremum (all NaN) matches no index.
_NO_POSITION = 2**63 - 1


def _first_extremum(r: Reduce, fresh, body2: Expr, names: Names) -> Expr:
    """True exactly at the first position (row-major over ``r.indices``) where the body
    equals the reduction ``r``: for each index in turn, it equals the smallest value of
    that index among the extrema that share the indices before it."""
    condition = None
    for n, k in enumerate(r.indices):
        later = r.indices[n:]     # the indices before k keep their current values
        body_here = rename(body2, {fresh[k2]: k2 for k2 in r.indices[:n]}, names)
        first = Reduce("min", tuple(fresh[k2] for k2 in later),
                       where(cmp("==", body_here, r), IndexValue(fresh[k]), num(_NO_POSITION)))
        test = cmp("==", IndexValue(k), first)
        condition = test if condition is None else Binary("&", condition, test)
    return condition


def position_indices(expr: Expr) -> Tuple[str, ...]:
    """The indices whose values ``_first_extremum`` computes with as numbers: each must
    be exact in the working dtype (float32 holds integers up to 2**24)."""
    found = []
    for node in expr.walk():
        if isinstance(node, Reduce) and node.op == "min" and isinstance(node.body, Call) \
                and node.body.func == "where" and isinstance(node.body.args[1], IndexValue) \
                and isinstance(node.body.args[2], Number) \
                and node.body.args[2].value == _NO_POSITION:
            found.append(node.body.args[1].name)
    return tuple(dict.fromkeys(found))


def _product_of_others(r: Reduce, fresh, body2: Expr) -> Expr:
    """The product of every factor but the one at the current position, from two
    position-free reductions (so computed once per output point, in linear time): the
    count of zero factors ``z`` and the product of the non-zero ones ``P``.  Exact with
    zeros: with no zero it is ``P / body``; with one zero, ``P`` at the zero and 0
    elsewhere; with two or more, 0 everywhere."""
    indices = tuple(fresh.values())
    is_zero = cmp("==", body2, num(0))
    zeros = Reduce("sum", indices, where(is_zero, num(1), num(0)))
    nonzero = Reduce("prod", indices, where(is_zero, num(1), body2))
    return where(cmp("==", r.body, num(0)),
                 where(cmp("==", zeros, num(1)), nonzero, num(0)),
                 where(cmp("==", zeros, num(0)), div(nonzero, r.body), num(0)))


def _reduction(r: Reduce, g: Expr, names: Names) -> Expr:
    if r.op == "sum":
        return g
    if r.op == "logsumexp":
        return mul(g, call("exp", sub(r.body, r)))
    fresh, body2 = _copy_body(r, names)
    if r.op == "prod":
        return mul(g, _product_of_others(r, fresh, body2))
    if r.op in ("max", "min"):
        return where(_first_extremum(r, fresh, body2, names), g, num(0))
    raise TypeError(r.op)
