"""The syntax tree of one einfuse statement.

All nodes are frozen dataclasses, hashable and comparable by structure; the
source span of a node (for error carets) is carried but takes no part in
equality or hashing, so two statements that differ only in spacing compare
equal.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence, Tuple, Union

Span = Optional[Tuple[int, int]]

REDUCTIONS = ("sum", "prod", "max", "min", "logsumexp")
# Reductions to the integer position of the first extremum (row-major over several
# indices, counted from each range's start). Not reserved: argmax[i] alone is a tensor.
POSITION_REDUCTIONS = ("argmax", "argmin")
UNARY_FUNCTIONS = ("exp", "log", "log1p", "expm1", "sqrt", "abs", "sin", "cos", "tanh",
                   "sigmoid", "relu", "softplus", "erf", "floor", "ceil", "sign", "tan")
BINARY_FUNCTIONS = ("min", "max", "pow", "atan2")
TERNARY_FUNCTIONS = ("where",)
FUNCTIONS = UNARY_FUNCTIONS + tuple(f for f in BINARY_FUNCTIONS if f not in UNARY_FUNCTIONS) \
    + TERNARY_FUNCTIONS
CONSTANTS = {"inf": float("inf"), "nan": float("nan"), "pi": 3.141592653589793}
RESERVED = frozenset(REDUCTIONS) | frozenset(FUNCTIONS) | frozenset(CONSTANTS)

ARITHMETIC_OPS = ("+", "-", "*", "/", "//", "%", "**")
COMPARISON_OPS = ("<", "<=", ">", ">=", "==", "!=")
LOGICAL_OPS = ("&", "|")
ASSIGN_OPS = (":=", "=", "+=")


def _span():
    return field(default=None, compare=False, hash=False, repr=False)


class Expr:
    """Base of value expressions."""

    span: Span

    def children(self) -> Tuple["Expr", ...]:
        return ()

    def walk(self) -> Iterator["Expr"]:
        """This node and every node below it, parents first."""
        yield self
        for child in self.children():
            yield from child.walk()


@dataclass(frozen=True)
class Number(Expr):
    value: Union[int, float]
    span: Span = _span()


@dataclass(frozen=True)
class Param(Expr):
    """A scalar parameter: a bare name that is not an index."""
    name: str
    span: Span = _span()


@dataclass(frozen=True)
class IndexValue(Expr):
    """An index name used as an integer value (``j + 1``, ``j <= i``)."""
    name: str
    span: Span = _span()


QUASI_OPS = ("//", "%")


@dataclass(frozen=True)
class Quasi:
    """A quasi-affine part of a subscript: ``inner // divisor`` (floor division) or
    ``inner % divisor`` (Python's modulo, in ``0 .. divisor-1``).  ``inner`` is affine in
    the indices (no gather, no ``//``/``%`` of its own); ``divisor`` is a positive
    integer literal (the parser folds a divisor of 1 and constant operands away)."""
    inner: "IndexExpr"
    op: str          # "//" or "%"
    divisor: int

    def apply(self, value):
        """``value // divisor`` or ``value % divisor`` with Python's semantics, on an int or
        on NumPy/JAX integer arrays (whose ``//`` and ``%`` floor as Python's do)."""
        return value // self.divisor if self.op == "//" else value % self.divisor

    def __str__(self) -> str:
        inner = str(self.inner)
        if self.inner.plain_index is None and not (not self.inner.terms and
                                                   self.inner.constant >= 0):
            inner = f"({inner})"
        return f"{inner} {self.op} {self.divisor}"


@dataclass(frozen=True)
class IndexExpr:
    """One subscript of an access:
    ``sum(c*i) + sum(c*gather) + sum(c*(inner // d or inner % d)) + constant``.

    ``terms`` pairs index names with integer coefficients (in source order, no
    zero coefficients); ``gathers`` pairs integer-array accesses with their
    coefficient (kept in source order); ``quasi`` pairs :class:`Quasi` parts with their
    coefficient (source order, no zero coefficients).  A subscript with a quasi part has
    no gather (the parser refuses the mix).
    """
    terms: Tuple[Tuple[str, int], ...] = ()
    gathers: Tuple[Tuple["Access", int], ...] = ()
    constant: int = 0
    quasi: Tuple[Tuple[Quasi, int], ...] = ()
    span: Span = _span()

    @property
    def plain_index(self) -> Optional[str]:
        """The index name if this subscript is exactly one index, else None."""
        if len(self.terms) == 1 and self.terms[0][1] == 1 and not self.gathers \
                and self.constant == 0 and not self.quasi:
            return self.terms[0][0]
        return None

    @property
    def is_affine(self) -> bool:
        """True for a subscript of indices only (no gather), not plain: affine, or
        quasi-affine (with ``//``/``%`` parts)."""
        return not self.gathers and self.plain_index is None

    @property
    def index_names(self) -> Tuple[str, ...]:
        """The indices the subscript uses directly (not through gathers), once each."""
        names = [name for name, _ in self.terms]
        for part, _ in self.quasi:
            names += part.inner.index_names
        return tuple(dict.fromkeys(names))

    def index_value(self, value_of):
        """The subscript's value without its gathers, ``value_of(name)`` giving each index's
        value (an int, or integer arrays that broadcast)."""
        total = self.constant
        for name, coeff in self.terms:
            total = total + coeff * value_of(name)
        for part, coeff in self.quasi:
            total = total + coeff * part.apply(part.inner.index_value(value_of))
        return total

    def renamed(self, names) -> "IndexExpr":
        """The subscript with its own indices renamed by the mapping ``names`` (gathers
        are left as they are: callers map them as child expressions)."""
        return dataclasses.replace(
            self, terms=tuple((names.get(n, n), c) for n, c in self.terms),
            quasi=tuple((dataclasses.replace(q, inner=q.inner.renamed(names)), c)
                        for q, c in self.quasi))

    def __str__(self) -> str:
        parts = []
        for name, coeff in self.terms:
            parts.append(_term(coeff, name))
        for part, coeff in self.quasi:
            parts.append(str(part) if coeff == 1 else _term(coeff, f"({part})"))
        for access, coeff in self.gathers:
            parts.append(_term(coeff, str(access)))
        if self.constant or not parts:
            parts.append(str(self.constant))
        text = parts[0]
        for part in parts[1:]:
            text += " - " + part[1:] if part.startswith("-") else " + " + part
        return text


def _term(coeff: int, what: str) -> str:
    if coeff == 1:
        return what
    if coeff == -1:
        return "-" + what
    return f"{coeff}*{what}"


@dataclass(frozen=True)
class Access(Expr):
    """``tensor[sub, sub, ...]``; a 0-d tensor is written ``tensor[]``."""
    tensor: str
    indices: Tuple[IndexExpr, ...]
    span: Span = _span()

    def children(self) -> Tuple[Expr, ...]:
        return tuple(access for sub in self.indices for access, _ in sub.gathers)

    def __str__(self) -> str:
        return f"{self.tensor}[{', '.join(str(sub) for sub in self.indices)}]"


@dataclass(frozen=True)
class Unary(Expr):
    op: str  # "-" (negation) or "+"
    operand: Expr
    span: Span = _span()

    def children(self) -> Tuple[Expr, ...]:
        return (self.operand,)


@dataclass(frozen=True)
class Binary(Expr):
    op: str
    left: Expr
    right: Expr
    span: Span = _span()

    def children(self) -> Tuple[Expr, ...]:
        return (self.left, self.right)


@dataclass(frozen=True)
class Call(Expr):
    func: str
    args: Tuple[Expr, ...]
    span: Span = _span()

    def children(self) -> Tuple[Expr, ...]:
        return self.args


@dataclass(frozen=True)
class Reduce(Expr):
    """``op[indices](body)``: reduce ``body`` over ``indices``."""
    op: str
    indices: Tuple[str, ...]
    body: Expr
    span: Span = _span()
    implicit: bool = field(default=False, compare=False)

    def children(self) -> Tuple[Expr, ...]:
        return (self.body,)


@dataclass(frozen=True)
class Statement:
    output: str
    output_indices: Tuple[str, ...]
    assign: str  # ":=", "=", "+="
    rhs: Expr
    source: str = field(default="", compare=False)
    output_span: Span = _span()
    index_spans: Tuple[Span, ...] = field(default=(), compare=False, hash=False, repr=False)
    # the source used a reduction that lang/sugar.py expanded (mean, var): explain shows
    # the source as written next to the expansion
    expanded: bool = field(default=False, compare=False, hash=False, repr=False)

    @property
    def creates_output(self) -> bool:
        return self.assign == ":="


def accesses(expr: Expr) -> Iterator[Access]:
    """Every tensor access in ``expr``, gathers included, in source order."""
    for node in expr.walk():
        if isinstance(node, Access):
            yield node


def has_position_reduction(expr: Expr) -> bool:
    return any(r.op in POSITION_REDUCTIONS for r in reductions(expr))


def reductions(expr: Expr) -> Iterator[Reduce]:
    for node in expr.walk():
        if isinstance(node, Reduce):
            yield node


def expression_size(expr: Expr) -> Tuple[int, int]:
    """(nodes, nesting depth) of ``expr``, counted without recursion: callers ask before
    handing an expression to the recursive walks, which a deep one would exhaust."""
    nodes = depth = 0
    stack = [(expr, 1)]
    while stack:
        node, level = stack.pop()
        nodes += 1
        depth = max(depth, level)
        stack.extend((child, level + 1) for child in node.children())
    return nodes, depth


# Terms a generated sum adds one after the other before it adds such runs pairwise.
SUM_CHAIN = 16


def sum_tree(terms: Sequence[Expr]) -> Expr:
    """The sum of ``terms`` (one or more): in order, in runs of SUM_CHAIN terms, and the
    runs added pairwise, so that a sum of thousands of terms (a gradient's contributions)
    is a few dozen deep, not a chain that exhausts every recursive walk; a sum of at most
    SUM_CHAIN terms is the plain chain ``((a + b) + c) ...``."""
    runs: List[Expr] = []
    for start in range(0, len(terms), SUM_CHAIN):
        run = terms[start]
        for term in terms[start + 1:start + SUM_CHAIN]:
            run = Binary("+", run, term)
        runs.append(run)
    while len(runs) > 1:
        runs = [Binary("+", runs[k], runs[k + 1]) if k + 1 < len(runs) else runs[k]
                for k in range(0, len(runs), 2)]
    return runs[0]


def map_children(expr: Expr, fn) -> Expr:
    """``expr`` rebuilt with ``fn`` applied to each direct child expression (the gathers
    in an access's subscripts included); leaves come back unchanged."""
    if isinstance(expr, Access):
        return dataclasses.replace(expr, indices=tuple(
            dataclasses.replace(sub, gathers=tuple((fn(a), c) for a, c in sub.gathers))
            for sub in expr.indices))
    if isinstance(expr, Unary):
        return dataclasses.replace(expr, operand=fn(expr.operand))
    if isinstance(expr, Binary):
        return dataclasses.replace(expr, left=fn(expr.left), right=fn(expr.right))
    if isinstance(expr, Call):
        return dataclasses.replace(expr, args=tuple(fn(a) for a in expr.args))
    if isinstance(expr, Reduce):
        return dataclasses.replace(expr, body=fn(expr.body))
    return expr
