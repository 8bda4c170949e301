"""The scores of an online-softmax attention taken apart (rewrite/online_softmax.py):

    s = where(c_1, where(c_2, ..., dot + t_1 + t_2 + ..., -inf), -inf)

with ``dot`` a (scaled) dot product, each ``t`` an additive term and each ``c`` a
comparison of the row index ``i`` and the key index ``j``.  The terms and the
comparisons become data the kernels read:

* an additive term is a tensor broadcast over (batch..., i, j) (:class:`TensorTerm`:
  a padding mask ``m[b,j]`` holding -inf, a bias ``bias[h,i,j]``), or an index term
  ``c * (a*j + b*i + k)`` with ``c`` a tensor over batch indices, a scalar parameter or
  a literal (:class:`IndexTerm`: ALiBi's ``slope[h] * (j - i)``);
* a comparison is a band on ``j - i``: an upper bound (``j <= i``, ``j < i``) or a lower
  one (the window ``i - j < W``), each ``constant + sum(coefficient * parameter)``
  (:class:`Bound`), resolved per call; keys outside the band are never computed.

Only a ``where`` around the whole sum masks it: ``where(c, x, -inf)`` is -inf whatever
``x`` is, so skipping a hidden key is exact; ``x + where(c, 0, -inf)`` is NaN where ``x``
is, so it is an ordinary term (which declines the match).  Anything else in the scores
declines the match: the statements then run one by one."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

from ..lang.ast import Access, Binary, Call, Expr, IndexValue, Number, Param, Unary
from .patterns import literal_value, plain_subscripts


@dataclass(frozen=True)
class Bound:
    """``constant + sum(coefficient * parameter)``: a bound on ``j - i``."""
    constant: int
    params: Tuple[Tuple[str, int], ...] = ()

    def value(self, named: Dict[str, object]) -> Optional[int]:
        """The bound for a call's scalar parameters, or None where one is not an
        integer (the statements then compare as written)."""
        total = self.constant
        for name, coefficient in self.params:
            given = named.get(name)
            if hasattr(given, "ndim") and getattr(given, "ndim") == 0 and \
                    hasattr(given, "item"):
                given = given.item()
            if isinstance(given, bool) or not isinstance(given, numbers.Real):
                return None
            if isinstance(given, numbers.Integral):
                total += coefficient * int(given)
            elif math.isfinite(float(given)) and float(given) == int(given):
                total += coefficient * int(given)
            else:
                return None
        return total

    def __str__(self) -> str:
        parts = [f"{'+' if c > 0 else '-'} {'' if abs(c) == 1 else f'{abs(c)}*'}{p}"
                 for p, c in self.params]
        return " ".join([str(self.constant)] + parts) if parts else str(self.constant)


@dataclass(frozen=True)
class TensorTerm:
    """``sign * tensor[indices]``: the indices among the batch, the row and the key."""
    tensor: str
    indices: Tuple[str, ...]
    sign: int = 1


@dataclass(frozen=True)
class Coefficient:
    """``value * tensor[indices]`` (the indices batch indices), ``value * param`` or
    ``value`` alone."""
    value: float = 1.0
    tensor: Optional[str] = None
    indices: Tuple[str, ...] = ()
    param: Optional[str] = None


@dataclass(frozen=True)
class IndexTerm:
    """``coefficient * (key * j + row * i + constant)``."""
    coefficient: Coefficient
    key: int
    row: int
    constant: int


Term = Union[TensorTerm, IndexTerm]


@dataclass(frozen=True)
class Scores:
    """The scores taken apart: the terms of the sum inside the masks (with their signs,
    as written) and the masks' comparisons."""
    terms: Tuple[Tuple[int, Expr], ...]
    conditions: Tuple[Expr, ...]

    def candidates(self):
        """(position, term) of each term that may be the dot product (added, not
        subtracted)."""
        return [(n, term) for n, (sign, term) in enumerate(self.terms) if sign == 1]

    def others(self, position: int, row: str, key: str) -> Optional[Tuple[Term, ...]]:
        """The terms but the one at ``position``, as data, or None where one is not a
        term this module reads."""
        found: List[Term] = []
        for index, (sign, expr) in enumerate(self.terms):
            if index != position:
                term = _term(expr, sign, row, key)
                if term is None:
                    return None
                found.append(term)
        return tuple(found)

    def bands(self, row: str, key: str) -> Optional[Tuple[Tuple[Bound, ...],
                                                         Tuple[Bound, ...]]]:
        """(upper bounds, lower bounds) of ``j - i`` the comparisons set, or None where
        one is not such a band."""
        upper: List[Bound] = []
        lower: List[Bound] = []
        for condition in self.conditions:
            band = _band(condition, row, key)
            if band is None:
                return None
            (upper if band[0] == "upper" else lower).append(band[1])
        return tuple(dict.fromkeys(upper)), tuple(dict.fromkeys(lower))


def take_apart(scores: Expr) -> Scores:
    """The scores' masks (``where(c, x, -inf)`` around the sum) and terms."""
    conditions: List[Expr] = []
    while isinstance(scores, Call) and scores.func == "where" and len(scores.args) == 3 \
            and literal_value(scores.args[2]) == -math.inf:
        conditions.extend(_conjuncts(scores.args[0]))
        scores = scores.args[1]
    terms: List[Tuple[int, Expr]] = []
    _flatten(scores, 1, terms)
    return Scores(tuple(terms), tuple(conditions))


def _conjuncts(condition: Expr) -> List[Expr]:
    if isinstance(condition, Binary) and condition.op == "&":
        return _conjuncts(condition.left) + _conjuncts(condition.right)
    return [condition]


