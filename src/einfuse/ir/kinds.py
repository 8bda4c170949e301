"""The closed vocabularies of the IR as enums: loop kinds, reduction operators, bounds
policies, operators and functions, element types, and the elementwise operations of
typed expressions (``ef.jit``'s programs).  One enum per concept: the statement lowering
and the jaxpr front end build nodes from the same members.

Each member is also its text (a ``str`` subclass whose ``str()`` and f-string form are
the text): renderers print it as it is, tables keyed by the text find it, and a
producer may still pass the text, which the IR node turns into the member when it is
built (``ir.nodes``), so every node holds members and an unknown word fails there, at
the seam, not in a renderer."""

from __future__ import annotations

import enum
from typing import Optional

import numpy as np


class _Word(str, enum.Enum):
    """A member that is its own text."""

    def __str__(self) -> str:
        return str.__str__(self)

    __format__ = str.__format__


class LoopKind(_Word):
    """parallel: race-free, may run on threads; serial; reduction: feeds accumulators;
    vectorised: innermost, SIMD; scan: a serial loop of a static trip count whose body's
    carries are copied after each step (``lax.scan``/``fori_loop``); while: a loop whose
    condition is tested before each step (``lax.while_loop``)."""
    PARALLEL = "parallel"
    SERIAL = "serial"
    REDUCTION = "reduction"
    VECTORISED = "vectorised"
    SCAN = "scan"
    WHILE = "while"


class ReduceOp(_Word):
    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"
    LOGSUMEXP = "logsumexp"
    ARGMAX = "argmax"
    ARGMIN = "argmin"
    AND = "all"      # logical (bitwise on integers) and / or: jax's reduce_and / reduce_or
    OR = "any"


class Policy(_Word):
    """The bounds policy of one subscript position: none (the analysis guarantees the
    position is in range); pad (out of range reads the pad value); clip, wrap, fill (a
    gather's policy); check (a gather under bounds='check'/'promise': never read out of
    bounds, raise the error flag instead)."""
    NONE = "none"
    PAD = "pad"
    CLIP = "clip"
    WRAP = "wrap"
    FILL = "fill"
    CHECK = "check"


class FillSource(_Word):
    """Which runtime values an invalid read gives: pad=, fill=, or either (fill wins)."""
    PAD = "pad"
    FILL = "fill"
    FILL_OR_PAD = "fill,pad"


class QuasiOp(_Word):
    FLOOR_DIV = "//"
    MOD = "%"


class UnaryOp(_Word):
    NEG = "-"


class BinaryOp(_Word):
    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"
    FLOOR_DIV = "//"
    MOD = "%"
    POW = "**"
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    EQ = "=="
    NE = "!="
    AND = "&"
    OR = "|"


class Function(_Word):
    """The functions of the notation (lang/ast.py's FUNCTIONS)."""
    EXP = "exp"
    LOG = "log"
    LOG1P = "log1p"
    EXPM1 = "expm1"
    SQRT = "sqrt"
    ABS = "abs"
    SIN = "sin"
    COS = "cos"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    RELU = "relu"
    SOFTPLUS = "softplus"
    ERF = "erf"
    FLOOR = "floor"
    CEIL = "ceil"
    SIGN = "sign"
    TAN = "tan"
    MIN = "min"
    MAX = "max"
    POW = "pow"
    ATAN2 = "atan2"
    WHERE = "where"


class ScalarType(_Word):
    """An element type, of a buffer or of a typed value.  ``working``: the kernel's
    working dtype, bound per call (the statement lowering's buffers); the others are
    concrete (int64 and uint64 hold index arrays and positions, float64 a float32 group's
    column sums, plan/fuse_columns.py; an ``ef.jit`` program types every value and buffer
    with them).  No renderer's type names here: each renderer keeps its own table
    (backends/c/types.py)."""
    WORKING = "working"
    BOOL = "bool"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    UINT8 = "uint8"
    UINT16 = "uint16"
    UINT32 = "uint32"
    UINT64 = "uint64"
    FLOAT32 = "float32"
    FLOAT64 = "float64"

    @property
    def numpy(self) -> np.dtype:
        if self is ScalarType.WORKING:
            raise TypeError("the working dtype is bound per call: it has no NumPy dtype")
        return np.dtype(self.value)

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
        """The concrete type of a NumPy/JAX dtype, or None when it has none here."""
        try:
            name = np.dtype(dtype).name
        except TypeError:
            return None
        for member in ScalarType:
            if member is not ScalarType.WORKING and member.value == name:
                return member
        return None


# The statement IR's name for a buffer's element type (one enum: a buffer of a statement
# kernel is WORKING, INT64, UINT64 or FLOAT64)
BufferType = ScalarType
INDEX = ScalarType.INT64     # the type of loop indices and subscripts in typed expressions


class ElementOp(_Word):
    """The elementwise operations of a typed expression (:class:`ir.typed.Apply`), with
    XLA's semantics (NaN-propagating max/min, integer division by zero defined, shifts
    past the width): lax's elementwise primitives, plus ``idiv``/``imod`` (floor division
    and Python's modulo on int64 subscripts), ``round_even`` and ``bitcast``.  The
    notation's functions (:class:`Function`) are a different vocabulary: ``sigmoid``,
    ``relu``, ``softplus`` and ``where`` are spelled with these (``logistic``, ``max``,
    ...) when a statement is converted (frontends/jaxpr_statements.py)."""
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    REM = "rem"
    MAX = "max"
    MIN = "min"
    POW = "pow"
    ATAN2 = "atan2"
    NEXTAFTER = "nextafter"
    AND = "and"
    OR = "or"
    XOR = "xor"
    NOT = "not"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    SHIFT_LEFT = "shift_left"
    SHIFT_RIGHT_LOGICAL = "shift_right_logical"
    SHIFT_RIGHT_ARITHMETIC = "shift_right_arithmetic"
    NEG = "neg"
    ABS = "abs"
    SIGN = "sign"
    EXP = "exp"
    EXP2 = "exp2"
    LOG = "log"
    LOG1P = "log1p"
    EXPM1 = "expm1"
    TANH = "tanh"
    LOGISTIC = "logistic"
    SIN = "sin"
    COS = "cos"
    TAN = "tan"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    SINH = "sinh"
    COSH = "cosh"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    CBRT = "cbrt"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"
    ROUND_EVEN = "round_even"
    IS_FINITE = "is_finite"
    ERF = "erf"
    ERFC = "erfc"
    ERF_INV = "erf_inv"
    SQUARE = "square"
    INTEGER_POW = "integer_pow"
    BITCAST = "bitcast"
    IDIV = "idiv"
    IMOD = "imod"


__all__ = ["BinaryOp", "BufferType", "ElementOp", "FillSource", "Function", "INDEX", "LoopKind",
           "Policy", "QuasiOp", "ReduceOp", "ScalarType", "UnaryOp"]
