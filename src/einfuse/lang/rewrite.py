"""Statement rewrites that produce new statements (text round-trips through the printer).

``batch_statement`` is how vmap is implemented: a statement mapped over leading batch
axes is the same statement with one more index per batch axis, on the output and on
every tensor and scalar parameter (which becomes a tensor over the batch indices)."""

from __future__ import annotations

import dataclasses
from typing import Sequence, Set, Tuple

from .ast import Access, Expr, IndexExpr, IndexValue, Param, Reduce, Statement, map_children


def names_in(statement: Statement) -> Set[str]:
    found = {statement.output, *statement.output_indices}
    for node in statement.rhs.walk():
        if isinstance(node, Access):
            found.add(node.tensor)
            for sub in node.indices:
                found.update(sub.index_names)
        elif isinstance(node, Reduce):
            found.update(node.indices)
        elif hasattr(node, "name"):
            found.add(node.name)
    return found


def fresh_indices(statement: Statement, count: int, stem: str = "vb") -> Tuple[str, ...]:
    taken = names_in(statement)
    result, n = [], 0
    while len(result) < count:
        candidate = f"{stem}{n}"
        if candidate not in taken:
            result.append(candidate)
        n += 1
    return tuple(result)


def batch_statement(statement: Statement, batch: Sequence[str]) -> Statement:
    """``statement`` with the indices ``batch`` prepended to its output and to every
    access, and every scalar parameter ``p`` read as ``p[batch...]``."""
    prefix = tuple(IndexExpr(((name, 1),)) for name in batch)

    def visit(expr: Expr) -> Expr:
        if isinstance(expr, Param):
            return Access(expr.name, prefix)
        mapped = map_children(expr, visit)
        if isinstance(mapped, Access):
            return dataclasses.replace(mapped, indices=prefix + mapped.indices)
        return mapped

    return dataclasses.replace(statement, output_indices=tuple(batch) +
                               statement.output_indices, rhs=visit(statement.rhs))


def free_indices(expr: Expr) -> Set[str]:
    """Indices ``expr`` depends on: those it uses that no reduction inside it binds."""
    if isinstance(expr, Reduce):
        return free_indices(expr.body) - set(expr.indices)
    found: Set[str] = set()
    if isinstance(expr, IndexValue):
        found.add(expr.name)
    if isinstance(expr, Access):
        for sub in expr.indices:
            found.update(sub.index_names)
    for child in expr.children():
        found |= free_indices(child)
    return found
