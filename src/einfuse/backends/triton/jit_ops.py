"""The expression rules of the Triton jit renderer (backends/triton/jit_render.py):
element types, literals, the elementwise operations of a typed program with XLA's
semantics (NaN-propagating max/min, signed division by zero and overflow, saturating
float-to-integer casts), reduction identities, and the Triton helper functions they
call; what has no rule here raises :class:`Declined`."""

from __future__ import annotations

import math

from ...ir import INDEX, Apply, Cast, Const, ElementOp, ReduceOp, ScalarType

TL_TYPE = {ScalarType.BOOL: "tl.int1", ScalarType.INT8: "tl.int8", ScalarType.INT16: "tl.int16",
           ScalarType.INT32: "tl.int32", ScalarType.INT64: "tl.int64",
           ScalarType.UINT8: "tl.uint8", ScalarType.UINT16: "tl.uint16",
           ScalarType.UINT32: "tl.uint32", ScalarType.UINT64: "tl.uint64",
           ScalarType.FLOAT32: "tl.float32", ScalarType.FLOAT64: "tl.float64"}
_UNSIGNED_OF_BITS = {8: "tl.uint8", 16: "tl.uint16", 32: "tl.uint32", 64: "tl.uint64"}

# NaN-propagating max/min (XLA's), the combine functions of tl.reduce, floor division
# of subscripts and XLA's signed integer division
JIT_HELPERS = '''
@triton.jit
def ef_fmax(a, b):
    return tl.where(a != a, a, tl.where(b != b, b, tl.maximum(a, b)))


@triton.jit
def ef_fmin(a, b):
    return tl.where(a != a, a, tl.where(b != b, b, tl.minimum(a, b)))


@triton.jit
def ef_imax(a, b):
    return tl.maximum(a, b)


@triton.jit
def ef_imin(a, b):
    return tl.minimum(a, b)


@triton.jit
def ef_mul(a, b):
    return a * b


@triton.jit
def ef_and(a, b):
    return a & b


@triton.jit
def ef_or(a, b):
    return a | b


@triton.jit
def ef_ifloordiv(a, b):
    # floor division whether '//' truncates (compiled) or floors (NumPy): the remainder
    # decides
    q = a // b
    r = a - q * b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)


@triton.jit
def ef_ifloormod(a, b):
    return a - ef_ifloordiv(a, b) * b


@triton.jit
def ef_erfinv(a):
    # as the C kernel: Giles' approximation as a start, then two Newton steps on erf,
    # in float64 (jax.random.normal's inverse transform)
    y = a.to(tl.float64)
    w = -tl.log((1.0 - y) * (1.0 + y))
    s = w - 2.5
    p = 2.81022636e-08
    p = 3.43273939e-07 + p * s
    p = -3.5233877e-06 + p * s
    p = -4.39150654e-06 + p * s
    p = 0.00021858087 + p * s
    p = -0.00125372503 + p * s
    p = -0.00417768164 + p * s
    p = 0.246640727 + p * s
    p = 1.50140941 + p * s
    t = tl.sqrt(tl.maximum(w, 0.0)) - 3.0
    q = -0.000200214257
    q = 0.000100950558 + q * t
    q = 0.00134934322 + q * t
    q = -0.00367342844 + q * t
    q = 0.00573950773 + q * t
    q = -0.0076224613 + q * t
    q = 0.00943887047 + q * t
    q = 1.00167406 + q * t
    q = 2.83297682 + q * t
    x = tl.where(w < 5.0, p, q) * y
    for _ in tl.static_range(2):
        x = x - (tl.erf(x) - y) / (1.1283791670955126 * tl.exp(-x * x))
    inside = (y > -1.0) & (y < 1.0)
    x = tl.where(inside, x, tl.where(y == 1.0, float("inf"),
                                     tl.where(y == -1.0, float("-inf"), float("nan"))))
    return x.to(a.dtype)


@triton.jit
def ef_idiv(a, b):
    # XLA's signed division: truncating, b = 0 gives -1, MIN / -1 wraps to MIN; the
    # divisor is made safe first (0 and -1 trap or are undefined where compiled)
    safe = tl.where((b == 0) | (b == -1), 1, b)
    q = a // safe
    r = a - q * safe
    q = tl.where((r != 0) & ((r < 0) != (a < 0)), q + 1, q)
    return tl.where(b == 0, -1, tl.where(b == -1, 0 - a, q))


@triton.jit
def ef_irem(a, b):
    # XLA's: the sign of a; b = 0 gives a, b = -1 gives 0
    return a - ef_idiv(a, b) * b
'''


