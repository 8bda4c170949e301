"""A row maximum (or minimum) of a fused group with a short combine of its lanes.

The C lowering keeps a float row max in 64 per-lane partials (32 for float64: four
SIMD vectors; no OpenMP reduction clause keeps NumPy's NaN rule) and combines them one
after another at the end of the row: 64 dependent NaN-aware comparisons, which cost
as much as the whole max pass on a 256-column row (softmax on 8192x256).  In a fused
group, where that combine runs once per row, the partials are kept instead as four
rows of one vector each (``rows=4``): full tiles of the row spread over the four
rows exactly as before (four independent chains), the last partial tile goes
vector by vector into one more vector of partials, and at the end of the row the
four rows are folded into that vector with SIMD comparisons before its lanes are
combined: a quarter of the dependent steps.

The maximum is the same value; what may change is which of several equal candidates
is kept (the sign of a zero maximum when the row holds both +0 and -0) and which
NaN is returned when a row holds NaNs of different payloads -- as in NumPy, whose
SIMD reductions do not specify either.  A result computed from the maximum by
subtracting it (softmax) has the same bits."""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

from .. import ir
from ..ir import LoopKind, ReduceOp

# the number of vectors of partials of a full tile (the rows of the accumulator)
_ROWS = 4


def combine_extrema_by_vectors(body: Tuple[ir.Stmt, ...]) -> Tuple[ir.Stmt, ...]:
    """``body`` with every row max/min over a tiled loop of per-lane partials kept as
    rows of vectors (module docstring); other statements as they are."""
    out: List[ir.Stmt] = []
    position = 0
    while position < len(body):
        rewritten = None
        if position + 2 < len(body):
            rewritten = _rewrite(*body[position:position + 3])
        if rewritten is None:
            out.append(body[position])
            position += 1
            continue
        out += rewritten
        position += 3
    return tuple(out)


def _rewrite(declare, tiled, combine) -> Optional[List[ir.Stmt]]:
    if not isinstance(declare, ir.DeclareAcc) or declare.op not in (ReduceOp.MAX, ReduceOp.MIN) or \
            declare.lanes is None or declare.rows is not None or \
            declare.lanes % _ROWS or declare.lanes // _ROWS < 2:
        return None
    acc, op, lanes = declare.name, declare.op, declare.lanes
    if not isinstance(tiled, ir.TiledLoop) or tiled.tile != lanes or len(tiled.body) != 1:
        return None
    if not isinstance(combine, ir.CombineLanes) or combine.name != acc or \
            combine.op != op or combine.lanes != lanes or combine.errors is not None:
        return None
    loop = tiled.body[0]
    if not isinstance(loop, ir.Loop) or not loop.simd or loop.reductions or \
            loop.start is not None or loop.extent != ir.Affine.var(tiled.count) or \
            len(loop.body) != 1:
        return None
    step = loop.body[0]
    if not isinstance(step, ir.Accumulate) or step.name != acc or step.op != op or \
            step.lane != loop.var or step.row is not None or step.position:
        return None
    if not _offsets_only(step.value, tiled.var, loop.var):
        return None
    width = lanes // _ROWS
    tail, row, lane = acc + "_t", acc + "_q", acc + "_l"
    tail_start, tail_count, tail_lane = acc + "_w", acc + "_c", acc + "_m"

    def full(node):      # lane la of the tile -> lane l of row q
        return _map_affines(node, lambda a: _replace(a, loop.var, ((row, width), (lane, 1))))

    def partial(node):   # element r1 + la of the last tile -> w + l of the tail vector
        return _map_affines(node, lambda a: _replace(
            _replace(a, tiled.var, ((tail_start, 1),)), loop.var, ((tail_lane, 1),)))

    full_tile = ir.Loop(row, ir.Affine(const=_ROWS), LoopKind.REDUCTION, (
        ir.Loop(lane, ir.Affine(const=width), LoopKind.VECTORISED, (
            dataclasses.replace(step, value=full(step.value), lane=lane, row=row),),
            simd=True),))
    last_tile = ir.TiledLoop(
        tail_start, ir.Affine.var(tiled.var) + ir.Affine.var(tiled.count), width,
        tail_count, LoopKind.REDUCTION, (
            ir.Loop(tail_lane, ir.Affine.var(tail_count), LoopKind.VECTORISED, (
                dataclasses.replace(step, name=tail, value=partial(step.value),
                                    lane=tail_lane),), simd=True),),
        start=ir.Affine.var(tiled.var))
    # lanes - count <= 0: a full tile (the likely side)
    is_full = ir.Affine(((tiled.count, -1),), lanes)
    fold_rows = ir.Loop(row, ir.Affine(const=_ROWS), LoopKind.REDUCTION, (
        ir.Loop(lane, ir.Affine(const=width), LoopKind.VECTORISED, (
            ir.Accumulate(tail, op, ir.AccValue(acc, op, lane=lane, row=row), lane=lane),),
            simd=True),))
    return [dataclasses.replace(declare, lanes=width, rows=_ROWS),
            ir.DeclareAcc(tail, op, lanes=width),
            dataclasses.replace(tiled, body=(
                ir.Branch((is_full,), 0, (full_tile,), (last_tile,)),)),
            fold_rows,
            dataclasses.replace(combine, name=tail, lanes=width)]


def _offsets_only(node, tile: str, lane: str) -> bool:
    """Whether every affine in ``node`` that names the tile start or the lane counter
    names both, with one coefficient (it addresses element ``tile + lane``)."""
    found = []
    _map_affines(node, lambda a: found.append(a) or a)
    for affine in found:
        terms = dict(affine.terms)
        if (tile in terms or lane in terms) and terms.get(tile) != terms.get(lane):
            return False
    return True


def _replace(affine: ir.Affine, old: str, new: Tuple[Tuple[str, int], ...]) -> ir.Affine:
    """``affine`` with ``old`` replaced by the sum of ``new`` (name, coefficient)."""
    terms = dict(affine.terms)
    coefficient = terms.pop(old, 0)
    result = ir.Affine(tuple(terms.items()), affine.const)
    for name, factor in new:
        result = result + ir.Affine.var(name, coefficient * factor)
    return result


def _map_affines(node, change):
    """``node`` with ``change`` applied to every affine expression in it."""
    if isinstance(node, tuple):
        return tuple(_map_affines(item, change) for item in node)
    if isinstance(node, ir.Affine):
        return change(node)
    if not dataclasses.is_dataclass(node):
        return node
    return dataclasses.replace(node, **{
        f.name: _map_affines(getattr(node, f.name), change)
        for f in dataclasses.fields(node)})
