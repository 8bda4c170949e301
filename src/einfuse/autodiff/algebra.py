"""Sums of products: a normal form of gradient expressions in which a forward
statement's right side can be recognised, and read as its output, wherever a term
contains it.

A gradient is linear in the seed (``dP``, ``dy``): a sum of terms, each a rational
coefficient times a product of *atoms* raised to integer powers.  Atoms are whatever
is not ``+ - * /`` or ``**`` by an integer: accesses, scalar parameters, function calls,
reductions other than ``sum``, and sums of forward values (``X[i,j] - mu[i]``) that
do not involve the seed (kept whole: expanding them would hide ``xhat``).  A ``sum``
reduction is an atom whose body is itself in normal form, with every factor that does
not move along the reduced indices taken outside (``sum[j](dP[i,j] * e[i,j] / s[i]**2)``
is ``s[i]**-2 * sum[j](dP[i,j] * e[i,j])``).

A forward statement ``O[I] := rhs`` whose right side is one such product ``M`` (softmax's
``P[i,j] := e[i,j] / sum[k](e[i,k])``: ``e[i,j] * sum[k](e[i,k])**-1``) *divides* a term
when, for some renaming of ``I``, each factor of ``M`` occurs in the term with a power of
the same sign and at least as large; the term is then ``O[I'] * term / M``.  Factors
outside a sum may be taken back in for that (``s[i]**-1 * sum[j](dP[i,j] * e[i,j])`` is
``sum[j](dP[i,j] * P[i,j])``).  Dividing out is exact in real arithmetic; in floating
point the value read differs from the recomputation only by the rounding of the
forward's own operations.

Atoms keep the expression as written (their operands are not reordered), and keys
compare them up to the names of their reduced indices (rewrite/hoist.canonical)."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from ..lang.ast import (Access, Binary, Expr, IndexExpr, IndexValue, Number, Param, Reduce,
                        Unary)
from ..lang.printer import format_expr
from ..lang.sugar import rename_indices
from ..lang.rewrite import free_indices
from ..rewrite.hoist import canonical

# Largest number of terms an expansion may produce before the statement is left alone.
MAX_TERMS = 64
# Largest integer power expanded as a power of a product.
MAX_POWER = 8


class TooLarge(Exception):
    """The normal form would grow past MAX_TERMS (the statement stays as derived)."""


@dataclass(frozen=True)
class Term:
    """``coefficient * prod(atom ** power)``; ``factors`` sorted by key, no zero power."""
    coefficient: Fraction
    factors: Tuple[Tuple[str, int], ...] = ()


Poly = Tuple[Term, ...]


@dataclass(frozen=True)
class Atom:
    expr: Expr
    free: Tuple[str, ...]        # free indices, in order of first appearance
    template: str                # the key with the free indices numbered by that order


@dataclass(frozen=True)
class Definition:
    """A forward statement ``name[indices] := coefficient * prod(factor ** power)``; its
    factors' atoms as expressions (keys depend on the renaming of ``indices``)."""
    name: str
    indices: Tuple[str, ...]
    coefficient: Fraction
    factors: Tuple[Tuple[Expr, int], ...]
    # the templates of its factors' atoms: a term it divides has them all
    templates: FrozenSet[str] = frozenset()


def key_of(expr: Expr) -> str:
    return format_expr(canonical(expr))


def free_order(expr: Expr) -> Tuple[str, ...]:
    """Free indices of ``expr`` in order of first appearance."""
    free = free_indices(expr)
    order: List[str] = []
    for node in expr.walk():
        names: Iterable[str] = ()
        if isinstance(node, IndexValue):
            names = (node.name,)
        elif isinstance(node, Access):
            names = [n for sub in node.indices for n in sub.index_names]
        for name in names:
            if name in free and name not in order:
                order.append(name)
    return tuple(order)


