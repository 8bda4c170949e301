"""A brute-force reference evaluator for einfuse statements.

It shares nothing with einfuse's planner or backends: it takes the syntax tree
from ``parse`` + ``analyse`` (so implicit sums are already explicit) and walks
it with plain Python loops, one output element at a time, in Python floats
(IEEE float64).  It is slow on purpose and meant for small arrays.

Besides the value, every node also carries a *magnitude*: a first-order bound
on the rounding error of any reasonable evaluation order, in units of the
machine epsilon (the sum of |value| over every rounding step, weighted by how
much later steps amplify it).  :func:`brute_force_with_scale` returns it per
output element so that tests can compare float32 results "relative to the
magnitude" of the computation rather than to a result that may have cancelled
to almost nothing.
"""

from __future__ import annotations

import itertools
import math
import warnings
from typing import Dict, Mapping, Optional, Tuple

import numpy as np

from einfuse.analysis.spec import analyse
from einfuse.lang.ast import (COMPARISON_OPS, Access, Binary, Call, Expr, IndexValue, Number,
                              Param, Reduce, Unary)
from einfuse.lang.parser import parse

INF = math.inf
NAN = math.nan


class OracleOutOfBounds(Exception):
    """A gathered index fell outside its axis under bounds="check" or "promise"."""


def brute_force(statement: str, ranges: Mapping[str, Tuple[int, int]],
                arrays: Mapping[str, np.ndarray], params: Mapping[str, float] = {},
                pad: Optional[float] = None, bounds: str = "check", fill: float = 0.0,
                out: Optional[np.ndarray] = None) -> np.ndarray:
    """Evaluate ``statement`` by brute force; see the module docstring."""
    return brute_force_with_scale(statement, ranges, arrays, params, pad=pad, bounds=bounds,
                                  fill=fill, out=out)[0]


