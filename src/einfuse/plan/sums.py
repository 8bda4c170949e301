"""Accurate long sums for the C plans: blocks folded into compensated totals.

A float sum of n terms added one after another into one accumulator has a relative
error growing like n (10**6 values of 0.1 in float32: 6e-4; float64: 2e-12).  A long
sum here runs in blocks: each block's partial takes at most LANE_TILES (or CHAIN_BLOCK)
terms in a row and is then added to the total with Neumaier's compensated addition
(:class:`ir.Fold`), so the error is that of one block plus a few roundings, whatever n
is (float32 3e-7, float64 5e-16 on that case).  A short reduction (at most the limits
below, counted at run time, or over indices short in this call) runs as it always did,
as one SIMD reduction or one register per output: nested reductions and dist's
784-term sums pay nothing.

Each block's partial is a fresh local, folded when its block ends, so that it stays in
registers (a partial living across blocks, folded every so often, is spilled); the
errors live in the long branch only and are added back at its end
(:class:`ir.Compensate`): the short branch is the code it always was.  New
names are fresh accumulators (``a7``) and loop counters (``p9``), as the renderers
expect of generated names.
"""

from __future__ import annotations

from typing import Callable, Tuple

from .. import ir
from ..ir import LoopKind, ReduceOp
from ..ir import Affine

SIMD_LIMIT = 2048    # a sum of at most this many terms: one SIMD reduction, as before;
LANE_BYTES = 256     # longer: explicit lanes (4 AVX-512 vectors: 64 float32, 32 float64),
LANE_TILES = 32      # each lane adding this many terms per block
CHAIN_BLOCK = 64     # terms per block of an accumulator that takes one term at a time
TILED_LIMIT = 1024   # tiled outputs' folds cost ~1/CHAIN_BLOCK of their work: only
#                      longer sums than this (not dist's 784) take them


class BlockedSums:
    """Mixed into plan.lower._Lowering, which provides ``working``, ``plain``,
    ``short``, ``tile``, ``index_no``, ``lo``, ``extent``, ``expr``, ``fresh_acc``,
    ``fresh_var`` and ``outer_reduction_loops``."""

    def sum_blocks(self, op: str, indices) -> bool:
        """Whether a reduction is a float sum that runs in blocks when it is long: not
        over indices all short in this call (gauss's d = 3), where there is nothing to
        gain, not even the test for length."""
        return op == "sum" and self.working.kind == "f" and not self.plain and \
            not all(name in self.short for name in indices)

    def long_index(self, order) -> str:
        """The reduced index that blocks run along: the innermost one that is not short
        (a short innermost index would end a block every few terms)."""
        return next(name for name in reversed(order) if name not in self.short)

    def extents(self, order) -> Tuple[Affine, ...]:
        return tuple(self.extent(name) for name in order)

    def lane_sum(self, body, acc: str, order, env, loops) -> ir.Stmt:
        """A sum whose body vectorises: ``loops`` (one SIMD reduction) up to SIMD_LIMIT
        terms, else LANE_BYTES of explicit lanes, each lane a chain of LANE_TILES terms
        per block whether or not the compiler vectorises (a strided body may not); the
        lanes' totals are added pairwise at the end."""
        lanes = LANE_BYTES // self.working.itemsize
        index = self.long_index(order)
        tile, lane, count = self.fresh_var(), self.fresh_var(), self.fresh_var()
        env = dict(env)   # (not a lane index to pack inputs for: each term is read once)
        env[index] = self.lo(index) + Affine.var(tile) + Affine.var(lane)
        partial = self.fresh_acc()
        step = ir.Loop(lane, Affine.var(count), LoopKind.VECTORISED,
                       (ir.Accumulate(partial, ReduceOp.SUM, self.expr(body, env, []), lane),),
                       simd=True)
        return self.lane_branch(order, index, acc, lanes, tile, count, (step,), partial,
                                loops)

    def tiled_lane_sum(self, acc: str, order, tile: str, count: str, body,
                       step: Callable[[str], ir.Stmt], loops) -> ir.Stmt:
        """A sum already in tiles of lanes (its body holds nested reductions, one per
        lane, plan.lower's lane_tiled_reduce): ``loops`` (each tile combined into the
        scalar accumulator) up to SIMD_LIMIT terms, else each lane keeps a partial
        (``step(partial)`` after ``body``) per block of tiles, as in :meth:`lane_sum`."""
        partial = self.fresh_acc()
        return self.lane_branch(order, order[-1], acc, self.tile, tile, count,
                                tuple(body) + (step(partial),), partial, loops)

    def lane_branch(self, order, index: str, acc: str, lanes: int, tile: str, count: str,
                    body, partial: str, loops) -> ir.Stmt:
        """``loops`` when short, else blocks of LANE_TILES tiles of ``lanes`` along
        ``index``: per block a fresh lane partial, the tiles (``body`` runs at ``tile``,
        ``count`` lanes, and accumulates into ``partial``), then its fold into the lane
        totals, which are combined into ``acc`` at the end."""
        totals, errors, error = self.fresh_acc(), self.fresh_acc(), self.fresh_acc()
        first, size = self.fresh_var(), self.fresh_var()
        tiles = ir.TiledLoop(tile, Affine.var(first) + Affine.var(size), lanes, count,
                             LoopKind.REDUCTION, tuple(body), start=Affine.var(first))
        block = ir.TiledLoop(first, self.extent(index), lanes * LANE_TILES, size, LoopKind.REDUCTION,
                             (ir.DeclareAcc(partial, ReduceOp.SUM, lanes=lanes), tiles,
                              ir.Fold(totals, errors, partial, lanes=lanes)),
                             constant_full=False)
        large = (ir.DeclareAcc(totals, ReduceOp.SUM, lanes=lanes),
                 ir.DeclareAcc(errors, ReduceOp.SUM, lanes=lanes), ir.DeclareAcc(error, ReduceOp.SUM)) + \
            self.outer_reduction_loops([n for n in order if n != index], block) + \
            (ir.CombineLanes(totals, ReduceOp.SUM, lanes, acc, (errors, error)),
             ir.Compensate(acc, error))
        return ir.Branch(self.extents(order), SIMD_LIMIT, tuple(loops), large)

    def chain_sum(self, acc: str, order, innermost: Callable[[str], Tuple[ir.Stmt, ...]],
                  shape, loops, tiled: bool) -> ir.Stmt:
        """A sum whose accumulators each take one term at a time (a lane of a tiled
        output, or a body that does not vectorise): ``loops`` when short, else blocks
        of CHAIN_BLOCK iterations of the long index, each into a fresh partial of the
        accumulators' shape, folded after it."""
        index = self.long_index(order)
        partial, error = self.fresh_acc(), self.fresh_acc()
        first, size = self.fresh_var(), self.fresh_var()
        inner = ir.Loop(f"p{self.index_no[index]}", Affine.var(first) + Affine.var(size),
                        LoopKind.REDUCTION, innermost(partial), start=Affine.var(first))
        chunk = ir.TiledLoop(first, self.extent(index), CHAIN_BLOCK, size, LoopKind.REDUCTION,
                             (ir.DeclareAcc(partial, ReduceOp.SUM, **shape), inner,
                              ir.Fold(acc, error, partial, **shape)), constant_full=False)
        large = (ir.DeclareAcc(error, ReduceOp.SUM, **shape),) + \
            self.outer_reduction_loops([n for n in order if n != index], chunk) + \
            (ir.Compensate(acc, error, **shape),)
        return ir.Branch(self.extents(order), TILED_LIMIT if tiled else CHAIN_BLOCK,
                         tuple(loops), large)
