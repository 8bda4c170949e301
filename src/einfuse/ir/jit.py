"""The typed program that a jaxpr is converted into (``ef.jit``).

A jaxpr carries a dtype on every value and static shapes everywhere, and its semantics
(casts, clamped dynamic starts, XLA's integer division) go beyond v1 index notation, so
the converted program keeps a typed expression per statement: ``out[i0, i1] := value``
where ``value`` is a tree of :class:`Node` over index values, constants and reads of
buffers with arbitrary integer subscripts.  ``jaxpr_print`` shows it in index notation.

Steps are :class:`Assign` (a loop nest over the output, optionally a reduction),
:class:`ScatterAdd`, :class:`Loop` (scan / fori / while, a C loop inside the kernel) and
:class:`Branch` (``lax.cond``).  All are frozen dataclasses; the C renderer
(``backends/c/loops.py``) turns a :class:`JitProgram` into one C function."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Optional, Tuple, Union

import numpy as np


class ScalarType(enum.Enum):
    """The element types a converted program computes in."""
    BOOL = ("bool", "unsigned char")
    INT8 = ("int8", "signed char")
    INT16 = ("int16", "short")
    INT32 = ("int32", "int")
    INT64 = ("int64", "long long")
    UINT8 = ("uint8", "unsigned char")
    UINT16 = ("uint16", "unsigned short")
    UINT32 = ("uint32", "unsigned int")
    UINT64 = ("uint64", "unsigned long long")
    FLOAT32 = ("float32", "float")
    FLOAT64 = ("float64", "double")

    @property
    def numpy(self) -> np.dtype:
        return np.dtype(self.value[0])

    @property
    def c_type(self) -> str:
        return self.value[1]

    @property
    def is_float(self) -> bool:
        return self in (ScalarType.FLOAT32, ScalarType.FLOAT64)

    @property
    def is_signed_int(self) -> bool:
        return self in (ScalarType.INT8, ScalarType.INT16, ScalarType.INT32, ScalarType.INT64)

    @property
    def is_unsigned_int(self) -> bool:
        return self in (ScalarType.UINT8, ScalarType.UINT16, ScalarType.UINT32,
                        ScalarType.UINT64)

    @property
    def bits(self) -> int:
        return 8 if self is ScalarType.BOOL else self.numpy.itemsize * 8

    @staticmethod
    def of(dtype) -> Optional["ScalarType"]:
        """The type for a NumPy/JAX dtype, or None when it has none here."""
        try:
            name = np.dtype(dtype).name
        except TypeError:
            return None
        for member in ScalarType:
            if member.value[0] == name:
                return member
        return None


INDEX = ScalarType.INT64


class Node:
    """A typed scalar expression, evaluated at one point of a loop nest."""
    dtype: ScalarType


@dataclass(frozen=True)
class Const(Node):
    value: Union[int, float, bool]
    dtype: ScalarType

    def __post_init__(self):
        # validated literals only: the renderer writes them into the C source
        if isinstance(self.value, (np.integer, np.floating, np.bool_)):
            object.__setattr__(self, "value", self.value.item())
        if not isinstance(self.value, (bool, int, float)):
            raise TypeError(f"constant {self.value!r} is not a number")
        if self.dtype.is_float and not isinstance(self.value, float):
            object.__setattr__(self, "value", float(self.value))


@dataclass(frozen=True)
class Index(Node):
    """A loop index's integer value."""
    name: str
    dtype: ScalarType = INDEX


@dataclass(frozen=True)
class Read(Node):
    buffer: str
    subscripts: Tuple[Node, ...]
    dtype: ScalarType


@dataclass(frozen=True)
class Apply(Node):
    """An operation from ``jaxpr_ops.OPS`` (elementwise: ``add``, ``exp``, ``lt``, ...)."""
    op: str
    args: Tuple[Node, ...]
    dtype: ScalarType


@dataclass(frozen=True)
class Select(Node):
    """``select_n``: ``cases[which]`` (``which`` a bool or an integer in range)."""
    which: Node
    cases: Tuple[Node, ...]
    dtype: ScalarType


@dataclass(frozen=True)
class Cast(Node):
    arg: Node
    dtype: ScalarType


class ReduceOp(enum.Enum):
    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"
    ARGMAX = "argmax"
    ARGMIN = "argmin"
    AND = "all"
    OR = "any"


@dataclass(frozen=True)
class Reduction:
    """``op[indices](body)``; for argmax/argmin the body's type is compared and the
    position (row-major over ``indices``) is the result."""
    op: ReduceOp
    indices: Tuple[Tuple[str, int], ...]     # (name, extent)
    body: Node


@dataclass(frozen=True)
class Buffer:
    name: str
    shape: Tuple[int, ...]
    dtype: ScalarType

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))


@dataclass(frozen=True)
class Assign:
    """``buffer[prefix..., i...] := value`` for every point of ``indices`` (the
    trailing axes); ``reduction`` replaces ``value`` where given."""
    buffer: str
    prefix: Tuple[Node, ...]
    indices: Tuple[Tuple[str, int], ...]
    value: Optional[Node]
    reduction: Optional[Reduction] = None
    origin: str = ""          # the jaxpr equation(s) it comes from, for explain


@dataclass(frozen=True)
class ScatterAdd:
    """For every point of ``indices``: if ``valid``: ``buffer[target] += value``
    (``replace``: ``buffer[target] = value``, the last write winning)."""
    buffer: str
    indices: Tuple[Tuple[str, int], ...]
    target: Tuple[Node, ...]
    valid: Node
    value: Node
    origin: str = ""
    replace: bool = False


class LoopKind(enum.Enum):
    SCAN = "scan"
    WHILE = "while"


@dataclass(frozen=True)
class Loop:
    """A loop inside the kernel.  ``SCAN``: ``counter`` runs 0..length-1; ``WHILE``:
    ``condition_steps`` then ``condition`` is tested before each step.  After the body,
    each ``(carry, new)`` pair copies ``new`` into ``carry`` (all news are computed
    before any carry is overwritten)."""
    kind: LoopKind
    counter: str
    length: Optional[int]
    condition_steps: Tuple["Step", ...]
    condition: Optional[Node]
    body: Tuple["Step", ...]
    updates: Tuple[Tuple[str, str], ...]
    origin: str = ""


@dataclass(frozen=True)
class Branch:
    """``lax.cond``/``switch``: run ``branches[clamp(which)]``."""
    which: Node
    branches: Tuple[Tuple["Step", ...], ...]
    origin: str = ""


Step = Union[Assign, ScatterAdd, Loop, Branch]


@dataclass(frozen=True)
class JitProgram:
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