class Algebra:
    """Atoms by key, and the conversions to and from the normal form.  ``seeded``: the
    names (seeds, gradients) whose presence makes a sum worth expanding."""

    def __init__(self, seeded: FrozenSet[str]):
        self.seeded = seeded
        self.atoms: Dict[str, Atom] = {}

    # -- atoms ---------------------------------------------------------------------
    def atom(self, expr: Expr) -> str:
        key = key_of(expr)
        if key not in self.atoms:
            free = free_order(expr)
            placeholders = {name: f"@{n}" for n, name in enumerate(free)}
            template = key_of(rename_indices(expr, placeholders))
            self.atoms[key] = Atom(expr, free, template)
        return key

    def _seeded(self, expr: Expr) -> bool:
        return any((isinstance(n, Access) and n.tensor in self.seeded) or
                   (isinstance(n, Param) and n.name in self.seeded) for n in expr.walk())

    # -- to the normal form --------------------------------------------------------
    def poly(self, expr: Expr, top: bool = True) -> Poly:
        if isinstance(expr, Number) and not isinstance(expr.value, bool):
            value = Fraction(expr.value) if _finite(expr.value) else None
            if value is not None:
                return (Term(value),) if value != 0 else ()
        if isinstance(expr, Unary) and expr.op in ("-", "+"):
            inner = self.poly(expr.operand, top)
            return _scale(inner, Fraction(-1 if expr.op == "-" else 1))
        if isinstance(expr, Binary):
            if expr.op in ("+", "-") and (top or self._seeded(expr)):
                right = self.poly(expr.right, top)
                if expr.op == "-":
                    right = _scale(right, Fraction(-1))
                return _add(self.poly(expr.left, top) + right)
            if expr.op == "*":
                return _times(self.poly(expr.left, False), self.poly(expr.right, False))
            if expr.op == "/":
                denominator = self.poly(expr.right, False)
                inverse = _inverse(denominator)
                if inverse is None:
                    inverse = (Term(Fraction(1), ((self.atom(expr.right), -1),)),)
                return _times(self.poly(expr.left, False), inverse)
            if expr.op == "**" and isinstance(expr.right, Number) and \
                    not isinstance(expr.right.value, bool) and \
                    float(expr.right.value).is_integer() and \
                    0 < abs(expr.right.value) <= MAX_POWER:
                power = int(expr.right.value)
                base = self.poly(expr.left, False)
                if len(base) == 1:
                    return (_power(base[0], power),)
                return (Term(Fraction(1), ((self.atom(expr.left), power),)),)
        if isinstance(expr, Reduce) and expr.op == "sum":
            return self._sum(expr)
        return (Term(Fraction(1), ((self.atom(expr), 1),)),)

    def _sum(self, expr: Reduce) -> Poly:
        """A sum with its invariant factors and coefficients outside; terms of the
        body with the same outside part share one sum."""
        reduced = set(expr.indices)
        groups: Dict[Tuple, List[Term]] = {}
        for term in self.poly(expr.body, True):
            outside = tuple((k, p) for k, p in term.factors
                            if not set(self.atoms[k].free) & reduced)
            inside = tuple((k, p) for k, p in term.factors
                           if set(self.atoms[k].free) & reduced)
            groups.setdefault(outside, []).append(Term(term.coefficient, inside))
        result: List[Term] = []
        for outside, inside in groups.items():
            if not any(t.factors for t in inside):
                # nothing moves along the reduced indices: summed as written (a count
                # of the points would need their ranges)
                body = tuple(Term(t.coefficient, merge(t.factors + outside)) for t in inside)
                summed = Reduce("sum", expr.indices, self.expr(body))
                result.append(Term(Fraction(1), ((self.atom(summed), 1),)))
                continue
            scale = inside[0].coefficient
            body = tuple(Term(t.coefficient / scale, t.factors) for t in inside)
            summed = Reduce("sum", expr.indices, self.expr(body))
            result.append(Term(scale, merge(outside + ((self.atom(summed), 1),))))
        return _add(tuple(result))

    def sum_parts(self, key: str) -> Optional[Tuple[Tuple[str, ...], Poly]]:
        """(reduced indices, body in normal form) of a sum atom, or None."""
        expr = self.atoms[key].expr
        if isinstance(expr, Reduce) and expr.op == "sum":
            return expr.indices, self.poly(expr.body, True)
        return None

    # -- back to an expression -----------------------------------------------------
    def expr(self, poly: Poly) -> Expr:
        if not poly:
            return Number(0.0)
        result: Optional[Expr] = None
        for term in poly:
            value = self._term(Term(abs(term.coefficient), term.factors))
            if result is None:
                result = value if term.coefficient > 0 else Unary("-", value)
            else:
                result = Binary("+" if term.coefficient > 0 else "-", result, value)
        return result

    def _term(self, term: Term) -> Expr:
        above = [self._power(k, p) for k, p in term.factors if p > 0]
        below = [self._power(k, -p) for k, p in term.factors if p < 0]
        coefficient = term.coefficient
        try:
            exact = Fraction(float(coefficient)) == coefficient
            numerator = _number(float(coefficient) if exact else coefficient.numerator)
            divisor = 1 if exact else float(coefficient.denominator)
        except OverflowError:     # a coefficient beyond the float range: left as derived
            raise TooLarge from None
        result: Optional[Expr] = None
        for factor in above:
            result = factor if result is None else Binary("*", result, factor)
        if result is None:
            result = numerator
        elif numerator.value != 1:
            result = Binary("*", numerator, result)
        for factor in below:
            result = Binary("/", result, factor)
        if divisor != 1:
            result = Binary("/", result, _number(divisor))
        return result

    def _power(self, key: str, power: int) -> Expr:
        base = self.atoms[key].expr
        return base if power == 1 else Binary("**", base, Number(power))

    # -- dividing out forward statements -------------------------------------------
    def divide_out(self, poly: Poly, definitions: Sequence[Definition]) -> Poly:
        """``poly`` with every term that a definition divides read as its output (the
        definitions in program order, each as often as it divides), inside sums too."""
        result: List[Term] = []
        for term in poly:
            # only a definition whose factors' shapes all occur in the term can divide
            # it: trying each one's renamings was quadratic in a long program
            templates = self._templates(term)
            for definition in definitions:
                if not definition.templates <= templates:
                    continue
                for _ in range(MAX_POWER):
                    found = self._divided(term, definition)
                    if found is None:
                        break
                    term = found
                    templates = self._templates(term)      # (it reads the output now)
            result += self._inside_sums(term, definitions)
        return _add(tuple(result))

    def _templates(self, term: Term) -> FrozenSet[str]:
        return frozenset(self.atoms[key].template for key, _ in term.factors)

    def _inside_sums(self, term: Term, definitions: Sequence[Definition]) -> Poly:
        """``term`` with a sum atom's body divided out, taking in factors from outside
        the sum where a definition then divides the body's one term."""
        factors = dict(term.factors)
        for key, power in term.factors:
            parts = self.sum_parts(key)
            if parts is None or power != 1:
                continue
            indices, body = parts
            others = {k: p for k, p in factors.items() if k != key}
            outside = tuple((k, p) for k, p in others.items()
                            if not set(self.atoms[k].free) & set(indices))
            if len(body) == 1 and outside:
                joined = Term(body[0].coefficient, merge(body[0].factors + outside))
                divided = self.divide_out((joined,), definitions)
                if _size(divided) < _size((joined,)):
                    rest = tuple((k, p) for k, p in others.items() if (k, p) not in outside)
                    new = self._sum(Reduce("sum", indices, self.expr(divided)))
                    return _times_term(Term(term.coefficient, rest), new)
            new_body = self.divide_out(body, definitions)
            if new_body != body:
                new = self._sum(Reduce("sum", indices, self.expr(new_body)))
                return _times_term(Term(term.coefficient, tuple(sorted(others.items()))), new)
        return (term,)

    def _divided(self, term: Term, definition: Definition) -> Optional[Term]:
        """``term / M * O[...]`` for the first renaming of the definition's indices under
        which its product ``M`` divides ``term``, or None."""
        have = dict(term.factors)
        for renaming in self._renamings(term, definition):
            wanted = [(self.atom(rename_indices(expr, renaming)), power)
                      for expr, power in definition.factors]
            if all(k in have and have[k] * p > 0 and abs(have[k]) >= abs(p)
                   for k, p in wanted):
                left = dict(have)
                for k, p in wanted:
                    left[k] -= p
                read = Access(definition.name, tuple(IndexExpr(((renaming[i], 1),))
                                                     for i in definition.indices))
                rest = tuple((k, p) for k, p in left.items() if p != 0)
                return Term(term.coefficient / definition.coefficient,
                            merge(rest + ((self.atom(read), 1),)))
        return None

    def _renamings(self, term: Term, definition: Definition):
        """Renamings of the definition's indices suggested by matching each factor of
        its product against a factor of ``term`` of the same shape."""
        wanted = set(definition.indices)
        seen = set()
        firsts = [(self.atoms[self.atom(e)], e) for e, _ in definition.factors]
        for atom, _ in sorted(firsts, key=lambda pair: -len(pair[0].free)):
            for key, _ in term.factors:
                mine = self.atoms[key]
                if mine.template != atom.template:
                    continue
                renaming = dict(zip(atom.free, mine.free))
                if not wanted <= set(renaming):
                    continue
                renaming = {i: renaming[i] for i in definition.indices}
                frozen = tuple(sorted(renaming.items()))
                if frozen not in seen:
                    seen.add(frozen)
                    yield renaming


