"""A costly element-wise term that a program computes in several statements, computed
once (issue 31: "common subexpressions across statements"; v3.md section 1).

``Z[i] := sum[j](exp(X[i,j] - M[i]))`` followed by ``P[i,j] := exp(X[i,j] - M[i]) /
Z[i]`` evaluates the same exponential twice; written with ``E[i,j] := exp(X[i,j] -
M[i])`` it is evaluated once and the statements are the softmax the row kernels know.
This pass makes the first program the second: a term that is a call of a costly
function (``COSTLY``: one that costs many times a memory read, unlike ``X - m``, whose
materialisation would cost more than its recomputation), holding no reduction, read
with plain subscripts whose indices span whole axes in every statement it appears in,
and appearing in two statements or more, becomes a statement of its own before its
first reader (or, where a statement already defines exactly it, the others read that
statement), and every occurrence reads it.

The same values, bitwise: each occurrence held the value the new intermediate holds at
that point (the same function of the same array elements; the intermediate's dtype is
the term's, and the reading statements worked in that dtype too, the inputs being the
same arrays).  Called only where ranges are the axes' (not under ``ranges=`` or
``pad=``: program/compile gives ``plain_ranges=False`` there)."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

from ..lang.ast import (Access, Call, Expr, IndexExpr, IndexValue, Reduce, Statement,
                        map_children)
from ..lang.rewrite import free_indices, names_in
from ..lang.sugar import rename_indices
from .hoist import only_plain, subscripts_of

# functions whose evaluation costs many times the read of an element
COSTLY = frozenset({"exp", "log", "log1p", "expm1", "tanh", "sigmoid", "softplus", "erf",
                    "sin", "cos", "tan"})

# statements looked at: a generated program of thousands has no spelling to fix
SHARED_STATEMENTS = 64


def _ordered_indices(expr: Expr) -> Tuple[str, ...]:
    """``expr``'s free indices in the order they first appear."""
    found: List[str] = []
    for node in expr.walk():
        names = (node.name,) if isinstance(node, IndexValue) else \
            tuple(n for sub in node.indices for n in sub.index_names) \
            if isinstance(node, Access) else ()
        found.extend(n for n in names if n not in found)
    return tuple(found)


def _key(term: Expr, order: Tuple[str, ...]) -> Expr:
    return rename_indices(term, {name: f"@{n}" for n, name in enumerate(order)})


def _candidate(node: Expr, whole: Expr) -> Optional[Tuple[str, ...]]:
    """The term's indices in order of appearance, where ``node`` is a shareable term of
    the right side ``whole``, else None."""
    if not isinstance(node, Call) or node.func not in COSTLY or \
            any(isinstance(n, Reduce) for n in node.walk()):
        return None
    order = _ordered_indices(node)
    if not order or set(order) != free_indices(node):
        return None
    own, everywhere = list(subscripts_of(node)), list(subscripts_of(whole))
    if not all(only_plain(i, own) and only_plain(i, everywhere) for i in order):
        return None
    return order


def share_costly_terms(statements: List[Statement], shared: List[str]):
    """The statements with each costly term appearing in two statements or more computed
    once, and each statement's position in the given list (a new statement: its first
    reader's)."""
    if len(statements) > SHARED_STATEMENTS or any(s.assign != ":=" for s in statements):
        return statements, tuple(range(len(statements)))
    where: Dict[Expr, List[int]] = {}      # a term's key -> the statements holding it
    for position, statement in enumerate(statements):
        for node in statement.rhs.walk():
            order = _candidate(node, statement.rhs)
            if order is not None:
                holders = where.setdefault(_key(node, order), [])
                if position not in holders:
                    holders.append(position)
    repeated = [key for key, holders in where.items() if len(holders) > 1]
    if not repeated:
        return statements, tuple(range(len(statements)))
    taken = set().union(*(names_in(s) for s in statements))
    names: Dict[Expr, Tuple[str, Tuple[str, ...]]] = {}   # key -> (array, its indices)
    before: Dict[int, List[Statement]] = {}               # new statements by position
    for key in repeated:
        first = where[key][0]
        definer = _defining(statements, key, where[key])
        if definer is not None:
            names[key] = (definer.output, _ordered_indices(definer.rhs))
            continue
        number = 1
        while f"e{number}" in taken:
            number += 1
        name = f"e{number}"
        taken.add(name)
        indices = tuple(f"i{n}" for n in range(_arity(key)))
        while set(indices) & taken:
            indices = tuple("_" + i for i in indices)
        term = rename_indices(key, {f"@{n}": i for n, i in enumerate(indices)})
        before.setdefault(first, []).append(Statement(name, indices, ":=", term))
        names[key] = (name, indices)
        shared.append(f"{name}: a term of {', '.join(statements[p].output for p in where[key])}")
    result: List[Statement] = []
    origins: List[int] = []
    for position, statement in enumerate(statements):
        for new in before.get(position, ()):
            result.append(new)
            origins.append(position)
        result.append(_read_terms(statement, names))
        origins.append(position)
    return result, tuple(origins)


def _arity(key: Expr) -> int:
    return len(_ordered_indices(key))


def _defining(statements, key: Expr, holders) -> Optional[Statement]:
    """The statement among ``holders`` whose whole right side is the term, indexed in its
    order of appearance, the first of them (its readers come after it)."""
    statement = statements[holders[0]]
    order = _ordered_indices(statement.rhs)
    if _candidate(statement.rhs, statement.rhs) is not None and \
            _key(statement.rhs, order) == key and statement.output_indices == order:
        return statement
    return None


def _read_terms(statement: Statement, names) -> Statement:
    whole = statement.rhs
    changed = [False]

    def visit(node: Expr) -> Expr:
        order = _candidate(node, whole)
        if order is not None:
            found = names.get(_key(node, order))
            if found is not None and found[0] != statement.output:
                changed[0] = True
                return Access(found[0], tuple(IndexExpr(((i, 1),)) for i in order),
                              span=getattr(node, "span", None))
        return map_children(node, visit)

    rhs = visit(whole)
    return dataclasses.replace(statement, rhs=rhs, source="") if changed[0] else statement


__all__ = ["COSTLY", "share_costly_terms"]
