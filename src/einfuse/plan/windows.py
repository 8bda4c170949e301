"""Lane tiles over strided windows (max/min pooling): when the C planner may spread an
output index over SIMD lanes although its loads step by more than one element, and
when it blocks rows.  See docs/backends.md, "strided windows"."""

from __future__ import annotations

from typing import Iterable

from ..lang import ast

# A lane tile pays where the lanes' loads step along a unit-stride axis by a few
# elements (pooling's x[c, 2*i+a, 2*j+b]): GCC loads such lanes with a few vector loads
# and shuffles, and the small reductions then run across the tile, not one output
# element at a time (64x64x64 2x2 pooling: 3-8x faster).
LANE_STEPS = (1, -1, 2, -2, 3, -3, 4, -4)
UNIT_STEPS = (1, -1)

# Reductions whose result is one of the values folded (or its position): the lane plan
# folds each output element in the same order as the scalar plan, so the choice of plan
# cannot change a bit.  A long sum or logsumexp would round differently on lanes (no
# SIMD reduction clause, no per-lane partials), so they keep their plans.
SELECTIONS = frozenset({"max", "min", "argmax", "argmin"})


def wide_lanes(rhs: ast.Expr, plain: bool, short: Iterable[str] = ()) -> bool:
    """Whether lanes may step by more than one element: every reduction selects, or is
    a window's sum (every index it sums is ``short``, under a vector's width, and moves
    a window: average pooling's ``sum[p,q](x[b, c, 2*i+p, 2*j+q])``), and the renderer
    is the C backend's
    (``plain`` block-per-program renderers such as Triton keep unit steps; the wider
    ones were not measured on a GPU).  A window's sum on lanes adds each output's
    terms one after another in the window's order; the scalar plan would spread a
    window row of 3 over SIMD lanes (a reduction clause's order) and run 12x slower
    (8x16x64x64 float32, 3x3 stride 2, one thread on Zen 4: 3.1 -> 0.25 ms; max-pooling,
    the same lanes, 0.93 ms)."""
    if plain:
        return False
    few = set(short)
    return all(r.op in SELECTIONS or (r.op == "sum" and _window_sum(r, few))
               for r in ast.reductions(rhs))


def _window_sum(reduce: ast.Reduce, short) -> bool:
    """Whether every index ``reduce`` sums is short and moves a window: it is read in a
    subscript beside another index (``2*i + p``), not as a plain axis of its own (dist's
    ``w[k, i]`` over a short ``k`` is a contraction, whose plans the short-index rules
    choose)."""
    windowed = {name for access in ast.accesses(reduce.body) for sub in access.indices
                if len(sub.index_names) > 1 for name in sub.index_names}
    return all(name in short and name in windowed for name in reduce.indices)


def read_once_per_block(row: str, tops: Iterable[ast.Reduce]) -> bool:
    """Whether some load inside the reductions moves with the reduction but not with
    ``row``: a block of rows then reads it once for all its rows (dist's x[k, j]),
    which is what row blocks are for.  Where every load moves with the row (pooling's
    x[c, 2*i+a, 2*j+b]) a block only adds accumulators: 2x2 max-pooling ran 2x faster
    without (1.1 -> 0.55 ms)."""
    for top in tops:
        bound = {i for r in ast.reductions(top) for i in r.indices}
        for access in ast.accesses(top.body):
            names = {n for sub in access.indices for n in sub.index_names}
            if row not in names and names & bound:
                return True
    return False
