"""A small pattern language over syntax trees, so that rewrites are written as data
(tables of patterns) rather than as hand-written tree walks.

A pattern is a tree of the frozen dataclasses below.  :func:`match` yields every way an
expression matches a pattern, as :class:`Bindings` (captured expressions and the names
of reduced indices); commutative operators and alternatives make it backtrack.

Reduced indices are captured by name (``Red("sum", "j", ...)`` binds ``j`` to whatever
the statement called that index).  A capture ``Any("s", over=("j",))`` stores its
expression with the indices bound to ``j`` renamed to a canonical placeholder, so that a
second capture of ``s`` under another reduction (``max[k](...)`` with ``k`` bound to
``over``) matches only the same expression up to that renaming: ``exp(S[i,j] -
max[k](S[i,k]))`` is the softmax weight, ``exp(S[i,j] - max[k](S[k,i]))`` is not."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

from ..lang.ast import (COMPARISON_OPS, LOGICAL_OPS, Access, Binary, Call, Expr, IndexValue,
                        Number, Param, Reduce, Unary, map_children)
from ..lang.sugar import rename_indices


class Pattern:
    """Base of patterns."""


@dataclass(frozen=True)
class Any(Pattern):
    """Any expression, captured as ``name``; ``over``: pattern variables of reduced
    indices to canonicalise in it (see the module docstring)."""
    name: str
    over: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Capture(Pattern):
    """Any expression, captured as written (nothing renamed, so that a rewrite can build
    from it); a second use of ``name`` matches only an equal expression (spans aside)."""
    name: str


@dataclass(frozen=True)
class Boolean(Pattern):
    """A boolean expression (a comparison, or ``&``/``|`` of them: 0 or 1, never NaN),
    captured as written as ``name``."""
    name: str


@dataclass(frozen=True)
class Op(Pattern):
    """A binary operator; ``commutative`` also tries the operands swapped."""
    op: str
    left: Pattern
    right: Pattern
    commutative: bool = False


@dataclass(frozen=True)
class Fn(Pattern):
    """A call of a named function."""
    func: str
    args: Tuple[Pattern, ...]


@dataclass(frozen=True)
class Red(Pattern):
    """A reduction ``op[index](body)`` over exactly one index, bound to the pattern
    variable ``index``."""
    op: str
    index: str
    body: Pattern


@dataclass(frozen=True)
class Reduction(Pattern):
    """A reduction ``op[indices](body)`` over any number of indices, their names (a
    tuple) bound to the pattern variable ``indices``."""
    op: str
    indices: str
    body: Pattern


@dataclass(frozen=True)
class Const(Pattern):
    """A number literal of this value."""
    value: float


@dataclass(frozen=True)
class Scalar(Pattern):
    """A number literal or a scalar parameter, captured as ``name``."""
    name: str


@dataclass(frozen=True)
class Tensor(Pattern):
    """A tensor access whose subscripts are distinct plain indices (``Q[b,h,i,d]``),
    captured as ``name``."""
    name: str


@dataclass(frozen=True)
class Compare(Pattern):
    """A comparison of two index values (``j <= i``), captured as ``name``."""
    name: str


@dataclass(frozen=True)
class OneOf(Pattern):
    """The first alternatives that match, in order."""
    options: Tuple[Pattern, ...]


@dataclass(frozen=True)
class Bindings:
    """What a match captured: expressions by capture name, index names by pattern
    variable."""
    exprs: Tuple[Tuple[str, Expr], ...] = ()
    indices: Tuple[Tuple[str, object], ...] = ()   # a name, or a Reduction's tuple

    def expr(self, name: str) -> Expr:
        return dict(self.exprs)[name]

    def index(self, name: str) -> str:
        return dict(self.indices)[name]

    def has(self, name: str) -> bool:
        return name in dict(self.exprs)

    def as_dict(self) -> dict:
        """Captured expressions and index variables in one mapping, by name."""
        return {**dict(self.exprs), **dict(self.indices)}

    def _with_expr(self, name: str, expr: Expr) -> Optional["Bindings"]:
        known = dict(self.exprs)
        if name in known:
            return self if known[name] == expr else None
        return dataclasses.replace(self, exprs=self.exprs + ((name, expr),))

    def _with_index(self, name: str, index) -> Optional["Bindings"]:
        known = dict(self.indices)
        if name in known:
            return self if known[name] == index else None
        return dataclasses.replace(self, indices=self.indices + ((name, index),))


def placeholder(position: int) -> str:
    """The canonical name a capture gives the index of its ``over[position]`` (no
    statement can use it: it is not an identifier)."""
    return f"#{position + 1}"


def canonical_bound(expr: Expr) -> Expr:
    """``expr`` with the indices its own reductions bind renamed by position (``%1``,
    ``%2``, ...), so that ``sum[d](Q[i,d]*K[j,d])`` and ``sum[e](Q[i,e]*K[j,e])`` compare
    equal."""
    counter = [0]

    def visit(node: Expr) -> Expr:
        if isinstance(node, Reduce):
            names = {}
            for index in node.indices:
                counter[0] += 1
                names[index] = f"%{counter[0]}"
            body = rename_indices(node.body, names)
            return dataclasses.replace(node, indices=tuple(names[i] for i in node.indices),
                                       body=visit(body))
        return map_children(node, visit)

    return visit(expr)


def match(pattern: Pattern, expr: Expr, bound: Bindings = Bindings()) -> Iterator[Bindings]:
    """Every way ``expr`` matches ``pattern`` given what is ``bound`` already."""
    if isinstance(pattern, Any):
        names = {}
        for position, variable in enumerate(pattern.over):
            index = dict(bound.indices).get(variable)
            if index is None:
                return
            names[index] = placeholder(position)
        result = bound._with_expr(pattern.name,
                                  canonical_bound(rename_indices(expr, names)))
        if result is not None:
            yield result
    elif isinstance(pattern, Capture):
        result = bound._with_expr(pattern.name, expr)
        if result is not None:
            yield result
    elif isinstance(pattern, Boolean):
        if is_boolean(expr):
            result = bound._with_expr(pattern.name, expr)
            if result is not None:
                yield result
    elif isinstance(pattern, Op):
        if isinstance(expr, Binary) and expr.op == pattern.op:
            orders = [(expr.left, expr.right)]
            if pattern.commutative:
                orders.append((expr.right, expr.left))
            for left, right in orders:
                for after_left in match(pattern.left, left, bound):
                    yield from match(pattern.right, right, after_left)
    elif isinstance(pattern, Fn):
        if isinstance(expr, Call) and expr.func == pattern.func and \
                len(expr.args) == len(pattern.args):
            yield from _match_all(pattern.args, expr.args, bound)
    elif isinstance(pattern, Red):
        if isinstance(expr, Reduce) and expr.op == pattern.op and len(expr.indices) == 1:
            result = bound._with_index(pattern.index, expr.indices[0])
            if result is not None:
                yield from match(pattern.body, expr.body, result)
    elif isinstance(pattern, Reduction):
        if isinstance(expr, Reduce) and expr.op == pattern.op:
            result = bound._with_index(pattern.indices, expr.indices)
            if result is not None:
                yield from match(pattern.body, expr.body, result)
    elif isinstance(pattern, Const):
        if literal_value(expr) == pattern.value:
            yield bound
    elif isinstance(pattern, Scalar):
        if isinstance(expr, (Number, Param)):
            result = bound._with_expr(pattern.name, expr)
            if result is not None:
                yield result
    elif isinstance(pattern, Tensor):
        if isinstance(expr, Access) and plain_subscripts(expr) is not None:
            result = bound._with_expr(pattern.name, expr)
            if result is not None:
                yield result
    elif isinstance(pattern, Compare):
        if isinstance(expr, Binary) and expr.op in ("<", "<=", ">", ">=") and \
                isinstance(expr.left, IndexValue) and isinstance(expr.right, IndexValue):
            result = bound._with_expr(pattern.name, expr)
            if result is not None:
                yield result
    elif isinstance(pattern, OneOf):
        for option in pattern.options:
            yield from match(option, expr, bound)
    else:   # a pattern class without a rule here is a bug in a pattern table
        raise TypeError(f"unknown pattern {type(pattern).__name__}")


def _match_all(patterns, exprs, bound: Bindings) -> Iterator[Bindings]:
    if not patterns:
        yield bound
        return
    for first in match(patterns[0], exprs[0], bound):
        yield from _match_all(patterns[1:], exprs[1:], first)


def plain_subscripts(access: Access) -> Optional[Tuple[str, ...]]:
    """The index names of an access whose subscripts are distinct plain indices, or
    None."""
    names = tuple(sub.plain_index for sub in access.indices)
    if any(name is None for name in names) or len(set(names)) != len(names):
        return None
    return names


def is_boolean(expr: Expr) -> bool:
    """A comparison, or a logical combination of booleans: 0 or 1, never NaN."""
    if isinstance(expr, Binary) and expr.op in COMPARISON_OPS:
        return True
    return isinstance(expr, Binary) and expr.op in LOGICAL_OPS and \
        is_boolean(expr.left) and is_boolean(expr.right)


def literal_value(expr: Expr) -> Optional[float]:
    """The value of a number literal (negated or not), or None (booleans are not
    numbers here)."""
    if isinstance(expr, Number) and not isinstance(expr.value, bool):
        return float(expr.value)
    if isinstance(expr, Unary) and expr.op == "-" and isinstance(expr.operand, Number) \
            and not isinstance(expr.operand.value, bool):
        return -float(expr.operand.value)
    return None
