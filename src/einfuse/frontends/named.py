"""Named dimensions (v3 section 2): index notation written as Python expressions.

    i, j, k = ef.dims("i j k")
    D = ((ef.wrap(w)[k, i] - ef.wrap(x)[k, j]) ** 2).sum(k)    # nothing runs yet
    D.order(i, j)                                              # one fused kernel

A :class:`Named` expression is a program under construction: a DAG whose leaves are
arrays indexed by dimensions (named_reads.py) and whose inner nodes are the notation's
operators, functions and reductions (named_node.py builds them).  Its axes are a set of
dimensions, with no order; broadcasting is by name.  Nothing is computed here:
``named_program`` spells the DAG as an einfuse program, and ``einfuse.named_api``
compiles and runs it (``order``, ``np.asarray``, ``ef.evaluate``), through hooks it
installs (this module imports no runtime).

This module is the front of the frontend: the operators (which take numbers,
dimensions, 0-d arrays and named expressions alike), ``ef.where`` and the notation's
functions, attached to :class:`Named` here; the rest is re-exported."""

from __future__ import annotations

import math
import numbers
from typing import Dict, Optional

from ..errors import EinfuseTypeError
from ..lang.ast import UNARY_FUNCTIONS
from .named_checks import Where, caller_line, error, framework_name
from .named_dims import Affine, Dim, Slot, dims, hooks, slot   # noqa: F401 (re-exported)
from .named_node import (REDUCTION_METHODS, Named, affine_value, combine,  # noqa: F401
                         index_value, leaf, pair)
from .named_reads import Wrapped, affine_sig, named, read, wrap   # noqa: F401 (re-exported)

SMALL_INT = 16          # ints up to this magnitude are literals, larger ones parameters


# -- operators -----------------------------------------------------------------------------

def _binary_operator(op: str, reflected: bool = False):
    args, local = (op,), ("b", op)

    def method(self, other):
        where = caller_line()
        operand = other if type(other) is Named else _operand(other, where)
        if operand is None:
            return NotImplemented
        if reflected:
            return pair(args, local, operand, self, where)
        return pair(args, local, self, operand, where)
    return method


for _op, _dunder in (("+", "add"), ("-", "sub"), ("*", "mul"), ("/", "truediv"),
                     ("//", "floordiv"), ("%", "mod"), ("**", "pow"), ("&", "and"),
                     ("|", "or")):
    setattr(Named, f"__{_dunder}__", _binary_operator(_op))
    setattr(Named, f"__r{_dunder}__", _binary_operator(_op, reflected=True))
for _op, _dunder in (("<", "lt"), ("<=", "le"), (">", "gt"), (">=", "ge"), ("==", "eq"),
                     ("!=", "ne")):
    setattr(Named, f"__{_dunder}__", _binary_operator(_op))


def _pow(self, exponent):
    return _node_of("call", ("pow",), (self, exponent), caller_line())


def _where(self, a, b):
    """``ef.where(self, a, b)``."""
    return _node_of("call", ("where",), (self, a, b), caller_line())


Named.pow, Named.where = _pow, _where


def _node_of(op, args, operands, where) -> Named:
    converted = []
    for value in operands:
        operand = _operand(value, where)
        if operand is None:
            raise error(EinfuseTypeError, f"{args[0]}() takes named expressions, dimensions "
                        f"and numbers, not {type(value).__name__}", where)
        converted.append(operand)
    return combine(op, args, tuple(converted), where)


