"""Render the loop-nest IR (:mod:`einfuse.ir`) as C99 + OpenMP source.

One method per IR node type (``stmt_Loop``, ``expr_Load`` ...), dispatched on
the class name, so a sibling renderer (Triton) can mirror the structure.

Only generated names reach the C text (``t0`` buffers, ``n0``/``lo0``/``d1_0``/
``s1_0`` runtime ints, ``p0`` loop counters, ``a0`` accumulators, ``q0``
parameters); the renderer re-validates every name it prints, and numbers are
printed as integer digits or C99 hex floats, so no user text reaches the
compiler.

Every kernel has the same C signature (so calling it needs no per-kernel glue)::

    void NAME(void **bufs, const int64_t *ints, const double *dprm,
              const int64_t *iprm, const double *fills, int nthreads, int32_t *err)
"""

from __future__ import annotations

import math
from typing import List, Optional

from ... import ir
from ..identifiers import name
from ...ir import BinaryOp, BufferType, Function, LoopKind, Policy, QuasiOp, ReduceOp
from ...plan.gathers import gather_helper, one_gather
from .build import VECTOR_MATH_FUNCTIONS, vector_math_declarations
from .gather_helpers import GATHER_HELPERS as _GATHER_HELPERS
from .elementwise import OPERATORS as _HELPER_OPS, elementwise_helpers
from .render_prelude import FLOAT_HELPERS, INT_HELPERS, PRELUDE

C_TYPES = {"float32": "float", "float64": "double", "int8": "int8_t", "int16": "int16_t",
           "int32": "int32_t", "int64": "int64_t", "uint8": "uint8_t", "uint16": "uint16_t",
           "uint32": "uint32_t", "uint64": "uint64_t"}
_UNARY_MATH = (Function.EXP, Function.LOG, Function.LOG1P, Function.EXPM1, Function.SQRT,
               Function.SIN, Function.COS, Function.TANH, Function.ERF, Function.FLOOR,
               Function.CEIL, Function.TAN)
# the functions rendered as (or through) a libmvec call in a SIMD loop
_VECTOR_MATH_CALLS = frozenset(f for f in Function if f.value in VECTOR_MATH_FUNCTIONS) | {
    Function.SIGMOID, Function.SOFTPLUS}
# argmax/argmin track the extremum the way max/min do
_POSITION_OPS = {ReduceOp.ARGMAX: ReduceOp.MAX, ReduceOp.ARGMIN: ReduceOp.MIN}
_ACC_INIT_FLOAT = {ReduceOp.SUM: "0", ReduceOp.PROD: "1", ReduceOp.MAX: "-INFINITY",
                   ReduceOp.MIN: "INFINITY"}

SIGNATURE = ("void {name}(void **bufs, const int64_t *ints, const double *dprm, "
             "const int64_t *iprm, const double *fills, int nthreads, int32_t *err)")


