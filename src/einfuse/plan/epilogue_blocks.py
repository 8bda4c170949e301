"""A reduction over an elementwise function of a contraction, run as a register block
with an epilogue: ``g[i] := sum[j](f(sum[k](body)))`` (the Gaussian-kernel sum
``sum[j](exp(-sum[k]((w[k,i] - x[k,j])**2) * s))``, or any f: tanh, sqrt, a where, a
product with ``b[j]``) on a tile of output lanes over ``i``.

Lowered the plain way, each lane's inner sum over k runs alone inside the lane loop
(``for j: for lane: for k``): the lane loop cannot keep a vector of accumulators, so
the inner sum is a scalar chain per output, gathered across lanes (K=784, 1024 x 1024:
0.5 GFLOP/s against dist's 70-120).  Here the outer reduced index j is blocked in rows
instead, as dist blocks its second output index (plan/blocking.py's register block):

    for j0 in 0..n_j step R:                 # rows = min(R, rest)
      acc[R][W] = 0                           # registers
      for k:  for row:  for lane:  acc[row][lane] += body      # dist's block
      for row:  for lane:  out[lane] op= f(acc[row][lane])     # the epilogue

Per step of k a lane vector of the operand that does not move with j (``w[k, i]``) is
loaded once for all R rows and the operand that does (``x[k, j]``) is broadcast once
per row: dist's FMAs per load.  f runs once per finished (i, j) value, on vectors (one
vector exp per accumulator vector), its cost next to the block's K terms per element
small; the outer reduction takes its terms per lane in the order of j, as before, and
a long one runs in compensated chunks (plan/sums.py) of whole row blocks.

The rule is the shape, not the spelling: an outer sum/prod/max/min over one index,
not short, whose body holds exactly one reduction (sum/prod/max/min, not nested, not
over short indices only: there f is the work) that moves with that index and reads
some operand once per block (``read_once_per_block``);
mixed into plan.lower._Lowering (which provides ``expr``, ``extent``, ``lo``,
``index_no``, ``block``, ``tile``, ``short``, ``plain``, ``checks``, ``order_indices``,
``sum_blocks``, ``fresh_acc`` and ``fresh_var``)."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from .. import ir
from ..ir import Affine, LoopKind, ReduceOp
from ..lang import ast
from .sums import CHAIN_BLOCK, TILED_LIMIT
from .windows import read_once_per_block

# The reductions an epilogue block takes: those whose Accumulate needs no position and
# no running maximum (argmax/logsumexp keep their own lane partials).
OUTER_OPS = ("sum", "prod", "max", "min")
INNER_OPS = ("sum", "prod", "max", "min")


def _inner_reductions(expr: ast.Expr) -> List[ast.Reduce]:
    """The reductions of ``expr`` that no other reduction inside it encloses."""
    if isinstance(expr, ast.Reduce):
        return [expr]
    found: List[ast.Reduce] = []
    for child in expr.children():
        if not isinstance(expr, ast.Access):
            found += _inner_reductions(child)
    return found


class EpilogueBlocks:
    def epilogue_block_index(self, e: ast.Reduce) -> Optional[str]:
        """The reduced index of ``e`` that runs in row blocks with its inner reduction
        as the block's accumulators, or None where ``e`` does not take that form."""
        if self.plain or self.checks or e.op not in OUTER_OPS or len(e.indices) != 1 \
                or self.block[0] < 2:
            return None
        index = e.indices[0]
        if index in self.short:
            return None
        inner = _inner_reductions(e.body)
        if len(inner) != 1:
            return None
        reduction = inner[0]
        if reduction.op not in INNER_OPS or any(True for _ in ast.reductions(reduction.body)):
            return None
        if all(name in self.short for name in reduction.indices):
            # gauss D=3: f is the work, and GCC's AVX2 code for the block's epilogue
            # called the scalar exp for most lanes (2x slower than lanes over j)
            return None
        used = {n for a in ast.accesses(reduction.body) for sub in a.indices
                for n in sub.index_names}
        if index not in used or not read_once_per_block(index, [reduction]):
            return None
        return index

    def takes_epilogue_blocks(self, tops: Sequence[ast.Reduce]) -> bool:
        """Whether a top-level reduction of a lane-tiled output takes the epilogue
        block (its lane tile is then the register block's width)."""
        return any(self.epilogue_block_index(top) is not None for top in tops)

    def epilogue_block_reduce(self, e: ast.Reduce, acc: str, env, pre: List[ir.Stmt],
                              lanes) -> ir.Expr:
        """``e`` (epilogue_block_index found its index) over the output lanes ``lanes``
        (lane counter, lane count): its index in row blocks, the inner reduction a
        rows x lanes block of accumulators, ``e``'s body its epilogue."""
        lane, count = lanes[:2]
        index = e.indices[0]
        rows = self.block[0]
        start, row, row_count = f"b{self.index_no[index]}", self.fresh_var(), self.fresh_var()
        env = dict(env)
        env[index] = self.lo(index) + Affine.var(start) + Affine.var(row)
        body_pre: List[ir.Stmt] = []
        value = self.expr(e.body, env, body_pre, lanes=(lane, count, row, row_count))

        def epilogue(target: str) -> Tuple[ir.Stmt, ...]:
            # the rows inside the lane loop: each vector of lanes takes its R terms in
            # the order of j, R independent f's in flight (the rows outside, GCC's
            # AVX2 code called a scalar exp for half the lanes: gauss D=3 2x slower)
            rows_step = ir.Loop(row, Affine.var(row_count), LoopKind.SERIAL,
                                (ir.Accumulate(target, e.op, value, lane),))
            return (ir.Loop(lane, Affine.var(count), LoopKind.VECTORISED, (rows_step,),
                            simd=True),)

        def blocks(target: str, first=None, extent=None) -> ir.Stmt:
            return ir.TiledLoop(start, extent if extent is not None else self.extent(index),
                                rows, row_count, LoopKind.REDUCTION,
                                tuple(body_pre) + epilogue(target), start=first)

        # the plan's row index: inputs read across its rows along their unit stride
        # are packed along the reduction (plan/lane_layout.packing_for_rows), as dist's
        self.row_index = index
        pre.append(ir.DeclareAcc(acc, e.op, lanes=self.tile))
        if not self.sum_blocks(e.op, (index,)):
            pre.append(blocks(acc))
        else:
            pre.append(self._compensated_blocks(acc, index, blocks))
        return ir.AccValue(acc, e.op, lane)

    def _compensated_blocks(self, acc: str, index: str, blocks) -> ir.Stmt:
        """The row blocks as they are up to TILED_LIMIT terms, else in chunks of whole
        blocks (about CHAIN_BLOCK terms), each chunk's lane partial folded into the
        total with compensation (plan/sums.chain_sum's rule, chunks a multiple of the
        rows so that every block but the last is full)."""
        rows = self.block[0]
        chunk = rows * max(1, -(-CHAIN_BLOCK // rows))
        shape = {"lanes": self.tile}
        partial, error = self.fresh_acc(), self.fresh_acc()
        first, size = self.fresh_var(), self.fresh_var()
        inner = blocks(partial, Affine.var(first), Affine.var(first) + Affine.var(size))
        chunks = ir.TiledLoop(first, self.extent(index), chunk, size, LoopKind.REDUCTION,
                              (ir.DeclareAcc(partial, ReduceOp.SUM, **shape), inner,
                               ir.Fold(acc, error, partial, **shape)), constant_full=False)
        large = (ir.DeclareAcc(error, ReduceOp.SUM, **shape), chunks,
                 ir.Compensate(acc, error, **shape))
        return ir.Branch((self.extent(index),), TILED_LIMIT, (blocks(acc),), large)