def _operand(value, where) -> Optional[Named]:
    """``value`` as a node: named expressions as they are, dimensions and affine
    expressions as index values; Python floats and ints as scalar parameters, so that a
    new value (a step count, a batch size, a temperature) is not a new program -- except
    small ints (|n| <= 16: exponents, the 0 and 1 of masks) and inf and nan, which are
    literals the program's rewrites recognise (NumPy scalars count as Python numbers, as
    torch and JAX take them); 0-d arrays as 0-d reads; None for what the notation cannot
    take (the operator then says so)."""
    if isinstance(value, Named):
        return value
    if isinstance(value, Dim):
        return index_value(value, where)
    if isinstance(value, Affine):
        return affine_value(value, where)
    if isinstance(value, numbers.Integral):
        value = int(value)
        return leaf("lit" if -SMALL_INT <= value <= SMALL_INT else "param", value, where)
    if isinstance(value, numbers.Real):
        value = float(value)
        return leaf("param" if math.isfinite(value) else "lit", value, where)
    if isinstance(value, Wrapped):
        if value.ndim:
            raise error(EinfuseTypeError, f"{value.described()} is used without dimensions; "
                        "index it (w[i, j]) to combine it with a named expression", where)
        return read(value, (), where)
    if framework_name(value) is not None and hasattr(value, "shape"):
        if len(value.shape):
            raise error(EinfuseTypeError, f"an unnamed {framework_name(value)} array of "
                        f"shape {tuple(value.shape)} meets a named expression; index it "
                        "with dimensions (ef.wrap(x)[i, j]) so that its axes have names",
                        where)
        return read(wrap(value), (), where)
    return None


def _value_op(op: str, left, right) -> Named:
    """An index-value expression: dimensions used as numbers (``j <= i``, ``i * j``).
    Over two dimensions, or a dimension and a number, built again on the same line it is
    the same node (nodes are immutable; a mask rebuilt each training step costs a
    lookup); a dimension's set size is a part of what it depends on."""
    where = caller_line()
    known = None
    if type(left) is Dim and (type(right) is Dim or type(right) in (int, float)):
        known = (op, left, left._size, left._size_where, type(right), right,
                 getattr(right, "_size", None), getattr(right, "_size_where", None), where)
        found = _VALUE_OPS.get(known)
        if found is not None:
            return found
    a, b = _operand(left, where), _operand(right, where)
    if a is None or b is None:
        bad = right if b is None else left
        raise error(EinfuseTypeError, f"dimension arithmetic takes dimensions, numbers and "
                    f"named expressions, not {type(bad).__name__}", where)
    found = combine("bin", (op,), (a, b), where)
    if known is not None and (type(right) is not float or right == right):
        if len(_VALUE_OPS) >= 256:
            _VALUE_OPS.clear()
        _VALUE_OPS[known] = found
    return found


_VALUE_OPS: Dict[tuple, Named] = {}
hooks["value_op"] = _value_op


def as_named(value, where: Where) -> Optional[Named]:
    """``value`` (a number, dimension, 0-d array or named expression) as a named
    expression; None where the notation cannot take it."""
    return _operand(value, where)


def apply_op(op: str, args, operands, where: Where) -> Named:
    """The node ``op`` ("bin", "un", "call") over ``operands`` converted by
    :func:`as_named` (an error naming a value it cannot take)."""
    return _node_of(op, args, operands, where)


# -- the notation's functions --------------------------------------------------------------

def _function(name: str, arity: int):
    notation = {"minimum": "min", "maximum": "max"}.get(name, name)

    def function(*args):
        where = caller_line()
        if len(args) != arity:
            raise error(EinfuseTypeError, f"ef.{name} takes {arity} argument"
                        f"{'s' if arity > 1 else ''}, not {len(args)}", where)
        for a in args:
            if isinstance(a, (Named, Dim, Affine)):
                break
        else:
            raise error(EinfuseTypeError, f"ef.{name} builds a named expression: give it "
                        "one (an array indexed by dimensions), not only "
                        f"{', '.join(type(a).__name__ for a in args)}", where)
        return _node_of("call", (notation,), args, where)
    function.__name__ = name
    function.__doc__ = f"The notation's {notation}() on named expressions."
    return function


FUNCTIONS = {name: _function(name, 1) for name in UNARY_FUNCTIONS}
FUNCTIONS.update({name: _function(name, 2) for name in ("minimum", "maximum", "pow",
                                                        "atan2")})
FUNCTIONS["where"] = _function("where", 3)
where = FUNCTIONS["where"]


def softmax(expression, *dimensions, dim=None):
    """``ef.softmax(x, k)`` is ``x.softmax(k)`` (``dim=k`` as torchdim's softmax)."""
    if not isinstance(expression, Named):
        raise error(EinfuseTypeError, "ef.softmax takes a named expression", caller_line())
    return expression.softmax(*dimensions, *(() if dim is None else (dim,)))


def is_named(value) -> bool:
    return isinstance(value, Named)