class Declined(Exception):
    """The program holds something this renderer has no rule for (``reason`` says what)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def padded(extent: int) -> int:
    return 1 << max(0, int(extent) - 1).bit_length()


def float_literal(value: float) -> str:
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else 'float("-inf")'
    return repr(float(value))


def tl_type(dtype: ScalarType) -> str:
    """Triton's name of ``dtype``; a type without one declines."""
    found = TL_TYPE.get(dtype)
    if found is None:
        raise Declined(f"the type {dtype.value} has no Triton rendering here")
    return found


def int_literal(value: int) -> str:
    """An integer literal; int64's minimum as an expression (its magnitude alone does not
    fit int64, and a compiler may type it unsigned before negating it)."""
    value = int(value)
    return f"({value + 1} - 1)" if value == -(2 ** 63) else str(value)


def where_text(origin: str) -> str:
    return f" ({origin[:120]})" if origin else ""


_UNARY_FLOAT = {ElementOp.EXP: "tl.exp({0})", ElementOp.EXP2: "tl.exp2({0})",
                ElementOp.LOG: "tl.log({0})", ElementOp.LOG1P: "ef_log1p({0})",
                ElementOp.EXPM1: "ef_expm1({0})", ElementOp.TANH: "ef_tanh({0})",
                ElementOp.LOGISTIC: "(1.0 / (1.0 + tl.exp(ef_neg({0}))))",
                ElementOp.SIN: "tl.sin({0})", ElementOp.COS: "tl.cos({0})",
                ElementOp.TAN: "ef_tan({0})", ElementOp.ERF: "tl.erf({0})",
                ElementOp.ERF_INV: "ef_erfinv({0})",
                ElementOp.NEG: "ef_neg({0})", ElementOp.ABS: "tl.abs({0})",
                ElementOp.FLOOR: "tl.floor({0})", ElementOp.CEIL: "tl.ceil({0})",
                ElementOp.SQUARE: "({0} * {0})",
                ElementOp.SIGN: "tl.where({0} > 0.0, 1.0, tl.where({0} < 0.0, -1.0, {0}))",
                ElementOp.IS_FINITE: "(({0} == {0}) & (tl.abs({0}) != float(\"inf\")))"}
_BINARY_FLOAT = {ElementOp.ADD: "({0} + {1})", ElementOp.SUB: "({0} - {1})",
                 ElementOp.MUL: "({0} * {1})", ElementOp.MAX: "ef_fmax({0}, {1})",
                 ElementOp.MIN: "ef_fmin({0}, {1})", ElementOp.POW: "ef_pow({0}, {1})",
                 ElementOp.REM: "ef_fmod({0}, {1})", ElementOp.ATAN2: "ef_atan2({0}, {1})"}
_BINARY_INT = {ElementOp.ADD: "({0} + {1})", ElementOp.SUB: "({0} - {1})",
               ElementOp.MUL: "({0} * {1})", ElementOp.MAX: "tl.maximum({0}, {1})",
               ElementOp.MIN: "tl.minimum({0}, {1})", ElementOp.AND: "({0} & {1})",
               ElementOp.OR: "({0} | {1})", ElementOp.XOR: "({0} ^ {1})",
               ElementOp.IDIV: "ef_ifloordiv({0}, {1})",
               ElementOp.IMOD: "ef_ifloormod({0}, {1})"}
