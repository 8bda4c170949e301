"""Lowering: an analysed statement (Spec) and its working dtype to a loop-nest
:class:`~einfuse.ir.LoopProgram` (``plan_for``); and a Triton row schedule -- several
statements over one row axis, plan/row_group.RowSchedule -- to a RowGroup
(``plan_rows``), by the same lowering: one expression lowering, with reductions and
reads placed as the schedule says (loops and buffer loads in a loop nest; a row's
registers, the group's inputs and earlier members in a row schedule).  The per-call
runtime arguments of a loop nest are plan/arguments.py's.

The plan depends only on the statement, the working dtype, the bounds/pad mode
and which axis of each buffer has unit stride (the layout); never on sizes.
Sizes, range starts and strides are runtime ints (:func:`call_arguments`).

Planning choices (why):

* the innermost output loop is the output index with the most votes, counted as
  memory transfers an inner loop over it keeps contiguous or saves: one per load
  that walks its unit-stride axis with it, one per load outside the reductions that
  it does not move (read once per run of the inner loop), two for the store when it
  walks the output's unit-stride axis (ties: the later output index);
* when the right side has reductions and that index is contiguous in a load
  inside them, the output loop is *tiled*: per tile of ``tile`` consecutive
  outputs, each top-level reduction keeps a vector of register accumulators and
  runs ``for k: for lane: acc[lane] += body`` -- the lane loop is contiguous,
  vectorises, and the reduction never touches memory (the dist / matmul shape);
* otherwise each output element keeps scalar accumulators and its reduction
  loops run innermost, the most contiguous reduced index last, with a SIMD
  reduction for sum/prod;
* every loop over a race-free output index is parallel (OpenMP);
* logsumexp keeps a running maximum in one pass; nested reductions are
  recomputed inside their enclosing loop (fully fused, no temporaries).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import ir
from ..ir import BinaryOp, BufferType, FillSource, Function, LoopKind, Policy, UnaryOp
from ..ir import Affine
from ..lang import ast
from ..lang.sugar import constant_value, is_count
from .expression_facts import fast_math_safe, indices_used, lane_panel
from .slots import buffer_slots
from .gathers import parse_mode
from .lane_reductions import LaneReductions
from .row_group import (RowGroup, RowReduction, RowRefused, RowSchedule, RowScope,
                        RowStatement, repeated)
from .sums import BlockedSums
from .epilogue_blocks import EpilogueBlocks
from .row_lowering import RowStatements
from .nest_order import NestOrder
from .blocking import lanes_outer
from .windows import LANE_STEPS, UNIT_STEPS, read_once_per_block, wide_lanes


# The output loop order's vote for the index a store walks along its unit stride: a
# write moves its cache line twice (read for ownership, written back), a load once.
STORE_VOTES = 2

# "verified": bounds='check'/'promise' with every index array found in range before the
# call, so the kernel needs no test at all.
_POLICY = {"clip": Policy.CLIP, "wrap": Policy.WRAP, "fill": Policy.FILL, "check": Policy.CHECK,
           "promise": Policy.CHECK, "verified": Policy.NONE}


@dataclass(frozen=True)
class Plan:
    program: ir.LoopProgram
    slots: Tuple[Tuple[str, str], ...]
    int_args: Tuple[Tuple, ...]       # how to compute each runtime int, in order
    params: Tuple[str, ...]
    fast_math: bool
    mode: str                         # "tiled", "scalar" or "elementwise", for explain
    inner: Optional[str]              # the innermost output index
    lane_indices: Tuple[str, ...] = ()  # indices walked by vectorised lane loops
    row_index: Optional[str] = None     # the index blocked in rows, if any (an output
    #                                     index, or plan/epilogue_blocks.py's reduced one)


@functools.lru_cache(maxsize=256)
def plan_for(spec, working: str, pad: bool, bounds: str, layouts: Tuple[int, ...],
             tile: int = 32, block: Tuple[int, int] = (1, 32),
             short: Tuple[str, ...] = (), plain: bool = False, blocks: bool = False,
             nest: Optional[NestOrder] = None) -> Plan:
    """``tile``: lanes of a 1-D lane tile; ``block``: (rows, lanes) of the register
    block used when two output indices can be tiled (dist, the matmul shape);
    ``short``: indices whose extent this call is below a vector's width (the plan is
    still size-generic, but does not spread those over SIMD lanes); ``plain``: no lane
    tiles, row blocks or lane partials -- every output loop parallel, every reduction a
    plain loop (what a block-per-program renderer such as Triton's maps onto);
    ``blocks`` with ``plain``: output tiles (rows x lanes) are still allowed;
    ``nest``: the output loops' order, tiling and row block as the schedule chose them
    (schedule/loop_choice.py's LoopChoice for C, TritonChoice for Triton, from
    :func:`nest_order`): every plan the library makes lowers a nest the schedule named
    (tests/test_nest_from_schedule.py checks that each call in the package passes
    one); None, for a test probing the lowering alone: as :func:`nest_order` finds it."""
    lowering = _Lowering(spec, np.dtype(working), pad, bounds, layouts, tile, block,
                         short, plain, blocks)
    return lowering.run(nest or lowering.nest_order())


@functools.lru_cache(maxsize=256)
def nest_order(spec, working: str, pad: bool, bounds: str, layouts: Tuple[int, ...],
               tile: int = 32, block: Tuple[int, int] = (1, 32),
               short: Tuple[str, ...] = (), plain: bool = False,
               blocks: bool = False) -> NestOrder:
    """The loop nest's output loop order, lane tiling and row block for these lowering
    inputs (the rules in this module's notes; ``plain``/``blocks`` as
    :func:`plan_for`'s): what the schedule carries and :func:`plan_for` lowers."""
    return _Lowering(spec, np.dtype(working), pad, bounds, layouts, tile, block,
                     short, plain, blocks).nest_order()


class _Lowering(BlockedSums, LaneReductions, EpilogueBlocks, RowStatements):
    def __init__(self, spec, working: np.dtype, pad: bool, bounds: str, layouts, tile: int,
                 block: Tuple[int, int] = (1, 32), short: Tuple[str, ...] = (),
                 plain: bool = False, blocks: bool = False,
                 rows: Optional[Tuple[RowScope, RowStatement]] = None):
        self.spec = spec
        # the reciprocals of divisors fixed along the innermost loop (see run())
        self.fixed_along: Optional[str] = None
        self.reciprocals: List[Tuple[str, ir.Expr]] = []
        self.short = set(short)
        self.plain = plain
        self.blocks = blocks
        self.block = block
        self.working = working
        self.pad = pad
        # uint64 index arrays come as int64 bit patterns; these slots are read unsigned
        self.bounds, self.unsigned = parse_mode(bounds)
        self.layouts = layouts
        self.tile = tile
        self.slots = buffer_slots(spec)
        self.slot_of = {slot: n for n, slot in enumerate(self.slots)}
        self.index_no = {name: k for k, name in enumerate(spec.all_indices)}
        self.int_args: List[Tuple] = []
        self.int_names: Dict[Tuple, str] = {}
        self.params = spec.params
        self.param_slot = {name: n for n, name in enumerate(spec.params)}
        self.n_acc = 0
        self.n_var = len(spec.all_indices)
        self.lane_indices: List[str] = []
        self.row_index: Optional[str] = None   # the output index blocked in rows, if any
        self.lanes_outer = False    # its lane tiles outside the row blocks (NestOrder's)
        self.wide_lanes = False   # lanes may step by more than 1 (set in run())
        self.checks = any(sub.gathers for a in ast.accesses(spec.rhs) for sub in a.indices) \
            and self.bounds in ("check", "promise")
        # a row schedule's statement (plan_rows): the scope lowered so far, and what
        # this statement adds to it
        self.row: Optional[RowStatement] = None
        if rows is not None:
            self.scope, self.row = rows
            self.row_inputs = list(self.scope.inputs)
            self.row_params = list(self.scope.params)
            self.row_reductions: List[RowReduction] = []
            self.n_acc = self.scope.accs

    # -- runtime ints ----------------------------------------------------------------
    def runtime_int(self, how: Tuple) -> str:
        if how not in self.int_names:
            kind = how[0]
            name = {"lo": "lo", "n": "n", "dim": "d", "stride": "s"}[kind] + "_".join(
                str(self.index_no[h]) if isinstance(h, str) else str(h) for h in how[1:])
            self.int_names[how] = name
            self.int_args.append(how)
        return self.int_names[how]

    def lo(self, index: str) -> Affine:
        return Affine.var(self.runtime_int(("lo", index)))

    def extent(self, index: str) -> Affine:
        return Affine.var(self.runtime_int(("n", index)))

    def stride(self, slot: int, axis: int) -> Optional[str]:
        if self.layouts[slot] == axis:
            return None
        return self.runtime_int(("stride", slot, axis))

    # -- heuristics --------------------------------------------------------------------
    def contiguity(self, index: str, expr: ast.Expr, varying=None,
                   steps: Tuple[int, ...] = UNIT_STEPS) -> int:
        """How many loads in ``expr`` walk their unit-stride axis with ``index`` (with
        ``varying``, only loads that also change with one of those indices: a load
        invariant in a reduction is read once per output, not once per term);
        ``steps``: the coefficients of ``index`` that count as walking it."""
        score = 0
        for access in ast.accesses(expr):
            if varying is not None and not any(
                    name in varying for sub in access.indices for name in sub.index_names):
                continue
            for kind in ("value", "index"):
                slot = self.slot_of.get((access.tensor, kind))
                if slot is None or not access.indices:
                    continue
                axis = self.layouts[slot]
                if axis >= 0 and dict(access.indices[axis].terms).get(index) in steps:
                    score += 1
        return score

    def lanes_pay(self, index: str, tops) -> bool:
        """Whether a lane tile over output ``index`` pays: not short, and walked by a
        load inside the top-level reductions (by a few elements, plan/windows.py)."""
        steps = LANE_STEPS if self.wide_lanes else UNIT_STEPS
        return index not in self.short and sum(
            self.contiguity(index, r.body, _bound_indices(r), steps) for r in tops) > 0

    def output_votes(self, outs: Sequence[str], rhs: ast.Expr, out_slot: int) -> Dict[str, int]:
        """Votes for the innermost output loop beyond the loads that walk it
        (``contiguity``), counted as memory transfers an inner loop over that index
        saves: the store walking its unit-stride axis counts two (a write moves its
        line twice: read for ownership, then written back), and a load outside the
        reductions that does not move with the index counts one (loop-invariant: read
        once per run of the inner loop, as ``dm[i]`` and ``h[i]`` under an inner ``j``
        in ``dX[i, j] := where(j == h[i], dm[i], 0)``, which an inner ``i`` would store
        256 elements apart)."""
        votes = dict.fromkeys(outs, 0)
        axis = self.layouts[out_slot]
        if 0 <= axis < len(outs):
            votes[outs[axis]] += STORE_VOTES
        for access in _top_accesses(rhs):
            if not access.indices:
                continue    # (a scalar is invariant along every index alike)
            used = indices_used(access)
            for name in outs:
                if name not in used:
                    votes[name] += 1
        return votes

    def order_indices(self, names: Sequence[str], expr: ast.Expr, bonus=None) -> List[str]:
        """``names`` with the most contiguous one moved innermost (last)."""
        if len(names) < 2:
            return list(names)
        scores = [self.contiguity(n, expr) + (bonus or {}).get(n, 0) for n in names]
        best = max(range(len(names)), key=lambda a: (scores[a], a))
        return [n for a, n in enumerate(names) if a != best] + [names[best]]

    # -- driver -------------------------------------------------------------------------
    def nest_order(self) -> NestOrder:
        """The output loops' order (the most contiguous innermost), whether the
        innermost runs in lane tiles, and the output index blocked in rows."""
        spec = self.spec
        outs = spec.output_indices
        rhs = spec.rhs
        tops = _top_reductions(rhs)
        out_slot = len(self.slots) - 1
        order = self.order_indices(outs, rhs, self.output_votes(outs, rhs, out_slot))
        inner = order[-1] if order else None
        can_tile = (not self.plain or self.blocks) and bool(tops)
        self.wide_lanes = wide_lanes(rhs, self.plain, self.short)
        walked = []     # (the index to move innermost instead of a short one, last)
        if inner is not None and inner in self.short:
            if can_tile and (
                    not self.contiguity(inner, rhs, None, LANE_STEPS) if self.wide_lanes
                    else not any(self.contiguity(k, r.body) for r in tops
                                 for k in r.indices)):
                # pooling's h3[c, i, j, a]: the store's last index a is short and no load
                # walks it, the loads walk j: lanes over j (a an outer loop) beat scalar
                # windows (3.5x on 64x64x64x2); a sum's too where no load walks a reduced
                # index for the scalar plan's SIMD sum (cdist's dy[j, d] at d=3 reads
                # h1[i, j] along j: 20 -> 0.3 ms at 2048 x 512)
                walked = [n for n in order[:-1] if self.lanes_pay(n, tops)]
            elif not tops:
                # an elementwise nest: not a few elements innermost (the votes assume a
                # long loop) but a long index a load walks (max-pool's gradient spread
                # over b of 2: j innermost, 2.9x); never the outermost, whose rows a
                # fused group lines its members up by
                walked = [n for n in order[1:-1] if n not in self.short and
                          self.contiguity(n, rhs)]
        if walked:
            inner = walked[-1]
            order = [n for n in order if n != inner] + [inner]
        tiled = can_tile and inner is not None and self.lanes_pay(inner, tops)
        rows = None
        candidates = [n for n in order[:-1] if n in spec.race_free_indices]
        # a sum of a few terms (one short reduced index) in lane tiles, not row blocks:
        # gauss's exp(-sum[d]) d=3, 10^4 x 10^4 AVX2 215-335 ms with rows, 108-117 without
        reduced = [k for r in tops for k in r.indices]
        few_terms = len(reduced) == 1 and reduced[0] in self.short
        if tiled and self.block[0] > 1 and candidates and not self.checks and \
                not few_terms and \
                not any(True for top in tops for _ in ast.reductions(top.body)) and \
                (not self.wide_lanes or read_once_per_block(candidates[-1], tops)):
            # the next output index in blocks of rows too, so that each load of the
            # lane tile serves several rows from registers (dist: 4x fewer
            # instructions per FLOP than one row at a time)
            rows = candidates[-1]
        outer = rows is not None and not self.plain and lanes_outer(
            self.block[0], self.block[1], lane_panel(rhs, inner, rows))
        return NestOrder(tuple(order), tiled, rows, outer)

    def run(self, nest: NestOrder) -> Plan:
        """The loop nest ``nest`` names (its output loops' order, tiling, row block)."""
        spec = self.spec
        outs = spec.output_indices
        rhs = spec.rhs
        tops = _top_reductions(rhs)
        out_slot = len(self.slots) - 1
        self.wide_lanes = wide_lanes(rhs, self.plain, self.short)
        order, tiled = list(nest.order), nest.tiled
        inner = nest.inner
        self.row_index = nest.rows
        self.lanes_outer = nest.lanes_outer
        strides = tuple(self.stride(out_slot, a) for a in range(len(outs)))
        env: Dict[str, Affine] = {}
        pos: Dict[str, Affine] = {}
        outer = order[:-1] if tiled else order
        for name in outer:
            var = f"p{self.index_no[name]}"
            pos[name] = Affine.var(var)
            env[name] = self.lo(name) + pos[name]
        pre: List[ir.Stmt] = []
        if tiled:
            body = self.tiled_outputs(order, inner, tops, env, pos, strides, out_slot)
            if self.row_index is not None:
                outer = [n for n in outer if n != self.row_index]
        else:
            # where reciprocal math is allowed, a divisor fixed along the innermost loop
            # is divided by as one reciprocal and a product per element (GCC does not
            # make that change for one division per iteration, and a division costs
            # several products): a second form of the loop, taken where every such
            # reciprocal is a normal number (else the product would lose accuracy)
            if not tops and not self.checks and not self.plain and len(outer) >= 2 and \
                    fast_math_safe(rhs) and self.working.kind == "f":
                self.fixed_along = inner
            value = self.expr(rhs, env, pre)
            self.fixed_along = None
            body = tuple(pre) + (ir.Store(out_slot, tuple(pos[n] for n in outs), strides,
                                          value),)
        reciprocals, self.reciprocals = self.reciprocals, []
        for depth, name in enumerate(reversed(outer)):
            kind = LoopKind.PARALLEL if name in spec.race_free_indices else LoopKind.SERIAL
            simd = depth == 0 and not tiled and not tops and not self.checks
            var, extent = pos[name].terms[0][0], self.extent(name)
            if depth == 0 and reciprocals:
                exact = (ir.Store(out_slot, tuple(pos[n] for n in outs), strides,
                                  self.expr(rhs, env, [])),)
                body = tuple(ir.Let(local, ir.Binary(BinaryOp.DIV, ir.Const(1), divisor))
                             for local, divisor in reciprocals) + (ir.NormalBranch(
                    tuple(local for local, _ in reciprocals),
                    (ir.Loop(var, extent, kind, body, simd=simd),),
                    (ir.Loop(var, extent, kind, exact, simd=simd),)),)
                continue
            body = (ir.Loop(var, extent, kind, body, simd=simd),)
        positions = spec.result_is_position     # int64 positions, exact
        buffers = tuple(ir.Buffer(f"t{n}", (BufferType.UINT64 if n in self.unsigned
                                            else BufferType.INT64)
                                  if kind == "index" or (kind == "output" and positions)
                                  else BufferType.WORKING, output=kind == "output")
                        for n, (_, kind) in enumerate(self.slots))
        kernel = ir.LoopNest("einfuse_kernel", buffers, tuple(self.int_names[h]
                                                            for h in self.int_args),
                           len(self.params), body, checks_bounds=self.checks)
        program = ir.LoopProgram(self.working.name, (kernel,))
        mode = "tiled" if tiled else ("scalar" if tops else "elementwise")
        if tiled:
            self.lane_indices.insert(0, inner)
        return Plan(program, self.slots, tuple(self.int_args), self.params,
                    fast_math_safe(rhs), mode, inner, tuple(dict.fromkeys(self.lane_indices)),
                    self.row_index)

    def tiled_outputs(self, order, inner, tops, env, pos, strides, out_slot):
        """The tiled output loops: ``inner`` in tiles of lanes and, where the nest
        blocks one (``row_index``, from :meth:`nest_order`), an output index in blocks
        of rows."""
        spec = self.spec
        outs = spec.output_indices
        rows, block_lanes = self.block
        k = self.index_no[inner]
        block, lane, count = f"b{k}", "l", "nb"
        pos[inner] = Affine.var(block) + Affine.var(lane)
        env[inner] = self.lo(inner) + pos[inner]
        lanes_tile = self.tile
        row = row_count = None
        if self.row_index is None and self.takes_epilogue_blocks(tops):
            lanes_tile = block_lanes    # (plan/epilogue_blocks.py: a reduced index's rows)
        if self.row_index is not None:
            lanes_tile = block_lanes
            kr = self.index_no[self.row_index]
            row, row_count, row_block = "r", "nr", f"b{kr}"
            pos[self.row_index] = Affine.var(row_block) + Affine.var(row)
            env[self.row_index] = self.lo(self.row_index) + pos[self.row_index]
        saved_tile, self.tile = self.tile, lanes_tile
        pre: List[ir.Stmt] = []
        value = self.expr(spec.rhs, env, pre, lanes=(lane, count, row, row_count))
        self.tile = saved_tile
        store = ir.Store(out_slot, tuple(pos[n] for n in outs), strides, value)
        stores: ir.Stmt = ir.Loop(lane, Affine.var(count), LoopKind.VECTORISED, (store,),
                                  simd=not self.checks)
        if row is not None:
            stores = ir.Loop(row, Affine.var(row_count), LoopKind.SERIAL, (stores,))
        kind = LoopKind.PARALLEL if inner in spec.race_free_indices else LoopKind.SERIAL
        if row is not None and self.lanes_outer:
            # the lane tiles outermost: each lane tile's panel stays cached while every
            # row block passes over it (plan/blocking.py)
            rows_loop = ir.TiledLoop(row_block, self.extent(self.row_index), rows, row_count,
                                     LoopKind.SERIAL, tuple(pre) + (stores,))
            return (ir.TiledLoop(block, self.extent(inner), lanes_tile, count,
                                 LoopKind.PARALLEL, (rows_loop,)),)
        body: Tuple[ir.Stmt, ...] = (ir.TiledLoop(block, self.extent(inner), lanes_tile, count,
                                                  kind, tuple(pre) + (stores,)),)
        if row is not None:
            body = (ir.TiledLoop(row_block, self.extent(self.row_index), rows, row_count,
                                 LoopKind.PARALLEL, body),)
        return body

    # -- expressions --------------------------------------------------------------------
    def expr(self, e: ast.Expr, env, pre: List[ir.Stmt], lanes=None) -> ir.Expr:
        """``e`` as an IR value over ``env`` (index -> its value as an Affine of loop
        counters, or of a row schedule's ``row``/``col``); reductions go where the
        schedule keeps them (loops before the value in ``pre``, or a row's registers)."""
        if isinstance(e, ast.Number):
            if e.value == 0 and math.copysign(1.0, e.value) < 0:
                # -0.0 as -(0.0): Const(-0.0) == Const(0.0), and what is keyed by
                # equality (a row group's shared subexpressions, kernel caches) would
                # merge them
                return ir.Unary(UnaryOp.NEG, ir.Const(0.0))
            return ir.Const(e.value)
        if isinstance(e, ast.Param):
            return ir.Param(self.param(e.name))
        if isinstance(e, ast.IndexValue):
            if e.name not in env:   # (a row schedule binds only the indices it sees)
                raise RowRefused
            return ir.IndexValue(env[e.name])
        if isinstance(e, ast.Access):
            if self.row is not None:
                return self.row_load(e, env)
            return self.load(e, env, in_gather=False)
        if isinstance(e, ast.Unary):
            operand = self.expr(e.operand, env, pre, lanes)
            return operand if e.op == "+" else ir.Unary(UnaryOp.NEG, operand)
        if isinstance(e, ast.Binary):
            left, right = self.expr(e.left, env, pre, lanes), self.expr(e.right, env, pre, lanes)
            if e.op == "/" and self.fixed_along is not None and \
                    self.fixed_along not in indices_used(e.right):
                local = f"r{len(self.reciprocals)}"
                self.reciprocals.append((local, right))
                return ir.Binary(BinaryOp.MUL, left, ir.Local(local))
            return ir.Binary(BinaryOp(e.op), left, right)
        if isinstance(e, ast.Call):
            return ir.Call(Function(e.func), tuple(self.expr(a, env, pre, lanes)
                                                   for a in e.args))
        if isinstance(e, ast.Reduce):
            if self.row is not None:
                return self.row_reduce(e, env)
            if is_count(e) and not self.pad:
                return self.count(e)
            return self.reduce(e, env, pre, lanes)
        raise TypeError(type(e).__name__)

    def count(self, e: ast.Reduce) -> ir.Expr:
        """A count (``mean``'s divisor, lang/sugar.is_count: a sum of one constant) as
        its constant times its indices' extents, the call's runtime ints: no pass over
        the data, and no accumulated ones to round (a float32 sum of ones stops at 2**24).
        (Not under pad=, whose reads outside the arrays the sum counts as the statement
        does, but which the padded call's own rules bind.)"""
        value: ir.Expr = ir.Const(constant_value(e.body))
        for name in e.indices:
            value = ir.Binary(BinaryOp.MUL, value, ir.IndexValue(self.extent(name)))
        return value

    def param(self, name: str) -> int:
        """The parameter slot of ``name``: the statement's, or in a row schedule the
        group's (every member's parameters in one array)."""
        if self.row is None:
            return self.param_slot[name]
        if name not in self.row_params:
            self.row_params.append(name)
        return self.row_params.index(name)

    def reduce(self, e: ast.Reduce, env, pre: List[ir.Stmt], lanes) -> ir.Expr:
        acc = f"a{self.n_acc}"
        self.n_acc += 1
        inner_env = dict(env)
        order = self.order_indices(e.indices, e.body)
        if e.op in ast.POSITION_REDUCTIONS:
            order = e.indices     # row-major in the listed order: the first one wins
        for name in order:
            inner_env[name] = self.lo(name) + Affine.var(f"p{self.index_no[name]}")
        nested = any(True for _ in ast.reductions(e.body))
        if lanes is not None and (len(lanes) < 3 or lanes[2] is None) and \
                self.epilogue_block_index(e) is not None:
            return self.epilogue_block_reduce(e, acc, inner_env, pre, lanes)
        if nested and lanes is None and e.op in ("sum", "prod") and not self.checks \
                and not self.plain and self.nested_lanes_pay(e, order[-1]):
            return self.lane_tiled_reduce(e, acc, order, inner_env, pre)
        # (not over a short innermost index: max-pooling's 2 values per output would
        # set up and fold 64 lanes each time, 30x the work)
        if not nested and lanes is None and e.op in ("max", "min", "logsumexp", "argmax",
                                                      "argmin") \
                and not self.checks and not self.plain and order[-1] not in self.short:
            return self.lane_partial_reduce(e, acc, order, inner_env, pre)
        body_pre: List[ir.Stmt] = []
        value = self.expr(e.body, inner_env, body_pre)
        position = self.position(e)
        row = None
        if lanes is not None:
            lane, count = lanes[:2]
            row, row_count = (lanes[2], lanes[3]) if len(lanes) > 2 else (None, None)
            shape = {"lanes": self.tile, "rows": self.block[0] if row is not None else None}

            def innermost(target: str) -> Tuple[ir.Stmt, ...]:
                step: ir.Stmt = ir.Loop(
                    lane, Affine.var(count), LoopKind.VECTORISED,
                    tuple(body_pre) + (ir.Accumulate(target, e.op, value, lane, row,
                                                     position),),
                    simd=not nested and not self.checks)
                if row is not None:
                    # rows outside the lane loop: measured 10% faster than inside on dist
                    step = ir.Loop(row, Affine.var(row_count), LoopKind.SERIAL, (step,))
                return (step,)
            simd = False
        else:
            shape = {}

            def innermost(target: str) -> Tuple[ir.Stmt, ...]:
                return tuple(body_pre) + (ir.Accumulate(target, e.op, value,
                                                        position=position),)
            simd = e.op in ("sum", "prod") and not nested and not self.checks
        pre.append(ir.DeclareAcc(acc, e.op, **shape))
        loops = self.reduction_loops(order, innermost(acc), acc, e.op, simd)
        if not self.sum_blocks(e.op, order):
            pre.extend(loops)
        else:   # a long sum runs in blocks (plan/sums.py)
            pre.append(self.lane_sum(e.body, acc, order, inner_env, loops) if simd
                       else self.chain_sum(acc, order, innermost, shape, loops,
                                           lanes is not None))
        return ir.AccValue(acc, e.op, lanes[0] if lanes is not None else None, row)

    def load(self, access: ast.Access, env, in_gather: bool) -> ir.Load:
        slot = self.slot_of[(access.tensor, "index" if in_gather else "value")]
        subs = []
        for axis, sub in enumerate(access.indices):
            affine = _affine(sub, env)
            quasi = tuple((ir.Quasi(_affine(q.inner, env), q.op, q.divisor), c)
                          for q, c in sub.quasi)
            gathers = tuple((self.load(g, env, True), c) for g, c in sub.gathers)
            own_output = access.tensor == self.spec.output and not in_gather
            if own_output:
                # '='/'+=' read the output only at the LHS indices: the element being
                # written, i.e. its position (value - range start), never padded
                affine = affine + self.lo(sub.plain_index).scale(-1)
                policy = Policy.NONE
            elif gathers:
                policy = _POLICY[self.bounds]
            elif self.pad and not in_gather:
                policy = Policy.PAD
            else:
                policy = Policy.NONE
            subs.append(ir.Subscript(affine, gathers, policy,
                                     self.runtime_int(("dim", slot, axis)),
                                     self.stride(slot, axis), quasi))
        # invalid reads: pad= where an affine axis leaves the array, fill= where a
        # gather policy rejects the value (fill wins where both apply)
        fills = {Policy.PAD: FillSource.PAD, Policy.FILL: FillSource.FILL,
                 Policy.CLIP: FillSource.FILL, Policy.WRAP: FillSource.FILL}
        used = tuple(sorted({fills[s.policy] for s in subs if s.policy in fills}))
        return ir.Load(slot, tuple(subs), ",".join(used) or None, is_index=in_gather)


def plan_rows(schedule: RowSchedule) -> RowGroup:
    """A row schedule lowered (its statements one after another, lower_row_statement),
    its stored members numbered in order, its repeated subexpressions named once."""
    scope = RowScope()
    for statement in schedule.statements:
        scope = lower_row_statement(scope, statement, schedule.working)
    members, outputs = [], 0
    for statement, member in zip(schedule.statements, scope.members):
        number = None
        if statement.stored:
            number, outputs = outputs, outputs + 1
        members.append(replace(member, stored=number))
    return RowGroup(schedule, scope.inputs, scope.params, tuple(members), repeated(members))


def lower_row_statement(scope: RowScope, statement: RowStatement, working: str) -> RowScope:
    """``scope`` with ``statement`` lowered as its next member (RowRefused where a row
    of registers cannot hold it: a subscript that is not a plain index of the group,
    a nested or other reduction, an index array, an earlier member read otherwise than
    written, a column sum read)."""
    return _Lowering(statement.spec, np.dtype(working), False, "check", (), 32,
                     rows=(scope, statement)).run_row()


def _affine(sub: ast.IndexExpr, env) -> Affine:
    """The affine part of a subscript (its terms and constant) over the loop names."""
    affine = Affine(const=sub.constant)
    for name, coeff in sub.terms:
        affine = affine + env[name].scale(coeff)
    return affine


def _bound_indices(reduce: ast.Reduce) -> frozenset:
    """The indices ``reduce`` and the reductions inside it bind."""
    return frozenset(i for r in ast.reductions(reduce) for i in r.indices)


def _top_accesses(expr: ast.Expr) -> List[ast.Access]:
    """The accesses of ``expr`` outside its reductions (gathers' own included)."""
    if isinstance(expr, ast.Reduce):
        return []
    if isinstance(expr, ast.Access):
        return list(ast.accesses(expr))
    return [a for child in expr.children() for a in _top_accesses(child)]


def _top_reductions(expr: ast.Expr) -> List[ast.Reduce]:
    if isinstance(expr, ast.Reduce):
        return [expr]
    found = []
    for child in expr.children():
        if not isinstance(expr, ast.Access):
            found += _top_reductions(child)
    return found
