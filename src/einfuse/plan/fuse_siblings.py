"""One loop where a fused group made several over the same row: sibling row sums, and
sibling row loops (stores, column sums).

In the merged loop body of a fusion group (plan/fuse.py) every member runs its own loop
over the row, one after the other.  Layernorm's backward makes six: three row sums,
each a SIMD reduction loop with its own setup and horizontal combine, then the dX row,
and two column-sum rows.  Here consecutive siblings over the same extent become one
loop, as far as that is measured to pay (MOST_ARRAYS): layernorm's backward makes
three passes, the sums, the dX row, and its two column rows together.

* **Row sums.**  ``DeclareAcc`` + ``Branch(small: one SIMD reduction loop, large:
  compensated blocks)`` of several sums, with only per-row scalar statements (the
  ``t[f0] = acc`` stores, ``Let``) between them, become the declarations, one
  ``Branch`` whose small side is one loop reducing every accumulator
  (``reduction(+:a) reduction(+:b) ...``) and whose large side is the sums' own long
  branches, then the scalar statements in their order.  Each accumulator keeps its
  own OpenMP reduction over the same trip count, so GCC gives it the same lanes and
  order as in its own loop and the sums' bits do not change
  (tests/test_fusion_siblings.py compares them with the kernel without this pass).
  Long rows keep their separate block loops: there the pass over the row is not the
  cost.
* **Row loops.**  SIMD loops without reductions (a row of a result, a column
  member's accumulation, plan/fuse_columns.py), also inside a ``NormalBranch``
  (plan/lower.py's reciprocal ``Let``), become one loop; the scalar ``Let`` s
  between them go before it.  One ``NormalBranch`` is merged into both of its arms;
  with several, the merged loop runs where all their scalars are normal and the
  loops one by one (each testing its own) otherwise.

A sibling joins only where merging cannot change what any loop reads: no member reads
or writes a buffer that another member of the run writes, and no member reads a
scalar or accumulator that a statement moved past it sets.  The loops' extents are
runtime ints of different members (``k0_n1``, ``k1_n1`` ...), equal at run time in
every call of layernorm but not in general, so a merge whose extents differ by name
comes with guards, as plan/fuse_sums.py's: the affine differences, which must all be
0; the caller passes the verdict of every guard of the kernel as ``GUARD_INT``, and
where it is not 0 the original loops run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import FrozenSet, List, Optional, Sequence, Tuple

from .. import ir
from ..ir import BinaryOp, Function, Policy, ReduceOp
from .fuse_sums import GUARD_INT, MergedSums, substitute_affine


def merge_sibling_loops(body: Tuple[ir.Stmt, ...], shared_loop: str) -> MergedSums:
    """``body`` (of the shared loop over rows ``shared_loop``) with every run of
    sibling row sums and of sibling row loops merged into one loop (guarded where
    their extents are different runtime ints)."""
    out: List[ir.Stmt] = []
    guards: List[ir.Affine] = []
    position = 0
    while position < len(body):
        run = _sum_run(body, position, shared_loop) or \
            _loop_run(body, position, shared_loop)
        if run is None:
            out.append(body[position])
            position += 1
            continue
        statements, more, position = run
        out += statements
        guards += [g for g in more if g not in guards]
    return MergedSums(tuple(out), tuple(guards))


# ------------------------------------------------------------------ what statements touch

@dataclass(frozen=True)
class _Touches:
    """The buffers a statement loads and stores, the scalars (``Let``) and
    accumulators it reads, and the scalars it sets (at its own level)."""
    loads: FrozenSet[int]
    stores: FrozenSet[int]
    locals: FrozenSet[str]
    accumulators: FrozenSet[str]
    sets: FrozenSet[str]

    def __or__(self, other: "_Touches") -> "_Touches":
        return _Touches(*(a | b for a, b in zip(dataclasses.astuple(self),
                                                 dataclasses.astuple(other))))


_NOTHING = _Touches(frozenset(), frozenset(), frozenset(), frozenset(), frozenset())


def _touches(nodes: Sequence[ir.Stmt]) -> _Touches:
    loads, stores, scalars, accumulators = set(), set(), set(), set()
    for statement in nodes:
        for node in ir.walk(statement):
            if isinstance(node, ir.Load):
                loads.add(node.buffer)
            elif isinstance(node, ir.Store):
                stores.add(node.buffer)
            elif isinstance(node, ir.Local):
                scalars.add(node.name)
            elif isinstance(node, ir.AccValue):
                accumulators.add(node.acc)
            elif isinstance(node, ir.NormalBranch):
                scalars.update(node.names)
    sets = frozenset(s.name for s in nodes if isinstance(s, ir.Let))
    return _Touches(frozenset(loads), frozenset(stores), frozenset(scalars),
                    frozenset(accumulators), sets)


def _independent(later: _Touches, earlier: _Touches) -> bool:
    """Whether ``later`` may run interleaved with (or before) ``earlier``: neither
    writes a buffer the other reads or writes, and ``later`` reads nothing that
    ``earlier`` sets."""
    return not (later.stores & (earlier.loads | earlier.stores) or
                later.loads & earlier.stores or later.locals & earlier.sets)


def _scalar(node) -> bool:
    """A per-row scalar statement that may move past a sibling: a ``Let`` or a store."""
    return isinstance(node, (ir.Let, ir.Store))


# The most arrays one merged loop may touch.  Each is a base pointer the loop keeps in a
# general register; the OpenMP-outlined body has about a dozen, and past them GCC
# reloads pointers from the stack in every iteration.  Measured on layernorm's backward
# (interleaved, same arrays, 12 placements each): merging its dX row (8 arrays) with
# its two column rows (13 in all) made the kernel 6-12% slower at 256 and 1024
# columns; its three sums (8 arrays) and its two column rows (6) gain where merged.
MOST_ARRAYS = 8


def _arrays(touches: _Touches) -> int:
    return len(touches.loads | touches.stores)


def _guard(extent: ir.Affine, first: ir.Affine, shared_loop: str) -> Optional[ir.Affine]:
    """``extent - first`` (0 at run time where the two loops have the same trip count),
    or None where they can never be merged: a literal difference, or an extent that
    depends on the row."""
    difference = extent + first.scale(-1)
    if shared_loop in extent.names or shared_loop in first.names or \
            (not difference.terms and difference.const):
        return None
    return difference


# What a loop body may compute for it to join a merged loop: operations GCC vectorises
# inline in the working dtype.  A library call (expf without libmvec, powf) keeps a
# loop scalar, and an int64 index or a strided read can make GCC take fewer lanes; in
# a merged loop either would change every member's vector width -- the lanes, so the
# bits, of a sum, and the speed of every loop.
_INLINE_OPS = (BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL, BinaryOp.DIV, BinaryOp.LT, BinaryOp.LE,
               BinaryOp.GT, BinaryOp.GE, BinaryOp.EQ, BinaryOp.NE, BinaryOp.AND, BinaryOp.OR)
_INLINE_CALLS = (Function.MIN, Function.MAX, Function.WHERE, Function.ABS, Function.RELU,
                 Function.SIGN, Function.SQRT)


def _vectorises(loop: ir.Loop) -> bool:
    """Whether every statement of ``loop`` reads and writes contiguous or loop-invariant
    elements and computes only inline operations (``_INLINE_OPS``, ``_INLINE_CALLS``,
    squares)."""
    for statement in loop.body:
        if isinstance(statement, ir.Store):
            if not _contiguous(statement.position, statement.strides, loop.var):
                return False
        elif not isinstance(statement, (ir.Let, ir.Accumulate)):
            return False
        if not _inline(statement.value, loop.var):
            return False
    return True


def _contiguous(position: Sequence[ir.Affine], strides, counter: str) -> bool:
    """The loop counter appears at most once, with coefficient 1, on a unit-stride axis."""
    found = [dict(p.terms).get(counter, 0) for p in position]
    along = [a for a, c in enumerate(found) if c]
    return not along or (len(along) == 1 and found[along[0]] == 1 and
                         strides[along[0]] is None)


def _inline(node: ir.Expr, counter: str) -> bool:
    if isinstance(node, (ir.Const, ir.Param, ir.Local)):
        return True
    if isinstance(node, ir.AccValue):
        # a finished accumulator in the working dtype (not a position, not a log)
        return node.lane is None and node.row is None and \
            node.op in (ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MAX, ReduceOp.MIN)
    if isinstance(node, ir.Load):
        return not node.is_index and node.fill is None and \
            all(s.policy == Policy.NONE and not s.gathers and not s.quasi
                for s in node.subscripts) and \
            _contiguous([s.affine for s in node.subscripts],
                        [s.stride for s in node.subscripts], counter)
    if isinstance(node, ir.Unary):
        return _inline(node.operand, counter)
    if isinstance(node, ir.Binary):
        if node.op == BinaryOp.POW:
            return node.right == ir.Const(2) and _inline(node.left, counter)
        return node.op in _INLINE_OPS and _inline(node.left, counter) and \
            _inline(node.right, counter)
    if isinstance(node, ir.Call):
        if node.func == Function.POW:
            return _inline(ir.Binary(BinaryOp.POW, *node.args), counter)
        return node.func in _INLINE_CALLS and all(_inline(a, counter) for a in node.args)
    return False


def _merged_loop(loops: Sequence[ir.Loop]) -> ir.Loop:
    """One loop with the counter and extent of the first of ``loops`` running each
    one's body in turn (each body's counter renamed to the first's)."""
    first = loops[0]
    counter = ir.Affine.var(first.var)
    body: List[ir.Stmt] = []
    for loop in loops:
        body += substitute_affine(loop.body, loop.var, counter) \
            if loop.var != first.var else loop.body
    return dataclasses.replace(first, body=tuple(body),
                               reductions=sum((l.reductions for l in loops), ()))