def definition_of(algebra: Algebra, name: str, indices: Tuple[str, ...],
                  rhs: Expr) -> Optional[Definition]:
    """The forward statement as a Definition, or None where its right side is not one
    product, or a renaming of its indices could not be found from its factors."""
    if len(set(indices)) != len(indices):
        return None
    try:
        poly = algebra.poly(rhs)
    except TooLarge:
        return None
    if len(poly) != 1 or not poly[0].factors:
        return None
    term = poly[0]
    covered = set()
    for key, _ in term.factors:
        covered |= set(algebra.atoms[key].free)
    if not set(indices) <= covered or (covered - set(indices)):
        return None
    factors = tuple((canonical(algebra.atoms[k].expr), p) for k, p in term.factors)
    return Definition(name, tuple(indices), term.coefficient, factors,
                      frozenset(algebra.atoms[algebra.atom(e)].template for e, _ in factors))


def _size(poly: Poly) -> int:
    """The number of factors of ``poly``, by power: dividing out lowers it."""
    return sum(abs(p) for term in poly for _, p in term.factors)


def _finite(value) -> bool:
    return value == value and value not in (float("inf"), float("-inf"))


def _number(value) -> Number:
    return Number(float(value))


def merge(factors) -> Tuple[Tuple[str, int], ...]:
    total: Dict[str, int] = {}
    for key, power in factors:
        total[key] = total.get(key, 0) + power
    return tuple(sorted((k, p) for k, p in total.items() if p != 0))


