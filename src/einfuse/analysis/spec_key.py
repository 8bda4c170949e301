"""The structural key of an analysed statement (a Spec): equal exactly where two
statements compute the same thing by the same steps, whatever their spelling's index
names, so that what is compiled for one (a C loop nest, a fused group) serves the
other (schedule/schedule.LoopChoice.key).

Exact where Python's equality is not: a constant is keyed by its type and its value's
bits, so ``-0.0`` and ``0.0`` differ, ``2`` and ``2.0`` differ, and NaNs with other
payloads differ (``Number(-0.0) == Number(0.0)`` and ``2 == 2.0`` hold in Python, and
a kernel keyed by that would print the other's constant).  Index names are replaced by
their position in the statement's indices (``spec.all_indices``, the numbering the
lowering's loop counters and runtime ints already use): renaming an index changes no
kernel.  Tensor and scalar parameter names are kept: a call binds them by keyword
and a kernel's buffers and parameters are ordered by them.  Spans and the source text
are left out (they place messages, not values)."""

from __future__ import annotations

import struct
from typing import Callable, Hashable, Mapping, Tuple

import numpy as np

from ..lang.ast import (Access, Binary, Call, Expr, IndexExpr, IndexValue, Number, Param,
                        Quasi, Reduce, Unary)


def statement_key(spec) -> Tuple[Hashable, ...]:
    """The structural key of ``spec`` (its statement, the facts analysis derived from
    it), index names as positions."""
    positions = {name: n for n, name in enumerate(spec.all_indices)}
    index = _renamer(positions)
    return ("statement", spec.output, spec.assign,
            tuple(map(index, spec.output_indices)),
            tuple(map(index, spec.reduction_indices)),
            expression_key(spec.rhs, positions),
            tuple((t.name, t.rank, t.as_value, t.as_index) for t in spec.tensors),
            spec.params, spec.arg_order, spec.result_is_bool,
            tuple(map(index, spec.race_free_indices)))


def index_positions(spec, names) -> Tuple[Hashable, ...]:
    """``names`` (indices of ``spec``) as statement_key writes them."""
    index = _renamer({name: n for n, name in enumerate(spec.all_indices)})
    return tuple(map(index, names))


def constant_key(value) -> Tuple[str, Hashable]:
    """(type, exact value) of a literal: a float by its IEEE bits (the sign of zero and
    a NaN's payload kept), an int by its value, a NumPy scalar by its bytes, anything
    else by its repr."""
    kind = type(value).__name__
    if isinstance(value, np.generic):
        return kind, value.dtype.str, value.tobytes()
    if isinstance(value, bool):
        return kind, bool(value)
    if isinstance(value, float):
        return kind, struct.pack("<d", value)
    if isinstance(value, int):
        return kind, int(value)
    if isinstance(value, complex):
        return kind, struct.pack("<dd", value.real, value.imag)
    return kind, repr(value)


def expression_key(expr: Expr, positions: Mapping[str, int]) -> Tuple[Hashable, ...]:
    """The structural key of ``expr``, its indices renamed by ``positions``."""
    index = _renamer(positions)

    def sub_key(sub: IndexExpr):
        return ("sub", tuple((index(name), coeff) for name, coeff in sub.terms),
                tuple((key(access), coeff) for access, coeff in sub.gathers),
                sub.constant,
                tuple((quasi_key(q), coeff) for q, coeff in sub.quasi))

    def quasi_key(q: Quasi):
        return ("quasi", sub_key(q.inner), q.op, q.divisor)

    def key(e: Expr):
        if isinstance(e, Number):
            return ("number",) + constant_key(e.value)
        if isinstance(e, Param):
            return ("param", e.name)
        if isinstance(e, IndexValue):
            return ("index", index(e.name))
        if isinstance(e, Access):
            return ("access", e.tensor, tuple(sub_key(s) for s in e.indices))
        if isinstance(e, Unary):
            return ("unary", e.op, key(e.operand))
        if isinstance(e, Binary):
            return ("binary", e.op, key(e.left), key(e.right))
        if isinstance(e, Call):
            return ("call", e.func, tuple(key(a) for a in e.args))
        if isinstance(e, Reduce):
            return ("reduce", e.op, tuple(map(index, e.indices)), key(e.body))
        raise TypeError(f"no structural key for {type(e).__name__}")

    return key(expr)


def _renamer(positions: Mapping[str, int]) -> Callable[[str], Hashable]:
    """An index name as its position (a name the statement does not number is kept, as
    a name: it cannot be confused with a position)."""
    def index(name: str) -> Hashable:
        position = positions.get(name)
        return ("name", name) if position is None else position
    return index


__all__ = ["constant_key", "expression_key", "index_positions", "statement_key"]
