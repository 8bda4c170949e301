"""Reading a value once per row where a fused loop over the row's elements reads the
same element at every step (softmax's backward ``dX[i,j] := P[i,j]*dP[i,j] -
P[i,j]*s[i]`` reads ``s[i]``, written by the group's sum just before).

The merged kernel of a fusion group (plan/fuse.py) is one OpenMP parallel loop; GCC
outlines its body into a function that takes the buffers through a struct, and the
buffers' ``restrict`` is lost there.  A store into the output row may then, as far as
GCC can tell, change ``s[i]``, so the vector loop loads it again at every step (or
checks the aliasing at run time): a 256x256 float32 softmax backward took 13 µs
against 10.5 µs with the value read once (C, one thread).

So a load in an inner loop whose position does not move with the loop, of a buffer the
loop does not write, is read into a local first.  Buffers of a kernel never alias (the
fused kernel passes one pointer per array: plan/fuse.py), so the value is the one every
step would read.  Only loads that each step evaluates (not under a nested loop or
branch), with plain subscripts (no bounds tests, gathers or quasi-affine parts) and in
the working dtype are taken; the local is read before the loop only where the loop
runs at least once, so a loop of no steps reads nothing, as before.  The arithmetic
is unchanged: the results are the same to the bit."""

from __future__ import annotations

import dataclasses
from typing import Dict, FrozenSet, List, Set, Tuple

from .. import ir
from ..ir import LoopKind, Policy, ScalarType


def read_invariants_once(body: Tuple[ir.Stmt, ...], buffers: Tuple[ir.Buffer, ...],
                         working: str) -> Tuple[ir.Stmt, ...]:
    """``body`` (of the shared parallel loop) with every inner loop's invariant loads
    read into locals before it."""
    return _Hoister(buffers, working).body(body)


class _Hoister:
    def __init__(self, buffers: Tuple[ir.Buffer, ...], working: str):
        self.buffers = buffers
        self.working = working
        self.count = 0

    def body(self, body: Tuple[ir.Stmt, ...]) -> Tuple[ir.Stmt, ...]:
        """A parallel loop's body; a lone parallel loop in it stays the only statement,
        so that the renderer can still collapse the two loops into one."""
        if len(body) == 1 and isinstance(body[0], ir.Loop) and \
                body[0].kind == LoopKind.PARALLEL and not body[0].simd:
            return (dataclasses.replace(body[0], body=self.body(body[0].body)),)
        return self.block(body)

    def block(self, body: Tuple[ir.Stmt, ...]) -> Tuple[ir.Stmt, ...]:
        out: List[ir.Stmt] = []
        for stmt in body:
            out += self.stmt(stmt)
        return tuple(out)

    def stmt(self, stmt: ir.Stmt) -> List[ir.Stmt]:
        if isinstance(stmt, ir.Loop):
            return self.loop(stmt)
        if isinstance(stmt, ir.TiledLoop):
            return [dataclasses.replace(stmt, body=self.block(stmt.body))]
        if isinstance(stmt, ir.Branch):
            return [dataclasses.replace(stmt, small=self.block(stmt.small),
                                        large=self.block(stmt.large))]
        if isinstance(stmt, ir.NormalBranch):
            return [dataclasses.replace(stmt, then=self.block(stmt.then),
                                        otherwise=self.block(stmt.otherwise))]
        return [stmt]

    def loop(self, loop: ir.Loop) -> List[ir.Stmt]:
        inner = dataclasses.replace(loop, body=self.block(loop.body))
        if loop.kind in (LoopKind.SCAN, LoopKind.WHILE) or \
                loop.extent is None or loop.start is not None or loop.condition_steps \
                or loop.condition is not None or loop.updates:
            return [inner]
        moving = _bound_names(loop)
        written = _written_buffers(loop.body)
        locals_: Dict[ir.Load, str] = {}
        for stmt in inner.body:
            for load in _direct_loads(stmt):
                if load not in locals_ and self.invariant(load, moving, written):
                    locals_[load] = f"inv{self.count}"
                    self.count += 1
        if not locals_:
            return [inner]
        hoisted = dataclasses.replace(inner, body=tuple(
            _replace_loads(stmt, locals_) for stmt in inner.body))
        reads = tuple(ir.Let(local, load) for load, local in locals_.items())
        if loop.length is not None and loop.length > 0:
            return [*reads, hoisted]
        # a loop of no steps must read nothing: the reads only where it has one
        return [ir.Branch((loop.extent,), 0, (), (*reads, hoisted))]

    def invariant(self, load: ir.Load, moving: FrozenSet[str], written: Set[int]) -> bool:
        buffer = self.buffers[load.buffer]
        return (not load.is_index and load.fill is None and load.buffer not in written
                and buffer.dtype in (ScalarType.WORKING, self.working)
                and all(s.policy == Policy.NONE and not s.gathers and not s.quasi
                        and not set(s.names) & moving for s in load.subscripts))


def _bound_names(loop: ir.Loop) -> FrozenSet[str]:
    """The integer names that change inside ``loop``: its counter and every nested
    loop's (a tiled loop's count too)."""
    names = {loop.var}
    for stmt in _all_stmts(loop.body):
        if isinstance(stmt, ir.Loop):
            names.add(stmt.var)
        elif isinstance(stmt, ir.TiledLoop):
            names.update((stmt.var, stmt.count))
    return frozenset(names)


def _all_stmts(body):
    for stmt in body:
        yield stmt
        for field in ("body", "small", "large", "then", "otherwise", "condition_steps"):
            yield from _all_stmts(getattr(stmt, field, ()) or ())


def _written_buffers(body) -> Set[int]:
    return {s.buffer for s in _all_stmts(body) if isinstance(s, ir.Store)}


def _direct_loads(stmt: ir.Stmt):
    """The loads a statement evaluates every time it runs (not those of a nested block,
    nor an index load inside a subscript)."""
    if isinstance(stmt, (ir.Store, ir.Accumulate, ir.Let)):
        yield from _loads(stmt.value)


def _loads(expr: ir.Expr):
    if isinstance(expr, ir.Load):
        yield expr
    elif isinstance(expr, ir.Unary):
        yield from _loads(expr.operand)
    elif isinstance(expr, ir.Binary):
        yield from _loads(expr.left)
        yield from _loads(expr.right)
    elif isinstance(expr, ir.Call):
        for arg in expr.args:
            yield from _loads(arg)


def _replace_loads(stmt: ir.Stmt, locals_: Dict[ir.Load, str]) -> ir.Stmt:
    if isinstance(stmt, (ir.Store, ir.Accumulate, ir.Let)):
        return dataclasses.replace(stmt, value=_replace(stmt.value, locals_))
    return stmt


def _replace(expr: ir.Expr, locals_: Dict[ir.Load, str]) -> ir.Expr:
    if isinstance(expr, ir.Load):
        found = locals_.get(expr)
        return expr if found is None else ir.Local(found)
    if isinstance(expr, ir.Unary):
        return dataclasses.replace(expr, operand=_replace(expr.operand, locals_))
    if isinstance(expr, ir.Binary):
        return dataclasses.replace(expr, left=_replace(expr.left, locals_),
                                   right=_replace(expr.right, locals_))
    if isinstance(expr, ir.Call):
        return dataclasses.replace(expr, args=tuple(_replace(a, locals_) for a in expr.args))
    return expr
