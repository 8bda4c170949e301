"""A backend-neutral loop-nest IR.

A :class:`LoopProgram` is a list of :class:`LoopNest` s; a kernel is a list of
statements (loops, accumulator declarations, accumulations, stores) over
value expressions (constants, parameters, index values, loads, arithmetic).
Nothing here knows about C: the C renderer (backends/c/render.py) prints one
method per node type, and a Triton renderer or gradient kernels can reuse the
same nodes.  ``ef.jit``'s programs (:mod:`einfuse.ir.typed`) are made of the same
nodes -- :class:`Loop` (its scan and while kinds), :class:`Buffer` (with a static
shape), :class:`Const` (with a type) -- and of typed nodes of their own.

Names in the IR are generated (``p0``, ``lo0``, ``t1``, ``a2`` ...): user
names never reach a renderer, so no user text can reach a compiler.

Integer arithmetic (positions, subscripts, extents) is kept affine:
:class:`Affine` is ``sum(coeff * name) + const`` over integer names, which are
loop counters or runtime integer arguments (sizes, range starts, strides).
Kernels are size-generic: every size is such a runtime name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import numpy as np

from .kinds import (BinaryOp, FillSource, Function, LoopKind, Policy, QuasiOp, ReduceOp,
                    ScalarType, UnaryOp)


def as_member(node, name: str, kind) -> None:
    """Field ``name`` of a frozen node as a member of the enum ``kind`` (a producer may
    pass the text): an unknown word fails here, when the node is built."""
    value = getattr(node, name)
    if value is not None and type(value) is not kind:
        object.__setattr__(node, name, kind(value))

# ------------------------------------------------------------------ integer forms


@dataclass(frozen=True)
class Affine:
    """``sum(coeff * name) + const`` over integer names (loop counters, runtime ints)."""
    terms: Tuple[Tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def var(name: str, coeff: int = 1) -> "Affine":
        return Affine(((name, coeff),)) if coeff else Affine()

    def __add__(self, other: "Affine") -> "Affine":
        merged = dict(self.terms)
        for name, coeff in other.terms:
            merged[name] = merged.get(name, 0) + coeff
        return Affine(tuple((n, c) for n, c in merged.items() if c), self.const + other.const)

    def scale(self, factor: int) -> "Affine":
        return Affine(tuple((n, c * factor) for n, c in self.terms if c * factor),
                      self.const * factor)

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(n for n, _ in self.terms)


# ------------------------------------------------------------------ value expressions

class Expr:
    """Base of value expressions (computed in the kernel's working dtype, or int64
    for loads from index arrays; a typed expression, ir.typed, carries its ``dtype``)."""


@dataclass(frozen=True)
class Const(Expr):
    """A literal; ``dtype`` None: of the kernel's working dtype (the statement
    lowering's), else of that type (a typed expression's)."""
    value: Union[int, float, bool]
    dtype: Optional[ScalarType] = None

    def __post_init__(self):
        if self.dtype is None:
            return
        as_member(self, "dtype", ScalarType)
        # validated literals only: a renderer writes them into source text
        if isinstance(self.value, (np.integer, np.floating, np.bool_)):
            object.__setattr__(self, "value", self.value.item())
        if not isinstance(self.value, (bool, int, float)):
            raise TypeError(f"constant {self.value!r} is not a number")
        if self.dtype.is_float and not isinstance(self.value, float):
            object.__setattr__(self, "value", float(self.value))


@dataclass(frozen=True)
class Param(Expr):
    """Scalar parameter number ``slot`` (a runtime argument)."""
    slot: int


@dataclass(frozen=True)
class IndexValue(Expr):
    """The integer value of an index (not its loop position), as a number."""
    value: Affine


# Bounds policies of one subscript position (ir.kinds.Policy says what each means)
POLICIES = tuple(p.value for p in Policy)


@dataclass(frozen=True)
class Quasi:
    """``affine // divisor`` (floor division) or ``affine % divisor`` (Python's modulo,
    in 0..divisor-1) on int64, ``divisor`` a positive literal.  Renderers divide only
    non-negative values (``-1 - ((-1 - a) // d)`` below 0), so truncating and flooring
    division give the same; the magnitudes are checked to fit int64 per call."""
    affine: Affine
    op: QuasiOp
    divisor: int

    def __post_init__(self):
        as_member(self, "op", QuasiOp)


@dataclass(frozen=True)
class Subscript:
    """One axis of a load: ``affine + sum(coeff * quasi) + sum(coeff * gathered)`` with
    its bounds policy (a subscript has quasi parts or gathers, not both).
    ``size`` names the runtime int holding the axis length."""
    affine: Affine
    gathers: Tuple[Tuple["Load", int], ...]
    policy: Policy
    size: str
    stride: Optional[str]       # runtime int holding the stride; None: unit stride
    quasi: Tuple[Tuple[Quasi, int], ...] = ()

    @property
    def names(self) -> Tuple[str, ...]:
        """The integer names the position depends on (gathers excluded)."""
        return self.affine.names + tuple(n for q, _ in self.quasi for n in q.affine.names)

    def __post_init__(self):
        as_member(self, "policy", Policy)


@dataclass(frozen=True)
class Load(Expr):
    """An element of buffer ``buffer``.  ``fill`` names the runtime values invalid
    reads may give ("pad", "fill" or "fill,pad"): a read outside the array on a
    'pad' axis gives pad=, a read a gather policy rejects gives fill= (fill wins)."""
    buffer: int
    subscripts: Tuple[Subscript, ...]
    fill: Optional[FillSource] = None
    is_index: bool = False      # an int64 index array (for gathers)

    def __post_init__(self):
        as_member(self, "fill", FillSource)


@dataclass(frozen=True)
class Unary(Expr):
    op: UnaryOp
    operand: Expr

    def __post_init__(self):
        as_member(self, "op", UnaryOp)


@dataclass(frozen=True)
class Binary(Expr):
    op: BinaryOp
    left: Expr
    right: Expr

    def __post_init__(self):
        as_member(self, "op", BinaryOp)


@dataclass(frozen=True)
class Call(Expr):
    func: Function
    args: Tuple[Expr, ...]

    def __post_init__(self):
        as_member(self, "func", Function)


@dataclass(frozen=True)
class Local(Expr):
    """The value of the scalar ``name`` that a :class:`Let` set."""
    name: str


@dataclass(frozen=True)
class AccValue(Expr):
    """The finished value of an accumulator (for logsumexp: max + log(sum))."""
    acc: str
    op: ReduceOp
    lane: Optional[str] = None  # lane counter for a vector of accumulators
    row: Optional[str] = None   # row counter for a block of them

    def __post_init__(self):
        as_member(self, "op", ReduceOp)


# ------------------------------------------------------------------ statements

class Stmt:
    """Base of statements."""


REDUCE_OPS = tuple(op.value for op in ReduceOp)
LOOP_KINDS = tuple(kind.value for kind in LoopKind)


@dataclass(frozen=True)
class DeclareAcc(Stmt):
    """A register accumulator set to the identity of ``op``; with ``lanes`` an array
    of that many accumulators, one per lane of a tiled loop."""
    name: str
    op: ReduceOp
    lanes: Optional[int] = None
    rows: Optional[int] = None  # with lanes: a rows x lanes block (register blocking)

    def __post_init__(self):
        as_member(self, "op", ReduceOp)


@dataclass(frozen=True)
class Accumulate(Stmt):
    """``name op= value``.  For argmax/argmin, ``position`` is the row-major position of
    the current term among the reduction's points: (loop counter, extent) per reduced
    index in the order the reduction lists them, evaluated as int64."""
    name: str
    op: ReduceOp
    value: Expr
    lane: Optional[str] = None
    row: Optional[str] = None
    position: Tuple[Tuple[Affine, Affine], ...] = ()

    def __post_init__(self):
        as_member(self, "op", ReduceOp)


@dataclass(frozen=True)
class Loop(Stmt):
    """``for var in range(extent)``, or ``range(start, extent)`` with ``start`` (a chunk
    of a longer loop).  kind: parallel (race-free, may run on threads), serial,
    reduction (feeds accumulators), vectorised (innermost, SIMD).  ``simd`` asks for
    SIMD code on a parallel/reduction loop too; ``reductions`` lists (accumulator, op)
    pairs a SIMD loop combines (sum/prod only).

    A loop of a typed program (ir.typed): kind ``scan``, ``var`` running over a constant
    ``extent``; or ``while`` (``extent`` None): ``condition_steps`` then ``condition``
    tested before each step.  After the body each ``(carry, new)`` pair of ``updates``
    copies buffer ``new`` into buffer ``carry`` (all news are computed before any carry
    is overwritten); ``origin``: the jaxpr equation it comes from, for explain."""
    var: str
    extent: Optional[Affine]
    kind: LoopKind
    body: Tuple[Stmt, ...]
    simd: bool = False
    reductions: Tuple[Tuple[str, ReduceOp], ...] = ()
    start: Optional[Affine] = None
    condition_steps: Tuple[Stmt, ...] = ()
    condition: Optional[Expr] = None
    updates: Tuple[Tuple[str, str], ...] = ()
    origin: str = ""

    @property
    def length(self) -> Optional[int]:
        """The trip count of a loop over a constant extent (a scan), else None."""
        if self.extent is None or self.extent.terms:
            return None
        return self.extent.const

    def __post_init__(self):
        as_member(self, "kind", LoopKind)
        if any(type(op) is not ReduceOp for _, op in self.reductions):
            object.__setattr__(self, "reductions", tuple(
                (acc, ReduceOp(op)) for acc, op in self.reductions))


@dataclass(frozen=True)
class Fold(Stmt):
    """Add the block partial sum ``source`` into the accumulator ``into``, element by
    element over lanes/rows, with Neumaier's compensated addition: the rounding error
    of each addition is added up in ``error`` (a sum accumulator of the same shape)."""
    into: str
    error: str
    source: str
    lanes: Optional[int] = None
    rows: Optional[int] = None


@dataclass(frozen=True)
class Compensate(Stmt):
    """Give the sum accumulator ``acc`` the rounding error its folds kept in ``error``
    (element by element; not where ``acc`` is inf or NaN, where the error means
    nothing)."""
    acc: str
    error: str
    lanes: Optional[int] = None
    rows: Optional[int] = None


@dataclass(frozen=True)
class Branch(Stmt):
    """``small`` when the product of ``extents`` is at most ``limit``, else ``large``:
    a short reduction runs as it always did, a long one in compensated blocks."""
    extents: Tuple[Affine, ...]
    limit: int
    small: Tuple[Stmt, ...]
    large: Tuple[Stmt, ...]


@dataclass(frozen=True)
class Let(Stmt):
    """Declare the scalar ``name`` (working dtype) with ``value``, computed once here
    (for the loops after it in the same block)."""
    name: str
    value: Expr


@dataclass(frozen=True)
class NormalBranch(Stmt):
    """``then`` where every scalar in ``names`` (set by :class:`Let`) is a normal
    number -- not zero, subnormal, infinite or NaN -- else ``otherwise``."""
    names: Tuple[str, ...]
    then: Tuple[Stmt, ...]
    otherwise: Tuple[Stmt, ...]


@dataclass(frozen=True)
class CombineLanes(Stmt):
    """Declare the scalar accumulator ``into`` and fold the ``lanes`` partial results of
    the lane accumulator ``name`` into it with ``op`` (after a vectorised reduction).
    ``errors`` (sums): the error accumulators of ``name`` and of ``into`` (see
    :class:`Fold`): ``into`` is declared already, and the lanes are added pairwise."""
    name: str
    op: ReduceOp
    lanes: int
    into: str
    errors: Optional[Tuple[str, str]] = None

    def __post_init__(self):
        as_member(self, "op", ReduceOp)


@dataclass(frozen=True)
class TiledLoop(Stmt):
    """``for var in range(0, extent, tile)`` (from ``start`` when given) with ``count`` =
    lanes in this tile (``tile`` in full tiles, the remainder in the last).  With
    ``constant_full`` renderers may emit the body twice so that full tiles see a
    constant count (register lanes, unrolled rows); without it the count only bounds an
    inner loop, and one copy of the body is all the compile time it is worth."""
    var: str
    extent: Affine
    tile: int
    count: str
    kind: LoopKind
    body: Tuple[Stmt, ...]
    start: Optional[Affine] = None
    constant_full: bool = True

    def __post_init__(self):
        as_member(self, "kind", LoopKind)


@dataclass(frozen=True)
class Store(Stmt):
    """``buffer[sum(position[a] * stride[a])] = value``."""
    buffer: int
    position: Tuple[Affine, ...]
    strides: Tuple[Optional[str], ...]
    value: Expr


# ------------------------------------------------------------------ kernels


# The runtime int of a kernel with ``Buffer.per_slice`` rows: iterations per slice.
SLICE_ROWS = "slice_rows"


@dataclass(frozen=True)
class Buffer:
    """An array of ``dtype`` elements (ir.kinds.ScalarType): a kernel argument of a
    statement kernel (its sizes are runtime ints; ``shape`` None), or a buffer of a typed
    program (ir.typed), whose ``shape`` is static.  ``per_thread``
    names the runtime int holding a row length: the array then holds one row of that
    many elements per thread, and each thread of the outermost parallel loop reads and
    writes its own row (a fused intermediate that never goes to memory whole).
    ``per_slice``: the row is not the thread's but that of the slice of the loop's
    iterations the counter is in (``SLICE_ROWS`` iterations each, a runtime int; one
    thread runs a whole slice), so that sums kept in it do not depend on the thread
    count."""
    name: str
    dtype: ScalarType
    output: bool = False
    per_thread: Optional[str] = None
    per_slice: bool = False
    shape: Optional[Tuple[int, ...]] = None

    def __post_init__(self):
        as_member(self, "dtype", ScalarType)

    @property
    def size(self) -> int:
        """Elements of a buffer of static shape."""
        return int(math.prod(self.shape))


@dataclass(frozen=True)
class LoopNest:
    """One loop nest with its arguments: buffers, runtime ints (sizes, range
    starts, strides, in this order in the ints array), scalar parameter count."""
    name: str
    buffers: Tuple[Buffer, ...]
    ints: Tuple[str, ...]
    n_params: int
    body: Tuple[Stmt, ...]
    checks_bounds: bool = False   # uses the error flag (bounds='check'/'promise')


@dataclass(frozen=True)
class LoopProgram:
    """Kernels run in order on shared buffers; ``working`` is the dtype name."""
    working: str
    kernels: Tuple[LoopNest, ...]


def walk(node):
    """Every IR node below ``node`` (statements and expressions), parents first."""
    yield node
    if isinstance(node, (LoopProgram,)):
        for k in node.kernels:
            yield from walk(k)
    elif isinstance(node, Loop):
        for s in node.condition_steps:
            yield from walk(s)
        if node.condition is not None:
            yield from walk(node.condition)
        for s in node.body:
            yield from walk(s)
    elif isinstance(node, (LoopNest, TiledLoop)):
        for s in node.body:
            yield from walk(s)
    elif isinstance(node, Branch):
        for s in node.small + node.large:
            yield from walk(s)
    elif isinstance(node, NormalBranch):
        for s in node.then + node.otherwise:
            yield from walk(s)
    elif isinstance(node, (Accumulate, Store, Let)):
        yield from walk(node.value)
    elif isinstance(node, Load):
        for sub in node.subscripts:
            for g, _ in sub.gathers:
                yield from walk(g)
    elif isinstance(node, Unary):
        yield from walk(node.operand)
    elif isinstance(node, Binary):
        yield from walk(node.left)
        yield from walk(node.right)
    elif isinstance(node, Call):
        for a in node.args:
            yield from walk(a)
    elif hasattr(node, "children"):          # the typed nodes (ir.typed)
        for child in node.children():
            yield from walk(child)
