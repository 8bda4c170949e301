"""Render the loop-nest IR as a Triton kernel: a sibling of the C renderer, one method
per IR node type, from the same (plain-style) plans.

The parallel output loops become the program grid: each program owns BLOCK consecutive
output elements (flattened), so every value expression is a BLOCK-wide tensor;
reduction loops stay loops, with their accumulators held in registers as BLOCK-wide
tensors; loads are masked (the block's tail, ``pad=``, ``fill=``).  Only generated names
and numeric literals reach the source, as in C.  The functions kernels call beyond
triton.language are in backends/triton/helpers.py.  Long sums run in chunks, each
folded into a compensated total (plan/sums.py explains why; the chunking is done here,
on plain plans, where the C planner builds it into the IR)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

from ... import ir
from ...ir import BinaryOp, BufferType, Function, LoopKind, Policy, QuasiOp, ReduceOp
from ...plan.gathers import gather_helper, one_gather
from ..identifiers import name
from .elementwise import (ELEMENTWISE_HELPERS, TARGET_HELPERS, FUNCTIONS as _HELPER_CALLS,
                          OPERATORS as _HELPER_OPS)
from .helpers import HELPERS as _HELPERS, ChunkedSums


@dataclass(frozen=True)
class Launch:
    """How to launch a rendered kernel: the grid's shape from runtime int names."""
    tiles: bool                         # 2-D output tiles, or a flat block of outputs
    outer: Tuple[ir.Affine, ...]        # extents flattened into one grid axis
    rows: Optional[ir.Affine] = None    # tiles: the row index's extent
    lanes: Optional[ir.Affine] = None   # tiles: the lane index's extent
    row_tile: int = 1
    lane_tile: int = 1
    reduce_block: bool = False          # flat: reductions run RB positions at a time
    dot: bool = False                   # tiles: a reduction runs as tl.dot (tensor cores)


# tl.dot takes these storage dtypes as they are (tensor cores, float32 accumulation)
_NATIVE_DOT = ("float16", "bfloat16")


