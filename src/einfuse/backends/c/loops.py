"""Renders a converted JAX function (:class:`~einfuse.ir.JitProgram`) as
ONE C function, ``int ef_jit(void **args)``: statements are loop nests over static
extents, ``scan``/``while`` are C loops whose bodies are those loop nests (carries in
buffers), ``cond`` is an if-chain.  So a loop of thousands of steps is one call, with no
per-step dispatch.  Small intermediates live on the stack, large ones are allocated
once per call.

Every operation is a small ``static inline`` helper per element type (``ef_add_f``,
``ef_div_i32`` ...), emitted only when used, so each argument expression is evaluated
once and the semantics of XLA (NaN-propagating max/min, integer division by zero,
saturating float-to-int conversion, shifts past the width) are written down in one
place.  Generated code contains only generated names and validated literals."""

from __future__ import annotations

import math
from typing import Dict, List, Tuple

from ...errors import BackendError
from . import (loops_dot as c_loops_dot, loops_flat as c_loops_flat, loops_parts as c_loops_parts,
               loops_rewrite as c_loops_rewrite, loops_select as c_loops_select,
               loops_vmath as c_loops_vmath)
from ...ir import (INDEX, Apply, Assign, Cast, Const, Expr, Index, JitProgram, Loop, LoopKind,
                   Read, ReduceOp, ScalarType, ScatterAdd, Select, Switch)
from ...plan.jit_threads import accumulator_row, decide
from .scalar_types import C_TYPE, SUFFIX, UNSIGNED_OF_BITS

STACK_LIMIT = 65536        # bytes of intermediates on the stack in all (callbacks run on
                           # threads with small stacks); the rest are allocated per call
ENTRY = "ef_jit"

