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
* prod: ``g * prod[K2](where(K2 != K, body[K2], 1))`` -- the product of the *other*
  factors, exact with zeros (never ``R / body``);
* logsumexp: ``g * exp(body - R)`` (the softmax weight);
* max / min: ``where((body == R) & (max[K2](where(K2 < K, body[K2], -inf)) < body), g, 0)``
  -- the gradient goes to the first arg-extremum in index order (lexicographic for
  several indices); the inner maximum over the earlier elements is below the extremum
  only at its first occurrence.
"""

from __future__ import annotations

from typing import Iterator, List, Tuple

from ..lang.ast import (COMPARISON_OPS, LOGICAL_OPS, Access, Binary, Call, Expr, IndexValue,
                        Number, Param, Reduce, Unary)
from .exprs import Names, add, any_of, call, cmp, div, mentions, mul, neg, num, rename, sub, \
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


def _reduction(r: Reduce, g: Expr, names: Names) -> Expr:
    if r.op == "sum":
        return g
    if r.op == "logsumexp":
        return mul(g, call("exp", sub(r.body, r)))
    fresh, body2 = _copy_body(r, names)
    here = [IndexValue(k) for k in r.indices]
    there = [IndexValue(fresh[k]) for k in r.indices]
    if r.op == "prod":
        others = any_of([cmp("!=", t, h) for t, h in zip(there, here)], "|")
        return mul(g, Reduce("prod", tuple(fresh.values()), where(others, body2, num(1))))
    if r.op in ("max", "min"):
        # K2 < K in lexicographic order
        earlier = cmp("<", there[-1], here[-1])
        for t, h in zip(reversed(there[:-1]), reversed(here[:-1])):
            earlier = Binary("|", cmp("<", t, h), Binary("&", cmp("==", t, h), earlier))
        worst = num(float("-inf") if r.op == "max" else float("inf"))
        before = Reduce(r.op, tuple(fresh.values()), where(earlier, body2, worst))
        first = Binary("&", cmp("==", r.body, r),
                       cmp("<" if r.op == "max" else ">", before, r.body))
        return where(first, g, num(0))
    raise TypeError(r.op)
