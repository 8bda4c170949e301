"""Reductions defined by the core ones (programs.md section 5), expanded while a statement
is parsed, so that every later stage -- analysis, gradients, hoisting, lowering, every
backend -- sees only ``sum prod max min logsumexp``.  One rule per reduction, as data.

* ``mean[K](e)`` is ``sum[K](e) / count``;
* ``var[K](e)`` is the population variance in two passes, ``sum[K]((e - m)**2) / count``
  with ``m`` the mean over fresh copies ``K2`` of ``K``: numerically stable, and
  rewrite/hoist.py computes ``m`` once per output point, so it costs two passes.

``count`` is ``sum[K](where(e == e, 1, 1))``: the number of points of ``K``'s ranges,
written with ``e``'s accesses so that the reduction infers its ranges on its own when
it is hoisted into a temporary (``sum[K](1)`` alone could not).  Every node of an
expansion carries the span of the reduction as written, so errors point at it."""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, Mapping, Optional, Tuple

from .ast import Access, Binary, Call, Expr, IndexValue, Number, Reduce, map_children
from .fresh_names import FreshNames

SUGAR_REDUCTIONS = ("mean", "var")


def expand(reduce: Reduce, fresh: FreshNames) -> Expr:
    """``reduce`` (a sugar reduction whose body is already expanded) in core terms."""
    return _RULES[reduce.op](reduce, fresh)


def count_points(indices: Tuple[str, ...], body: Expr, span) -> Expr:
    """``sum[indices](where(body == body, 1, 1))``: how many points of ``indices`` the
    reduction of ``body`` visits (1 at each, NaN or not), the count mean and var divide
    by (the rewrite rules build counts this way too)."""
    ones = Call("where", (Binary("==", body, body, span=span), Number(1, span=span),
                          Number(1, span=span)), span=span)
    return Reduce("sum", indices, ones, span=span)


def constant_value(expr: Expr) -> Optional[float]:
    """The value of ``expr`` where it is the same number at every point: a number, or a
    ``where`` choosing between two equal constants (whatever its condition reads, NaN
    included), as a count's body is; else None."""
    if isinstance(expr, Number):
        return expr.value
    if isinstance(expr, Call) and expr.func == "where" and len(expr.args) == 3:
        chosen = constant_value(expr.args[1]), constant_value(expr.args[2])
        if chosen[0] is not None and chosen[0] == chosen[1]:
            return chosen[0]
    return None


def is_count(expr: Expr) -> bool:
    """Whether ``expr`` is a sum of a constant (a count, as :func:`count_points` writes
    it): its value is that constant times the number of points of its ranges, whatever
    the arrays hold -- a fact of the call's ranges, not a pass over the data."""
    return isinstance(expr, Reduce) and expr.op == "sum" and \
        constant_value(expr.body) is not None


def count_value(count: Reduce, ranges: Mapping[str, Tuple[int, int]]):
    """The value of the count ``count`` (:func:`is_count`) for the ranges ``ranges``
    (index -> (start, stop)) of a bound call: its constant times the number of points
    of its indices' ranges (an integer where the constant is one)."""
    points = math.prod(max(0, ranges[i][1] - ranges[i][0]) for i in count.indices)
    return constant_value(count.body) * points


def counted(expr: Expr, ranges: Mapping[str, Tuple[int, int]]) -> Expr:
    """``expr`` with each count (:func:`is_count`) replaced by its value for the ranges
    ``ranges`` of a bound call (:func:`count_value`)."""
    if is_count(expr):
        # (an integer count stays an integer: the statement's dtypes are as they were)
        return Number(count_value(expr, ranges), span=expr.span)
    return map_children(expr, lambda child: counted(child, ranges))


def _mean(reduce: Reduce, fresh: FreshNames) -> Expr:
    span = reduce.span
    total = Reduce("sum", reduce.indices, reduce.body, span=span)
    return Binary("/", total, count_points(reduce.indices, reduce.body, span), span=span)


def _var(reduce: Reduce, fresh: FreshNames) -> Expr:
    span = reduce.span
    copies = {k: fresh.copy_of(k) for k in reduce.indices}
    body2 = rename_indices(reduce.body, copies)
    mean = _mean(Reduce("mean", tuple(copies.values()), body2, span=span), fresh)
    deviation = Binary("-", reduce.body, mean, span=span)
    squares = Reduce("sum", reduce.indices,
                     Binary("**", deviation, Number(2, span=span), span=span), span=span)
    return Binary("/", squares, count_points(reduce.indices, reduce.body, span), span=span)


_RULES: Dict[str, Callable[[Reduce, FreshNames], Expr]] = {"mean": _mean, "var": _var}


def rename_indices(expr: Expr, names: Dict[str, str]) -> Expr:
    """``expr`` with free uses of the indices in ``names`` renamed (values, subscripts); a
    reduction rebinding one of them shadows it."""
    if not names:
        return expr
    if isinstance(expr, Reduce):
        inner = {k: v for k, v in names.items() if k not in expr.indices}
        return dataclasses.replace(expr, body=rename_indices(expr.body, inner))
    if isinstance(expr, IndexValue):
        return dataclasses.replace(expr, name=names.get(expr.name, expr.name))
    expr = map_children(expr, lambda child: rename_indices(child, names))
    if isinstance(expr, Access):
        expr = dataclasses.replace(expr, indices=tuple(sub.renamed(names)
                                                       for sub in expr.indices))
    return expr


__all__ = ["SUGAR_REDUCTIONS", "FreshNames", "constant_value", "count_points", "count_value",
           "counted", "expand", "is_count", "rename_indices"]
