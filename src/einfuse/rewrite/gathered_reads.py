"""A gather of an intermediate read at its gathered point (issue 31: the canonical form
does not depend on how a program is cut into statements).  ``Y[n,c] := X[n,c] -
logsumexp[k](X[n,k])`` then ``L[n] := -Y[n, y[n]]`` is ``L[n] := -(X[n, y[n]] -
logsumexp[k](X[n,k]))``: the cross-entropy the row-statistics kernel runs, one read of
X, where the statements as written make the whole log-softmax matrix to read one entry
of each row.

An intermediate is read at its gathered point only where that is its value there:

* it is a ``:=`` intermediate, not an output, written once, its indices plain and
  distinct subscripts of what it reads (its extents are its inputs' axes);
* each index read through a gather (``c`` in ``Y[n, y[n]]``) appears in its right side
  only as a whole plain subscript of an array (``X[n,c]``, never ``c`` as a value, in
  an affine subscript or inside an index array): the expression at ``c = y[n]`` reads
  ``X[n, y[n]]``, the same element, so the same operations give the same value;
* every read of it, in every later statement, is by distinct plain subscripts for its
  other indices (each read is replaced; the intermediate is then dropped).

Bounds: the gathered array has the intermediate's extent along that axis (its plain
subscript gave the intermediate that extent), so ``bounds="check"`` raises the same
OutOfBoundsError for the same index array and value -- naming the array read, not the
intermediate -- and ``"clip"``, ``"wrap"`` and ``"promise"`` read the same positions.
Under ``"fill"`` the intermediate read out of range is ``fill=`` where the expression
would be computed from ``fill=``: the step is taken only where the options name one of
the other four (``Options.rewrite_options``)."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Set, Tuple

from ..lang.ast import Access, Expr, IndexExpr, IndexValue, Reduce, Statement, accesses, \
    map_children
from ..lang.rewrite import free_indices, names_in
from ..lang.sugar import FreshNames, rename_indices
from .hoist import only_plain, subscripts_of

# the bounds policies under which a gathered read of the intermediate and of the array it
# reads give the same values or the same error
SAME_READ_POLICIES = frozenset({"bounds=check", "bounds=clip", "bounds=wrap",
                                "bounds=promise"})

# statements looked at (each read is looked at once per intermediate)
GATHERED_STATEMENTS = 64


def _candidate(statement: Statement, outputs: Set[str]) -> bool:
    rhs = statement.rhs
    if statement.assign != ":=" or statement.output in outputs or \
            len(set(statement.output_indices)) != len(statement.output_indices) or \
            free_indices(rhs) != set(statement.output_indices):
        return False
    own = list(subscripts_of(rhs))
    return all(only_plain(i, own) for i in statement.output_indices)


def _only_plain_subscript(expr: Expr, index: str) -> bool:
    """Whether ``index`` appears free in ``expr`` only as a whole plain subscript of an
    access that is not itself an index array."""
    def fine(node: Expr, bound: frozenset, in_gather: bool) -> bool:
        if isinstance(node, Reduce):
            return fine(node.body, bound | set(node.indices), in_gather)
        if isinstance(node, IndexValue):
            return node.name != index or index in bound
        if isinstance(node, Access):
            for sub in node.indices:
                uses = index in sub.index_names and index not in bound
                if uses and (in_gather or sub.plain_index != index):
                    return False
                if not all(fine(a, bound, True) for a, _ in sub.gathers):
                    return False
            return True
        return all(fine(child, bound, in_gather) for child in node.children())

    return fine(expr, frozenset(), False)


def _with_subscript(expr: Expr, index: str, subscript: IndexExpr) -> Expr:
    """``expr`` with each plain subscript ``index`` replaced by ``subscript`` (its free
    uses: the caller has checked that those are the only ones)."""
    if isinstance(expr, Reduce):
        if index in expr.indices:
            return expr
        return dataclasses.replace(expr, body=_with_subscript(expr.body, index, subscript))
    expr = map_children(expr, lambda child: _with_subscript(child, index, subscript))
    if isinstance(expr, Access):
        expr = dataclasses.replace(expr, indices=tuple(
            dataclasses.replace(subscript, span=sub.span) if sub.plain_index == index
            else sub for sub in expr.indices))
    return expr


def fresh_binders(expr: Expr, fresh: FreshNames, avoid: Set[str]) -> Expr:
    """``expr`` with each reduction's indices that are in ``avoid`` renamed afresh, so
    that substituting the reader's names and subscripts captures none."""
    if isinstance(expr, Reduce):
        names = {k: fresh.copy_of(k) for k in expr.indices if k in avoid}
        body = fresh_binders(rename_indices(expr.body, names), fresh, avoid)
        return dataclasses.replace(expr, indices=tuple(names.get(k, k) for k in expr.indices),
                                   body=body)
    return map_children(expr, lambda child: fresh_binders(child, fresh, avoid))


