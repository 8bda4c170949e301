"""A contraction under elementwise work -- ``y[b,o] := max(sum[i](x[b,i]*W[o,i]) +
bias[o], 0)``, a Linear layer's GELU, an attention projection's scale -- split into the
contraction, which BLAS computes into a temporary, and the statement reading it (the
epilogue), which one compiled elementwise pass computes::

    p1[b,o] := sum[i](x[b,i] * W[o,i]) + bias[o]
    y[b,o]  := max(p1[b,o], 0)

One rule, not a spelling: every sum at the top of the right side (inside no other
reduction) whose free indices are output indices and which, as a statement of its own
over those indices, is a contraction BLAS computes (plan/contraction.py) becomes a
temporary -- with a broadcast term added to it where the sum is one side of a ``+``
(plan/contraction_addend.py: one ``addmm``, and the term's gradient a column sum of the
temporary's); expressions equal up to the names of their reduced indices share one
(GELU's ``0.5*z*(1 + erf(z*0.707))`` reads ``z`` twice).  A statement that is a contraction, or one plus a
broadcast term, already runs on BLAS as written (plan/contraction_addend.py) and is
not split.  BLAS's kernels are several times faster than a fused loop nest of the same
product (at 64x784x256 float32, one thread: 0.35 ms against 1.4 ms for the whole
statement), and the epilogue costs one pass over the product, which is small
(b x o against b x o x i multiply-adds); the gradient of the split form is the
program's (dp1 from dy and p1, then dx and dW as two more contractions on BLAS) where
the statement's own gradient would recompute the product inside each gradient
statement.

The temporary's ranges are the statement's by the rules rewrite/hoist.py states (plain
subscripts, explicit ranges from 0, no ``pad=``, no read of the output); dtypes and the
choice of the C backend are the schedule's (schedule/choose.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ..lang.fresh_names import FreshNames
from ..lang.ast import Access, Binary, Expr, IndexExpr, Reduce, Statement, accesses, map_children
from ..lang.printer import format_statement
from ..lang.rewrite import free_indices, names_in
from ..rewrite.hoist import Hoisted, canonical, hoist, only_plain, subscripts_of
from .contraction import match_contraction
from .contraction_addend import match_contraction_addend


@dataclass(frozen=True)
class _Part:
    """What match_contraction reads of a statement, for a sum alone."""
    assign: str
    rhs: Expr
    output: str
    output_indices: Tuple[str, ...]


@dataclass(frozen=True)
class ContractionEpilogue:
    """The contractions split out of a statement (``temporaries``, each computed by
    BLAS as ``contractions`` says) and the elementwise statement reading them."""
    temporaries: Tuple[Statement, ...]
    contractions: Tuple[object, ...]    # Contraction, or ContractionAddend (+ a term)
    epilogue: Statement

    def describe(self) -> str:
        products = "; ".join(f"{t.output} by {c.describe()}"
                             for t, c in zip(self.temporaries, self.contractions))
        return (f"{products}; then the epilogue {format_statement(self.epilogue)} "
                f"in one elementwise pass")


def split_epilogue(statement: Statement, rhs: Expr,
                   explicit_ranges: Tuple[Tuple[str, Tuple[int, int]], ...] = (),
                   pad: bool = False, taken=()) -> Optional[ContractionEpilogue]:
    """``statement`` (right side ``rhs``, its reductions explicit) with its contractions
    under elementwise work split out, or None where there is none (or the statement
    runs on BLAS as written).  ``taken``: names the temporaries must not have."""
    if pad or statement.assign != ":=":
        return None
    out = tuple(statement.output_indices)
    whole = _Part(":=", rhs, statement.output, out)
    if match_contraction(whole) is not None or match_contraction_addend(whole) is not None:
        return None
    splitter = _Splitter(statement, rhs, explicit_ranges, taken)
    new_rhs = splitter.visit(rhs)
    if not splitter.temporaries:
        return None
    return ContractionEpilogue(tuple(splitter.temporaries), tuple(splitter.contractions),
                               dataclasses.replace(statement, rhs=new_rhs))


def epilogue_program(statement: Statement, rhs: Expr,
                     explicit_ranges: Tuple[Tuple[str, Tuple[int, int]], ...] = (),
                     pad: bool = False) -> Optional[Tuple[Hoisted, ContractionEpilogue]]:
    """The statement as a program whose contractions run on BLAS: its hoisted form's
    temporaries (rewrite/hoist.py), the contractions split from the statement that reads
    them, then the epilogue; None where no contraction is split out."""
    hoisted = hoist(statement, rhs, explicit_ranges, pad=pad)
    last = hoisted.statement if hoisted is not None else statement
    earlier = hoisted.temporaries if hoisted is not None else ()
    taken = set(names_in(statement))
    for temporary in earlier:
        taken |= names_in(temporary)
    found = split_epilogue(last, last.rhs if hoisted is not None else rhs,
                           explicit_ranges, pad, frozenset(taken))
    if found is None:
        return None
    return Hoisted(earlier + found.temporaries, found.epilogue), found


class _Splitter:
    def __init__(self, statement: Statement, rhs: Expr, explicit_ranges, taken):
        self.statement = statement
        self.out = tuple(statement.output_indices)
        self.explicit = frozenset(name for name, _ in explicit_ranges)
        self.offset = frozenset(name for name, (start, _) in explicit_ranges if start != 0)
        self.subscripts = tuple(subscripts_of(rhs))
        self.names = FreshNames(set(taken) | names_in(statement))
        self.temporaries: List[Statement] = []
        self.contractions: List[object] = []
        self.shared: Dict[Expr, Access] = {}

    def visit(self, expr: Expr) -> Expr:
        if isinstance(expr, Binary) and expr.op == "+":
            # a broadcast term added to a contraction joins its temporary (one addmm):
            # the epilogue's gradient then reaches the term through the temporary's
            # (a column sum of dp), not through the epilogue's derivative again
            joined = self._temporary(expr, match_contraction_addend)
            if joined is not None:
                return joined
        if not isinstance(expr, Reduce):
            return map_children(expr, self.visit)
        found = self._temporary(expr, match_contraction)
        return expr if found is None else found

    def _temporary(self, expr: Expr, match) -> Optional[Access]:
        """The read of the temporary computing ``expr`` (made, or shared with an equal
        expression's) where ``match`` finds it a BLAS product over its free indices,
        else None."""
        # (a reduction's inside is not elementwise work over the output: left alone)
        key = canonical(expr)
        if key in self.shared:
            return self.shared[key]
        free = free_indices(expr)
        if not free <= set(self.out) or not self._ranges_kept(expr, free):
            return None
        order = tuple(i for i in self.out if i in free)
        name = self.names.numbered("p")
        contraction = match(_Part(":=", expr, name, order))
        if contraction is None:
            return None
        self.temporaries.append(Statement(name, order, ":=", expr))
        self.contractions.append(contraction)
        read = Access(name, tuple(IndexExpr(((i, 1),)) for i in order))
        self.shared[key] = read
        return read

    def _ranges_kept(self, expr: Expr, free) -> bool:
        """Whether the temporary's ranges are provably those the statement used (the
        rules of rewrite/hoist.py's ``_hoistable``)."""
        if any(a.tensor == self.statement.output for a in accesses(expr)):
            return False
        own = tuple(subscripts_of(expr))
        for index in free:
            if index in self.offset or \
                    index not in self.explicit and not only_plain(index, own):
                return False
        bound = {i for node in expr.walk() if isinstance(node, Reduce) for i in node.indices}
        return all(index in self.explicit or only_plain(index, self.subscripts)
                   for index in bound)