# ------------------------------------------------------------------ row sums

@dataclass(frozen=True)
class _RowSum:
    declare: ir.DeclareAcc
    branch: ir.Branch
    touches: _Touches

    @property
    def loop(self) -> ir.Loop:
        return self.branch.small[0]


def _row_sum(declare, branch, shared_loop: str) -> Optional[_RowSum]:
    """A sum whose short side is one SIMD reduction loop of its own accumulator
    (plan/sums.py), or None."""
    if not isinstance(declare, ir.DeclareAcc) or declare.op != ReduceOp.SUM or \
            declare.lanes is not None or declare.rows is not None or \
            not isinstance(branch, ir.Branch) or len(branch.small) != 1:
        return None
    loop = branch.small[0]
    if not isinstance(loop, ir.Loop) or not loop.simd or loop.start is not None or \
            loop.reductions != ((declare.name, ReduceOp.SUM),) or \
            branch.extents != (loop.extent,) or shared_loop in loop.extent.names:
        return None
    for statement in loop.body:
        if not isinstance(statement, ir.Let) and not (
                isinstance(statement, ir.Accumulate) and statement.name == declare.name and
                statement.op == ReduceOp.SUM and statement.lane is None and
                statement.row is None and not statement.position):
            return None
    if not _vectorises(loop):
        return None
    touches = _touches((branch,))
    if touches.stores:          # a producer merged into its sum (plan/fuse_sums.py)
        return None
    return _RowSum(declare, branch, touches)


