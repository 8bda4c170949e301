"""Syntax-tree helpers for derivation: folding constructors, capture-avoiding index
substitution, fresh names and the final renaming of shadowed reduction indices.

Derivation builds new trees out of pieces of the forward statement.  Those pieces keep
their reduction indices (``logsumexp[j](x[i,j])`` re-evaluated inside a gradient whose
grid also holds ``j``), which is correct under scoping but not legal notation (a
reduction may not rebind an index in scope), so :func:`freshen` renames them last.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, List, Mapping, Optional, Set, Tuple

from ..lang.ast import (Access, Binary, Call, Expr, IndexExpr, IndexValue, Number, Param,
                        Quasi, Reduce, RESERVED, Unary)
from ..lang.fresh_names import FreshNames

# An affine combination of indices: ((name, coeff), ...), constant.
Affine = Tuple[Tuple[Tuple[str, int], ...], int]


def affine(name: str) -> Affine:
    return (((name, 1),), 0)


class Names(FreshNames):
    """Hands out names unused anywhere in the statements being built, remembering which
    forward index each new index stands for (its range is that index's range)."""

    LETTERS = ("j", "k", "l", "m", "n", "p", "q", "r", "s", "t", "u", "v", "w")

    def __init__(self, used: Iterable[str]):
        super().__init__(set(used) | set(RESERVED))
        self.origin: Dict[str, str] = {}

    @property
    def used(self) -> Set[str]:
        return self.taken

    def fresh(self, base: Optional[str] = None) -> str:
        """``base2``, ``base3``... for a copy of index ``base``; else a free letter."""
        if base is None:
            letter = self.letter(self.LETTERS)
            if letter is not None:
                return letter
            base = "g"
        root = self.origin.get(base, base)
        name = self.copy_of(base)
        self.origin[name] = root
        return name

    def root(self, name: str) -> str:
        return self.origin.get(name, name)


# -- folding constructors ----------------------------------------------------------------
def num(value) -> Number:
    return Number(value)


def is_num(expr: Expr, value) -> bool:
    return isinstance(expr, Number) and expr.value == value and not isinstance(expr.value, bool)


def mul(a: Expr, b: Expr) -> Expr:
    # negations move outwards, so that nested rules fold -(-x) away
    if isinstance(a, Unary) and a.op == "-":
        return neg(mul(a.operand, b))
    if isinstance(b, Unary) and b.op == "-":
        return neg(mul(a, b.operand))
    if is_num(a, 1):
        return b
    if is_num(b, 1):
        return a
    if is_num(a, -1):
        return neg(b)
    if is_num(b, -1):
        return neg(a)
    if isinstance(a, Number) and isinstance(b, Number):
        return Number(a.value * b.value)
    return Binary("*", a, b)


def neg(a: Expr) -> Expr:
    if isinstance(a, Number):
        return Number(-a.value)
    if isinstance(a, Unary) and a.op == "-":
        return a.operand
    return Unary("-", a)


def add(a: Expr, b: Expr) -> Expr:
    if is_num(a, 0):
        return b
    if is_num(b, 0):
        return a
    return Binary("+", a, b)


def sub(a: Expr, b: Expr) -> Expr:
    if is_num(b, 0):
        return a
    return Binary("-", a, b)


def div(a: Expr, b: Expr) -> Expr:
    if is_num(b, 1):
        return a
    return Binary("/", a, b)


def call(func: str, *args: Expr) -> Expr:
    return Call(func, tuple(args))


def where(cond: Expr, a: Expr, b: Expr) -> Expr:
    return Call("where", (cond, a, b))


def cmp(op: str, a: Expr, b: Expr) -> Expr:
    return Binary(op, a, b)


def any_of(parts: List[Expr], op: str) -> Expr:
    result = parts[0]
    for part in parts[1:]:
        result = Binary(op, result, part)
    return result


def affine_expr(aff: Affine) -> Expr:
    """An affine combination as a value expression (for index values)."""
    terms, const = aff
    result: Optional[Expr] = None
    for name, coeff in terms:
        term = mul(Number(abs(coeff)), IndexValue(name))
        if result is None:
            result = term if coeff > 0 else neg(term)
        else:
            result = Binary("+" if coeff > 0 else "-", result, term)
    if result is None:
        return Number(const)
    if const:
        result = Binary("+" if const > 0 else "-", result, Number(abs(const)))
    return result


# -- free names and substitution ---------------------------------------------------------
def free_indices(expr: Expr) -> List[str]:
    """Indices used in ``expr`` and not bound by a reduction inside it, first use first."""
    found: Dict[str, None] = {}

    def visit(e: Expr, bound: frozenset):
        if isinstance(e, Reduce):
            visit(e.body, bound | set(e.indices))
            return
        if isinstance(e, IndexValue) and e.name not in bound:
            found.setdefault(e.name)
        if isinstance(e, Access):
            for s in e.indices:
                for name in s.index_names:
                    if name not in bound:
                        found.setdefault(name)
        for child in e.children():
            visit(child, bound)

    visit(expr, frozenset())
    return list(found)


def subst_subscript(s: IndexExpr, m: Mapping[str, Affine], names: Names) -> IndexExpr:
    coeffs: Dict[str, int] = {}
    const = s.constant
    for name, coeff in s.terms:
        terms, c0 = m.get(name, affine(name))
        const += coeff * c0
        for n2, c2 in terms:
            coeffs[n2] = coeffs.get(n2, 0) + coeff * c2
    gathers = tuple((subst(a, m, names), c) for a, c in s.gathers)
    quasi: Dict[Quasi, int] = {}
    for part, coeff in s.quasi:
        part = dataclasses.replace(part, inner=subst_subscript(part.inner, m, names))
        quasi[part] = quasi.get(part, 0) + coeff
    return IndexExpr(tuple((n, c) for n, c in coeffs.items() if c), gathers, const,
                     tuple((q, c) for q, c in quasi.items() if c))


def subst(expr: Expr, m: Mapping[str, Affine], names: Names) -> Expr:
    """Replace free indices by affine combinations, renaming reduction indices that
    would capture a name of a replacement."""
    if not m:
        return expr
    if isinstance(expr, IndexValue):
        return affine_expr(m[expr.name]) if expr.name in m else expr
    if isinstance(expr, (Number, Param)):
        return expr
    if isinstance(expr, Access):
        return Access(expr.tensor, tuple(subst_subscript(s, m, names) for s in expr.indices))
    if isinstance(expr, Reduce):
        inner = {k: v for k, v in m.items() if k not in expr.indices}
        incoming = {n for terms, _ in inner.values() for n, _ in terms}
        indices = list(expr.indices)
        for pos, name in enumerate(indices):
            if name in incoming:  # would capture: rename the bound index first
                new = names.fresh(name)
                inner[name] = affine(new)
                indices[pos] = new
        return Reduce(expr.op, tuple(indices), subst(expr.body, inner, names))
    if isinstance(expr, Unary):
        return Unary(expr.op, subst(expr.operand, m, names))
    if isinstance(expr, Binary):
        return Binary(expr.op, subst(expr.left, m, names), subst(expr.right, m, names))
    if isinstance(expr, Call):
        return Call(expr.func, tuple(subst(a, m, names) for a in expr.args))
    raise TypeError(type(expr).__name__)


def rename(expr: Expr, m: Mapping[str, str], names: Names) -> Expr:
    return subst(expr, {k: affine(v) for k, v in m.items()}, names)


def freshen(expr: Expr, scope: Set[str], names: Names) -> Expr:
    """Rename every reduction index that is already in scope (an output index or bound
    by an enclosing reduction), so the tree prints as legal notation."""
    if isinstance(expr, Reduce):
        clash = {n: names.fresh(n) for n in expr.indices if n in scope}
        body = rename(expr.body, clash, names) if clash else expr.body
        indices = tuple(clash.get(n, n) for n in expr.indices)
        return Reduce(expr.op, indices, freshen(body, scope | set(indices), names))
    if isinstance(expr, Unary):
        return Unary(expr.op, freshen(expr.operand, scope, names))
    if isinstance(expr, Binary):
        return Binary(expr.op, freshen(expr.left, scope, names),
                      freshen(expr.right, scope, names))
    if isinstance(expr, Call):
        return Call(expr.func, tuple(freshen(a, scope, names) for a in expr.args))
    return expr  # accesses hold no reductions


def contains_reduce(expr: Expr) -> bool:
    return any(isinstance(node, Reduce) for node in expr.walk())


def mentions(expr: Expr, name: str) -> bool:
    """True if tensor or parameter ``name`` is read for its value inside ``expr``."""
    for node in expr.walk():
        if isinstance(node, Access) and node.tensor == name:
            return True
        if isinstance(node, Param) and node.name == name:
            return True
    return False
