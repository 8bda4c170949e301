"""An einfuse statement inside a function that ``ef.jit`` converts: the ``einfuse``
primitive (runtime/jax_adapter.py) that ``ef.ein`` -- and so a named expression's
``.order(...)``, and the gradient statements ``jax.grad`` of either runs -- leaves in
the jaxpr.  Its statement is translated into the converted program's own terms, so it
is fused with the rest of the function into the one kernel:

* the statement's ranges are inferred from the operands' shapes as ``ef.ein`` infers
  them (``analysis/ranges.py``, the same errors), and a position ``p`` of an index with
  range ``lo..hi`` holds the index value ``lo + p``, as the notation says;
* every reduction is computed into a buffer of its own over the indices it depends on
  (``logsumexp`` as a maximum, then a sum of shifted exponentials), so what is left of
  the right side is elementwise and composes with the equations that read it;
* arithmetic follows the notation: ``/`` is true division, ``//`` and ``%`` floor as
  Python's, comparisons in arithmetic are 0 or 1, integers meet floats as floats.

What a kernel cannot do is refused loudly: a gather under ``bounds="check"`` (the
kernel cannot raise the out-of-range error ``ef.ein`` raises), an affine read that the
ranges given let fall outside its array without ``pad=``, and a statement that writes
into an array (``=``, ``+=``; JAX arrays take only ``:=`` anyway)."""

from __future__ import annotations

import functools
from typing import Dict, Tuple

from ..analysis.ranges import infer_ranges
from ..analysis.spec import analyse
from ..lang import parse
from ..lang.rewrite import free_indices
from ..lang.ast import (Access, Binary, Call, Expr, IndexExpr, IndexValue, Number, Param,
                        Reduce, Unary)
from .jaxpr_values import Value, scalar_type, unsupported
from ..ir import (INDEX, Apply, Cast, Const, Expr as IRExpr, Index, Read, ReduceOp, Reduction,
                  ScalarType, Select)

BOOL = ScalarType.BOOL
_REDUCE_OPS = {"sum": ReduceOp.SUM, "prod": ReduceOp.PROD, "max": ReduceOp.MAX,
               "min": ReduceOp.MIN, "argmax": ReduceOp.ARGMAX, "argmin": ReduceOp.ARGMIN}
_COMPARE = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}
_SAME_NAME = ("exp", "log", "log1p", "expm1", "sqrt", "abs", "sin", "cos", "tan", "tanh",
              "erf", "floor", "ceil", "sign")


@functools.lru_cache(maxsize=512)
def _spec(statement: str):
    return analyse(parse(statement))


def einfuse_statement(conv, eqn, invals, level):
    """The rule of the ``einfuse`` primitive: its statement's value (module docstring)."""
    spec = _spec(eqn.params["statement"])
    options = eqn.params["options"]
    if spec.assign != ":=":
        raise unsupported(eqn, f"a statement with '{spec.assign}'")
    operands = dict(zip(eqn.params["names"], invals))
    shapes = {t.name: operands[t.name].shape for t in spec.tensors}
    bounds = infer_ranges(spec, shapes, options, None)
    out = eqn.outvars[0].aval
    return [_Statement(conv, eqn, spec, options, operands, bounds.range_map,
                       scalar_type(out, eqn), level).value(tuple(out.shape))]