def _sum_run(body, start: int, shared_loop: str):
    """(statements, guards, next position) merging the row sums from ``start`` on,
    or None where fewer than two merge."""
    if start + 1 >= len(body):
        return None
    first = _row_sum(body[start], body[start + 1], shared_loop)
    if first is None:
        return None
    sums, moved, guards = [first], [], []
    position = start + 2
    while True:
        scan = position
        while scan < len(body) and _scalar(body[scan]):
            scan += 1
        if scan + 1 >= len(body):
            break
        following = _row_sum(body[scan], body[scan + 1], shared_loop)
        if following is None or following.branch.limit != first.branch.limit or \
                following.loop.kind != first.loop.kind:
            break
        guard = _guard(following.loop.extent, first.loop.extent, shared_loop)
        between = moved + list(body[position:scan])
        # it runs before the scalar statements now, and beside the earlier sums
        if guard is None or not _independent(following.touches, _touches(between)) or \
                following.touches.accumulators & {s.declare.name for s in sums} or \
                _arrays(_touches([s.loop for s in sums + [following]])) > MOST_ARRAYS:
            break
        sums.append(following)
        moved = between
        if guard.terms:
            guards.append(guard)
        position = scan + 2
    if len(sums) < 2:
        return None
    limit = first.branch.limit
    extent = first.loop.extent
    if guards:
        # one test for "short and merged": the verdict is 0 or 1, so with it 1 the
        # extent reads as more than the limit; the long side then holds every sum's
        # own branch, which tests its own extent
        test = extent + ir.Affine.var(GUARD_INT, limit + 1)
        long_side = tuple(s.branch for s in sums)
    else:
        test = extent
        long_side = tuple(statement for s in sums for statement in s.branch.large)
    merged = ir.Branch((test,), limit, (_merged_loop([s.loop for s in sums]),), long_side)
    return [s.declare for s in sums] + [merged] + moved, guards, position