def _flatten(expr: Expr, sign: int, out: List[Tuple[int, Expr]]) -> None:
    """The terms of a sum (``+``, ``-``, unary ``-``) with their signs, in order."""
    if isinstance(expr, Binary) and expr.op in ("+", "-"):
        _flatten(expr.left, sign, out)
        _flatten(expr.right, sign if expr.op == "+" else -sign, out)
    elif isinstance(expr, Unary) and expr.op in ("-", "+") and literal_value(expr) is None:
        _flatten(expr.operand, -sign if expr.op == "-" else sign, out)
    else:
        out.append((sign, expr))


def linear(expr: Expr) -> Optional[Dict[Tuple[str, str], int]]:
    """An integer-affine form of index values and scalar parameters,
    ``{("index", i): c, ("param", W): c, ("constant", ""): c}``, or None."""
    if isinstance(expr, IndexValue):
        return {("index", expr.name): 1}
    if isinstance(expr, Param):
        return {("param", expr.name): 1}
    value = literal_value(expr)
    if value is not None:
        if not math.isfinite(value) or value != int(value):
            return None
        return {("constant", ""): int(value)}
    if isinstance(expr, Unary) and expr.op in ("-", "+"):
        inner = linear(expr.operand)
        return None if inner is None else \
            {k: (-c if expr.op == "-" else c) for k, c in inner.items()}
    if isinstance(expr, Binary) and expr.op in ("+", "-"):
        left, right = linear(expr.left), linear(expr.right)
        if left is None or right is None:
            return None
        total = dict(left)
        for k, c in right.items():
            total[k] = total.get(k, 0) + (c if expr.op == "+" else -c)
        return {k: c for k, c in total.items() if c != 0}
    if isinstance(expr, Binary) and expr.op == "*":
        left, right = linear(expr.left), linear(expr.right)
        if left is None or right is None:
            return None
        for factor, other in ((left, right), (right, left)):
            if set(factor) <= {("constant", "")}:
                scale = factor.get(("constant", ""), 0)
                return {k: c * scale for k, c in other.items() if c * scale != 0}
    return None


_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _band(condition: Expr, row: str, key: str) -> Optional[Tuple[str, Bound]]:
    """("upper" or "lower", the bound on ``j - i``) of a comparison, or None."""
    if not isinstance(condition, Binary) or condition.op not in _FLIPPED:
        return None
    left, right = linear(condition.left), linear(condition.right)
    if left is None or right is None:
        return None
    form = dict(left)           # left - right  op  0
    for k, c in right.items():
        form[k] = form.get(k, 0) - c
    op = condition.op
    j_coefficient = form.pop(("index", key), 0)
    i_coefficient = form.pop(("index", row), 0)
    if abs(j_coefficient) != 1 or i_coefficient != -j_coefficient or \
            any(kind == "index" and c for (kind, _), c in form.items()):
        return None
    if j_coefficient == -1:        # -(j - i) + rest op 0  is  (j - i) - rest flipped op 0
        form = {k: -c for k, c in form.items()}
        op = _FLIPPED[op]
    # (j - i) + rest op 0:  j - i op -rest
    constant = -form.pop(("constant", ""), 0)
    params = tuple(sorted((name, -c) for (_, name), c in form.items() if c))
    if op == "<":
        return "upper", Bound(constant - 1, params)
    if op == "<=":
        return "upper", Bound(constant, params)
    if op == ">":
        return "lower", Bound(constant + 1, params)
    return "lower", Bound(constant, params)


def _term(expr: Expr, sign: int, row: str, key: str) -> Optional[Term]:
    """An additive term as data, or None."""
    if isinstance(expr, Access):
        names = plain_subscripts(expr)
        return None if names is None else TensorTerm(expr.tensor, names, sign)
    affine = _index_affine(expr, row, key)
    if affine is not None:
        return _index_term(Coefficient(), affine, sign)
    if isinstance(expr, (Number, Param)) or literal_value(expr) is not None:
        coefficient = _coefficient(expr)
        return None if coefficient is None else \
            _index_term(coefficient, (0, 0, 1), sign)
    if isinstance(expr, Binary) and expr.op == "*":
        for factor, other in ((expr.left, expr.right), (expr.right, expr.left)):
            coefficient, affine = _coefficient(factor), _index_affine(other, row, key)
            if coefficient is not None and affine is not None:
                return _index_term(coefficient, affine, sign)
    return None


def _index_term(coefficient: Coefficient, affine, sign: int) -> IndexTerm:
    key, row, constant = affine
    return IndexTerm(coefficient, sign * key, sign * row, sign * constant)


def _index_affine(expr: Expr, row: str, key: str) -> Optional[Tuple[int, int, int]]:
    """(a, b, k) of ``a*j + b*i + k`` (at least one index), or None."""
    form = linear(expr)
    if form is None or not set(form) <= {("index", key), ("index", row), ("constant", "")}:
        return None
    if ("index", key) not in form and ("index", row) not in form:
        return None
    return form.get(("index", key), 0), form.get(("index", row), 0), \
        form.get(("constant", ""), 0)


def _coefficient(expr: Expr) -> Optional[Coefficient]:
    value = literal_value(expr)
    if value is not None:
        return Coefficient(value=value) if math.isfinite(value) else None
    if isinstance(expr, Param):
        return Coefficient(param=expr.name)
    if isinstance(expr, Access):
        names = plain_subscripts(expr)
        return None if names is None else Coefficient(tensor=expr.tensor, indices=names)
    return None