class CRenderer:
    def __init__(self, program: ir.LoopProgram, vector_math: bool = False):
        self.program = program
        self.vector_math = vector_math
        self.working = program.working
        self.ctype = C_TYPES[self.working]
        self.is_float = self.working.startswith("float")
        self.f = "f" if self.working == "float32" else ""
        self.tiles: List[int] = []
        self.in_parallel = False
        self.buffers: tuple = ()
        self.tiles_doubled = False    # a tiled loop's body was written twice (below)
        self.single_copy = False      # inside a partial register block: no doubling

    # -- program and kernels -----------------------------------------------------------
    def render(self) -> str:
        parts = [PRELUDE.format(T=self.ctype), _GATHER_HELPERS]
        if self.is_float and self.vector_math:
            parts.append(vector_math_declarations(self.f, self.ctype))
        parts.append(FLOAT_HELPERS.format(f=self.f) if self.is_float else INT_HELPERS)
        parts.append(elementwise_helpers(self.working))
        for kernel in self.program.kernels:
            parts.append(self.kernel(kernel))
        return "\n".join(parts)

    def kernel(self, k: ir.LoopNest) -> str:
        lines = [SIGNATURE.format(name=name(k.name)) + " {"]
        self.buffers = k.buffers
        self.thread_rows = []
        for n, buf in enumerate(k.buffers):
            ctype = C_TYPES.get(buf.dtype, "T")
            qual = "" if buf.output else "const "
            if buf.per_thread is not None:   # its row is found in the parallel loop
                lines.append(f"  {ctype} *restrict {name(buf.name)}_rows = "
                             f"({ctype} *)bufs[{n}];")
                self.thread_rows.append(buf)
                continue
            lines.append(f"  {qual}{ctype} *restrict {name(buf.name)} = "
                         f"({qual}{ctype} *)bufs[{n}];")
        for n, int_name in enumerate(k.ints):
            lines.append(f"  const int64_t {name(int_name)} = ints[{n}];")
        source = "dprm" if self.is_float else "iprm"
        for n in range(k.n_params):
            lines.append(f"  const T q{n} = (T){source}[{n}];")
        lines.append("  const double padv = fills[0], fillv = fills[1];")
        lines.append("  const int nth = nthreads > 0 ? nthreads : omp_get_max_threads();")
        lines.append("  (void)padv; (void)fillv; (void)nth; (void)err; (void)dprm; (void)iprm;")
        for stmt in k.body:
            lines += self.stmt(stmt, 1)
        lines.append("}")
        return "\n".join(lines) + "\n"

    # -- statements ------------------------------------------------------------------------
    def stmt(self, node: ir.Stmt, depth: int) -> List[str]:
        return getattr(self, "stmt_" + type(node).__name__)(node, depth)

    def block(self, body, depth: int) -> List[str]:
        lines: List[str] = []
        for stmt in body:
            lines += self.stmt(stmt, depth)
        return lines

    def stmt_DeclareAcc(self, node: ir.DeclareAcc, depth: int) -> List[str]:
        pad = "  " * depth
        acc = name(node.name)
        if node.op == ReduceOp.LOGSUMEXP:
            inits = [(acc + "_m", "-INFINITY"), (acc + "_s", "0")]
        else:
            inits = [(acc, self.identity(node.op))]
        lines = []
        if node.op in _POSITION_OPS:     # the extremum so far and its position
            inits = [(acc, self.identity(node.op)), (acc + "_p", "0")]
        for var, init in inits:
            ctype = "int64_t" if var.endswith("_p") and node.op in _POSITION_OPS else "T"
            if node.lanes is None:
                lines.append(f"{pad}{ctype} {var} = ({ctype})({init});")
            elif node.rows is None:
                lines.append(f"{pad}{ctype} {var}[{int(node.lanes)}];")
                lines.append(f"{pad}for (int64_t l_ = 0; l_ < {int(node.lanes)}; ++l_) "
                             f"{var}[l_] = ({ctype})({init});")
            else:
                rows, lanes = int(node.rows), int(node.lanes)
                lines.append(f"{pad}{ctype} {var}[{rows}][{lanes}];")
                lines.append(f"{pad}for (int64_t r_ = 0; r_ < {rows}; ++r_) "
                             f"for (int64_t l_ = 0; l_ < {lanes}; ++l_) "
                             f"{var}[r_][l_] = ({ctype})({init});")
        return lines

    def identity(self, op: str) -> str:
        op = _POSITION_OPS.get(op, op)
        if self.is_float or op in (ReduceOp.SUM, ReduceOp.PROD):
            return _ACC_INIT_FLOAT[op]
        import numpy as np
        info = np.iinfo(np.dtype(self.working))
        value = info.min if op == ReduceOp.MAX else info.max
        # INT64_MIN has no literal: write it as an expression
        return f"{value + 1}LL - 1" if value < 0 else f"{value}ULL"

    def acc_ref(self, acc: str, lane: Optional[str], suffix: str = "",
                row: Optional[str] = None) -> str:
        ref = name(acc) + suffix
        if row is not None:
            ref += f"[{name(row)}]"
        return f"{ref}[{name(lane)}]" if lane is not None else ref

    def stmt_Fold(self, node: ir.Fold, depth: int) -> List[str]:
        into, error, source = name(node.into), name(node.error), name(node.source)
        index, loops = "", ""
        for var, size in (("r_", node.rows), ("l_", node.lanes)):
            if size is not None:
                loops += f"for (int64_t {var} = 0; {var} < {int(size)}; ++{var}) "
                index += f"[{var}]"
        return ["  " * depth + f"{loops}ef_fold(&{into}{index}, &{error}{index}, "
                f"{source}{index});"]

    def stmt_Compensate(self, node: ir.Compensate, depth: int) -> List[str]:
        acc, error = name(node.acc), name(node.error)
        index, loops = "", ""
        for var, size in (("r_", node.rows), ("l_", node.lanes)):
            if size is not None:
                loops += f"for (int64_t {var} = 0; {var} < {int(size)}; ++{var}) "
                index += f"[{var}]"
        return ["  " * depth + f"{loops}{acc}{index} = ef_total({acc}{index}, {error}{index});"]

    def stmt_Branch(self, node: ir.Branch, depth: int) -> List[str]:
        # short reductions are the rule (dist's 784 terms): expecting them keeps the
        # long branch's code out of the way of the hot loops' registers
        pad = "  " * depth
        total = " * ".join(self.affine(e) for e in node.extents) or "1"
        return ([f"{pad}if (ef_likely({total} <= {int(node.limit)})) {{"] +
                self.block(node.small, depth + 1) + [f"{pad}}} else {{"] +
                self.block(node.large, depth + 1) + [f"{pad}}}"])

    def stmt_Let(self, node: ir.Let, depth: int) -> List[str]:
        return [f"{'  ' * depth}const T {name(node.name)} = {self.expr(node.value)};"]

    def stmt_NormalBranch(self, node: ir.NormalBranch, depth: int) -> List[str]:
        pad = "  " * depth
        test = " && ".join(f"isnormal({name(n)})" for n in node.names)
        return ([f"{pad}if (ef_likely({test})) {{"] + self.block(node.then, depth + 1) +
                [f"{pad}}} else {{"] + self.block(node.otherwise, depth + 1) + [f"{pad}}}"])

    def stmt_CombineLanes(self, node: ir.CombineLanes, depth: int) -> List[str]:
        pad = "  " * depth
        lanes, into = int(node.lanes), name(node.into)
        if node.errors is not None:
            # into is declared already; the lanes are added pairwise, a vector step per
            # level (a few roundings, where one lane after another would add 64)
            src = name(node.name)
            src_error, into_error = (name(e) for e in node.errors)
            return [f"{pad}for (int64_t l_ = {lanes} / 2; l_ > 0; l_ /= 2)",
                    f"{pad}  for (int64_t l = 0; l < l_; ++l) {{ {src}[l] += {src}[l + l_]; "
                    f"{src_error}[l] += {src_error}[l + l_]; }}",
                    f"{pad}ef_fold(&{into}, &{into_error}, {src}[0]);",
                    f"{pad}{into_error} += {src_error}[0];"]
        lines = self.stmt_DeclareAcc(ir.DeclareAcc(node.into, node.op), depth)
        if node.op in _POSITION_OPS:
            # lanes in order; a better value wins, an equal one (or a second NaN) only
            # from an earlier position
            src = name(node.name)
            value, where = f"{src}[l_]", f"{src}_p[l_]"
            better = self.beats(node.op, value, into)
            same = f"(({value} == {into}) | (({value} != {value}) & ({into} != {into})))" \
                if self.is_float else f"({value} == {into})"
            return lines + [f"{pad}for (int64_t l_ = 0; l_ < {lanes}; ++l_) {{ "
                            f"const int b_ = {better} | ({same} & ({where} < {into}_p)); "
                            f"{into} = b_ ? {value} : {into}; "
                            f"{into}_p = b_ ? {where} : {into}_p; }}"]
        if node.op == ReduceOp.LOGSUMEXP:
            src = name(node.name)
            lines.append(f"{pad}for (int64_t l_ = 0; l_ < {lanes}; ++l_) "
                         f"ef_lse_merge(&{into}_m, &{into}_s, {src}_m[l_], {src}_s[l_]);")
            return lines
        partial = f"{name(node.name)}[l_]"
        step = {ReduceOp.SUM: f"{into} += {partial};", ReduceOp.PROD: f"{into} *= {partial};",
                ReduceOp.MAX: f"{into} = ef_max({into}, {partial});",
                ReduceOp.MIN: f"{into} = ef_min({into}, {partial});"}[node.op]
        lines.append(f"{pad}for (int64_t l_ = 0; l_ < {lanes}; ++l_) {step}")
        return lines

    def stmt_Accumulate(self, node: ir.Accumulate, depth: int) -> List[str]:
        pad = "  " * depth
        value = self.expr(node.value)
        if node.op in _POSITION_OPS:
            # the first extremum wins; a NaN is the extremum (the first NaN, as NumPy)
            acc = self.acc_ref(node.name, node.lane, row=node.row)
            where = self.acc_ref(node.name, node.lane, "_p", node.row)
            position = "0"
            for counter, extent in node.position:
                position = f"({position}) * ({self.affine(extent)}) + {self.affine(counter)}"
            # branch-free selects: vectorisable, and no mispredicted jumps
            return [f"{pad}{{ const T v_ = {value}; const int b_ = "
                    f"{self.beats(node.op, 'v_', acc)}; {acc} = b_ ? v_ : {acc}; "
                    f"{where} = b_ ? {position} : {where}; }}"]
        if node.op == ReduceOp.LOGSUMEXP:
            m, s = (self.acc_ref(node.name, node.lane, x, node.row) for x in ("_m", "_s"))
            return [f"{pad}ef_lse(&{m}, &{s}, {value});"]
        ref = self.acc_ref(node.name, node.lane, row=node.row)
        if node.op == ReduceOp.SUM:
            return [f"{pad}{ref} += {value};" if self.is_float else
                    f"{pad}{ref} = (T)({ref} + {value});"]
        if node.op == ReduceOp.PROD:
            return [f"{pad}{ref} *= {value};" if self.is_float else
                    f"{pad}{ref} = (T)({ref} * {value});"]
        return [f"{pad}{ref} = ef_{node.op}({ref}, {value});"]

    def stmt_Loop(self, node: ir.Loop, depth: int) -> List[str]:
        pad = "  " * depth
        lines = []
        entered = False
        sliced = any(buf.per_slice for buf in self.thread_rows)
        if node.kind == LoopKind.PARALLEL and not self.in_parallel:
            collapse, inner = 1, node
            # a TiledLoop starts with an 'if' (full tile or not): not perfectly nested
            while len(inner.body) == 1 and isinstance(inner.body[0], ir.Loop) \
                    and inner.body[0].kind == LoopKind.PARALLEL \
                    and not getattr(inner.body[0], "simd", False) and not sliced:
                inner = inner.body[0]
                collapse += 1
            simd = " simd" if collapse == 1 and node.simd else ""
            # rows kept per slice: each slice of SLICE_ROWS iterations runs on one thread
            schedule = f"static, {name(ir.SLICE_ROWS)}" if sliced else "static"
            lines.append(f"{pad}#pragma omp parallel for{simd} collapse({collapse}) "
                         f"schedule({schedule}) num_threads(nth)")
            self.in_parallel = entered = True
        var = name(node.var)
        bound = self.affine(node.extent)
        hidden = False
        if not entered and node.simd:
            hidden = self.calls_vector_math(node)
            if hidden:
                # A SIMD loop that calls libmvec with a bound GCC can see (a full
                # register tile's 16 lanes) is unrolled whole and then vectorised as
                # straight-line code, where GCC 12 has no SIMD clones: half its lanes
                # called the scalar expf (the tiled exp(-sum[k](a-b)**2) epilogue ran at
                # a third of the speed of an elementwise exp loop).  The bound read
                # through an empty asm is a runtime value: the loop is vectorised as a
                # loop, with libmvec.
                lines += [f"{pad}{{", f"{pad}int64_t {var}_n = {bound};",
                          f'{pad}__asm__("" : "+r"({var}_n));']
                bound = f"{var}_n"
            clause = "".join(f" reduction({'+' if op == 'sum' else '*'}:{name(acc)})"
                             for acc, op in node.reductions)
            lines.append(f"{pad}#pragma omp simd{clause}")
        first = "0" if node.start is None else self.affine(node.start)
        lines.append(f"{pad}for (int64_t {var} = {first}; {var} < {bound}; "
                     f"++{var}) {{")
        if entered:
            lines += self.thread_row_pointers(depth + 1, var if first == "0" else
                                              f"({var} - ({first}))")
        lines += self.block(node.body, depth + 1)
        lines.append(pad + "}")
        if hidden:
            lines.append(pad + "}")
        if entered:
            self.in_parallel = False
        return lines

    def calls_vector_math(self, node: ir.Loop) -> bool:
        """Whether ``node``'s body calls a function libmvec has a SIMD version of (directly
        or through ef_sigmoid / ef_softplus, which call expf)."""
        return self.is_float and self.vector_math and any(
            isinstance(n, ir.Call) and n.func in _VECTOR_MATH_CALLS for n in ir.walk(node))

    def thread_row_pointers(self, depth: int, iteration: str) -> List[str]:
        """Inside the parallel loop: each per-thread buffer's row for this thread (a
        per-slice buffer's for the slice holding ``iteration``, counted from 0)."""
        return ["  " * depth + f"{C_TYPES.get(buf.dtype, 'T')} *restrict {name(buf.name)} = "
                f"{name(buf.name)}_rows + " +
                (f"({iteration} / {name(ir.SLICE_ROWS)})" if buf.per_slice
                 else "(int64_t)omp_get_thread_num()") +
                f" * {name(buf.per_thread)};" for buf in self.thread_rows]

    def stmt_TiledLoop(self, node: ir.TiledLoop, depth: int) -> List[str]:
        pad = "  " * depth
        lines = []
        entered = False
        if node.kind == LoopKind.PARALLEL and not self.in_parallel:
            lines.append(f"{pad}#pragma omp parallel for schedule(static) num_threads(nth)")
            self.in_parallel = entered = True
        var, count, tile = name(node.var), name(node.count), int(node.tile)
        extent = self.affine(node.extent)
        first = "0" if node.start is None else self.affine(node.start)
        lines.append(f"{pad}for (int64_t {var} = {first}; {var} < {extent}; {var} += {tile}) {{")
        if node.constant_full and not self.single_copy and _register_block(node):
            lines += self.register_block(node, depth)
            lines.append(pad + "}")
            if entered:
                self.in_parallel = False
            return lines
        if not node.constant_full or self.single_copy:
            lines.append(f"{pad}  const int64_t {count} = {extent} - {var} < {tile} ? "
                         f"{extent} - {var} : {tile};")
            lines += self.block(node.body, depth + 1)
            lines.append(pad + "}")
            if entered:
                self.in_parallel = False
            return lines
        # full tiles see a constant lane count, so the accumulators stay in registers;
        # the body is then written twice, but only where no tiled loop inside it was:
        # doubling at every level of nested reductions made the source (and the
        # compiler's time and memory) exponential in their depth
        self.tiles_doubled = False
        body = self.block(node.body, depth + 2)
        if self.tiles_doubled:
            lines.append(f"{pad}  {{")
            lines.append(f"{pad}    const int64_t {count} = {extent} - {var} < {tile} ? "
                         f"{extent} - {var} : {tile};")
            lines += body
        else:
            lines.append(f"{pad}  if ({extent} - {var} >= {tile}) {{")
            lines.append(f"{pad}    const int64_t {count} = {tile};")
            lines += body
            lines.append(f"{pad}  }} else {{")
            lines.append(f"{pad}    const int64_t {count} = {extent} - {var};")
            lines += body
        self.tiles_doubled = True
        lines.append(f"{pad}  }}")
        lines.append(pad + "}")
        if entered:
            self.in_parallel = False
        return lines

    def register_block(self, node: ir.TiledLoop, depth: int) -> List[str]:
        """The rows of a register block (plan/blocking.py): a full block sees a constant
        row count, so GCC unrolls its rows and keeps every accumulator in a register
        (with the count a runtime value they lived on the stack: AVX2 dist ran at half
        speed); its lane loop inside is doubled as usual.  A partial block (the last
        rows) is written once with runtime counts: three copies of the body, not four."""
        pad = "  " * depth
        var, count, tile = name(node.var), name(node.count), int(node.tile)
        extent = self.affine(node.extent)
        lines = [f"{pad}  if ({extent} - {var} >= {tile}) {{",
                 f"{pad}    const int64_t {count} = {tile};"]
        lines += self.block(node.body, depth + 2)
        lines += [f"{pad}  }} else {{",
                  f"{pad}    const int64_t {count} = {extent} - {var};"]
        self.single_copy = True
        try:
            lines += self.block(node.body, depth + 2)
        finally:
            self.single_copy = False
        self.tiles_doubled = True
        return lines + [f"{pad}  }}"]

    def stmt_Store(self, node: ir.Store, depth: int) -> List[str]:
        address = self.address([self.affine(p) for p in node.position], node.strides)
        buf = name(self.program_buffer(node.buffer))
        return ["  " * depth + f"{buf}[{address}] = {self.expr(node.value)};"]

    def program_buffer(self, slot: int) -> str:
        return f"t{int(slot)}"

    # -- integer forms -------------------------------------------------------------------
    def affine(self, a: ir.Affine) -> str:
        parts = []
        for var, coeff in a.terms:
            parts.append(name(var) if coeff == 1 else f"({int(coeff)})*{name(var)}")
        if a.const or not parts:
            parts.append(f"({int(a.const)})")
        return "(" + " + ".join(parts) + ")"

    def quasi(self, part: ir.Quasi) -> str:
        helper = {QuasiOp.FLOOR_DIV: "ef_qdiv", QuasiOp.MOD: "ef_qmod"}[part.op]
        return f"{helper}({self.affine(part.affine)}, {int(part.divisor)}LL)"

    @staticmethod
    def address(indices: List[str], strides) -> str:
        if not indices:
            return "0"
        return " + ".join(i if s is None else f"{i}*{name(s)}"
                          for i, s in zip(indices, strides))

    # -- expressions ---------------------------------------------------------------------
    def expr(self, node: ir.Expr) -> str:
        return getattr(self, "expr_" + type(node).__name__)(node)

    def expr_Const(self, node: ir.Const) -> str:
        value = node.value
        if isinstance(value, bool) or isinstance(value, int):
            if not -2**63 < int(value) < 2**63:
                raise ValueError(f"integer literal {value} does not fit in int64")
            return f"((T){int(value)}LL)"
        value = float(value)
        if math.isnan(value):
            return "((T)NAN)"
        if math.isinf(value):
            return "((T)INFINITY)" if value > 0 else "(-(T)INFINITY)"
        return f"((T){value.hex()})"

    def expr_Param(self, node: ir.Param) -> str:
        return f"q{int(node.slot)}"

    def expr_IndexValue(self, node: ir.IndexValue) -> str:
        return f"((T){self.affine(node.value)})"

    def expr_Load(self, node: ir.Load) -> str:
        # Two masks, as the reference: pad= for affine reads outside the array, and the
        # gather policy (fill=, or clip/wrap on an empty axis) -- fill wins over pad.
        padded, gathered, indices = [], [], []
        for sub in node.subscripts:
            n = name(sub.size)
            if sub.gathers and sub.policy != Policy.NONE:
                pos = self.gathered_position(sub)
            else:
                pos = self.affine(sub.affine)
                for part, coeff in sub.quasi:
                    pos = f"({pos} + ({int(coeff)})*{self.quasi(part)})"
                for gather, coeff in sub.gathers:   # in range: exact modulo 2**64
                    pos = f"({pos} + ({int(coeff)})*(int64_t){self.expr(gather)})"
            if sub.policy == Policy.NONE:
                indices.append(pos)
            elif sub.policy == Policy.PAD:
                padded.append(f"ef_in({pos}, {n})")
                indices.append(pos)
            elif sub.policy == Policy.FILL:
                gathered.append(f"ef_in({pos}, {n})")
                indices.append(pos)
            elif sub.policy == Policy.CHECK:
                gathered.append(f"ef_ok({pos}, {n}, err)")
                indices.append(pos)
            elif sub.policy == Policy.WRAP:   # already wrapped, unless the axis is empty
                gathered.append(f"({n} > 0)")
                indices.append(pos)
            else:  # clip: every value is moved in range, unless the axis is empty
                gathered.append(f"({n} > 0)")
                indices.append(f"ef_clip({pos}, {n})")
        value = f"{self.program_buffer(node.buffer)}" \
                f"[{self.address(indices, [s.stride for s in node.subscripts])}]"
        ctype = "T"
        if node.is_index:
            ctype = "uint64_t" if self.unsigned(node) else "int64_t"
        # '&' not '&&': every axis is checked, as the reference does
        if padded:
            value = f"(({' & '.join(padded)}) ? {value} : ({ctype})padv)"
        if gathered:
            check = any(s.policy == Policy.CHECK for s in node.subscripts)
            other = "0" if check else ("(int64_t)fillv" if node.is_index else "fillv")
            value = f"(({' & '.join(gathered)}) ? {value} : ({ctype}){other})"
        return value

    def unsigned(self, load: ir.Load) -> bool:
        return self.buffers[load.buffer].dtype == BufferType.UINT64

    def gathered_position(self, sub: ir.Subscript) -> str:
        """A gathered subscript on its exact value (_GATHER_HELPERS): saturated to -1 or
        the axis length, or, under wrap, already wrapped."""
        a, n = self.affine(sub.affine), name(sub.size)
        helper = gather_helper(sub, self.unsigned(sub.gathers[0][0]))
        if one_gather(sub):
            return f"ef_{helper}({self.expr(sub.gathers[0][0])}, {a}, {n})"
        wrapped, estimate = a, f"(double){a}"
        for load, coeff in sub.gathers:
            g = self.expr(load)
            as_double = f"(double)(uint64_t){g}" if self.unsigned(load) else f"(double){g}"
            wrapped = f"{wrapped} + ({int(coeff)})*(int64_t){g}"
            estimate = f"{estimate} + {float(coeff).hex()}*{as_double}"
        return f"ef_{helper}(({wrapped}), ({estimate}), {n})"

    def expr_Unary(self, node: ir.Unary) -> str:
        inner = self.expr(node.operand)
        return f"(-{inner})" if self.is_float else f"((T)(-{inner}))"

    def expr_Binary(self, node: ir.Binary) -> str:
        op = node.op
        if op == BinaryOp.POW:
            return self.power(node.left, node.right)
        left, right = self.expr(node.left), self.expr(node.right)
        if op in (BinaryOp.AND, BinaryOp.OR):
            return f"((T)((({left}) != 0) {op} (({right}) != 0)))"
        if op in ("<", "<=", ">", ">=", "==", "!="):
            return f"((T)({left} {op} {right}))"
        if op in _HELPER_OPS:
            return f"{_HELPER_OPS[op]}({left}, {right})"
        if op not in ("+", "-", "*", "/"):
            raise ValueError(f"unknown operator {op!r}")
        return f"({left} {op} {right})" if self.is_float else f"((T)({left} {op} {right}))"

    def power(self, base: ir.Expr, exponent: ir.Expr) -> str:
        if isinstance(exponent, ir.Const) and exponent.value == 2:
            return f"ef_sq({self.expr(base)})"
        if isinstance(exponent, ir.Const) and exponent.value == 0.5 and self.is_float:
            return f"ef_pow_half({self.expr(base)})"
        return f"ef_pow({self.expr(base)}, {self.expr(exponent)})"

    def expr_Call(self, node: ir.Call) -> str:
        args = [self.expr(a) for a in node.args]
        func = node.func
        if func == Function.POW:
            return self.power(*node.args)
        if func in (Function.MIN, Function.MAX, Function.WHERE, Function.ABS, Function.SIGMOID,
                    Function.SOFTPLUS, Function.SIGN):
            return f"ef_{func}({', '.join(args)})"
        if func == Function.ATAN2 and self.is_float:
            return f"atan2{self.f}({args[0]}, {args[1]})"
        if func == Function.RELU:
            return f"ef_max({args[0]}, (T)0)"
        if func in _UNARY_MATH:
            if not self.is_float:  # cannot happen: these make the working dtype float
                return f"((T){func}((double){args[0]}))"
            return f"{func}{self.f}({args[0]})"
        raise ValueError(f"unknown function {func!r}")

    def beats(self, op: str, new: str, old: str) -> str:
        """C test: ``new`` replaces ``old`` as the first extremum seen so far."""
        sign = ">" if op == ReduceOp.ARGMAX else "<"
        if not self.is_float:
            return f"({new} {sign} {old})"
        return f"((({new} {sign} {old}) | ({new} != {new})) & ({old} == {old}))"

    def expr_Local(self, node: ir.Local) -> str:
        return name(node.name)

    def expr_AccValue(self, node: ir.AccValue) -> str:
        if node.op in _POSITION_OPS:
            return self.acc_ref(node.acc, node.lane, "_p", node.row)
        if node.op == ReduceOp.LOGSUMEXP:
            m = self.acc_ref(node.acc, node.lane, "_m", node.row)
            s = self.acc_ref(node.acc, node.lane, "_s", node.row)
            return f"({m} + log{self.f}({s}))"
        return self.acc_ref(node.acc, node.lane, row=node.row)


def render_c(program: ir.LoopProgram, vector_math: bool = False) -> str:
    """C source for ``program``; ``vector_math`` lets SIMD loops call libmvec."""
    return CRenderer(program, vector_math).render()


def _register_block(node: ir.TiledLoop) -> bool:
    """Whether ``node`` is the row loop of a register block: its body one lane tile; or
    the lane tile of a reduced index's row blocks (plan/epilogue_blocks.py), whose full
    tiles must see a constant lane count as well as their full blocks a constant row
    count."""
    return len(node.body) == 1 and isinstance(node.body[0], ir.TiledLoop) and \
        node.body[0].constant_full or any(_reduced_rows(s) for s in node.body)


def _reduced_rows(node) -> bool:
    """Whether ``node`` is (or a branch of it holds) a reduction's row blocks."""
    if isinstance(node, ir.Branch):
        return any(_reduced_rows(s) for s in node.small + node.large)
    if isinstance(node, ir.TiledLoop) and not node.constant_full:
        return any(_reduced_rows(s) for s in node.body)
    return isinstance(node, ir.TiledLoop) and node.kind == LoopKind.REDUCTION and \
        node.constant_full and any(isinstance(s, ir.DeclareAcc) and s.rows
                                   for s in node.body)
