"""Subscripts as the parser builds them (lang/parser.py): an expression inside ``X[...]``
turned into an :class:`IndexExpr`, or a syntax error pointing into it.

A subscript is a sum of integer multiples of indices, of gathers (``idx[i]``) and of
quasi-affine parts ``inner // d`` and ``inner % d`` (``x[i // 4, i % 4]``), plus an
integer constant.  The divisor ``d`` of a quasi part is a positive integer constant
(``2*2`` folds to one); ``inner`` is affine in the indices: no gather (read the
positions from an index array instead) and no ``//``/``%`` of its own.  A subscript with
a quasi part reads no index array.  Constant operands fold (``7 // 2`` is ``3``), and so
does a divisor of 1.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from ..errors import EinfuseOverflowError
from .ast import Access, Binary, Expr, IndexExpr, Number, Param, Quasi, Unary

INT64_MAX = 2**63 - 1

# (index coefficients, gathers, constant, quasi parts -> coefficient)
Linear = Tuple[Dict[str, int], List[Tuple[Access, int]], int, Dict[Quasi, int]]


class SubscriptBuilder:
    """Builds the subscripts of one statement; ``error(message, start, end, cls)`` raises
    pointing into the source, ``reading`` names the tensor being indexed."""

    def __init__(self, error, source: str):
        self.error = error
        self.source = source

    def subscript(self, expr: Expr, span: Tuple[int, int], reading: str) -> IndexExpr:
        terms, gathers, constant, quasi = self.linear(expr)
        if quasi and gathers:
            self.error(f"a subscript with '//' or '%' cannot also read an index array "
                       f"({gathers[0][0]} here); compute the whole position into the index "
                       f"array instead", *span)
        return IndexExpr(tuple((n, c) for n, c in terms.items() if c != 0),
                         tuple((a, c) for a, c in gathers if c != 0), constant,
                         tuple((q, c) for q, c in quasi.items() if c != 0), span=span)

    def linear(self, expr: Expr) -> Linear:
        """``expr`` as (index coefficients, gathers, constant, quasi parts), or a syntax
        error."""
        if isinstance(expr, Number):
            if isinstance(expr.value, float):
                self.error("a subscript constant must be an integer", *expr.span)
            return {}, [], expr.value, {}
        if isinstance(expr, Param):
            return {expr.name: 1}, [], 0, {}
        if isinstance(expr, Access):
            return {}, [(expr, 1)], 0, {}
        if isinstance(expr, Unary) and expr.op == "-":
            return self.scaled(self.linear(expr.operand), -1, expr.span)
        if isinstance(expr, Binary) and expr.op in ("+", "-"):
            lt, lg, lc, lq = self.linear(expr.left)
            rt, rg, rc, rq = self.linear(expr.right)
            sign = 1 if expr.op == "+" else -1
            terms, quasi = dict(lt), dict(lq)
            for name, coeff in rt.items():
                terms[name] = terms.get(name, 0) + sign * coeff
            for part, coeff in rq.items():
                quasi[part] = quasi.get(part, 0) + sign * coeff
            return self.fits((terms, lg + [(a, sign * c) for a, c in rg], lc + sign * rc,
                              quasi), expr.span)
        if isinstance(expr, Binary) and expr.op == "*":
            left, right = self.linear(expr.left), self.linear(expr.right)
            for factor, other in ((left, right), (right, left)):
                if not factor[0] and not factor[1] and not factor[3]:
                    return self.scaled(other, factor[2], expr.span)
            self.error("a subscript may multiply an index only by an integer constant",
                       *expr.span)
        if isinstance(expr, Binary) and expr.op in ("//", "%"):
            return self.quasi(expr)
        self.error("a subscript must be an index, an integer, a gather (idx[i]) or an "
                   "affine combination of them such as 2*i + a - 1 (with i // 4 and i % 4 "
                   "by positive integer constants)", *expr.span)

    def scaled(self, linear: Linear, scale: int, span) -> Linear:
        terms, gathers, constant, quasi = linear
        return self.fits(({n: scale * c for n, c in terms.items()},
                          [(a, scale * c) for a, c in gathers], scale * constant,
                          {q: scale * c for q, c in quasi.items()}), span)

    def quasi(self, expr: Binary) -> Linear:
        """``inner // d`` or ``inner % d`` (a positive integer constant ``d``)."""
        what = "'//'" if expr.op == "//" else "'%'"
        divisor = self.divisor(expr, what)
        terms, gathers, constant, quasi = self.linear(expr.left)
        if gathers:
            self.error(f"{what} in a subscript cannot take a gather ({gathers[0][0]}) as "
                       "its operand; compute the positions into the index array instead",
                       *gathers[0][0].span)
        if quasi:
            self.error(f"{what} in a subscript cannot take another '//' or '%' as its "
                       "operand; write one division (i // 6 for (i // 2) // 3) or compute "
                       "the positions into an index array", *expr.left.span)
        terms = {n: c for n, c in terms.items() if c != 0}
        if not terms:   # a constant: fold it
            return {}, [], (constant // divisor if expr.op == "//" else constant % divisor), {}
        if divisor == 1:
            return (terms, [], constant, {}) if expr.op == "//" else ({}, [], 0, {})
        inner = IndexExpr(tuple(terms.items()), (), constant)
        return {}, [], 0, {Quasi(inner, expr.op, divisor): 1}

    def divisor(self, expr: Binary, what: str) -> int:
        right = expr.right
        span = right.span or expr.span
        if isinstance(right, Number) and isinstance(right.value, float):
            self.error(f"the divisor of {what} in a subscript must be a positive integer "
                       f"constant, not the float {self.source[span[0]:span[1]]}", *span)
        terms, gathers, constant, quasi = self.linear(right)
        if terms or gathers or quasi:
            names = list(terms) + [str(q) for q in quasi]
            shown = f"the index {names[0]}" if len(terms) == 1 and not quasi and not gathers \
                else "an expression of indices" if not gathers else "a gather"
            self.error(f"the divisor of {what} in a subscript must be a positive integer "
                       f"constant, not {shown} (every name inside a subscript is an index; "
                       f"a divisor that varies needs an index array with the positions)",
                       *span)
        if constant <= 0:
            self.error(f"the divisor of {what} in a subscript must be a positive integer "
                       f"constant, not {constant}", *span)
        return constant

    def fits(self, linear: Linear, span) -> Linear:
        """``linear`` unchanged when its coefficients and constant fit in int64."""
        terms, gathers, constant, quasi = linear
        for value in (*terms.values(), *(c for _, c in gathers), constant, *quasi.values()):
            if not -INT64_MAX <= value <= INT64_MAX:
                self.error(f"subscript arithmetic gives {value}, which does not fit in int64",
                           *span, cls=EinfuseOverflowError)
        return linear


__all__ = ["SubscriptBuilder"]