_FLOAT = {
    "add": "return a + b;", "sub": "return a - b;", "mul": "return a * b;",
    "div": "return a / b;", "rem": "return fmod@(a, b);",
    "max": "return (a != a) ? a : (b != b) ? b : (a > b ? a : b);",
    "min": "return (a != a) ? a : (b != b) ? b : (a < b ? a : b);",
    "pow": "return pow@(a, b);", "atan2": "return atan2@(a, b);",
    "nextafter": "return nextafter@(a, b);",
    "neg": "return -a;", "abs": "return fabs@(a);",
    "sign": "return a > 0 ? (T)1 : a < 0 ? (T)-1 : a;",
    "exp": "return exp@(a);", "exp2": "return exp2@(a);", "log": "return log@(a);",
    "log1p": "return log1p@(a);", "expm1": "return expm1@(a);", "tanh": "return tanh@(a);",
    "logistic": "return (T)1 / ((T)1 + exp@(-a));",
    "sin": "return sin@(a);", "cos": "return cos@(a);", "tan": "return tan@(a);",
    "asin": "return asin@(a);", "acos": "return acos@(a);", "atan": "return atan@(a);",
    "sinh": "return sinh@(a);", "cosh": "return cosh@(a);", "asinh": "return asinh@(a);",
    "acosh": "return acosh@(a);", "atanh": "return atanh@(a);",
    "sqrt": "return sqrt@(a);", "rsqrt": "return (T)1 / sqrt@(a);",
    "cbrt": "return cbrt@(a);", "floor": "return floor@(a);", "ceil": "return ceil@(a);",
    "round": "return round@(a);", "round_even": "return nearbyint@(a);",
    "erf": "return erf@(a);", "erfc": "return erfc@(a);", "square": "return a * a;",
    # Giles' approximation as a start, then two Newton steps on erf, in double
    "erf_inv": "double y = (double)a, w, p, x; "
               "if (!(y > -1.0 && y < 1.0)) return y == 1.0 ? (T)INFINITY : "
               "y == -1.0 ? (T)(-INFINITY) : (T)NAN; "
               "w = -log((1.0 - y) * (1.0 + y)); "
               "if (w < 5.0) { w -= 2.5; p = 2.81022636e-08; p = 3.43273939e-07 + p * w; "
               "p = -3.5233877e-06 + p * w; p = -4.39150654e-06 + p * w; "
               "p = 0.00021858087 + p * w; p = -0.00125372503 + p * w; "
               "p = -0.00417768164 + p * w; p = 0.246640727 + p * w; p = 1.50140941 + p * w; }"
               " else { w = sqrt(w) - 3.0; p = -0.000200214257; "
               "p = 0.000100950558 + p * w; p = 0.00134934322 + p * w; "
               "p = -0.00367342844 + p * w; p = 0.00573950773 + p * w; "
               "p = -0.0076224613 + p * w; p = 0.00943887047 + p * w; "
               "p = 1.00167406 + p * w; p = 2.83297682 + p * w; } "
               "x = p * y; for (int k = 0; k < 2; ++k) "
               "x -= (erf(x) - y) / (1.1283791670955126 * exp(-x * x)); return (T)x;",
    "integer_pow": "T r = 1; long long m = n < 0 ? -n : n; T p = a; "
                   "while (m) { if (m & 1) r *= p; p *= p; m >>= 1; } "
                   "return n < 0 ? (T)1 / r : r;",
}
_INT = {
    "add": "return (T)(a + b);", "sub": "return (T)(a - b);", "mul": "return (T)(a * b);",
    "div": "return b == 0 ? (T)-1 : (MIN != 0 && a == (T)MIN && b == (T)-1) ? a : "
           "(T)(a / b);",
    "rem": "return b == 0 ? a : (MIN != 0 && a == (T)MIN && b == (T)-1) ? (T)0 : (T)(a % b);",
    "max": "return a > b ? a : b;", "min": "return a < b ? a : b;",
    "neg": "return (T)(0 - a);", "abs": "return a < 0 ? (T)(0 - a) : a;",
    "sign": "return (T)((a > 0) - (a < 0));", "square": "return (T)(a * a);",
    "and": "return (T)(a & b);", "or": "return (T)(a | b);", "xor": "return (T)(a ^ b);",
    "not": "return (T)~a;",
    "shift_left": "return (b < 0 || b >= BITS) ? (T)0 : (T)((U)a << b);",
    "shift_right_logical": "return (b < 0 || b >= BITS) ? (T)0 : (T)((U)a >> b);",
    "shift_right_arithmetic": "return (b < 0 || b >= BITS) ? (a < 0 ? (T)-1 : (T)0) : "
                              "(T)(a >> b);",
    "integer_pow": "T r = 1; long long m = n; T p = a; "
                   "while (m) { if (m & 1) r = (T)(r * p); p = (T)(p * p); m >>= 1; } "
                   "return r;",
}
_BOOL = {"add": "return a | b;", "mul": "return a & b;", "max": "return a | b;",
         "min": "return a & b;", "and": "return a & b;", "or": "return a | b;",
         "xor": "return a ^ b;", "not": "return !a;", "sub": "return a ^ b;"}
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
UNARY = {"neg", "abs", "sign", "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic",
         "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
         "atanh", "sqrt", "rsqrt", "cbrt", "floor", "ceil", "round", "round_even", "erf",
         "erfc", "square", "not", "is_finite", "erf_inv"}


