"""Conversion rules of the jaxpr front end: elementwise primitives, and the table of
every rule (``RULES``: primitive name -> rule).  A rule takes the converter, the
equation, its operands' :class:`Value` s and the level its results belong to, and
returns one :class:`Value` per output.  Shape-moving, reducing, gathering and
control-flow rules live in ``jaxpr_structural`` and ``jaxpr_control``."""

from __future__ import annotations

from typing import Callable, Dict, Optional

from .jaxpr_values import JaxprConversionError, Value, scalar_type, unsupported
from ..ir import INDEX, Apply, Cast, Const, ScalarType, Select
from . import (jaxpr_control, jaxpr_random, jaxpr_statements, jaxpr_structural,
               jaxpr_windows)

Rule = Callable[..., list]

# JAX's elementwise primitives (each result element a function of the operands' elements
# at its position, operands broadcast as lax allows), the one list of them: with the
# renderer's operation (backends/c/loops.py OPERATIONS) where the generic ``elementwise``
# rule below converts the primitive, None where a rule of its own does (a parameter, a
# dtype change, a select: RULES below) or none does (``real``, ``lgamma`` ...: the front end
# refuses them).  runtime/jit_chain_rules.py derives the primitives it takes per chain.
ELEMENTWISE_PRIMITIVES: Dict[str, Optional[str]] = {
    "add": "add", "add_any": "add", "sub": "sub", "mul": "mul", "div": "div", "rem": "rem",
    "max": "max", "min": "min", "pow": "pow", "atan2": "atan2", "nextafter": "nextafter",
    "and": "and", "or": "or", "xor": "xor", "not": "not",
    "eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge",
    "shift_left": "shift_left", "shift_right_logical": "shift_right_logical",
    "shift_right_arithmetic": "shift_right_arithmetic",
    "neg": "neg", "abs": "abs", "sign": "sign", "exp": "exp", "exp2": "exp2", "log": "log",
    "log1p": "log1p", "expm1": "expm1", "tanh": "tanh", "logistic": "logistic",
    "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos",
    "atan": "atan", "sinh": "sinh", "cosh": "cosh", "asinh": "asinh", "acosh": "acosh",
    "atanh": "atanh", "sqrt": "sqrt", "rsqrt": "rsqrt", "cbrt": "cbrt", "floor": "floor",
    "ceil": "ceil", "is_finite": "is_finite", "erf": "erf", "erfc": "erfc",
    "square": "square", "round": "round", "erf_inv": "erf_inv",
    # converted by rules of their own
    "integer_pow": None, "select_n": None, "clamp": None, "convert_element_type": None,
    "copy": None, "copy_p": None, "reduce_precision": None,
    # not converted
    "real": None, "imag": None, "lgamma": None, "digamma": None,
}
# primitive -> the renderer's operation, for the generic rule
ELEMENTWISE = {name: op for name, op in ELEMENTWISE_PRIMITIVES.items() if op is not None}
# operations defined on floats only: a rule refuses them on integers rather than
# letting C convert silently
FLOAT_ONLY = {"exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos",
              "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
              "sqrt", "rsqrt", "cbrt", "floor", "ceil", "is_finite", "erf", "erfc",
              "atan2", "nextafter", "round", "pow", "erf_inv"}
INTEGER_ONLY = {"shift_left", "shift_right_logical", "shift_right_arithmetic"}


def elementwise(conv, eqn, invals, level):
    op = ELEMENTWISE[eqn.primitive.name]
    out_aval = eqn.outvars[0].aval
    dtype = scalar_type(out_aval, eqn)
    operand_type = invals[0].dtype
    if op in FLOAT_ONLY and not operand_type.is_float:
        raise unsupported(eqn, f"on {operand_type.value}")
    if op in INTEGER_ONLY and operand_type.is_float:
        raise unsupported(eqn, f"on {operand_type.value}")
    if op == "round" and int(eqn.params.get("rounding_method", 0)) == 1:
        op = "round_even"      # RoundingMethod.TO_NEAREST_EVEN
    if any(not v.dtype.is_float for v in invals) and any(v.dtype.is_float for v in invals):
        raise unsupported(eqn, "mixed float and integer operands")
    return [_combine(tuple(out_aval.shape), dtype, invals, level,
                     lambda args: Apply(op, args, dtype), conv)]