def brute_force_with_scale(statement: str, ranges: Mapping[str, Tuple[int, int]],
                           arrays: Mapping[str, np.ndarray],
                           params: Mapping[str, float] = {}, pad: Optional[float] = None,
                           bounds: str = "check", fill: float = 0.0,
                           out: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Like :func:`brute_force`, also returning the per-element error magnitude."""
    if bounds not in ("check", "promise", "clip", "wrap", "fill"):
        raise ValueError(f"unknown bounds mode {bounds!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the bias-term warning is einfuse's business
        spec = analyse(parse(statement))
    return _Oracle(spec, ranges, arrays, params, pad, bounds, fill, out).run()


# -- IEEE-style scalar arithmetic on Python floats --------------------------------------

def _div(a: float, b: float) -> float:
    if b == 0:
        if a == 0 or math.isnan(a):
            return NAN
        return math.copysign(INF, a) * math.copysign(1.0, b)
    return a / b


def _is_odd_integer(x: float) -> bool:
    return math.isfinite(x) and x == math.floor(x) and int(x) % 2 == 1


def _pow(a: float, b: float) -> float:
    try:
        return math.pow(a, b)
    except OverflowError:
        return -INF if a < 0 and _is_odd_integer(b) else INF
    except ValueError:
        if a == 0 and b < 0:  # pole: 0 ** negative
            return math.copysign(INF, a) if _is_odd_integer(b) else INF
        return NAN  # negative base, non-integer exponent


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return INF


def _expm1(x: float) -> float:
    try:
        return math.expm1(x)
    except OverflowError:
        return INF


def _log(x: float) -> float:
    if math.isnan(x) or x < 0:
        return NAN
    return -INF if x == 0 else math.log(x)


def _log1p(x: float) -> float:
    if math.isnan(x) or x < -1:
        return NAN
    return -INF if x == -1 else math.log1p(x)


def _sqrt(x: float) -> float:
    return NAN if x < 0 else math.sqrt(x)


def _periodic(f):
    def wrapped(x: float) -> float:
        return f(x) if math.isfinite(x) else NAN
    return wrapped


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + _exp(-x))


def _softplus(x: float) -> float:
    if x > 0:
        return x + math.log1p(_exp(-x))
    return math.log1p(_exp(x)) if not math.isnan(x) else NAN


def _relu(x: float) -> float:
    return x if math.isnan(x) else max(x, 0.0)


def _rounding(f):
    def wrapped(x: float) -> float:
        return float(f(x)) if math.isfinite(x) else x
    return wrapped


def _sign(x: float) -> float:
    return x if math.isnan(x) else float((x > 0) - (x < 0))


def _floordiv(a: float, b: float) -> float:
    """Python's float //, which NumPy's floor_divide follows; a / b for b = 0."""
    return _div(a, b) if b == 0 else a // b


def _mod(a: float, b: float) -> float:
    """Python's float %, which NumPy's mod follows; NaN for b = 0."""
    return NAN if b == 0 else a % b


def _nan_max(a: float, b: float) -> float:
    return NAN if math.isnan(a) or math.isnan(b) else max(a, b)


def _nan_min(a: float, b: float) -> float:
    return NAN if math.isnan(a) or math.isnan(b) else min(a, b)


def _safe(f, x: float) -> float:
    try:
        return f(x)
    except (OverflowError, ValueError, ZeroDivisionError):
        return INF


# name -> (function, |derivative| as a function of (x, f(x))) for error magnitudes
_UNARY = {
    "exp": (_exp, lambda x, y: y),
    "log": (_log, lambda x, y: _safe(lambda t: 1 / abs(t), x)),
    "log1p": (_log1p, lambda x, y: _safe(lambda t: 1 / abs(1 + t), x)),
    "expm1": (_expm1, lambda x, y: y + 1),
    "sqrt": (_sqrt, lambda x, y: _safe(lambda t: 0.5 / t, y)),
    "abs": (abs, lambda x, y: 1.0),
    "sin": (_periodic(math.sin), lambda x, y: 1.0),
    "cos": (_periodic(math.cos), lambda x, y: 1.0),
    "tanh": (math.tanh, lambda x, y: 1.0),
    "sigmoid": (_sigmoid, lambda x, y: 1.0),
    "relu": (_relu, lambda x, y: 1.0),
    "softplus": (_softplus, lambda x, y: 1.0),
    "erf": (math.erf, lambda x, y: 1.2),
    "floor": (_rounding(math.floor), lambda x, y: 0.0),
    "ceil": (_rounding(math.ceil), lambda x, y: 0.0),
    "sign": (_sign, lambda x, y: 0.0),
    "tan": (_periodic(math.tan), lambda x, y: 1.0 + y * y),
}

_COMPARE = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}


def _times(derivative: float, error: float) -> float:
    """derivative * error with 0 * inf = 0 (an exact input stays exact)."""
    return 0.0 if error == 0 or derivative == 0 else abs(derivative) * error


# -- the evaluator ------------------------------------------------------------------------

Value = Tuple[float, float]  # (value, error magnitude)


class _Oracle:
    def __init__(self, spec, ranges, arrays, params, pad, bounds, fill, out):
        self.spec = spec
        self.arrays = dict(arrays)
        self.params = dict(params)
        self.pad = None if pad is None else float(pad)
        self.bounds = bounds
        self.fill = float(fill)
        self.out = out
        st = spec.statement
        if st.output not in self.arrays and out is not None:
            self.arrays[st.output] = out  # '=' / '+=' may read the output elementwise
        self.ranges: Dict[str, Tuple[int, int]] = {}
        for axis, name in enumerate(spec.output_indices):
            if name in ranges:
                self.ranges[name] = tuple(ranges[name])
            elif out is not None:
                self.ranges[name] = (0, out.shape[axis])
        for name in spec.all_indices:
            if name not in self.ranges:
                if name not in ranges:
                    raise AssertionError(f"the oracle needs a range for index {name}")
                self.ranges[name] = tuple(ranges[name])

    def run(self) -> Tuple[np.ndarray, np.ndarray]:
        spec = self.spec
        out_ranges = [self.ranges[name] for name in spec.output_indices]
        shape = tuple(max(0, hi - lo) for lo, hi in out_ranges)
        result = np.empty(shape, dtype=np.float64)
        scale = np.empty(shape, dtype=np.float64)
        for position in itertools.product(*(range(n) for n in shape)):
            env = {name: lo + p
                   for name, (lo, _), p in zip(spec.output_indices, out_ranges, position)}
            result[position], scale[position] = self.eval(spec.rhs, env)
        if spec.assign != ":=":
            if self.out is None:
                raise AssertionError(f"{spec.assign!r} needs out=")
            if self.out.shape != shape:
                raise AssertionError(f"out has shape {self.out.shape}, the ranges give {shape}")
        if spec.assign == "+=":
            total = self.out.astype(np.float64) + result
            scale = scale + np.abs(self.out.astype(np.float64)) + np.abs(total)
            result = total
        if spec.result_is_bool and spec.assign == ":=":
            return result != 0, np.zeros(shape)
        return result, scale

    # -- expressions -------------------------------------------------------------------
    def eval(self, expr: Expr, env: Dict[str, int]) -> Value:
        if isinstance(expr, Number):
            value = float(expr.value)
            return value, abs(value)
        if isinstance(expr, Param):
            value = float(self.params[expr.name])
            return value, abs(value)
        if isinstance(expr, IndexValue):
            return float(env[expr.name]), 0.0
        if isinstance(expr, Access):
            value = self.read(expr, env)
            return float(value), abs(float(value))
        if isinstance(expr, Unary):
            value, error = self.eval(expr.operand, env)
            return -value, error
        if isinstance(expr, Binary):
            return self.binary(expr, env)
        if isinstance(expr, Call):
            return self.call(expr, env)
        if isinstance(expr, Reduce):
            return self.reduce(expr, env)
        raise TypeError(f"unknown node {expr!r}")

    def binary(self, expr: Binary, env) -> Value:
        a, ea = self.eval(expr.left, env)
        b, eb = self.eval(expr.right, env)
        op = expr.op
        if op in COMPARISON_OPS:
            return (1.0 if _COMPARE[op](a, b) else 0.0), 0.0
        if op == "&":
            return (1.0 if a != 0 and b != 0 else 0.0), 0.0
        if op == "|":
            return (1.0 if a != 0 or b != 0 else 0.0), 0.0
        if op == "+":
            r = a + b
            return r, ea + eb + abs(r)
        if op == "-":
            r = a - b
            return r, ea + eb + abs(r)
        if op == "*":
            r = a * b
            return r, _times(b, ea) + _times(a, eb) + abs(r)
        if op == "/":
            r = _div(a, b)
            return r, _times(_div(1.0, b), ea) + _times(_div(r, b), eb) + abs(r)
        if op == "**":
            return self.power(a, ea, b, eb)
        if op == "//":   # a step function: exact where its inputs are
            r = _floordiv(a, b)
            return r, abs(r)
        if op == "%":    # a - b * (a // b)
            r = _mod(a, b)
            return r, ea + _times(_floordiv(a, b), eb) + abs(r)
        raise ValueError(f"unknown operator {op}")

    @staticmethod
    def power(a: float, ea: float, b: float, eb: float) -> Value:
        r = _pow(a, b)
        da = _safe(lambda t: b * _pow(t, b - 1), a)
        db = _safe(lambda t: r * math.log(abs(t)), a) if a != 0 else 0.0
        return r, _times(da, ea) + _times(db, eb) + abs(r)

    def call(self, expr: Call, env) -> Value:
        func = expr.func
        if func == "where":
            cond, _ = self.eval(expr.args[0], env)
            return self.eval(expr.args[1] if cond != 0 else expr.args[2], env)
        args = [self.eval(arg, env) for arg in expr.args]
        if len(args) == 1:
            (x, ex), = args
            f, derivative = _UNARY[func]
            y = f(x)
            return y, _times(derivative(x, y), ex) + abs(y)
        (a, ea), (b, eb) = args
        if func == "pow":
            return self.power(a, ea, b, eb)
        if func == "atan2":
            r = math.atan2(a, b)
            norm = a * a + b * b
            return r, _times(_div(b, norm), ea) + _times(_div(a, norm), eb) + abs(r)
        pick = _nan_max if func == "max" else _nan_min
        return pick(a, b), max(ea, eb)

    def reduce(self, expr: Reduce, env) -> Value:
        values = []
        for combo in itertools.product(*(range(*self.ranges[n]) for n in expr.indices)):
            inner = dict(env)
            inner.update(zip(expr.indices, combo))
            values.append(self.eval(expr.body, inner))
        return _REDUCERS[expr.op](values)

    # -- tensor reads --------------------------------------------------------------------
    def read(self, access: Access, env):
        """The element ``access`` reads (a NumPy scalar), or the pad / fill value."""
        array = self.arrays[access.tensor]
        if access.tensor == self.spec.output:
            # '=' / '+=' read the element being updated; output position p holds lo + p
            return array[tuple(env[name] - self.ranges[name][0]
                               for name in self.spec.output_indices)]
        assert array.ndim == len(access.indices), \
            f"{access.tensor} has {array.ndim} axes but is read as {access}"
        position = []
        use_fill = use_pad = False
        for axis, sub in enumerate(access.indices):
            n = array.shape[axis]
            value = sub.constant + sum(c * env[name] for name, c in sub.terms)
            for part, c in sub.quasi:   # Python's // and % (floor) on exact ints
                inner = part.inner.constant + sum(k * env[n] for n, k in part.inner.terms)
                value += c * (inner // part.divisor if part.op == "//"
                              else inner % part.divisor)
            for gather, c in sub.gathers:
                value += c * self.gathered(gather, env)
            if 0 <= value < n:
                position.append(value)
            elif sub.gathers:
                if self.bounds in ("check", "promise"):
                    raise OracleOutOfBounds(f"{access}: axis {axis} index {value} is outside "
                                            f"[0, {n})")
                if self.bounds == "clip":
                    position.append(min(max(value, 0), n - 1))
                elif self.bounds == "wrap":
                    position.append(value % n)
                else:
                    use_fill = True
                    position.append(0)
            else:
                if self.pad is None:
                    raise AssertionError(f"{access}: axis {axis} index {value} is outside "
                                         f"[0, {n}) and no pad= was given")
                use_pad = True
                position.append(0)
        if use_fill:
            return self.fill
        if use_pad:
            return self.pad
        return array[tuple(position)]

    def gathered(self, access: Access, env) -> int:
        array = self.arrays[access.tensor]
        assert np.issubdtype(array.dtype, np.integer), \
            f"{access.tensor} is used as an index array but has dtype {array.dtype}"
        value = self.read(access, env)
        assert float(value) == int(value), f"{access} read a non-integer {value}"
        return int(value)


# -- reductions: a list of (value, magnitude) pairs -> (value, magnitude) ----------------

def _sum(values) -> Value:
    total, error = 0.0, 0.0
    for x, ex in values:
        total += x
        error += ex + abs(x)
    return total, error + abs(total)


def _prod(values) -> Value:
    product, error = 1.0, 0.0
    for x, ex in values:
        new = product * x
        error = _times(x, error) + _times(product, ex) + abs(new)
        product = new
    return product, error


def _extremum(pick, empty: float):
    def reduce(values) -> Value:
        result = empty
        for x, _ in values:
            result = pick(result, x)
        return result, max((ex for _, ex in values), default=0.0)
    return reduce


def _logsumexp(values) -> Value:
    if not values:
        return -INF, 0.0
    xs = [x for x, _ in values]
    if any(math.isnan(x) for x in xs):
        return NAN, NAN
    m = max(xs)
    if math.isinf(m):  # all -inf, or some +inf
        return m, 0.0
    result = m + math.log(sum(math.exp(x - m) for x in xs))
    return result, max(ex for _, ex in values) + abs(m) + abs(result)


def _position(largest: bool):
    """argmax/argmin: the list position (the reduction's indices in row-major order) of
    the first NaN, else of the first extremum."""
    def reduce(values) -> Value:
        xs = [x for x, _ in values]
        for n, x in enumerate(xs):
            if math.isnan(x):
                return float(n), 0.0
        best = max(xs) if largest else min(xs)
        return float(xs.index(best)), 0.0
    return reduce


_REDUCERS = {
    "argmax": _position(True),
    "argmin": _position(False),
    "sum": _sum,
    "prod": _prod,
    "max": _extremum(_nan_max, -INF),
    "min": _extremum(_nan_min, INF),
    "logsumexp": _logsumexp,
}