class TritonRenderer(ChunkedSums):
    """``buffer_dtypes``: each buffer's storage dtype name (a float16/bfloat16 input is
    loaded as it is stored and converted in registers); ``native_dot``: compiled for a
    GPU, not interpreted: tl.dot may take 16-bit operands as loaded (the interpreter's
    bfloat16 dot is wrong), C's fmod is libdevice's (the interpreter has none) and a
    float32 division is correctly rounded (triton_elementwise.TARGET_HELPERS)."""

    def __init__(self, program: ir.LoopProgram, buffer_dtypes: Tuple[str, ...] = (),
                 native_dot: bool = True):
        if len(program.kernels) != 1:
            raise ValueError("one kernel per program is rendered")
        self.program = program
        self.kernel = program.kernels[0]
        self.buffer_dtypes = buffer_dtypes
        self.native_dot = native_dot
        self.T = {"float32": "tl.float32", "float64": "tl.float64"}[program.working]
        self.shape = "[BLOCK]"
        self.inline = set()   # row and lane loop variables: whole tensors, not loops
        self.rename = {}      # loop variable -> tensor expression, while rendering tl.dot
        self.rows_var = self.lanes_var = None
        self.rows_count = self.lanes_count = None
        # what expressions broadcast against and mask with: the output block's, or,
        # inside a vectorised reduction, the [BLOCK, RB] tile's
        self.izero, self.omask = "izero", "omask"
        self.output_vars: List[str] = []
        self.outer_accs = {}      # accumulator -> op, while inside a vectorised reduction
        self.redirect = {}        # sum accumulator -> the partial of the chunk being run
        self.tile_partial = {}    # the same for a vector loop's tiles (default: _tp)
        self.reduction_depth = 0  # reduction loops around the statement being rendered
        self.nested_accs = set()  # accumulators declared inside a reduction loop
        self.vector_loops = 0
        self.dot_loops = 0
        # a 2-D block's axes: (names along rows, names along lanes, {"rows"|"lanes":
        # (izero, mask)}): a load that varies along one axis only is loaded as one row
        # or one column, not as the whole block of repeated addresses
        self.axes = None

    # -- the kernel ------------------------------------------------------------------------
    def render(self) -> Tuple[str, Launch]:
        k = self.kernel
        outputs, body = self.output_loops(k.body)
        # outputs last, after the scalars: the order jax_triton.triton_call passes
        # scalar parameters are read from one small array (``qv``, in the working
        # dtype): a float64 parameter keeps its precision (Triton passes Python floats as
        # float32), and under jax.jit a parameter is a traced array, not a number
        args = [name(b.name) for b in k.buffers if not b.output] + \
            (["qv"] if k.n_params else []) + [name(i) for i in k.ints] + \
            ["padv", "fillv", "total"] + [name(b.name) for b in k.buffers if b.output]
        tiles = self.tile_loops(body)
        if tiles is None:
            self.output_vars = [loop.var for loop in outputs]
            lines = self.flat_prologue(args, outputs)
        else:
            lines, launch, body = self.tile_prologue(args, outputs, tiles)
        for stmt in body:
            lines += self.stmt(stmt, 1)
        if tiles is None:
            launch = Launch(False, tuple(loop.extent for loop in outputs),
                            reduce_block=self.vector_loops > 0)
            lines[1] = lines[1].replace("BLOCK: tl.constexpr", "BLOCK: tl.constexpr, "
                                        "RB: tl.constexpr") if self.vector_loops else lines[1]
        if self.dot_loops:
            launch = dataclasses.replace(launch, dot=True)
        source = "import triton\nimport triton.language as tl\n" + _HELPERS + \
            TARGET_HELPERS[self.native_dot] + ELEMENTWISE_HELPERS + "\n\n" + \
            "\n".join(lines) + "\n"
        return source, launch

    def flat_prologue(self, args, outputs) -> List[str]:
        lines = ["@triton.jit",
                 f"def einfuse_kernel({', '.join(args)}, BLOCK: tl.constexpr):",
                 "    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)",
                 "    omask = o < total",
                 "    izero = o * 0",
                 "    rest = o"]
        return lines + self.int64_arguments() + self.decompose(outputs)

    def int64_arguments(self) -> List[str]:
        """Runtime ints arrive as int32 when they fit (Triton's convention); index
        arithmetic is int64 (subscript coefficients beyond int32, products of sizes and
        strides beyond 2**31), so each is widened once."""
        return [f"    {name(n)} = tl.cast({name(n)}, tl.int64)" for n in self.kernel.ints]

    def decompose(self, loops) -> List[str]:
        lines = []
        for loop in reversed(loops):
            var, extent = name(loop.var), self.affine(loop.extent)
            lines.append(f"    {var} = rest % ({extent})")
            lines.append(f"    rest = rest // ({extent})")
        return lines

    @staticmethod
    def tile_loops(body):
        """(row TiledLoop or None, lane TiledLoop) when ``body`` is a tiled output nest."""
        if len(body) != 1 or not isinstance(body[0], ir.TiledLoop):
            return None
        first = body[0]
        inner = first.body
        if len(inner) == 1 and isinstance(inner[0], ir.TiledLoop):
            return first, inner[0]
        return None, first

    def tile_prologue(self, args, outputs, tiles):
        rows_loop, lanes_loop = tiles
        self.shape = "[ROWS, LANES]"
        lines = ["@triton.jit",
                 f"def einfuse_kernel({', '.join(args)}, ROWS: tl.constexpr, "
                 "LANES: tl.constexpr, KB: tl.constexpr):",
                 "    rest = tl.program_id(2).to(tl.int64)"]
        lines += self.int64_arguments() + self.decompose(outputs)
        lines.append("    r_ = tl.arange(0, ROWS).to(tl.int64)[:, None]")
        lines.append("    l_ = tl.arange(0, LANES).to(tl.int64)[None, :]")
        mask = []
        if rows_loop is not None:
            lines += self.tile_axis(rows_loop, 0, "ROWS", "r_")
            mask.append(f"(r_ < {name(rows_loop.count)})")
        lines += self.tile_axis(lanes_loop, 1, "LANES", "l_")
        mask.append(f"(l_ < {name(lanes_loop.count)})")
        lines.append(f"    omask = {' & '.join(mask)} & (r_ < ROWS)")
        lines.append("    izero = r_ * 0 + l_ * 0")
        lines.append(f"    rmask_ = {mask[0] if rows_loop is not None else '(r_ < ROWS)'}")
        lines.append(f"    lmask_ = {mask[-1]}")
        self.axes = ({self.rows_var} if rows_loop is not None else set(), {self.lanes_var},
                     {"rows": ("r_ * 0", "rmask_"), "lanes": ("l_ * 0", "lmask_")})
        launch = Launch(True, tuple(loop.extent for loop in outputs),
                        rows_loop.extent if rows_loop is not None else None,
                        lanes_loop.extent,
                        rows_loop.tile if rows_loop is not None else 1, lanes_loop.tile)
        return lines, launch, lanes_loop.body

    def tile_axis(self, loop: ir.TiledLoop, axis: int, size: str, offsets: str) -> List[str]:
        """Block start, count and the lane/row variable of one tiled output loop; the
        variable is the loop inside the tile's body over ``count``."""
        var, count = name(loop.var), name(loop.count)
        self.inline.add(self.lane_var(loop))
        if axis == 0:
            self.rows_var, self.rows_count = self.lane_var(loop), count
        else:
            self.lanes_var, self.lanes_count = self.lane_var(loop), count
        return [f"    {var} = tl.program_id({axis}).to(tl.int64) * {size}",
                f"    {count} = tl.minimum({size}, {self.affine(loop.extent)} - {var})",
                f"    {self.lane_var(loop)} = {offsets}"]

    @staticmethod
    def lane_var(loop: ir.TiledLoop) -> str:
        """The variable of the loop over ``count`` inside a tiled loop (its lanes/rows)."""
        for node in ir.walk(loop):
            if isinstance(node, ir.Loop) and node.extent == ir.Affine.var(loop.count):
                return name(node.var)
        return "unused_"

    @staticmethod
    def output_loops(body) -> Tuple[List[ir.Loop], Tuple[ir.Stmt, ...]]:
        loops: List[ir.Loop] = []
        while len(body) == 1 and isinstance(body[0], ir.Loop) and body[0].kind == LoopKind.PARALLEL:
            loops.append(body[0])
            body = body[0].body
        return loops, body

    # -- integers ---------------------------------------------------------------------------
    def affine(self, a: ir.Affine) -> str:
        shown = [self.rename.get(n, name(n)) for n, _ in a.terms]
        parts = [f"{int(c)} * {n}" if c != 1 else n for n, (_, c) in zip(shown, a.terms)]
        if a.const or not parts:
            parts.append(str(int(a.const)))
        return "(" + " + ".join(parts) + ")"

    # -- statements --------------------------------------------------------------------------
    def stmt(self, node: ir.Stmt, depth: int) -> List[str]:
        return getattr(self, "stmt_" + type(node).__name__)(node, depth)

    def stmt_DeclareAcc(self, node: ir.DeclareAcc, depth: int) -> List[str]:
        pad, acc = "    " * depth, name(node.name)
        if self.reduction_depth:
            self.nested_accs.add(acc)
        init = {ReduceOp.SUM: "0.0", ReduceOp.PROD: "1.0", ReduceOp.MAX: 'float("-inf")',
                ReduceOp.MIN: 'float("inf")'}
        if node.op == ReduceOp.LOGSUMEXP:
            return [f"{pad}{acc}_m = tl.full({self.shape}, float(\"-inf\"), {self.T})",
                    f"{pad}{acc}_s = tl.zeros({self.shape}, {self.T})"]
        lines = [f"{pad}{acc} = tl.full({self.shape}, {init[node.op]}, {self.T})"]
        if node.op == ReduceOp.SUM:   # the rounding errors of the compensated chunk folds
            lines.append(f"{pad}{acc}_e = tl.zeros({self.shape}, {self.T})")
        return lines

    def stmt_Loop(self, node: ir.Loop, depth: int) -> List[str]:
        if node.var in self.inline:   # a row or lane loop: the whole tile at once
            return [line for stmt in node.body for line in self.stmt(stmt, depth)]
        dot = self.dot_operands(node)
        if dot is not None:
            return self.dot_loop(node, *dot, depth)
        if self.vectorisable(node, depth):
            return self.vector_loop(node, depth)
        return self.reduction_loop(node, depth)

    # -- reductions RB positions at a time ------------------------------------------------
    def vectorisable(self, loop: ir.Loop, depth: int) -> bool:
        """A reduction loop right under a flat kernel's output block, all of whose
        accumulations into accumulators declared outside it are sum/max/min/logsumexp:
        it runs as a [BLOCK, RB] tile per step (coalesced along the reduced index, RB
        times fewer sequential steps), reduced across RB into the accumulators."""
        if self.rows_var is not None or self.lanes_var is not None or depth != 1 or \
                loop.kind != LoopKind.REDUCTION:
            return False
        inner = {n.name for n in ir.walk(loop) if isinstance(n, ir.DeclareAcc)}
        steps = [n for n in ir.walk(loop) if isinstance(n, ir.Accumulate)
                 and n.name not in inner]
        return bool(steps) and all(n.op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.LOGSUMEXP)
                                   for n in steps)

    def vector_loop(self, loop: ir.Loop, depth: int) -> List[str]:
        """Each outer accumulator gets a [BLOCK, RB] tile of partial results, combined
        element by element in the loop and across RB once after it: no cross-lane
        reduction per step (which cost half of a Gaussian kernel sum's time on an H100),
        and each lane sums 1/RB of the terms (smaller rounding error)."""
        pad, var, extent = "    " * depth, name(loop.var), self.affine(loop.extent)
        inner = {n.name for n in ir.walk(loop) if isinstance(n, ir.DeclareAcc)}
        outer = {}
        for node in ir.walk(loop):
            if isinstance(node, ir.Accumulate) and node.name not in inner:
                outer.setdefault(node.name, node.op)
        lines = [line for acc, op in outer.items()
                 for line in self.tile_partials(name(acc), op, pad)]
        # sums run in chunks (their tiles' partials folded after each); the rest as one
        sums = [name(acc) for acc, op in outer.items() if op == ReduceOp.SUM]
        head, first, last = self.chunks(var, extent, "RB", pad, [f"{acc}_tp" for acc in sums],
                                        "[BLOCK, RB]")
        if not sums:
            head, first, last = [], "0", extent
        at = pad + "    " * bool(sums)
        depth += bool(sums)
        lines += head + [
            f"{at}for {var}_b in range({first}, {last}, RB):",
            f"{at}    {var}_v = {var}_b + tl.arange(0, RB).to(tl.int64)[None, :]",
            f"{at}    {var}_ok = {var}_v < {extent}",
            f"{at}    izero2 = izero[:, None] + {var}_v * 0",
            f"{at}    omask2 = omask[:, None] & {var}_ok"]
        saved = (self.shape, self.izero, self.omask, dict(self.rename), self.axes)
        self.shape, self.izero, self.omask = "[BLOCK, RB]", "izero2", "omask2"
        self.axes = (set(self.output_vars), {loop.var},
                     {"rows": ("izero[:, None]", "omask[:, None]"),
                      "lanes": (f"{var}_v * 0", f"{var}_ok")})
        self.rename.update({v: f"{name(v)}[:, None]" for v in self.output_vars})
        self.rename[loop.var] = f"{var}_v"
        self.outer_accs = {acc: f"{var}_ok" for acc in outer}
        self.reduction_depth += 1
        for stmt in loop.body:
            lines += self.stmt(stmt, depth + 1)
        self.reduction_depth -= 1
        self.shape, self.izero, self.omask, self.rename, self.axes = saved
        self.outer_accs = {}
        self.vector_loops += 1
        lines += [f"{pad}    {acc}_t, {acc}_te = ef_fold({acc}_t, {acc}_te, {acc}_tp)"
                  for acc in sums]
        for acc, op in outer.items():
            lines += self.combine_partials(name(acc), op, pad)
        return lines

    def tile_partials(self, acc: str, op: str, pad: str) -> List[str]:
        """The [BLOCK, RB] tile of partial results of ``acc``, at the identity of op."""
        if op == ReduceOp.LOGSUMEXP:
            return [f"{pad}{acc}_tm = tl.full([BLOCK, RB], float(\"-inf\"), {self.T})",
                    f"{pad}{acc}_ts = tl.zeros([BLOCK, RB], {self.T})"]
        init = {ReduceOp.SUM: "0.0", ReduceOp.MAX: 'float("-inf")',
                ReduceOp.MIN: 'float("inf")'}[op]
        errors = [f"{pad}{acc}_te = tl.zeros([BLOCK, RB], {self.T})"] if op == ReduceOp.SUM else []
        return [f"{pad}{acc}_t = tl.full([BLOCK, RB], {init}, {self.T})"] + errors

    def reduce_into(self, node: ir.Accumulate, pad: str) -> List[str]:
        """``node`` combines a [BLOCK, RB] tile of values into its accumulator's tile of
        partials: positions past the reduced index's end are masked to the operation's
        identity."""
        acc, ok = name(node.name), self.outer_accs[node.name]
        v = self.widen(self.expr(node.value))
        if node.op == ReduceOp.SUM:   # into the chunk's partials (vector_loop, stmt_Loop)
            return [f"{pad}{acc}{self.tile_partial.get(acc, '_tp')} += tl.where({ok}, {v}, 0.0)"]
        if node.op in (ReduceOp.MAX, ReduceOp.MIN):
            fill = 'float("-inf")' if node.op == ReduceOp.MAX else 'float("inf")'
            # ef_max/ef_min keep a NaN, as the scalar loop does
            return [f"{pad}{acc}_t = ef_{node.op}(tl.where({ok}, {v}, {fill}), {acc}_t)"]
        # logsumexp: each partial is a running (maximum, scaled sum), as in the scalar loop
        m, t = f"{acc}_tm", f"{acc}_ts"
        return [f"{pad}v_ = tl.where({ok}, {v}, float(\"-inf\"))",
                f"{pad}e_ = tl.where(v_ == {m}, tl.where({m} == float(\"-inf\"), 0.0, 1.0),"
                f" tl.exp(-tl.abs(v_ - {m})))",
                f"{pad}{t} = tl.where(v_ > {m}, {t} * e_ + 1.0, {t} + e_)",
                f"{pad}{m} = tl.where(v_ > {m}, v_, {m})"]

    def combine_partials(self, acc: str, op: str, pad: str) -> List[str]:
        """Fold the tile of partials across RB into the [BLOCK] accumulator."""
        if op == ReduceOp.SUM:
            return [f"{pad}{acc}, {acc}_e = ef_fold({acc}, {acc}_e, tl.sum({acc}_t, axis=1))",
                    f"{pad}{acc}_e += tl.sum({acc}_te, axis=1)"]
        if op in (ReduceOp.MAX, ReduceOp.MIN):
            t = f"{acc}_t"   # a NaN partial makes the row's result NaN
            return [f"{pad}{acc} = ef_{op}(tl.where(tl.sum(({t} != {t}).to(tl.int32), axis=1)"
                    f" > 0, float(\"nan\"), tl.{op}({t}, axis=1)), {acc})"]
        m, t = f"{acc}_tm", f"{acc}_ts"
        return [f"{pad}nm_ = tl.maximum({acc}_m, tl.max({m}, axis=1))",
                f"{pad}sm_ = tl.where(nm_ == float(\"-inf\"), 0.0, nm_)",
                f"{pad}{acc}_s = {acc}_s * tl.where({acc}_m == nm_, 1.0, tl.exp({acc}_m - sm_))"
                f" + tl.sum({t} * tl.where({m} == nm_[:, None], 1.0, "
                f"tl.exp({m} - sm_[:, None])), axis=1)",
                f"{pad}{acc}_m = nm_"]

    # -- contractions as tl.dot -------------------------------------------------------------
    def dot_operands(self, loop: ir.Loop):
        """(accumulator, row-side load, lane-side load) when ``loop`` is a reduction whose
        whole body, per tile element, is ``acc += A[row.., k] * B[k.., lane]`` in float32
        with in-range reads: then the loop is a matrix product of tiles."""
        if self.rows_var is None or self.T != "tl.float32" or loop.kind != LoopKind.REDUCTION:
            return None
        body = loop.body
        while len(body) == 1 and isinstance(body[0], ir.Loop) and body[0].var in self.inline:
            body = body[0].body
        if len(body) != 1 or not isinstance(body[0], ir.Accumulate):
            return None
        step = body[0]
        if step.op != ReduceOp.SUM or not isinstance(step.value, ir.Binary) or \
                step.value.op != BinaryOp.MUL:
            return None
        pair = (step.value.left, step.value.right)
        if not all(isinstance(p, ir.Load) and not p.is_index and all(
                s.policy == Policy.NONE and not s.gathers and not s.quasi for s in p.subscripts)
                for p in pair):
            return None

        def uses(load, var):
            return any(var in sub.names for sub in load.subscripts)
        for a, b in (pair, pair[::-1]):
            if uses(a, self.rows_var) and not uses(a, self.lanes_var) and \
                    uses(b, self.lanes_var) and not uses(b, self.rows_var) and \
                    uses(a, loop.var) and uses(b, loop.var):
                return step.name, a, b
        return None

    def dot_loop(self, loop: ir.Loop, acc: str, a: ir.Load, b: ir.Load,
                 depth: int) -> List[str]:
        pad, var, extent = "    " * depth, name(loop.var), self.affine(loop.extent)
        self.dot_loops += 1
        acc = name(acc)
        lines, first, last = self.chunks(var, extent, "KB", pad, [f"{acc}_p"])
        pad += "    "
        lines += [f"{pad}for {var}_b in range({first}, {last}, KB):",
                  f"{pad}    kk_ = {var}_b + tl.arange(0, KB).to(tl.int64)"]
        native = self.native_dot and self.storage(a.buffer) in _NATIVE_DOT and \
            self.storage(a.buffer) == self.storage(b.buffer)
        convert = "" if native else ".to(tl.float32)"
        precision = "" if native else ', input_precision="ieee"'
        row_ok = f"({self.rows_var} < {self.rows_count})"
        lane_ok = f"({self.lanes_var} < {self.lanes_count})"
        for load, target, k_shape, mask in (
                (a, "da_", "kk_[None, :]", f"{row_ok} & (kk_[None, :] < {extent})"),
                (b, "db_", "kk_[:, None]", f"(kk_[:, None] < {extent}) & {lane_ok}")):
            self.rename = {loop.var: k_shape}
            address = self.address([self.affine(s.affine) for s in load.subscripts],
                                   [s.stride for s in load.subscripts])
            self.rename = {}
            lines.append(f"{pad}    {target} = tl.load(t{int(load.buffer)} + {address}, "
                         f"mask={mask}, other=0.0){convert}")
        lines.append(f"{pad}    {acc}_p += tl.dot(da_, db_{precision})")
        return lines + [f"{pad}{acc}, {acc}_e = ef_fold({acc}, {acc}_e, {acc}_p)"]

    def storage(self, buffer: int) -> str:
        return self.buffer_dtypes[buffer] if buffer < len(self.buffer_dtypes) else "?"

    def stmt_Accumulate(self, node: ir.Accumulate, depth: int) -> List[str]:
        if node.name in self.outer_accs:
            return self.reduce_into(node, "    " * depth)
        pad, acc, v = "    " * depth, name(node.name), self.expr(node.value)
        if node.op == ReduceOp.SUM:
            return [f"{pad}{self.redirect.get(acc, acc)} += {v}"]
        if node.op == ReduceOp.PROD:
            return [f"{pad}{acc} *= {v}"]
        if node.op in (ReduceOp.MAX, ReduceOp.MIN):
            return [f"{pad}{acc} = ef_{node.op}({self.widen(v)}, {acc})"]
        # one-pass logsumexp, branch-free (the C renderer's ef_lse)
        return [f"{pad}v_ = {self.widen(v)}",
                f"{pad}e_ = tl.where(v_ == {acc}_m, tl.where({acc}_m == float(\"-inf\"), 0.0,"
                f" 1.0), tl.exp(-tl.abs(v_ - {acc}_m)))",
                f"{pad}{acc}_s = tl.where(v_ > {acc}_m, {acc}_s * e_ + 1.0, {acc}_s + e_)",
                f"{pad}{acc}_m = tl.where(v_ > {acc}_m, v_, {acc}_m)"]

    def stmt_Store(self, node: ir.Store, depth: int) -> List[str]:
        address = self.address([self.affine(p) for p in node.position], node.strides)
        value = self.expr(node.value)
        target = f"t{int(node.buffer)}"   # stored in the output's own dtype
        return ["    " * depth + f"tl.store({target} + {address} + {self.izero}, "
                f"{self.widen(value)}.to({target}.dtype.element_ty),"
                f" mask={self.omask})"]

    def stmt_CombineLanes(self, node, depth):
        raise ValueError("lane partials are a C plan; Triton renders plain plans")

    stmt_TiledLoop = stmt_CombineLanes

    @staticmethod
    def address(positions, strides) -> str:
        terms = [p if s is None else f"{p} * {name(s)}" for p, s in zip(positions, strides)]
        return "(" + " + ".join(terms or ["0"]) + ")"

    # -- expressions ---------------------------------------------------------------------------
    def expr(self, node: ir.Expr) -> str:
        return getattr(self, "expr_" + type(node).__name__)(node)

    def expr_Const(self, node: ir.Const) -> str:
        """A scalar of the working dtype (``tl.full([], v, T)``), not a Python number:
        Triton takes a bare float as float32 where no tensor sets the type (float64's
        where(c, 0.1, 0.3) gave 0.30000001), and folds constants with Python's rules
        (1.25 / 0.0 raised ZeroDivisionError).  A zero is built as +0.0, so -0.0 is the
        negation of one."""
        value = float(node.value)
        if value == 0 and math.copysign(1.0, value) < 0:
            return f"(-tl.full([], 0.0, {self.T}))"
        return f"tl.full([], {self.literal(value)}, {self.T})"

    @staticmethod
    def literal(value: float) -> str:
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)

    def expr_Param(self, node: ir.Param) -> str:
        return f"tl.load(qv + {int(node.slot)})"

    def expr_IndexValue(self, node: ir.IndexValue) -> str:
        return f"({self.affine(node.value)} + {self.izero}).to({self.T})"

    def expr_Load(self, node: ir.Load) -> str:
        positions, valid, filled = [], [], []
        izero, mask = self.load_frame(node)
        for sub in node.subscripts:
            size = name(sub.size)
            if sub.gathers and sub.policy in (Policy.CLIP, Policy.WRAP, Policy.FILL):
                pos = self.gathered_position(sub, izero)
            else:   # in range (checked before the launch): exact modulo 2**64
                pos = self.affine(sub.affine)
                for part, coeff in sub.quasi:   # a block (izero): tl.where needs one
                    helper = {QuasiOp.FLOOR_DIV: "ef_qdiv", QuasiOp.MOD: "ef_qmod"}[part.op]
                    pos = f"({pos} + {int(coeff)} * {helper}({self.affine(part.affine)} + " \
                          f"{izero}, {int(part.divisor)}))"
                for gathered, coeff in sub.gathers:
                    pos = f"({pos} + {int(coeff)} * {self.expr(gathered)})"
            if sub.policy in (Policy.PAD, Policy.FILL):   # block-shaped: it masks the load too
                ok = f"((({pos}) + {izero} >= 0) & (({pos}) + {izero} < {size}))"
                (valid if sub.policy == Policy.PAD else filled).append(ok)
                pos = f"tl.minimum(tl.maximum({pos}, 0), {size} - 1)"
            elif sub.policy == Policy.CLIP:
                filled.append(f"(({size} + {izero}) > 0)")
                pos = f"tl.minimum(tl.maximum({pos}, 0), {size} - 1)"
            elif sub.policy == Policy.WRAP:   # already wrapped
                filled.append(f"(({size} + {izero}) > 0)")
            positions.append(pos)
        address = self.address(positions, [s.stride for s in node.subscripts])
        if valid or filled:   # never read where the value is replaced (an empty axis)
            mask = f"{mask} & {' & '.join(valid + filled)}"
        load = f"tl.load(t{int(node.buffer)} + {address} + {izero}, mask={mask}, other=0)"
        kind = "tl.int64" if node.is_index else self.T
        value = f"{load}.to({kind})"
        if valid:
            # jax_triton passes Python floats as float64: the value keeps the working dtype
            value = f"tl.where({' & '.join(valid)}, {value}, tl.cast(padv, {kind}))"
        if filled:   # an index array's fill= is a position: truncated, as in C
            value = f"tl.where({' & '.join(filled)}, {value}, tl.cast(fillv, {kind}))"
        return value

    def gathered_position(self, sub: ir.Subscript, izero: str) -> str:
        """A gathered subscript on its exact value (see plan/gathers.py and the ef_sat_* /
        ef_wrap_* helpers): saturated to -1 or the axis length, or, under wrap, wrapped;
        ``izero`` broadcasts scalars to the load's frame."""
        a, n = f"({self.affine(sub.affine)} + {izero})", f"({name(sub.size)} + {izero})"
        helper = gather_helper(sub, self.unsigned(sub.gathers[0][0]))
        if one_gather(sub):
            return f"ef_{helper}({self.expr(sub.gathers[0][0])} + {izero}, {a}, {n})"
        wrapped, estimate = a, f"{a}.to(tl.float64)"
        for load, coeff in sub.gathers:
            g = f"({self.expr(load)} + {izero})"
            as_float = f"ef_u2f({g})" if self.unsigned(load) else f"{g}.to(tl.float64)"
            wrapped = f"{wrapped} + {int(coeff)} * {g}"
            estimate = f"{estimate} + {float(coeff)!r} * {as_float}"
        return f"ef_{helper}({wrapped}, {estimate}, {n})"

    def unsigned(self, load: ir.Load) -> bool:
        return self.kernel.buffers[load.buffer].dtype == BufferType.UINT64

    def load_frame(self, node: ir.Load) -> Tuple[str, str]:
        """(izero, mask) shaping ``node``: a row, a column, or the whole block."""
        if self.axes is None:
            return self.izero, self.omask
        rows, lanes, frames = self.axes
        used = {n for load in ir.walk(node) if isinstance(load, ir.Load)
                for sub in load.subscripts for n in sub.names}
        along_rows, along_lanes = bool(used & rows), bool(used & lanes)
        if along_rows and not along_lanes:
            return frames["rows"]
        if along_lanes and not along_rows:
            return frames["lanes"]
        return self.izero, self.omask

    def widen(self, value: str) -> str:
        """``value`` as a tensor of the block's shape and the working dtype.  It subtracts
        +0 rather than adding 0: x + 0 turns -0 into +0 (1/(0 - d) would lose its sign),
        x - (+0) is x for every x."""
        return f"({value} - tl.zeros({self.shape}, {self.T}))"

    def expr_Unary(self, node: ir.Unary) -> str:
        return f"ef_neg({self.expr(node.operand)})"   # (triton_helpers.py says why)

    def expr_Binary(self, node: ir.Binary) -> str:
        left, right, op = self.expr(node.left), self.expr(node.right), node.op
        if op == BinaryOp.POW:
            if isinstance(node.right, ir.Const) and node.right.value in (1, 2, 3):
                # a helper evaluates the base once (its loads are not repeated)
                return f"ef_ipow{int(node.right.value)}({left})"
            return f"ef_pow({self.widen(left)}, {self.widen(right)})"
        if op in (BinaryOp.LT, BinaryOp.LE, BinaryOp.GT, BinaryOp.GE, BinaryOp.EQ, BinaryOp.NE):
            return f"(({left}) {op} ({right})).to({self.T})"
        if op in (BinaryOp.AND, BinaryOp.OR):
            return f"((({left}) != 0) {op} (({right}) != 0)).to({self.T})"
        if op in _HELPER_OPS:
            return f"{_HELPER_OPS[op]}({self.widen(left)}, {self.widen(right)})"
        if op == BinaryOp.DIV and self.native_dot and self.T == "tl.float32":
            # a float32 '/' compiles to div.full.f32 (within 2 ulp, subnormal results
            # flushed); NumPy, C and torch divide correctly rounded
            return f"ef_div({self.widen(left)}, {self.widen(right)})"
        return f"({left} {op} {right})"

    def expr_Call(self, node: ir.Call) -> str:
        args = [self.expr(a) for a in node.args]
        f = node.func
        direct = {Function.EXP: "tl.exp", Function.LOG: "tl.log", Function.SQRT: "tl.sqrt",
                  Function.ABS: "tl.abs", Function.SIN: "tl.sin", Function.COS: "tl.cos",
                  Function.FLOOR: "tl.floor", Function.CEIL: "tl.ceil", Function.ERF: "tl.erf",
                  Function.SIGMOID: "tl.sigmoid", Function.TANH: "ef_tanh",
                  Function.LOG1P: "ef_log1p", Function.EXPM1: "ef_expm1"}
        if f in direct:
            return f"{direct[f]}({self.widen(args[0])})"
        if f in _HELPER_CALLS:
            return f"{_HELPER_CALLS[f]}({', '.join(self.widen(a) for a in args)})"
        if f == Function.RELU:
            return f"ef_max({self.widen(args[0])}, 0.0)"
        if f == Function.SOFTPLUS:
            x = self.widen(args[0])
            return f"(tl.maximum({x}, 0.0) + ef_log1p(tl.exp(-tl.abs({x}))))"
        if f in (Function.MIN, Function.MAX):
            return f"ef_{f}({self.widen(args[0])}, {self.widen(args[1])})"
        if f == Function.POW:
            return f"ef_pow({self.widen(args[0])}, {self.widen(args[1])})"
        if f == Function.WHERE:
            return f"tl.where(({args[0]}) != 0, {args[1]}, {args[2]})"
        raise ValueError(f"unknown function {f!r}")

    def expr_AccValue(self, node: ir.AccValue) -> str:
        acc = name(node.acc)
        if node.op == ReduceOp.LOGSUMEXP:
            return f"({acc}_m + tl.log({acc}_s))"
        return f"ef_total({acc}, {acc}_e)" if node.op == ReduceOp.SUM else acc


def render_triton(program: ir.LoopProgram, buffer_dtypes: Tuple[str, ...] = (),
                  native_dot: bool = True):
    return TritonRenderer(program, buffer_dtypes, native_dot).render()