def _read_at(definition: Statement, read: Access, fresh: FreshNames,
             reader_names: Set[str]) -> Optional[Expr]:
    """The definition's right side at the point ``read`` reads, or None where a read
    is not one this step can replace."""
    indices = definition.output_indices
    if len(read.indices) != len(indices):
        return None
    plain: Dict[str, str] = {}
    gathered: List[Tuple[str, IndexExpr]] = []
    for index, sub in zip(indices, read.indices):
        if sub.plain_index is not None:
            plain[index] = sub.plain_index
        elif sub.gathers and not sub.quasi:
            gathered.append((index, sub))
        else:
            return None     # (an affine read: the put-back passes' business)
    if len(set(plain.values())) != len(plain) or not gathered:
        return None
    rhs = definition.rhs
    if not all(_only_plain_subscript(rhs, index) for index, _ in gathered):
        return None
    avoid = reader_names | {i for sub in read.indices for a, _ in sub.gathers
                            for node in a.walk() for i in free_indices(node)}
    rhs = fresh_binders(rhs, fresh, avoid | set(indices))
    # the gathered indices first under names no one uses, then every index renamed
    placeholders = {index: fresh.copy_of(index) for index, _ in gathered}
    rhs = rename_indices(rhs, {**placeholders, **plain})
    for index, sub in gathered:
        rhs = _with_subscript(rhs, placeholders[index], sub)
    return rhs


def _replace_reads(expr: Expr, definition: Statement, fresh: FreshNames,
                   reader_names: Set[str]) -> Optional[Expr]:
    failed = [False]

    def visit(node: Expr) -> Expr:
        if isinstance(node, Access) and node.tensor == definition.output:
            value = _read_at(definition, node, fresh, reader_names)
            if value is None:
                failed[0] = True
                return node
            return value
        if isinstance(node, Access) and any(a.tensor == definition.output
                                            for a in accesses(node)):
            failed[0] = True          # read as an index array
            return node
        return map_children(node, visit)

    result = visit(expr)
    return None if failed[0] else result


def read_gathers_at_their_points(statements: List[Statement], outputs: Set[str],
                                 options: frozenset, shared: List[str]
                                 ) -> Tuple[List[Statement], Tuple[int, ...]]:
    """The statements with each intermediate that is read only through gathers (see the
    module's conditions) replaced by its value at the gathered points, and dropped; and
    each kept statement's position in the given list."""
    if not options & SAME_READ_POLICIES or len(statements) > GATHERED_STATEMENTS or \
            len(statements) < 2:
        return statements, tuple(range(len(statements)))
    result: List[Optional[Statement]] = list(statements)
    for position, definition in enumerate(statements):
        if not _candidate(definition, outputs):
            continue
        later = result[position + 1:]
        if any(s is not None and s.output == definition.output for s in later):
            continue
        readers = [k for k in range(position + 1, len(result)) if result[k] is not None
                   and any(a.tensor == definition.output for a in accesses(result[k].rhs))]
        if not readers:
            continue
        replaced = {}
        for k in readers:
            reader = result[k]
            names = names_in(reader)
            fresh = FreshNames(names | names_in(definition))
            rhs = _replace_reads(reader.rhs, definition, fresh, names)
            if rhs is None:
                break
            replaced[k] = rhs
        if len(replaced) != len(readers):
            continue
        for k, rhs in replaced.items():
            result[k] = dataclasses.replace(result[k], rhs=rhs, source="")
            shared.append(f"{result[k].output}: {definition.output} read at its "
                          f"gathered points")
        result[position] = None
    kept = tuple(k for k, s in enumerate(result) if s is not None)
    return [result[k] for k in kept], kept


__all__ = ["read_gathers_at_their_points", "SAME_READ_POLICIES"]