class Renderer:
    def __init__(self, program: JitProgram, threads_inside: bool = True):
        # the program as rendered: c_loops_rewrite's transposed weights, vector math
        # outside sums and carries updated in place (every value unchanged), then which
        # statements run on threads, decided before any line is printed
        # (plan/jit_threads.py; threads_inside False: the caller runs this code on a
        # thread team, so no statement gets threads of its own)
        self.program = decide(c_loops_rewrite.optimise(program), threads_inside)
        self.helpers: Dict[str, str] = {}
        self.lines: List[str] = []
        self.depth = 1
        self.counter = 0
        self._extents = None         # loop index -> extent (c_loops_select), when needed

    # -- helpers ------------------------------------------------------------------------------
    def helper(self, op: str, dtype: ScalarType) -> str:
        name = f"ef_{op}_{SUFFIX[dtype]}"
        if name in self.helpers:
            return name
        t = C_TYPE[dtype]
        if op in _COMPARE:
            body = f"return a {_COMPARE[op]} b;"
            self.helpers[name] = f"static inline unsigned char {name}({t} a, {t} b) {{ {body} }}"
            return name
        if op == "is_finite":
            self.helpers[name] = (f"static inline unsigned char {name}({t} a) "
                                  "{ return isfinite(a) ? 1 : 0; }")
            return name
        if dtype is ScalarType.BOOL:
            body = _BOOL.get(op)
        elif dtype.is_float:
            body = _FLOAT.get(op)
            if body is not None:
                body = body.replace("@", "f" if dtype is ScalarType.FLOAT32 else "")
        else:
            body = _INT.get(op)
            if body is not None:
                minimum = f"({-(2 ** (dtype.bits - 1))}LL)" if dtype.is_signed_int else "0"
                body = body.replace("MIN", minimum).replace("BITS", str(dtype.bits)) \
                    .replace("(U)", f"({UNSIGNED_OF_BITS[dtype.bits]})")
        if body is None:
            raise BackendError(f"the operation {op} is not defined on {dtype.value} in "
                               "the jit kernel renderer")
        body = body.replace("(T)", f"({t})").replace("T r", f"{t} r").replace("T p", f"{t} p")
        if op == "integer_pow":
            params = f"{t} a, long long n"
        elif op in UNARY:
            params = f"{t} a"
        else:
            params = f"{t} a, {t} b"
        self.helpers[name] = f"static inline {t} {name}({params}) {{ {body} }}"
        return name

    def bitcast_helper(self, source: ScalarType, target: ScalarType) -> str:
        """The bits of a value read as another type of the same width."""
        name = f"ef_bitcast_{SUFFIX[source]}_{SUFFIX[target]}"
        if name not in self.helpers:
            s, t = C_TYPE[source], C_TYPE[target]
            self.helpers[name] = (f"static inline {t} {name}({s} a) {{ {t} b; "
                                  f"memcpy(&b, &a, sizeof b); return b; }}")
        return name

    def convert_helper(self, source: ScalarType, target: ScalarType) -> str:
        """Float to integer as XLA does: NaN to 0, out of range saturates."""
        import numpy as np
        name = f"ef_cvt_{SUFFIX[source]}_{SUFFIX[target]}"
        if name not in self.helpers:
            info = np.iinfo(target.numpy)
            low, high = int(info.min), int(info.max)
            t, s = C_TYPE[target], C_TYPE[source]
            high_literal = f"{high}ULL" if high > 2 ** 63 - 1 else f"{high}LL"
            low_literal = f"({low + 1}LL - 1)" if low < 0 else f"{low}LL"
            self.helpers[name] = (
                f"static inline {t} {name}({s} a) {{ if (a != a) return 0; "
                f"if (a <= ({s}){low_literal}) return ({t}){low_literal}; "
                f"if (a >= ({s}){high_literal}) return ({t}){high_literal}; "
                f"return ({t})a; }}")
        return name

    # -- expressions ----------------------------------------------------------------------------
    def expr(self, node: Expr) -> str:
        if isinstance(node, Const):
            return literal(node)
        if isinstance(node, Index):
            return node.name
        if isinstance(node, Read):
            return f"{node.buffer}[{self.offset(node.buffer, node.subscripts)}]"
        if isinstance(node, Cast):
            return self.cast(node)
        if isinstance(node, Select):
            which = self.expr(node.which)
            cases = [self.expr(c) for c in node.cases]
            if self.unconditional(node):
                # every arm read first, then chosen: no masked loads (c_loops_select)
                self.counter += 1
                names = [f"s{self.counter}_{k}" for k in range(len(cases))]
                t = C_TYPE[node.dtype]
                values = " ".join(f"{t} {n} = {c};" for n, c in zip(names, cases))
                cases = names
                if len(cases) == 2:
                    return f"({{ {values} ({which}) ? {cases[1]} : {cases[0]}; }})"
                w = f"w{self.counter}"
                chain = cases[-1]
                for k in range(len(cases) - 2, -1, -1):
                    chain = f"({w} <= {k} ? {cases[k]} : {chain})"
                return f"({{ {values} long long {w} = (long long)({which}); {chain}; }})"
            if len(cases) == 2:
                return f"(({which}) ? {cases[1]} : {cases[0]})"
            self.counter += 1
            w = f"w{self.counter}"
            chain = cases[-1]
            for k in range(len(cases) - 2, -1, -1):
                chain = f"({w} <= {k} ? {cases[k]} : {chain})"
            return f"({{ long long {w} = (long long)({which}); {chain}; }})"
        if isinstance(node, Apply):
            return self.apply(node)
        raise BackendError(f"the jit kernel renderer has no rule for {type(node).__name__}")

    def unconditional(self, node: Select) -> bool:
        """Whether the arms of ``node`` may all be evaluated before choosing: each of
        their reads stays in its buffer (c_loops_select: GCC 12's masked loads)."""
        if self._extents is None:
            self._extents = c_loops_select.index_extents(self.program)
        shape_of = lambda name: self.program.buffer(name).shape  # noqa: E731
        return all(c_loops_select.reads_in_bounds(c, self._extents, shape_of)
                   for c in node.cases)

    def apply(self, node: Apply) -> str:
        args = [self.expr(a) for a in node.args]
        if node.dtype is INDEX and node.op in ("add", "mul", "idiv", "imod", "min", "max") \
                and all(a.dtype is INDEX for a in node.args):
            a, b = args
            if node.op in ("min", "max"):
                comparison = "<" if node.op == "min" else ">"
                return f"({{ long long p_ = {a}, q_ = {b}; p_ {comparison} q_ ? p_ : q_; }})"
            # idiv/imod are floor division and Python's modulo (their operands may be
            # negative only where a select discards the value; keep them defined there)
            if node.op == "idiv":
                return f"ef_floordiv({a}, {b})"
            if node.op == "imod":
                return f"ef_floormod({a}, {b})"
            return f"({a} {'+' if node.op == 'add' else '*'} {b})"
        operand_type = node.args[0].dtype
        if node.op == "bitcast":
            return f"{self.bitcast_helper(operand_type, node.dtype)}({args[0]})"
        if node.op == "integer_pow":
            return f"{self.helper('integer_pow', node.dtype)}({args[0]}, {args[1]})"
        return f"{self.helper(node.op, operand_type)}({', '.join(args)})"

    def cast(self, node: Cast) -> str:
        inner = self.expr(node.arg)
        source, target = node.arg.dtype, node.dtype
        if target is ScalarType.BOOL:
            return f"(({inner}) != 0)"
        if source.is_float and not target.is_float:
            return f"{self.convert_helper(source, target)}({inner})"
        return f"(({C_TYPE[target]})({inner}))"

    def offset(self, buffer: str, subscripts) -> str:
        shape = self.program.buffer(buffer).shape
        if len(subscripts) != len(shape):
            raise BackendError(f"{buffer} is read with {len(subscripts)} subscripts; it has "
                               f"{len(shape)} axes")
        parts = []
        stride = 1
        for sub, extent in reversed(list(zip(subscripts, shape))):
            if not (isinstance(sub, Const) and sub.value == 0):
                text = self.expr(sub)
                parts.append(text if stride == 1 else f"{text} * {stride}LL")
            stride *= extent
        return " + ".join(reversed(parts)) or "0"

    # -- statements -----------------------------------------------------------------------------
    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def open_loops(self, indices, simd: bool = False, clause: str = "",
                   parallel: bool = False) -> int:
        """Opens ``for`` loops over ``indices`` (an index of extent 1 is the constant 0);
        ``simd``: the innermost loop is an OpenMP SIMD loop (its iterations are
        independent; a reduction's ``clause`` lets it reassociate its sum, a rounding
        difference as in any vectorised sum); ``parallel``: the outermost loop is shared
        among threads.  Returns the number of blocks to close."""
        real = [name for name, extent in indices if extent != 1]
        opened = 0
        for name, extent in indices:
            self.emit("{" if extent == 1 else
                      f"for (long long {name} = 0; {name} < {extent}LL; ++{name}) {{")
            if extent == 1:
                self.depth += 1
                self.emit(f"const long long {name} = 0;")
                opened += 1
                continue
            pragma = []
            if parallel and name == real[0]:
                pragma.append("parallel for")
            if simd and name == real[-1]:
                pragma.append("simd" + clause)
            if pragma:
                line = self.lines.pop()
                self.emit("#pragma omp " + " ".join(pragma))
                self.lines.append(line)
            self.depth += 1
            opened += 1
        return opened

    def close(self, count: int) -> None:
        for _ in range(count):
            self.depth -= 1
            self.emit("}")

    def steps(self, steps) -> None:
        for step in steps:
            if isinstance(step, Assign):
                self.assign(step)
            elif isinstance(step, ScatterAdd):
                self.scatter_add(step)
            elif isinstance(step, Loop):
                self.loop(step)
            elif isinstance(step, Switch):
                self.switch(step)
            else:
                raise BackendError(f"the jit kernel renderer has no rule for {step!r}")

    def assign(self, step: Assign) -> None:
        if step.origin:
            self.emit(f"/* {_comment(step.origin)} */")
        if step.reduction is not None and step.indices and step.indices[-1][1] >= 8:
            operands = c_loops_dot.contraction_operands(step, self.program.buffer(step.buffer).dtype)
            if operands is not None:
                c_loops_dot.render_contraction(self, step, *operands)
                return
        if accumulator_row(step):
            self.row_reduction(step)
            return
        if c_loops_vmath.applies(self, step):
            c_loops_vmath.render(self, step)
            return
        if c_loops_flat.flattens(self, step):
            c_loops_flat.render_flat(self, step)
            return
        # the innermost loop that is a loop (a vmapped (8, 1) activation: the 8)
        real = [extent for _, extent in step.indices if extent != 1]
        simd = step.reduction is None and bool(real) and real[-1] >= 4
        opened = self.open_loops(step.indices, simd, parallel=step.parallel)
        target = f"{step.buffer}[{self.offset(step.buffer, step.prefix + tuple(Index(n) for n, _ in step.indices))}]"
        if step.reduction is None:
            self.emit(f"{target} = {self.expr(step.value)};")
        else:
            self.reduction(step.reduction, target, self.program.buffer(step.buffer).dtype)
        self.close(opened)

    def row_reduction(self, step: Assign) -> None:
        """A reduction with the last output loop moved inside the reduced loops: a row of
        accumulators, updated by a SIMD loop over contiguous output elements (each
        element still sums in the same order, so the result is that of the plain nest)."""
        reduction = step.reduction
        dtype = self.program.buffer(step.buffer).dtype
        *outer, (last, extent) = step.indices
        opened = self.open_loops(outer, parallel=step.parallel)
        self.emit("{")
        self.depth += 1
        initial = identity(reduction.op, dtype)
        self.emit(f"{C_TYPE[dtype]} acc[{extent}];")
        self.emit(f"for (long long {last} = 0; {last} < {extent}LL; ++{last}) "
                  f"acc[{last}] = {initial};")
        inner = self.open_loops(reduction.indices)
        combine = {ReduceOp.SUM: "add", ReduceOp.PROD: "mul", ReduceOp.MAX: "max",
                   ReduceOp.MIN: "min", ReduceOp.AND: "and", ReduceOp.OR: "or"}[reduction.op]
        self.emit("#pragma omp simd")
        self.emit(f"for (long long {last} = 0; {last} < {extent}LL; ++{last}) "
                  f"acc[{last}] = {self.helper(combine, dtype)}(acc[{last}], "
                  f"{self.expr(reduction.body)});")
        self.close(inner)
        target = f"{step.buffer}[{self.offset(step.buffer, step.prefix + tuple(Index(n) for n, _ in step.indices))}]"
        self.emit(f"for (long long {last} = 0; {last} < {extent}LL; ++{last}) "
                  f"{target} = acc[{last}];")
        self.depth -= 1
        self.emit("}")
        self.close(opened)

    def reduction(self, reduction, target: str, dtype: ScalarType) -> None:
        op = reduction.op
        body_type = reduction.body.dtype
        self.emit("{")
        self.depth += 1
        if op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN):
            better = ">" if op is ReduceOp.ARGMAX else "<"
            self.emit(f"{C_TYPE[body_type]} best = 0; long long pos = 0, at = 0;")
            opened = self.open_loops(reduction.indices)
            self.emit(f"{C_TYPE[body_type]} v = {self.expr(reduction.body)};")
            # the first NaN wins, as in NumPy and JAX
            self.emit(f"if (at == 0 || (!(best != best) && (v {better} best || v != v))) "
                      "{ best = v; pos = at; }")
            self.emit("++at;")
            self.close(opened)
            self.emit(f"{target} = ({C_TYPE[dtype]})pos;")
        else:
            initial = identity(op, dtype)
            self.emit(f"{C_TYPE[dtype]} acc = {initial};")
            simd = op is ReduceOp.SUM and dtype.is_float and len(reduction.indices) == 1 \
                and reduction.indices[0][1] >= 4
            opened = self.open_loops(reduction.indices, simd, " reduction(+:acc)")
            value = self.expr(reduction.body)
            combine = {ReduceOp.SUM: "add", ReduceOp.PROD: "mul", ReduceOp.MAX: "max",
                       ReduceOp.MIN: "min", ReduceOp.AND: "and", ReduceOp.OR: "or"}[op]
            if simd:
                self.emit(f"acc += {value};")
            else:
                self.emit(f"acc = {self.helper(combine, dtype)}(acc, {value});")
            self.close(opened)
            self.emit(f"{target} = acc;")
        self.depth -= 1
        self.emit("}")

    def scatter_add(self, step: ScatterAdd) -> None:
        if step.origin:
            self.emit(f"/* {_comment(step.origin)} */")
        opened = self.open_loops(step.indices)
        dtype = self.program.buffer(step.buffer).dtype
        target = f"{step.buffer}[{self.offset(step.buffer, step.target)}]"
        value = self.expr(step.value) if step.replace else \
            f"{self.helper('add', dtype)}({target}, {self.expr(step.value)})"
        self.emit(f"if ({self.expr(step.valid)}) {target} = {value};")
        self.close(opened)

    def loop(self, step: Loop) -> None:
        self.emit(f"/* {_comment(step.origin)} */")
        if step.kind is LoopKind.SCAN:
            self.emit(f"for (long long {step.var} = 0; {step.var} < {step.length}LL; "
                      f"++{step.var}) {{")
            self.depth += 1
        elif step.kind is LoopKind.WHILE:
            self.emit("for (;;) {")
            self.depth += 1
            self.steps(step.condition_steps)
            self.emit(f"if (!({self.expr(step.condition)})) break;")
        else:
            raise BackendError(f"the jit kernel renderer has no rule for a {step.kind} loop")
        self.steps(step.body)
        for carry, new in step.updates:
            nbytes = self.program.buffer(carry).size * self.program.buffer(carry).dtype.numpy.itemsize
            self.emit(f"memcpy({carry}, {new}, {nbytes});")
        self.depth -= 1
        self.emit("}")

    def switch(self, step: Switch) -> None:
        self.emit(f"/* {_comment(step.origin)} */")
        self.emit("{")
        self.depth += 1
        self.emit(f"long long which = (long long)({self.expr(step.which)});")
        for k, body in enumerate(step.branches):
            last = k == len(step.branches) - 1
            if k == 0:
                self.emit("if (which <= 0) {" if not last else "{")
            elif last:
                self.emit("} else {")
            else:
                self.emit(f"}} else if (which == {k}) {{")
            self.depth += 1
            self.steps(body)
            self.depth -= 1
        self.emit("}")
        self.depth -= 1
        self.emit("}")

    def vector_math(self) -> List[str]:
        from .build import vector_math, vector_math_declarations
        if not vector_math():
            return []
        return [vector_math_declarations("f", "float") + vector_math_declarations("", "double")]

    # -- the function -------------------------------------------------------------------------
    def head(self) -> str:
        """Includes and the helpers used so far (render the body first)."""
        return "\n".join(["#include <math.h>", "#include <stdlib.h>", "#include <string.h>",
                          "static inline long long ef_floordiv(long long a, long long b) "
                          "{ long long q = a / b; return (a % b != 0 && ((a < 0) != (b < 0)))"
                          " ? q - 1 : q; }",
                          "static inline long long ef_floormod(long long a, long long b) "
                          "{ long long r = a % b; return (r != 0 && ((r < 0) != (b < 0))) "
                          "? r + b : r; }"] + self.vector_math() + list(self.helpers.values()))

    def storage(self, declared, on_failure: str = "goto fail;") \
            -> Tuple[List[str], List[str], List[str]]:
        """The intermediates (buffers not in ``declared``): (declarations, allocations,
        frees).  Small ones live on the stack (STACK_LIMIT in all), the rest are
        allocated; every pointer starts NULL so that a failure frees only what was
        allocated, and a failed allocation jumps to ``fail``."""
        declarations, allocations, frees = [], [], []
        for buffer, t, nbytes, on_stack in self.placed(declared):
            if on_stack:
                # a cache line's alignment, stated: GCC 12 stored to such an array with
                # an aligned 32-byte move at an address 16 bytes off (a transposed copy,
                # 12 x 12 doubles, in a 45 KB frame: SIGSEGV)
                declarations.append(f"{t} {buffer.name}[{max(1, buffer.size)}] "
                                    "__attribute__((aligned(64)));")
            else:
                declarations.append(f"{t} *{buffer.name} = 0;")
                allocations.append(f"{buffer.name} = ({t} *)malloc({nbytes}ULL);")
                allocations.append(f"if (!{buffer.name}) {on_failure}")
                frees.append(f"free({buffer.name});")
        return declarations, allocations, frees

    def placed(self, declared):
        """(buffer, C type, bytes, whether on the stack) of each intermediate (buffer not
        in ``declared``): the small ones, in order, until STACK_LIMIT bytes in all."""
        on_stack = 0
        for buffer in self.program.buffers:
            if buffer.name in declared:
                continue
            nbytes = max(1, buffer.size) * buffer.dtype.numpy.itemsize
            fits = on_stack + nbytes <= STACK_LIMIT
            on_stack += nbytes if fits else 0
            yield buffer, C_TYPE[buffer.dtype], nbytes, fits

    def render(self) -> str:
        body = self.function(f"int {ENTRY}(void **args)")
        return "\n".join([self.head(), "", body])

    def function(self, signature: str) -> str:
        """The program as one C function (``args``: inputs, then outputs), preceded by
        the functions its steps are split into where it is long (c_loops_parts); render
        the head after it, which holds the helpers that the body uses."""
        program = self.program
        prologue = []
        for k, name in enumerate(program.inputs):
            t = C_TYPE[program.buffer(name).dtype]
            prologue.append(f"const {t} *restrict {name} = (const {t} *)args[{k}];")
        for k, name in enumerate(program.outputs):
            t = C_TYPE[program.buffer(name).dtype]
            prologue.append(f"{t} *restrict {name} = ({t} *)args[{len(program.inputs) + k}];")
        split = c_loops_parts.split_function(self, signature, STACK_LIMIT)
        if split is not None:
            return split
        declarations, allocations, frees = self.storage(set(program.inputs + program.outputs))
        self.steps(program.steps)
        body = "\n".join(self.lines)
        return "\n".join([
            f"{signature} {{",
            *("    " + line for line in prologue + declarations + allocations),
            body,
            *("    " + line for line in frees),
            "    return 0;",
            "fail:" if frees else "",
            *(("    " + line for line in frees) if frees else ()),
            "    return 1;" if frees else "",
            "}", ""])


