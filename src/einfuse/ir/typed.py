"""The typed nodes of the IR: what ``ef.jit`` converts a jaxpr into.

A jaxpr carries a dtype on every value and static shapes everywhere, and its semantics
(casts, clamped dynamic starts, XLA's integer division) go beyond v1 index notation, so
a converted program keeps a typed expression per statement: ``out[i0, i1] := value``
where ``value`` is a tree of typed expressions (each with its ``dtype``, an
:class:`~einfuse.ir.kinds.ScalarType`) over loop indices, constants and reads of
buffers with arbitrary integer subscripts.  ``jaxpr_print`` shows it in index notation.

Its statements are :class:`Assign` (a loop nest over the output, optionally a
reduction), :class:`ScatterAdd`, :class:`~einfuse.ir.nodes.Loop` (kinds ``scan`` and
``while``: a loop inside the kernel) and :class:`Switch` (``lax.cond``/``switch``); its
buffers are :class:`~einfuse.ir.nodes.Buffer` s with a static shape, its literals
:class:`~einfuse.ir.nodes.Const` s with a type.  Operations are
:class:`~einfuse.ir.kinds.ElementOp` members; the loop kinds and reduction operators
are those of the statement IR.  The C renderer (``backends/c/loops.py``) turns a
:class:`JitProgram` into one C function."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterator, Optional, Tuple, Union

from .kinds import INDEX, ElementOp, ReduceOp, ScalarType
from .nodes import Buffer, Expr, Loop, Stmt, as_member


@dataclass(frozen=True)
class Index(Expr):
    """A loop index's integer value (a named counter of an :class:`Assign`'s nest, of a
    :class:`Reduction` or of a scan :class:`~einfuse.ir.nodes.Loop`)."""
    name: str
    dtype: ScalarType = INDEX

    def children(self):
        return ()


@dataclass(frozen=True)
class Read(Expr):
    """An element of the static-shape buffer ``buffer`` at integer expressions."""
    buffer: str
    subscripts: Tuple[Expr, ...]
    dtype: ScalarType

    def children(self):
        return self.subscripts


@dataclass(frozen=True)
class Apply(Expr):
    """An elementwise operation (:class:`~einfuse.ir.kinds.ElementOp`) of ``args``."""
    op: ElementOp
    args: Tuple[Expr, ...]
    dtype: ScalarType

    def __post_init__(self):
        as_member(self, "op", ElementOp)

    def children(self):
        return self.args


@dataclass(frozen=True)
class Select(Expr):
    """``select_n``: ``cases[which]`` (``which`` a bool or an integer in range)."""
    which: Expr
    cases: Tuple[Expr, ...]
    dtype: ScalarType

    def children(self):
        return (self.which,) + self.cases


@dataclass(frozen=True)
class Cast(Expr):
    arg: Expr
    dtype: ScalarType

    def children(self):
        return (self.arg,)


def map_reads(node: Expr, read) -> Expr:
    """``node`` with every :class:`Read` replaced by ``read(the read, its subscripts
    already mapped)``, the rest rebuilt around them: the one walk the loop rewrites
    (backends/c/loops_residuals.py, loops_transposed.py) share."""
    if isinstance(node, Read):
        return read(node, tuple(map_reads(s, read) for s in node.subscripts))
    if isinstance(node, Apply):
        return replace(node, args=tuple(map_reads(a, read) for a in node.args))
    if isinstance(node, Cast):
        return replace(node, arg=map_reads(node.arg, read))
    if isinstance(node, Select):
        return replace(node, which=map_reads(node.which, read),
                       cases=tuple(map_reads(c, read) for c in node.cases))
    return node


@dataclass(frozen=True)
class Reduction:
    """``op[indices](body)``; for argmax/argmin the body's type is compared and the
    position (row-major over ``indices``) is the result."""
    op: ReduceOp
    indices: Tuple[Tuple[str, int], ...]     # (name, extent)
    body: Expr

    def __post_init__(self):
        as_member(self, "op", ReduceOp)

    def children(self):
        return (self.body,)


@dataclass(frozen=True)
class Assign(Stmt):
    """``buffer[prefix..., i...] := value`` for every point of ``indices`` (the
    trailing axes); ``reduction`` replaces ``value`` where given.  ``parallel``: the
    nest's outermost loop is shared among threads, as decided before rendering
    (plan/jit_threads.py); renderers read it."""
    buffer: str
    prefix: Tuple[Expr, ...]
    indices: Tuple[Tuple[str, int], ...]
    value: Optional[Expr]
    reduction: Optional[Reduction] = None
    origin: str = ""          # the jaxpr equation(s) it comes from, for explain
    parallel: bool = False

    def children(self):
        return self.prefix + tuple(n for n in (self.value, self.reduction) if n is not None)


@dataclass(frozen=True)
class ScatterAdd(Stmt):
    """For every point of ``indices``: if ``valid``: ``buffer[target] += value``
    (``replace``: ``buffer[target] = value``, the last write winning)."""
    buffer: str
    indices: Tuple[Tuple[str, int], ...]
    target: Tuple[Expr, ...]
    valid: Expr
    value: Expr
    origin: str = ""
    replace: bool = False

    def children(self):
        return self.target + (self.valid, self.value)


@dataclass(frozen=True)
class Switch(Stmt):
    """``lax.cond``/``switch``: run ``branches[clamp(which)]`` (a runtime value chooses;
    the statement IR's :class:`~einfuse.ir.nodes.Branch` tests a size)."""
    which: Expr
    branches: Tuple[Tuple[Stmt, ...], ...]
    origin: str = ""

    def children(self):
        return (self.which,) + tuple(s for body in self.branches for s in body)


Step = Union[Assign, ScatterAdd, Loop, Switch]


@dataclass(frozen=True)
class JitProgram:
    """A converted function: its buffers (static shapes), which of them are the inputs
    and outputs (in argument order), and its statements."""
    buffers: Tuple[Buffer, ...]
    inputs: Tuple[str, ...]
    outputs: Tuple[str, ...]
    steps: Tuple[Step, ...]
    # (equation text, statement buffer or "inline") pairs in jaxpr order, for explain
    mapping: Tuple[Tuple[str, str], ...] = ()
    # (input buffer, NumPy array): the jaxpr's array constants, passed after the arguments
    constants: Tuple[Tuple[str, object], ...] = field(default=(), compare=False)

    def buffer(self, name: str) -> Buffer:
        # by name through a dict made on first use: renderers ask for every read, and a
        # search of the buffers each time made a program of thousands of steps quadratic
        by_name = self.__dict__.get("_by_name")
        if by_name is None:
            by_name = {b.name: b for b in self.buffers}
            object.__setattr__(self, "_by_name", by_name)
        return by_name[name]

    def children(self):
        return self.steps


# -- walking the steps (the loop rewrites of backends/c ask them) --------------------------
def node_reads(node: Expr) -> Iterator[str]:
    """Every buffer ``node`` reads (its subscripts' reads included)."""
    if isinstance(node, Read):
        yield node.buffer
        for sub in node.subscripts:
            yield from node_reads(sub)
    elif isinstance(node, Apply):
        for arg in node.args:
            yield from node_reads(arg)
    elif isinstance(node, Cast):
        yield from node_reads(node.arg)
    elif isinstance(node, Select):
        yield from node_reads(node.which)
        for case in node.cases:
            yield from node_reads(case)


def step_reads(step: Step) -> Iterator[str]:
    """Every buffer ``step`` reads (nested steps included)."""
    if isinstance(step, Assign):
        for sub in step.prefix:
            yield from node_reads(sub)
        if step.value is not None:
            yield from node_reads(step.value)
        if step.reduction is not None:
            yield from node_reads(step.reduction.body)
    elif isinstance(step, ScatterAdd):
        yield step.buffer              # an accumulation reads what it adds to
        for node in step.target + (step.valid, step.value):
            yield from node_reads(node)
    elif isinstance(step, Loop):
        for inner in step.condition_steps + step.body:
            yield from step_reads(inner)
        if step.condition is not None:
            yield from node_reads(step.condition)
        for _, new in step.updates:
            yield new
    elif isinstance(step, Switch):
        yield from node_reads(step.which)
        for body in step.branches:
            for inner in body:
                yield from step_reads(inner)


def step_writes(step: Step) -> Iterator[str]:
    """Every buffer ``step`` writes (nested steps, and loops' carry updates, included)."""
    if isinstance(step, (Assign, ScatterAdd)):
        yield step.buffer
    elif isinstance(step, Loop):
        for inner in step.condition_steps + step.body:
            yield from step_writes(inner)
        for carry, _ in step.updates:
            yield carry
    elif isinstance(step, Switch):
        for body in step.branches:
            for inner in body:
                yield from step_writes(inner)


__all__ = ["Apply", "Assign", "Cast", "Index", "JitProgram", "Read", "Reduction",
           "ScatterAdd", "Select", "Step", "Switch", "map_reads", "node_reads", "step_reads",
           "step_writes"]