def _add(terms: Tuple[Term, ...]) -> Poly:
    """Like terms collected, in first-seen order."""
    total: Dict[Tuple, Fraction] = {}
    for term in terms:
        total[term.factors] = total.get(term.factors, Fraction(0)) + term.coefficient
    if len(total) > MAX_TERMS:
        raise TooLarge
    return tuple(Term(c, f) for f, c in total.items() if c != 0)


def _scale(poly: Poly, factor: Fraction) -> Poly:
    return tuple(Term(t.coefficient * factor, t.factors) for t in poly)


def _times_term(a: Term, b: Poly) -> Poly:
    return tuple(Term(a.coefficient * t.coefficient, merge(a.factors + t.factors))
                 for t in b)


def _times(a: Poly, b: Poly) -> Poly:
    if len(a) * len(b) > MAX_TERMS:
        raise TooLarge
    return _add(tuple(Term(x.coefficient * y.coefficient, merge(x.factors + y.factors))
                      for x in a for y in b))


def _inverse(poly: Poly) -> Optional[Poly]:
    if len(poly) != 1:
        return None
    term = poly[0]
    return (Term(1 / term.coefficient, tuple((k, -p) for k, p in term.factors)),)


def _power(term: Term, power: int) -> Term:
    if term.coefficient == 0 and power < 0:
        raise TooLarge
    return Term(term.coefficient ** power, tuple((k, p * power) for k, p in term.factors))


__all__ = ["Algebra", "Definition", "Poly", "Term", "TooLarge", "definition_of", "key_of",
           "merge"]
