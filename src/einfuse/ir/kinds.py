"""The closed vocabularies of the loop-nest IR as enums: loop kinds, reduction
operators, bounds policies, operators and functions, buffer element types.

Each member is also its text (a ``str`` subclass whose ``str()`` and f-string form are
the text): renderers print it as it is, tables keyed by the text find it, and a
producer may still pass the text, which the IR node turns into the member when it is
built (``ir.nodes``), so every node holds members and an unknown word fails there, at
the seam, not in a renderer."""

from __future__ import annotations

import enum


class _Word(str, enum.Enum):
    """A member that is its own text."""

    def __str__(self) -> str:
        return str.__str__(self)

    __format__ = str.__format__


class LoopKind(_Word):
    """parallel: race-free, may run on threads; serial; reduction: feeds accumulators;
    vectorised: innermost, SIMD."""
    PARALLEL = "parallel"
    SERIAL = "serial"
    REDUCTION = "reduction"
    VECTORISED = "vectorised"


class ReduceOp(_Word):
    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"
    LOGSUMEXP = "logsumexp"
    ARGMAX = "argmax"
    ARGMIN = "argmin"


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


class BufferType(_Word):
    """A buffer's elements: the kernel's working dtype, int64 or uint64 (index arrays,
    and positions), or float64 (a float32 group's column sums, plan/fuse_columns.py)."""
    WORKING = "working"
    INT64 = "int64"
    UINT64 = "uint64"
    FLOAT64 = "float64"


__all__ = ["BinaryOp", "BufferType", "FillSource", "Function", "LoopKind", "Policy",
           "QuasiOp", "ReduceOp", "UnaryOp"]
