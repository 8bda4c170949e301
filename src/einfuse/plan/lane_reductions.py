"""The loop-nest schedule's reductions that walk lanes or nest loops: argmax/argmin's
positions, the loops of a reduction, lane tiles of a reduced index, the lane partials
of max/min/logsumexp/argmax/argmin and the lane-tiled sums over nested reductions.
Mixed into plan.lower._Lowering (which provides ``expr``, ``extent``, ``lo``,
``index_no``, ``working``, ``tile``, ``lane_indices``, ``n_acc``, ``n_var``,
``sum_blocks`` and ``tiled_lane_sum``)."""

from __future__ import annotations

from typing import List, Tuple

from .. import ir
from ..ir import Affine, LoopKind
from ..lang import ast


class LaneReductions:
    def position(self, e: ast.Reduce, counters=None) -> Tuple[Tuple[Affine, Affine], ...]:
        """For argmax/argmin, (counter, extent) per reduced index in the listed order
        (ir.Accumulate.position); ``counters`` replaces an index's loop counter."""
        if e.op not in ast.POSITION_REDUCTIONS:
            return ()
        counters = counters or {}
        return tuple((counters.get(k, Affine.var(f"p{self.index_no[k]}")), self.extent(k))
                     for k in e.indices)

    def fresh_acc(self) -> str:
        self.n_acc += 1
        return f"a{self.n_acc - 1}"

    def fresh_var(self) -> str:
        """A loop counter after the indices' own (p0, p1 ... are theirs)."""
        self.n_var += 1
        return f"p{self.n_var - 1}"

    def reduction_loops(self, order, body, target: str, op: str,
                        simd: bool) -> Tuple[ir.Stmt, ...]:
        """The loops over ``order`` (outermost first) around ``body``, which accumulates
        into ``target``; the innermost one a SIMD reduction with ``simd``."""
        for depth, name in enumerate(reversed(order)):
            here = simd and depth == 0
            body = (ir.Loop(f"p{self.index_no[name]}", self.extent(name), LoopKind.REDUCTION, body,
                            simd=here, reductions=((target, op),) if here else ()),)
        return body

    def lane_tile(self, inner: str, acc: str, env):
        """Names for walking reduction index ``inner`` in tiles of lanes (block start,
        lane, lane count) and ``env`` with ``inner`` = its start + block + lane."""
        self.lane_indices.append(inner)
        block, lane, count = f"r{self.index_no[inner]}", f"l{acc}", f"c{acc}"
        env = dict(env)
        env[inner] = self.lo(inner) + Affine.var(block) + Affine.var(lane)
        return block, lane, count, env

    def outer_reduction_loops(self, names, inner: ir.Stmt) -> Tuple[ir.Stmt, ...]:
        """``inner`` inside plain loops over the other reduced ``names`` (outermost first)."""
        body: Tuple[ir.Stmt, ...] = (inner,)
        for name in reversed(names):
            body = (ir.Loop(f"p{self.index_no[name]}", self.extent(name), LoopKind.REDUCTION, body),)
        return body

    def lane_partial_reduce(self, e: ast.Reduce, acc: str, order, env, pre) -> ir.Expr:
        """max/min/logsumexp/argmax/argmin have no OpenMP SIMD reduction that keeps
        NumPy's NaN rules; instead four vectors of lanes each keep their own partial result
        (branch-free updates), folded into one value at the end (:class:`ir.CombineLanes`;
        argmax/argmin: the better value, on a tie the earlier position)."""
        # four 64-byte vectors: independent chains, so the compare-and-select latency of
        # one lane group overlaps the others (one vector: 5x slower than torch.amax)
        lanes_count = max(4, 256 // self.working.itemsize)
        block, lane, count, env = self.lane_tile(order[-1], acc, env)
        partial = acc + "v"
        value = self.expr(e.body, env, [])
        # each lane: its first extremum and where (the last index walks block + lane)
        position = self.position(e, {order[-1]: Affine.var(block) + Affine.var(lane)})
        step = ir.Loop(lane, Affine.var(count), LoopKind.VECTORISED,
                       (ir.Accumulate(partial, e.op, value, lane, position=position),),
                       simd=True)
        tiles = ir.TiledLoop(block, self.extent(order[-1]), lanes_count, count, LoopKind.REDUCTION,
                             (step,))
        pre.append(ir.DeclareAcc(partial, e.op, lanes=lanes_count))
        pre.extend(self.outer_reduction_loops(order[:-1], tiles))
        pre.append(ir.CombineLanes(partial, e.op, lanes_count, acc))
        return ir.AccValue(acc, e.op)

    def nested_lanes_pay(self, e: ast.Reduce, inner: str) -> bool:
        """Whether lanes over ``inner`` pay for a sum whose body holds reductions
        (:meth:`lane_tiled_reduce`): each nested reduction is short (gauss's d = 3), or
        a load inside it walks ``inner`` (the lanes' terms are then one vector load).
        Otherwise every lane walks a long nested reduction of its own, far from the
        others': ``sum[n](max[c](X[n,c]))`` read 128 rows 4 kB apart at each step of c,
        6.1 ms against 0.40 ms for a plain loop over n around each row's vector max
        (2048 x 1024 float32, one thread, Zen 4)."""
        return all(set(r.indices) <= self.short or self.contiguity(inner, r.body) > 0
                   for r in ast.reductions(e.body))

    def lane_tiled_reduce(self, e: ast.Reduce, acc: str, order, env, pre) -> ir.Expr:
        """A sum/prod whose body holds nested reductions (gauss: the sum over j of
        exp(-sum over d ...)): its innermost index runs in tiles of lanes, each nested
        reduction keeps one register accumulator per lane (``for d: for lane``), and
        the lane loop that combines them is SIMD (exp on a vector, via libmvec).  The
        nested loops are typically short (d = 3) and this one long."""
        block, lane, count, env = self.lane_tile(order[-1], acc, env)
        body_pre: List[ir.Stmt] = []
        value = self.expr(e.body, env, body_pre, lanes=(lane, count))
        combine = ir.Loop(lane, Affine.var(count), LoopKind.VECTORISED,
                          (ir.Accumulate(acc, e.op, value),), simd=True,
                          reductions=((acc, e.op),))
        tiles = self.outer_reduction_loops(order[:-1], ir.TiledLoop(
            block, self.extent(order[-1]), self.tile, count, LoopKind.REDUCTION,
            tuple(body_pre) + (combine,)))
        pre.append(ir.DeclareAcc(acc, e.op))
        if not self.sum_blocks(e.op, order):
            pre.extend(tiles)
            return ir.AccValue(acc, e.op)

        def step(partial: str) -> ir.Stmt:
            return ir.Loop(lane, Affine.var(count), LoopKind.VECTORISED,
                           (ir.Accumulate(partial, e.op, value, lane),), simd=True)
        pre.append(self.tiled_lane_sum(acc, order, block, count, body_pre, step, tiles))
        return ir.AccValue(acc, e.op)
