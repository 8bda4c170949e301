"""The order a program's statements run in, from its dataflow rather than from the order
they were written in (a program step of rewrite/canonical.py).

The fusion groups (schedule/fusion.py) join consecutive statements, so a statement
written between a producer and its consumer -- a contraction for another output, a
reduction of another array -- would end the producer's group although nothing ties
them.  Here each statement runs as soon after the statement it reads from as the
dataflow allows: among the statements whose inputs are ready, the one reading the
most recently run intermediate goes first (a consumer joins its producer); among
equals, the one with the longest chain of statements depending on it (a producer starts
its consumers' group early), then the statement's text (not its position, so that the
order written does not decide).  So a program and any reordering of its independent
statements run in one order and fuse alike.

Statements that write into an existing array (``=``, ``+=``) keep their place: nothing
moves across one, so every read and write of such an array happens in the order written."""

from __future__ import annotations

import heapq
from typing import Dict, List, Sequence, Tuple

from ..lang.ast import Statement, accesses
from ..lang.printer import format_statement


def dataflow_order(statements: Sequence[Statement]) -> Tuple[int, ...]:
    """The positions of ``statements`` in the order they should run (a permutation
    that keeps every intermediate after its definition)."""
    order: List[int] = []
    segment: List[int] = []
    for position, statement in enumerate(statements):
        if statement.assign == ":=":
            segment.append(position)
            continue
        order += _segment_order(statements, segment)
        order.append(position)          # an update: a barrier
        segment = []
    order += _segment_order(statements, segment)
    return tuple(order)


def _segment_order(statements: Sequence[Statement], segment: List[int]) -> List[int]:
    """The run order of a stretch of ':=' statements (each name defined once)."""
    if len(segment) < 3:
        return list(segment)      # two statements: the second reads the first or not
    defined = {statements[p].output: p for p in segment}
    reads: Dict[int, Tuple[int, ...]] = {}
    for p in segment:
        names = {a.tensor for a in accesses(statements[p].rhs)}
        reads[p] = tuple(sorted(defined[n] for n in names
                                if n in defined and defined[n] != p))
    readers: Dict[int, List[int]] = {p: [] for p in segment}
    for p in segment:
        for q in reads[p]:
            readers[q].append(p)
    chain: Dict[int, int] = {}      # the longest chain of readers after each statement
    for p in reversed(segment):     # (readers come after what they read)
        chain[p] = 1 + max((chain[r] for r in readers[p]), default=0)
    text = {p: format_statement(statements[p]) for p in segment}
    # a statement's key is fixed once it is ready (every producer has its place): the
    # latest-run intermediate it reads (-1: none), its chain, its text; the smallest
    # key runs next, the order as written breaking what is left of ties
    unmet = {p: len(reads[p]) for p in segment}
    ran: Dict[int, int] = {}        # position as written -> its place in the run order
    ready = [((1, -chain[p], text[p]), p) for p in segment if not reads[p]]
    heapq.heapify(ready)
    order: List[int] = []
    while ready:
        _, best = heapq.heappop(ready)
        ran[best] = len(order)
        order.append(best)
        for r in readers[best]:
            unmet[r] -= 1
            if not unmet[r]:
                latest = max(ran[q] for q in reads[r])
                heapq.heappush(ready, ((-latest, -chain[r], text[r]), r))
    # (a program reads only what is defined before it, so every statement gets its
    # place; should one not, the order as written is kept rather than losing it)
    return order if len(order) == len(segment) else list(segment)


__all__ = ["dataflow_order"]