def _combine(shape, dtype, invals, level, build, conv=None) -> Value:
    """An elementwise value of ``invals``.  Operands broadcast as lax's elementwise
    primitives allow: a rank-0 operand (literals, scalars), and an axis of length 1
    against a longer one (``mul f32[2,2] f32[1,2]``, which jax.numpy and JAX's own
    gradients emit): that axis is read at 0.  A compound operand that would so be
    recomputed for many elements is computed into a buffer first (with ``conv``)."""
    shape = tuple(shape)
    operands = []
    for v in invals:
        if v.shape and tuple(v.shape) != shape:
            if len(v.shape) != len(shape) or any(n not in (1, m)
                                                 for n, m in zip(v.shape, shape)):
                raise JaxprConversionError(f"ef.jit: an elementwise operand of shape "
                                           f"{v.shape} does not broadcast to {shape}")
            if conv is not None:
                v = conv.cheap(v)
        operands.append(v)

    def subs_for(v, subs):
        if not v.shape:
            return ()
        if tuple(v.shape) == shape:
            return subs
        return tuple(Const(0, INDEX) if n == 1 and m != 1 else s
                     for s, n, m in zip(subs, v.shape, shape))

    def at(subs, operands=operands):
        return build(tuple(v.at(subs_for(v, tuple(subs))) for v in operands))
    return Value(shape, dtype, at, level, True)


def integer_pow(conv, eqn, invals, level):
    dtype = scalar_type(eqn.outvars[0].aval, eqn)
    power = int(eqn.params["y"])
    if power < 0 and not dtype.is_float:
        raise unsupported(eqn, "a negative power of an integer")
    (x,) = invals
    return [_combine(x.shape, dtype, invals, level,
                     lambda args: Apply("integer_pow", (args[0], Const(power, ScalarType.INT64)),
                                        dtype))]


def one_minus_square(conv, eqn, invals, level):
    """``1 - x*x`` (jax 0.11's derivative of tanh, ``1 - tanh(x)**2``), computed as
    ``(1 - x) * (1 + x)``, which keeps its digits where ``x*x`` is near 1."""
    dtype = scalar_type(eqn.outvars[0].aval, eqn)
    (x,) = invals
    if not x.dtype.is_float:
        raise unsupported(eqn, f"on {x.dtype.value}")
    one = Const(1.0, dtype)
    return [_combine(x.shape, dtype, invals, level, lambda args: Apply("mul", (
        Apply("sub", (one, args[0]), dtype), Apply("add", (one, args[0]), dtype)), dtype))]


def select_n(conv, eqn, invals, level):
    dtype = scalar_type(eqn.outvars[0].aval, eqn)
    shape = tuple(eqn.outvars[0].aval.shape)
    return [_combine(shape, dtype, invals, level,
                     lambda args: Select(args[0], tuple(args[1:]), dtype), conv)]


def clamp(conv, eqn, invals, level):
    dtype = scalar_type(eqn.outvars[0].aval, eqn)
    shape = tuple(eqn.outvars[0].aval.shape)
    return [_combine(shape, dtype, invals, level, lambda args: Apply(
        "min", (Apply("max", (args[1], args[0]), dtype), args[2]), dtype), conv)]


def convert_element_type(conv, eqn, invals, level):
    dtype = scalar_type(eqn.outvars[0].aval, eqn)
    (x,) = invals
    if x.dtype is dtype:
        return [x]
    return [Value(x.shape, dtype, lambda subs: Cast(x.at(subs), dtype), level, True)]


def identity(conv, eqn, invals, level):
    return list(invals)


def reduce_precision(conv, eqn, invals, level):
    (x,) = invals
    full = {ScalarType.FLOAT32: (8, 23), ScalarType.FLOAT64: (11, 52)}.get(x.dtype)
    if full != (eqn.params["exponent_bits"], eqn.params["mantissa_bits"]):
        raise unsupported(eqn, "rounding to a narrower float format")
    return [x]


def rule_for(eqn) -> Rule:
    rule = RULES.get(eqn.primitive.name)
    if rule is None:
        raise unsupported(eqn)
    return rule


RULES: Dict[str, Rule] = {name: elementwise for name in ELEMENTWISE}
RULES.update({
    "integer_pow": integer_pow, "one_minus_square": one_minus_square,
    "select_n": select_n, "clamp": clamp,
    "convert_element_type": convert_element_type, "stop_gradient": identity,
    "copy": identity, "copy_p": identity, "optimization_barrier": identity,
    "reduce_precision": reduce_precision,
})


# the rules of the other modules (structural, windows, control flow, random)
RULES.update(jaxpr_structural.RULES)
RULES.update(jaxpr_windows.RULES)
RULES.update(jaxpr_control.RULES)
RULES.update(jaxpr_random.RULES)
RULES.update(jaxpr_statements.RULES)
