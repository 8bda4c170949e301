"""Common subexpressions of a backward's statements, computed once.

Gradient statements repeat the forward's elementwise work: softmax's ``dX = de *
exp(X - m)`` recomputes ``e``, and the single statement's backward has
``exp(X[i,j] - h1[i])`` in three statements.  Inside one fused kernel a shared value
costs a row buffer per thread; recomputed, it costs a transcendental per element per
use.  ``share`` finds calls of such functions (no reduction inside, every subscript a
plain index) that occur more than once, up to the names of their indices, and reads
them from one definition: a statement that already computes exactly that expression
(a recomputed forward statement), or a new temporary placed before its first use.

Only the statements change; whether the temporary's ranges match every use's (the
temporary covers whole axes) is the caller's check, with the ``Share`` records."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

from ..lang.ast import Access, Call, Expr, IndexExpr, IndexValue, Reduce, Statement, \
    map_children
from ..lang.printer import format_expr
from ..lang.fresh_names import FreshNames
from ..lang.sugar import rename_indices

# Functions worth computing once (a transcendental costs tens of simple operations).
EXPENSIVE = frozenset(("exp", "log", "log1p", "expm1", "sqrt", "tanh", "sigmoid",
                       "softplus", "erf", "sin", "cos", "tan"))
# Rewrites done per backward at most (each removes one repeated expression).
MAX_SHARED = 8


@dataclass(frozen=True)
class Share:
    """One shared expression: read as ``name`` (a new temporary when ``new``), and for
    each statement reading it (by position in the result), which of that statement's
    indices stands for each of the definition's output axes."""
    name: str
    new: bool
    uses: Tuple[Tuple[int, Tuple[str, ...]], ...]


def share(statements: Sequence[Statement], definitions: Sequence[bool],
          taken: Set[str]) -> Tuple[List[Statement], List[Share]]:
    """``statements`` with repeated expensive calls read from one definition.
    ``definitions[n]``: statement ``n`` may serve as a definition (and is not
    rewritten); ``taken``: names in use.  Returns the statements (temporaries
    inserted) and what was shared."""
    current = list(statements)
    fixed = list(definitions)
    shares: List[Share] = []
    used = FreshNames(taken)
    for _ in range(MAX_SHARED):
        found = _most_repeated(current, fixed)
        if found is None:
            break
        key, definer = found
        if definer is None:
            name = used.suffixed("cse", bare=False)
            first = next(n for n, s in enumerate(current) if not fixed[n] and
                         any(k == key for k, _, _ in _calls(s.rhs)))
            node, order = next((node, order) for k, node, order in _calls(current[first].rhs)
                               if k == key)
            temp = Statement(name, order, ":=", node)
            current.insert(first, temp)
            fixed.insert(first, True)
            shares = [dataclasses.replace(s, uses=tuple((p + (p >= first), m)
                                                        for p, m in s.uses)) for s in shares]
            definer, def_order, outputs, new = first, order, order, True
        else:
            name = current[definer].output
            def_order = next(order for k, _, order in _calls(current[definer].rhs)
                             if k == key)
            outputs, new = current[definer].output_indices, False
        positions = [def_order.index(o) for o in outputs]
        uses = []
        for n, statement in enumerate(current):
            if fixed[n]:
                continue
            mapped: List[Tuple[str, ...]] = []
            rhs = _replace(statement.rhs, key, name, positions, mapped)
            if mapped:
                current[n] = dataclasses.replace(statement, rhs=rhs)
                uses += [(n, m) for m in mapped]
        shares.append(Share(name, new, tuple(uses)))
    return current, shares


def _calls(expr: Expr, inside_reduce: bool = False):
    """(key, node, index order) for each expensive call in ``expr`` that qualifies."""
    for node in expr.walk():
        if isinstance(node, Call) and node.func in EXPENSIVE:
            order = _index_order(node)
            if order:
                canonical = rename_indices(node, {n: f"_{p}" for p, n in enumerate(order)})
                yield format_expr(canonical), node, order


def _index_order(node: Expr) -> Optional[Tuple[str, ...]]:
    """The indices of ``node`` in order of first use, or None where it does not
    qualify (a reduction, an index used as a value, a subscript other than a plain
    index)."""
    order: List[str] = []
    for inner in node.walk():
        if isinstance(inner, (Reduce, IndexValue)):
            return None
        if isinstance(inner, Access):
            for sub in inner.indices:
                name = sub.plain_index
                if name is None:
                    return None
                if name not in order:
                    order.append(name)
    return tuple(order) or None


def _most_repeated(statements, fixed) -> Optional[Tuple[str, Optional[int]]]:
    """(key, the statement defining it or None) of the largest expression used twice
    or more, or used once besides a definition."""
    counts: Dict[str, int] = {}
    sizes: Dict[str, int] = {}
    definers: Dict[str, int] = {}
    for n, statement in enumerate(statements):
        if fixed[n]:
            whole = list(_calls(statement.rhs))
            if whole and whole[0][1] is statement.rhs and \
                    set(whole[0][2]) == set(statement.output_indices):
                definers.setdefault(whole[0][0], n)
            continue
        for key, node, _ in _calls(statement.rhs):
            counts[key] = counts.get(key, 0) + 1
            sizes[key] = sum(1 for _ in node.walk())
    best = None
    for key, count in counts.items():
        if count + (key in definers) >= 2 and (best is None or sizes[key] > sizes[best]):
            best = key
    return None if best is None else (best, definers.get(best))


def _replace(expr: Expr, key: str, name: str, positions: List[int],
             mapped: List[Tuple[str, ...]]) -> Expr:
    if isinstance(expr, Call) and expr.func in EXPENSIVE:
        order = _index_order(expr)
        if order:
            canonical = rename_indices(expr, {n: f"_{p}" for p, n in enumerate(order)})
            if format_expr(canonical) == key:
                indices = tuple(order[p] for p in positions)
                mapped.append(indices)
                return Access(name, tuple(IndexExpr(((i, 1),)) for i in indices))
    return map_children(expr, lambda child: _replace(child, key, name, positions, mapped))


__all__ = ["Share", "share"]