class _Statement:
    def __init__(self, conv, eqn, spec, options, operands: Dict[str, Value], ranges,
                 result: ScalarType, level: int):
        self.conv, self.eqn, self.spec, self.options = conv, eqn, spec, options
        self.operands, self.ranges, self.result, self.level = operands, ranges, result, level
        floats = [v.dtype for v in operands.values() if v.dtype.is_float]
        self.float = result if result.is_float else (
            ScalarType.FLOAT64 if ScalarType.FLOAT64 in floats else ScalarType.FLOAT32)
        self.reduced: Dict[Reduce, Tuple[str, Tuple[str, ...]]] = {}

    # -- the statement's value ----------------------------------------------------------
    def value(self, shape) -> Value:
        rhs, outputs = self.spec.rhs, self.spec.output_indices
        if isinstance(rhs, Reduce) and rhs.op in _REDUCE_OPS:
            # the whole right side a reduction: reduced straight into the result (the
            # reductions inside it first)
            self.prepare(rhs.body)

            def reduction_of(subs):
                return self.reduction(rhs, self.scope(outputs, subs))
            return self.conv.reduce_into(shape, self.result, self.level, reduction_of)
        self.prepare(rhs)

        def at(subs):
            return self.cast(self.expr(rhs, self.scope(outputs, subs)), self.result)
        return Value(tuple(shape), self.result, at, self.level, True)

    def scope(self, names, subs) -> Dict[str, IRExpr]:
        """Index values for the positions ``subs`` of the indices ``names``."""
        return {name: _plus(sub, self.ranges[name][0]) for name, sub in zip(names, subs)}

    def extent(self, name: str) -> int:
        lo, hi = self.ranges[name]
        return max(0, hi - lo)

    # -- reductions, computed first -----------------------------------------------------
    def prepare(self, expr: Expr) -> None:
        """Every reduction in ``expr`` into a buffer over the indices it depends on,
        innermost first (a buffer reads the ones below it)."""
        for child in expr.children():
            self.prepare(child)
        if isinstance(expr, Reduce) and expr not in self.reduced:
            free = tuple(sorted(free_indices(expr), key=list(self.ranges).index))
            shape = tuple(self.extent(n) for n in free)
            if expr.op == "logsumexp":
                buffer = self.logsumexp(expr, free, shape)
            else:
                buffer = self.conv.reduce_into(
                    shape, self.reduced_type(expr), self.level,
                    lambda subs: self.reduction(expr, self.scope(free, subs))).buffer
            self.reduced[expr] = (buffer, free)

    def reduced_type(self, expr: Reduce) -> ScalarType:
        if expr.op in ("argmax", "argmin"):
            return INDEX
        if expr.op == "logsumexp":
            return self.float
        found = self.promoted(expr.body)
        if found is BOOL and expr.op in ("sum", "prod"):     # comparisons counted
            return self.result if self.result is not BOOL else INDEX
        return found

    def promoted(self, expr: Expr) -> ScalarType:
        """The type ``expr`` computes in: the statement's float type if anything in it
        is a float, else the integer (or bool) type it has."""
        probe = self.expr(expr, {n: Index(n) for n in self.ranges}, probing=True)
        return probe.dtype

    def reduction(self, expr: Reduce, scope) -> Reduction:
        return Reduction(_REDUCE_OPS[expr.op], *self.reduced_body(expr, scope))

    def reduced_body(self, expr: Reduce, scope):
        """``(loop indices, body)`` of the reduction ``expr`` at the outer ``scope``."""
        indices = tuple((self.conv.fresh("r"), self.extent(n)) for n in expr.indices)
        inner = dict(scope)
        inner.update(self.scope(expr.indices, [Index(name) for name, _ in indices]))
        body = self.expr(expr.body, inner)
        if expr.op not in ("argmax", "argmin"):
            body = self.cast(body, self.reduced_type(expr))
        return indices, body

    def logsumexp(self, expr: Reduce, free, shape) -> str:
        """``m + log(sum(exp(x - m)))`` with ``m`` the maximum (0 where it is not
        finite: then the sum is 0, inf or nan, and so is the result)."""
        F = self.float

        def parts(subs):
            return self.reduced_body(expr, self.scope(free, subs))

        peak = self.conv.reduce_into(shape, F, self.level, lambda subs: Reduction(
            ReduceOp.MAX, *parts(subs)))

        def shift(subs):
            m = peak.at(tuple(subs))
            return Select(Apply("is_finite", (m,), BOOL), (Const(0.0, F), m), F)

        def shifted_sum(subs):
            indices, body = parts(subs)
            return Reduction(ReduceOp.SUM, indices, Apply("exp", (
                Apply("sub", (body, shift(subs)), F),), F))
        total = self.conv.reduce_into(shape, F, self.level, shifted_sum)
        result = Value(shape, F, lambda subs: Apply("add", (
            Apply("log", (total.at(tuple(subs)),), F), shift(subs)), F), self.level, True)
        return self.conv.materialize(result).buffer

    # -- expressions ----------------------------------------------------------------------
    def expr(self, expr: Expr, scope: Dict[str, IRExpr], probing: bool = False) -> IRExpr:
        recurse = functools.partial(self.expr, scope=scope, probing=probing)
        if isinstance(expr, Number):
            value = expr.value
            return Const(value, self.float) if isinstance(value, float) else \
                Const(int(value), INDEX)
        if isinstance(expr, Param):
            return self.operands[expr.name].at(())
        if isinstance(expr, IndexValue):
            return scope[expr.name]
        if isinstance(expr, Access):
            return self.read(expr, scope, probing)
        if isinstance(expr, Unary):
            operand = recurse(expr.operand)
            if expr.op == "+":
                return operand
            operand = self.cast(operand, INDEX) if operand.dtype is BOOL else operand
            return Apply("neg", (operand,), operand.dtype)
        if isinstance(expr, Binary):
            return self.binary(expr.op, recurse(expr.left), recurse(expr.right))
        if isinstance(expr, Call):
            return self.call(expr.func, [recurse(a) for a in expr.args])
        if isinstance(expr, Reduce):
            if probing:
                return Const(0, self.reduced_type(expr))
            buffer, free = self.reduced[expr]
            from_zero = tuple(_plus(scope[n], -self.ranges[n][0]) for n in free)
            found = self.conv.buffers[buffer]
            return Read(found.name, from_zero, found.dtype)
        raise unsupported(self.eqn, f"the construct {expr!s} of a statement")

    def binary(self, op: str, a: IRExpr, b: IRExpr) -> IRExpr:
        if op in _COMPARE:
            a, b = self.common(a, b)
            return Apply(_COMPARE[op], (a, b), BOOL)
        if op in ("&", "|"):
            return Apply("and" if op == "&" else "or",
                         (self.cast(a, BOOL), self.cast(b, BOOL)), BOOL)
        if op == "**" and isinstance(b, Const) and not b.dtype.is_float and \
                (a.dtype.is_float or int(b.value) >= 0):
            a = self.cast(a, INDEX) if a.dtype is BOOL else a
            return Apply("integer_pow", (a, Const(int(b.value), ScalarType.INT64)), a.dtype)
        if op in ("/", "**"):
            a, b = self.cast(a, self.float if not a.dtype.is_float else a.dtype), b
        if a.dtype is BOOL and b.dtype is BOOL:     # comparisons in arithmetic: 0 or 1
            counted = self.result if self.result is not BOOL else INDEX
            a, b = self.cast(a, counted), self.cast(b, counted)
        a, b = self.common(a, b)
        dtype = a.dtype
        if op in ("+", "-", "*", "/", "**"):
            name = {"+": "add", "-": "sub", "*": "mul", "/": "div", "**": "pow"}[op]
            return Apply(name, (a, b), dtype)
        # Python's floor division and modulo: C's (and XLA's) truncate toward zero
        remainder = Apply("rem", (a, b), dtype)
        zero = Const(0, dtype)
        off = Apply("and", (Apply("ne", (remainder, zero), BOOL),
                            Apply("ne", (Apply("lt", (remainder, zero), BOOL),
                                         Apply("lt", (b, zero), BOOL)), BOOL)), BOOL)
        if op == "%":
            return Select(off, (remainder, Apply("add", (remainder, b), dtype)), dtype)
        if dtype.is_float:
            return Apply("floor", (Apply("div", (a, b), dtype),), dtype)
        quotient = Apply("div", (a, b), dtype)
        return Select(off, (quotient, Apply("sub", (quotient, Const(1, dtype)), dtype)), dtype)

    def call(self, func: str, args) -> IRExpr:
        if func == "where":
            test, yes, no = args
            yes, no = self.common(yes, no)
            return Select(self.cast(test, BOOL), (no, yes), yes.dtype)
        if func in ("min", "max", "pow", "atan2"):
            a, b = args
            if func in ("pow", "atan2"):
                a = self.cast(a, a.dtype if a.dtype.is_float else self.float)
            a, b = self.common(a, b)
            return Apply(func, (a, b), a.dtype)
        (x,) = args
        if func == "abs" and not x.dtype.is_float:
            x = self.cast(x, INDEX) if x.dtype is BOOL else x
            return Apply("abs", (x,), x.dtype)
        x = self.cast(x, x.dtype if x.dtype.is_float else self.float)
        F = x.dtype
        if func in _SAME_NAME:
            return Apply(func, (x,), F)
        if func == "sigmoid":
            return Apply("logistic", (x,), F)
        if func == "relu":
            return Apply("max", (x, Const(0.0, F)), F)
        if func == "softplus":      # log1p(exp(-|x|)) + max(x, 0): no overflow
            return Apply("add", (Apply("log1p", (Apply("exp", (Apply("neg", (
                Apply("abs", (x,), F),), F),), F),), F), Apply("max", (x, Const(0.0, F)), F)), F)
        raise unsupported(self.eqn, f"the function {func} in a statement")

    # -- reads ------------------------------------------------------------------------------
    def read(self, access: Access, scope, probing: bool) -> IRExpr:
        value = self.operands[access.tensor]
        if probing:
            return Const(0, value.dtype) if not value.dtype.is_float else Const(0.0, value.dtype)
        pad = self.options.pad
        subs, inside = [], []
        for axis, (sub, extent) in enumerate(zip(access.indices, value.shape)):
            position = self.subscript(sub, scope)
            if sub.gathers:
                position, valid = self.gathered(access, sub, position, extent)
                if valid is not None:
                    inside.append(valid)
            elif not self.in_range(sub, extent):
                if pad is None:
                    raise unsupported(self.eqn, f"the read {access} may fall outside its "
                                      f"array (axis {axis} has {extent}) with these ranges")
                inside.append(_within(position, extent))
                position = _clamped(position, extent)
            subs.append(position)
        element = value.at(tuple(subs))
        if not inside:
            return element
        valid = inside[0]
        for more in inside[1:]:
            valid = Apply("and", (valid, more), BOOL)
        fill = self.options.fill if pad is None or any(s.gathers for s in access.indices) \
            else pad
        fill = float(fill) if element.dtype.is_float else int(fill)
        return Select(valid, (Const(fill, element.dtype), element), element.dtype)

    def subscript(self, sub: IndexExpr, scope) -> IRExpr:
        total: IRExpr = Const(sub.constant, INDEX)
        for name, coeff in sub.terms:
            total = _add(total, _times(scope[name], coeff))
        for part, coeff in sub.quasi:
            inner = self.subscript(part.inner, scope)
            found = self.binary(part.op, inner, Const(part.divisor, INDEX))
            total = _add(total, _times(found, coeff))
        for access, coeff in sub.gathers:
            total = _add(total, _times(self.cast(self.read(access, scope, False), INDEX),
                                       coeff))
        return total

    def gathered(self, access, sub, position, extent):
        policy = self.options.bounds
        if policy == "check":
            raise unsupported(self.eqn, f"the gather {access} under bounds='check' (a kernel "
                              "cannot raise ef.ein's out-of-range error; give bounds='clip', "
                              "'wrap', 'fill' or 'promise')")
        if policy == "clip":
            return _clamped(position, extent), None
        if policy == "wrap":
            return self.binary("%", position, Const(max(extent, 1), INDEX)), None
        if policy == "fill":
            return _clamped(position, extent), _within(position, extent)
        return position, None          # "promise": the caller guarantees the bounds

    def in_range(self, sub: IndexExpr, extent: int) -> bool:
        lo, hi = self.interval(sub)
        return 0 <= lo and hi < extent

    def interval(self, sub: IndexExpr) -> Tuple[int, int]:
        lo = hi = sub.constant
        for name, coeff in sub.terms:
            a, b = self.ranges[name]
            ends = (coeff * a, coeff * (b - 1))
            lo, hi = lo + min(ends), hi + max(ends)
        for part, coeff in sub.quasi:
            a, b = self.interval(part.inner)
            ends = (a // part.divisor, b // part.divisor) if part.op == "//" else \
                ((a % part.divisor, b % part.divisor) if b - a < part.divisor and
                 a % part.divisor <= b % part.divisor else (0, part.divisor - 1))
            ends = (coeff * ends[0], coeff * ends[1])
            lo, hi = lo + min(ends), hi + max(ends)
        return lo, hi

    # -- types ------------------------------------------------------------------------------
    def common(self, a: IRExpr, b: IRExpr) -> Tuple[IRExpr, IRExpr]:
        """``a`` and ``b`` in one type: a float if either is (the wider), else the wider
        integer; a bool meeting a number counts as 0 or 1."""
        if a.dtype is b.dtype:
            return a, b
        if a.dtype.is_float or b.dtype.is_float:
            floats = [t for t in (a.dtype, b.dtype) if t.is_float]
            target = max(floats, key=lambda t: t.bits)
        else:
            target = max((t for t in (a.dtype, b.dtype) if t is not BOOL),
                         key=lambda t: t.bits, default=BOOL)
        return self.cast(a, target), self.cast(b, target)

    @staticmethod
    def cast(node: IRExpr, dtype: ScalarType) -> IRExpr:
        if node.dtype is dtype:
            return node
        if isinstance(node, Const):
            value = node.value
            if dtype.is_float:
                return Const(float(value), dtype)
            if dtype is BOOL:
                return Const(bool(value), dtype)
            if not isinstance(value, float):
                return Const(int(value), dtype)
        return Cast(node, dtype)


def _plus(node: IRExpr, constant: int) -> IRExpr:
    return _add(node, Const(constant, INDEX)) if constant else node


def _add(a: IRExpr, b: IRExpr) -> IRExpr:
    if isinstance(b, Const) and b.value == 0:
        return a
    if isinstance(a, Const) and a.value == 0:
        return b
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(int(a.value) + int(b.value), INDEX)
    return Apply("add", (a, b), INDEX)


def _times(node: IRExpr, factor: int) -> IRExpr:
    if factor == 1:
        return node
    if isinstance(node, Const):
        return Const(int(node.value) * factor, INDEX)
    return Apply("mul", (node, Const(factor, INDEX)), INDEX)


def _within(position: IRExpr, extent: int) -> IRExpr:
    return Apply("and", (Apply("ge", (position, Const(0, INDEX)), BOOL),
                         Apply("lt", (position, Const(extent, INDEX)), BOOL)), BOOL)


def _clamped(position: IRExpr, extent: int) -> IRExpr:
    return Apply("min", (Apply("max", (position, Const(0, INDEX)), INDEX),
                         Const(max(extent - 1, 0), INDEX)), INDEX)


RULES = {"einfuse": einfuse_statement}
