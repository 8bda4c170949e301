"""Hoisting and common-subexpression elimination of reductions (programs.md section 1:
"shared work is computed once, also inside a single statement").

A reduction that does not depend on every loop around it is computed once, before
those loops, into a temporary indexed by the indices it does depend on; two reductions
that are the same up to the names of their reduced indices share one temporary::

    P[i,j] := exp(X[i,j] - max[k](X[i,k])) / sum[k](exp(X[i,k] - max[l](X[i,l])))

becomes the program::

    h1[i]   := max[k](X[i,k])
    h2[i]   := sum[k](exp(X[i,k] - h1[i]))
    P[i,j]  := exp(X[i,j] - h1[i]) / h2[i]

which costs O(rows x cols) instead of O(rows x cols^2).

The rewrite must never change a result, so a reduction is hoisted only where the
temporary's ranges are provably those the statement used (``_hoistable``):

* each index the temporary is indexed by has an explicit range starting at 0 (as a
  gradient statement's indices all have: pooling's ``x[c, 2*i+a3, 2*j+b3]``) or occurs
  in the reduction only as a plain subscript (``X[i,k]``, not ``X[i+1,k]``), so its
  range there is the whole axis, starting at 0, and reading the temporary as ``h[i]``
  constrains ``i`` exactly as the accesses it replaces did;
* each reduced index has an explicit range or occurs in the whole statement only as
  a plain subscript (two reductions over ``k`` share ``k``'s range in the statement);
* no ``pad=`` (reads outside the arrays change how ranges are inferred); an explicit
  range on an index of the temporary starts at 0 (the temporary's kernel gets the same
  range, and position ``p`` of its axis then holds index value ``p``, as reading it
  as ``h[i]`` assumes); and the reduction does not read the statement's own output
  (``=``/``+=``).

Dtypes and errors are the caller's part (runtime.hoisted): temporaries are computed
in the statement's working dtype, and an error in the rewritten form is reported by
the statement as written."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple

from ..lang.ast import (Access, Binary, Expr, IndexExpr, IndexValue, Number, Reduce,
                        Statement, accesses, has_position_reduction, map_children)
from ..lang.rewrite import names_in
from ..lang.sugar import FreshNames, is_count
from .factors import factors
from ..lang.rewrite import free_indices


@dataclass(frozen=True)
class Hoisted:
    """A statement as a program: the temporaries, in order, then the statement itself
    reading them."""
    temporaries: Tuple[Statement, ...]
    statement: Statement

    @property
    def statements(self) -> Tuple[Statement, ...]:
        return self.temporaries + (self.statement,)

    @property
    def index_valued(self) -> bool:
        """Whether a temporary holds index values (a first-extremum position, as max's
        gradient finds): held in the working dtype, they are exact only below 2**24
        (float32) or 2**53 (float64), which the caller checks per call."""
        return any(isinstance(node, IndexValue) for temporary in self.temporaries
                   for node in temporary.rhs.walk())


def hoist(statement: Statement, rhs: Expr,
          explicit_ranges: Tuple[Tuple[str, Tuple[int, int]], ...] = (),
          pad: bool = False) -> Optional[Hoisted]:
    """``statement`` (whose right side with implicit reductions made explicit is
    ``rhs``) with its loop-invariant reductions hoisted into temporaries, or None when
    there is nothing to hoist.  ``explicit_ranges`` are the ``ranges=`` option's
    (index, (start, stop)) pairs."""
    if pad:
        return None
    rewriter = _Rewriter(statement, rhs, explicit_ranges)
    new_rhs = rewriter.visit(rhs, tuple(statement.output_indices))
    if not rewriter.temporaries:
        return None
    return Hoisted(tuple(rewriter.temporaries), dataclasses.replace(statement, rhs=new_rhs))


def subscripts_of(expr: Expr):
    """Every subscript in ``expr`` (gather arrays' own included)."""
    for access in accesses(expr):
        yield from access.indices


def only_plain(index: str, subscripts) -> bool:
    """``index`` occurs in ``subscripts`` only as whole plain subscripts, at least once."""
    seen = False
    for sub in subscripts:
        if index in sub.index_names:
            if sub.plain_index != index:
                return False
            seen = True
    return seen


def canonical(reduce: Expr) -> Expr:
    """``reduce`` (a reduction, or any expression) with its own reduced indices (and those of reductions inside it)
    renamed by position, so that ``max[k](X[i,k])`` and ``max[l](X[i,l])`` compare
    equal."""
    counter = [0]

    def rename(expr: Expr, names: Dict[str, str]) -> Expr:
        if isinstance(expr, Reduce):
            inner = dict(names)
            for index in expr.indices:
                counter[0] += 1
                inner[index] = f"#{counter[0]}"
            return dataclasses.replace(expr, indices=tuple(inner[i] for i in expr.indices),
                                       body=rename(expr.body, inner))
        if isinstance(expr, IndexValue):
            return dataclasses.replace(expr, name=names.get(expr.name, expr.name))
        expr = map_children(expr, lambda child: rename(child, names))
        if isinstance(expr, Access):
            expr = dataclasses.replace(expr, indices=tuple(sub.renamed(names)
                                                           for sub in expr.indices))
        return expr

    return rename(reduce, {})


class _Rewriter:
    def __init__(self, statement: Statement, rhs: Expr, explicit_ranges):
        self.statement = statement
        self.rhs = rhs
        self.explicit = frozenset(name for name, _ in explicit_ranges)
        self.offset = frozenset(name for name, (start, _) in explicit_ranges if start != 0)
        self.names = FreshNames(names_in(statement))   # (h1, h2, ...: not the statement's)
        self.temporaries: List[Statement] = []
        self.shared: Dict[Reduce, Access] = {}     # canonical reduction -> its temporary
        self.subscripts = tuple(subscripts_of(rhs))

    def visit(self, expr: Expr, enclosing: Tuple[str, ...]) -> Expr:
        """``expr`` inside loops over ``enclosing``, its hoistable reductions replaced
        (innermost first, so that a hoisted body reads the temporaries of its own
        invariant parts)."""
        mean = self._mean(expr, enclosing)
        if mean is not None:
            return mean
        if not isinstance(expr, Reduce):
            return map_children(expr, lambda child: self.visit(child, enclosing))
        free = free_indices(expr)
        reduce = self._inner(expr, enclosing)
        if not free < set(enclosing) or not self._hoistable(reduce, free):
            # a reduction that depends on every loop around it (inside a temporary of
            # its own) is still computed once where an equal one has a temporary
            # already: var's mean inside a hoisted factor reads mean's own sums
            known = self.shared.get(canonical(reduce))
            if known is not None and free == set(enclosing) and \
                    self._hoistable(reduce, free):
                return known
            return reduce
        return self.temporary(reduce, tuple(i for i in enclosing if i in free))

    def _inner(self, expr: Reduce, enclosing: Tuple[str, ...]) -> Reduce:
        """The reduction ``expr`` with its body's hoistable reductions replaced."""
        free = free_indices(expr)
        own = tuple(i for i in expr.indices if i not in enclosing)
        # the loops the body runs in once this reduction is itself hoisted: a factor
        # invariant only along an index the whole reduction does not depend on is
        # left to the reduction's own temporary
        body = factors(self, expr.body, tuple(i for i in enclosing if i in free) + own)
        return dataclasses.replace(expr, body=self.visit(body, enclosing + own))

    def _mean(self, expr: Expr, enclosing: Tuple[str, ...]) -> Optional[Access]:
        """The read of the temporary holding ``expr`` whole where it is a mean -- a
        reduction divided by a number or by a count (lang/sugar.is_count) over no other
        indices -- that is hoisted, else None.  A mean is one row value: its temporary
        is ``m[i] := sum[k](X[i,k]) / n``, as a program writes it (and as the row kernels
        match it), not a sum whose readers each divide it again."""
        if not (isinstance(expr, Binary) and expr.op == "/" and
                isinstance(expr.left, Reduce) and
                (isinstance(expr.right, Number) or is_count(expr.right))):
            return None
        free = free_indices(expr.left)
        if not free < set(enclosing) or not free_indices(expr.right) <= free:
            return None
        whole = dataclasses.replace(expr, left=self._inner(expr.left, enclosing))
        if not self._hoistable(whole, free):
            return None
        return self.temporary(whole, tuple(i for i in enclosing if i in free))

    def temporary(self, expr: Expr, order: Tuple[str, ...]) -> Access:
        """The read of the temporary holding ``expr`` over ``order`` (made, or shared
        with an equal expression's)."""
        key = canonical(expr)
        if key not in self.shared:
            name = self.names.numbered("h")
            self.temporaries.append(Statement(name, order, ":=", expr))
            self.shared[key] = Access(name, tuple(IndexExpr(((i, 1),)) for i in order))
        return self.shared[key]

    def _hoistable(self, reduce: Expr, free: Set[str]) -> bool:
        if any(a.tensor == self.statement.output for a in accesses(reduce)):
            return False
        if has_position_reduction(reduce):
            return False    # a temporary in the working dtype would round positions
        own = tuple(subscripts_of(reduce))
        for index in free:
            # an explicit range fixes the index's values whatever its subscripts (the
            # temporary gets the same range: position p holds index value p)
            if index in self.offset or \
                    index not in self.explicit and not only_plain(index, own):
                return False
        for index in _bound(reduce):
            # a reduced index's range is the statement's: plain everywhere, or explicit
            if index not in self.explicit and not only_plain(index, self.subscripts):
                return False
        return True

def _bound(reduce: Expr) -> Set[str]:
    """Every index a reduction binds, its nested reductions' included."""
    found: Set[str] = set()
    for node in reduce.walk():
        if isinstance(node, Reduce):
            found.update(node.indices)
    return found