_BINARY_BOOL = {ElementOp.AND: "({0} & {1})", ElementOp.OR: "({0} | {1})",
                ElementOp.XOR: "({0} ^ {1})", ElementOp.MAX: "({0} | {1})",
                ElementOp.MIN: "({0} & {1})", ElementOp.ADD: "({0} | {1})",
                ElementOp.MUL: "({0} & {1})"}
_COMPARE = {ElementOp.EQ: "==", ElementOp.NE: "!=", ElementOp.LT: "<", ElementOp.LE: "<=",
            ElementOp.GT: ">", ElementOp.GE: ">="}


class ExpressionRules:
    """Literals, operations and casts; the renderer mixes this in (it provides
    ``expr``, ``emit`` and ``fresh``)."""

    def const(self, node: Const) -> str:
        dtype = node.dtype or ScalarType.FLOAT64
        if dtype is ScalarType.BOOL:
            value = "1" if node.value else "0"
        elif dtype.is_float:
            value = float_literal(float(node.value))
        else:
            value = int_literal(node.value)
        return f"tl.full((), {value}, {tl_type(dtype)})"

    def apply(self, node: Apply, nest) -> str:
        op = node.op
        operand = node.args[0].dtype
        if op is ElementOp.INTEGER_POW:
            exponent = node.args[1]
            if not isinstance(exponent, Const) or not operand.is_float:
                raise Declined("integer_pow with an exponent that is not a literal")
            base = self.fresh("q")
            self.emit(f"{base} = {self.expr(node.args[0], nest)}")
            n = abs(int(exponent.value))
            power = " * ".join([base] * n) if n else "1.0"
            return f"(1.0 / ({power}))" if int(exponent.value) < 0 else f"({power})"
        if op is ElementOp.BITCAST:
            source, target = operand, node.dtype
            if source.bits != target.bits or ScalarType.BOOL in (source, target):
                raise Declined(f"a bitcast of {source.value} to {target.value}")
            return f"({self.expr(node.args[0], nest)}).to({tl_type(target)}, bitcast=True)"
        args = [self.expr(a, nest) for a in node.args]
        if op in (ElementOp.SHIFT_LEFT, ElementOp.SHIFT_RIGHT_LOGICAL,
                  ElementOp.SHIFT_RIGHT_ARITHMETIC) and not operand.is_float and \
                operand is not ScalarType.BOOL:
            return self.shift(op, operand, *args)
        if op in _COMPARE:
            return f"({args[0]} {_COMPARE[op]} {args[1]})"
        if operand is ScalarType.BOOL:
            if op is ElementOp.NOT:
                return f"({args[0]} == 0)"
            rule = _BINARY_BOOL.get(op)
        elif operand.is_float:
            if op is ElementOp.DIV:
                return f"ef_div({args[0]}, {args[1]})"
            if op is ElementOp.SQRT:
                return f"tl.sqrt_rn({args[0]})" if operand is ScalarType.FLOAT32 else \
                    f"tl.sqrt({args[0]})"
            if op is ElementOp.RSQRT:
                inner = f"tl.sqrt_rn({args[0]})" if operand is ScalarType.FLOAT32 else \
                    f"tl.sqrt({args[0]})"
                return f"ef_div(1.0, {inner})"
            rule = _UNARY_FLOAT.get(op) or _BINARY_FLOAT.get(op)
        else:
            if op is ElementOp.NOT:
                return f"(~{args[0]})"
            if op is ElementOp.NEG:
                return f"(0 - {args[0]})"
            if op is ElementOp.ABS:
                return f"tl.abs({args[0]})"
            if op is ElementOp.SIGN:
                t = tl_type(operand)
                return f"(({args[0]} > 0).to({t}) - ({args[0]} < 0).to({t}))"
            if op is ElementOp.SQUARE:
                return f"({args[0]} * {args[0]})"
            if op in (ElementOp.IDIV, ElementOp.IMOD) and node.dtype is not INDEX:
                rule = None
            elif op in (ElementOp.DIV, ElementOp.REM) and operand.is_signed_int:
                rule = "ef_idiv({0}, {1})" if op is ElementOp.DIV else "ef_irem({0}, {1})"
            elif op in (ElementOp.DIV, ElementOp.REM):
                # unsigned, XLA's: by zero, all bits set (division) or a (remainder)
                a, b = args
                safe = f"tl.where({b} == 0, 1, {b})"
                return (f"tl.where({b} == 0, {int(2 ** operand.bits - 1)}, {a} // {safe})"
                        if op is ElementOp.DIV else f"tl.where({b} == 0, {a}, {a} % {safe})")
            else:
                rule = _BINARY_INT.get(op)
        if rule is None:
            raise Declined(f"the operation {op.value} on {operand.value} has no Triton rule")
        return rule.format(*args)

    def shift(self, op: ElementOp, dtype: ScalarType, a: str, b: str) -> str:
        """XLA's shifts: a count outside 0..bits-1 gives 0 (an arithmetic right shift: the
        sign, -1 or 0); the count is made safe first (out of range is undefined where
        compiled)."""
        bits = dtype.bits
        out = f"({b} >= {bits})" if dtype.is_unsigned_int else f"(({b} < 0) | ({b} >= {bits}))"
        count = self.fresh("h")
        self.emit(f"{count} = tl.where({out}, 0, {b})")
        if op is ElementOp.SHIFT_LEFT:
            return f"tl.where({out}, 0, {a} << {count})"
        if op is ElementOp.SHIFT_RIGHT_ARITHMETIC:
            if dtype.is_unsigned_int:
                raise Declined(f"an arithmetic right shift of {dtype.value}")
            return f"tl.where({out}, tl.where({a} < 0, -1, 0), {a} >> {count})"
        if dtype.is_unsigned_int:
            return f"tl.where({out}, 0, {a} >> {count})"
        unsigned = _UNSIGNED_OF_BITS[bits]
        return (f"tl.where({out}, 0, (({a}).to({unsigned}, bitcast=True) >> "
                f"{count}.to({unsigned})).to({tl_type(dtype)}, bitcast=True))")

    def cast(self, node: Cast, nest) -> str:
        inner = self.expr(node.arg, nest)
        source, target = node.arg.dtype, node.dtype
        if target is ScalarType.BOOL:
            return f"({inner} != 0)"
        if source.is_float and not target.is_float:
            import numpy as np
            info = np.iinfo(target.numpy)
            low, high = int(info.min), int(info.max)
            # the largest value of the source type below high + 1: the conversion of
            # the clamped value stays in range however the target rounds
            safe = source.numpy.type(high)
            while int(safe) > high:
                safe = np.nextafter(safe, source.numpy.type(-np.inf))
            value = self.fresh("f")
            self.emit(f"{value} = {inner}")
            t = tl_type(target)
            # saturating, NaN to 0 (XLA's conversion)
            return (f"tl.where({value} != {value}, 0, tl.where({value} >= {float(high)!r}, "
                    f"{high}, tl.where({value} <= {float(low)!r}, {int_literal(low)}, "
                    f"tl.minimum(tl.maximum({value}, {float(low)!r}), {float(safe)!r})"
                    f".to({t})))).to({t})")
        return f"({inner}).to({tl_type(target)})"


    @staticmethod
    def identity(op: ReduceOp, dtype: ScalarType) -> str:
        import numpy as np
        if op is ReduceOp.SUM or op is ReduceOp.OR:
            return "0"
        if op is ReduceOp.PROD:
            return "1"
        if op is ReduceOp.AND:
            return "1" if dtype is ScalarType.BOOL else "-1"
        low = op is ReduceOp.MAX
        if dtype.is_float:
            return 'float("-inf")' if low else 'float("inf")'
        if dtype is ScalarType.BOOL:
            return "0" if low else "1"
        info = np.iinfo(dtype.numpy)
        return int_literal(info.min if low else info.max)


def division_helper() -> str:
    # float division: correctly rounded where the kernel is compiled (Triton's float32
    # '/' is div.full.f32 there); the interpreter's '/' is NumPy's, exact already
    from ...analysis.triton_facts import interpreted
    from .elementwise import TARGET_HELPERS
    return TARGET_HELPERS[not interpreted()]