def literal(node: Const) -> str:
    dtype = node.dtype
    value = node.value
    if dtype.is_float:
        value = float(value)
        if math.isnan(value):
            text = "NAN"
        elif math.isinf(value):
            text = "INFINITY" if value > 0 else "(-INFINITY)"
        else:
            text = repr(value)
        return f"(({C_TYPE[dtype]}){text})"
    if dtype is ScalarType.BOOL:
        return "1" if value else "0"
    value = int(value)
    if dtype.is_unsigned_int:
        return f"(({C_TYPE[dtype]}){value}ULL)"
    if value == -(2 ** 63):
        return "((long long)(-9223372036854775807LL - 1))"
    return f"(({C_TYPE[dtype]}){value}LL)"


def identity(op: ReduceOp, dtype: ScalarType) -> str:
    """The C literal a reduction starts from.  AND on integers is bitwise (reduce_and
    of an int array): it starts from all bits set, not from 1."""
    if op is ReduceOp.AND and dtype is not ScalarType.BOOL:
        return f"(({C_TYPE[dtype]})-1)"
    found = {ReduceOp.SUM: "0", ReduceOp.PROD: "1", ReduceOp.OR: "0",
             ReduceOp.AND: "1"}.get(op)
    return found if found is not None else extreme(dtype, low=op is ReduceOp.MAX)


def extreme(dtype: ScalarType, low: bool) -> str:
    import numpy as np
    if dtype.is_float:
        return "(-INFINITY)" if low else "INFINITY"
    if dtype is ScalarType.BOOL:
        return "0" if low else "1"
    info = np.iinfo(dtype.numpy)
    return literal(Const(int(info.min if low else info.max), dtype))


def _comment(text: str) -> str:
    return text.replace("*/", "* /").replace("\n", " ")[:200]


def render(program: JitProgram) -> str:
    return Renderer(program).render()


def build(program: JitProgram):
    """The compiled entry point (a ctypes function taking ``void **``)."""
    return load_entry(lambda: render(program))


def load_entry(source, *extra_argtypes):
    """The entry point of ``source()`` (rendered once a compiler is found): void **, ..."""
    import ctypes
    from . import build as c_build
    if c_build.find_compiler() is None:
        raise BackendError("ef.jit needs a C compiler (cc, gcc or clang) on PATH, or $CC")
    entry = getattr(c_build.load(source()), ENTRY)
    entry.restype = ctypes.c_int
    entry.argtypes = [ctypes.POINTER(ctypes.c_void_p)] + list(extra_argtypes)
    return entry