# ------------------------------------------------------------------ row loops

@dataclass(frozen=True)
class _RowLoop:
    """A row loop, or a ``NormalBranch`` choosing between two (``arms``)."""
    statement: ir.Stmt
    arms: Tuple[ir.Loop, ...]
    touches: _Touches

    @property
    def loop(self) -> ir.Loop:
        return self.arms[0]


def _row_loop(node, shared_loop: str) -> Optional[_RowLoop]:
    if isinstance(node, ir.Loop):
        arms = (node,)
    elif isinstance(node, ir.NormalBranch) and len(node.then) == 1 and \
            len(node.otherwise) == 1:
        arms = (node.then[0], node.otherwise[0])
    else:
        return None
    for loop in arms:
        if not isinstance(loop, ir.Loop) or not loop.simd or loop.reductions or \
                loop.start is not None or loop.extent != arms[0].extent or \
                loop.kind != arms[0].kind or shared_loop in loop.extent.names or \
                not all(isinstance(s, (ir.Let, ir.Store)) for s in loop.body) or \
                not _vectorises(loop):
            return None
    return _RowLoop(node, arms, _touches((node,)))


def _loop_run(body, start: int, shared_loop: str):
    """(statements, guards, next position) merging the row loops from ``start`` on,
    or None where fewer than two merge."""
    first = _row_loop(body[start], shared_loop)
    if first is None:
        return None
    loops, hoisted, guards = [first], [], []
    position = start + 1
    while True:
        scan = position
        while scan < len(body) and _scalar(body[scan]):
            scan += 1
        if scan >= len(body):
            break
        following = _row_loop(body[scan], shared_loop)
        if following is None or following.loop.kind != first.loop.kind:
            break
        guard = _guard(following.loop.extent, first.loop.extent, shared_loop)
        if guard is None:
            break
        earlier = _NOTHING
        for loop in loops:
            earlier = earlier | loop.touches
        between = body[position:scan]
        # the statements between go before the run, the loop beside the earlier loops
        if not all(_independent(_touches((s,)), earlier) for s in between) or \
                not _independent(following.touches, earlier) or \
                _arrays(earlier | following.touches) > MOST_ARRAYS:
            break
        loops.append(following)
        hoisted += between
        if guard.terms:
            guards.append(guard)
        position = scan + 1
    if len(loops) < 2:
        return None
    originals = tuple(loop.statement for loop in loops)
    merged = _merged_row_loops(loops, originals)
    if guards:
        merged = (ir.Branch((ir.Affine.var(GUARD_INT),), 0, merged, originals),)
    return list(hoisted) + list(merged), guards, position


def _merged_row_loops(loops: Sequence[_RowLoop], originals: Tuple[ir.Stmt, ...]):
    """One loop running ``loops``; a ``NormalBranch`` among them is merged into both
    of its arms, several into their ``then`` arms (else the loops run one by one)."""
    branches = [loop.statement for loop in loops
                if isinstance(loop.statement, ir.NormalBranch)]
    if not branches:
        return (_merged_loop([loop.loop for loop in loops]),)
    then = (_merged_loop([loop.arms[0] for loop in loops]),)
    if len(branches) == 1:
        otherwise = (_merged_loop([loop.arms[-1] for loop in loops]),)
    else:
        otherwise = originals
    names = tuple(dict.fromkeys(n for b in branches for n in b.names))
    return (ir.NormalBranch(names, then, otherwise),)
