"""Renders a converted JAX function (:class:`~einfuse.ir.JitProgram`, the IR the C
renderer of ``ef.jit`` prints as one C function, backends/c/loops.py) as ONE Triton
kernel: each program instance runs the whole function for one batch element, or for a
block of chains in lanes (backends/triton/jit_lanes.py: the program is then the vmap of
the function over the block).

How the IR maps onto a Triton program:

* every buffer that is not an input is a **register tensor** of its static shape, each
  axis padded to a power of two (Triton's tiles); they are all created at the top of the
  kernel, so a loop or a branch only ever rebinds a value of the same shape and type
  (what compiled Triton requires of loop-carried and branch-joined values);
* an :class:`~einfuse.ir.Assign` is one tile expression over its nest (output axes, then
  reduction axes): the nest's indices are ``tl.arange`` s along their own axes, a
  reduction is ``tl.sum``/``tl.reduce`` over its axes after the padded lanes are set to
  the operator's identity, a prefix (``ys[t, :] := ...``) is a ``tl.where`` on the
  prefix position;
* a read of an input is a ``tl.load`` at the subscripts, each clamped into its axis (so
  an arm of a select that is not taken, or a padded lane, never reads outside the
  array); a read of a register tensor is that tensor permuted and reshaped onto the
  nest's axes, and an axis read at any other position is picked out by a one-hot
  ``tl.where`` and a sum over it (exactly one term is kept);
* ``scan`` is a ``for`` loop, ``while`` a ``while`` loop whose condition is recomputed at
  the end of each step, ``cond`` an ``if`` chain; a loop's carries are rebound after the
  body from temporaries (every new value is read before any carry changes);
* outputs are stored, masked to their real extent, at the end;
* a buffer too large for registers, one read at computed positions along a long axis (a
  window or a gather), or one written a row at a time
  (``ys[t, :] := ...``, a stacked scan output or a gradient's residuals: a tl.where over
  the whole tile per step would make the loop quadratic), lives in **memory** instead:
  an output in its own output array, an intermediate in a scratch array per program
  (allocated by the caller, ``RenderedJit.scratch``); it is written by ``tl.store`` and
  read by ``tl.load``, each store between two ``tl.debug_barrier`` s so that every
  thread of the program sees it and none overwrites what another has yet to read
  (backends/triton/jit_memory.py has the rule and the store);

What it cannot render it DECLINES (:class:`Declined`, naming the construct and the
jaxpr equation it comes from): scatter-adds into memory or whose last write wins
(backends/triton/jit_reductions.py renders the others, and argmax/argmin), operations
or types without a rule here.  The caller then runs the host C kernel; nothing is
launched."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Tuple

from ...ir import (Apply, Assign, Cast, Const, Expr, Index, JitProgram, Loop, LoopKind, Read,
                   ReduceOp, ScalarType, ScatterAdd, Select, Switch, walk)
from ..identifiers import name as checked
from .elementwise import ELEMENTWISE_HELPERS
from .helpers import HELPERS
from .jit_ops import (JIT_HELPERS, TL_TYPE, Declined, ExpressionRules, division_helper, padded,
                      where_text as _where)
from .jit_lanes import chain_bound, grid, output_mask, prologue as lane_prologue
from .jit_memory import Nest, placed_in_memory, store
from .jit_reductions import arg_reduction, scatter_add

KERNEL = "ef_jit_kernel"



@dataclass(frozen=True)
class RenderedJit:
    """One kernel's source: its parameters are the input pointers (the program's inputs,
    constants included), then the output pointers; program ``pid`` reads batched inputs
    and writes outputs at ``pid`` times their element counts.  ``largest``: elements of
    its largest tile (registers per program); ``registers``: elements of all register
    tensors together."""
    source: str
    kernel: str
    largest: int
    registers: int
    # (buffer, NumPy dtype name, elements per program): the scratch arrays the caller
    # passes after the outputs, in this order
    scratch: Tuple[Tuple[str, str, int], ...] = ()
    # chains per program (backends/triton/jit_lanes.py) and the programs to launch
    lanes: int = 1
    programs: int = 1


class JitRenderer(ExpressionRules):
    def __init__(self, program: JitProgram, lanes: int = 1, lane_inputs=()):
        self.program = program
        self.inputs = set(program.inputs)
        # a block of ``lanes`` chains per program: the buffers whose leading axis is the
        # chain axis (batched inputs, outputs), read clamped to the valid lanes
        self.lanes = lanes
        self.lane_buffers = set(lane_inputs) | set(program.outputs) if lanes > 1 else set()
        self.lines: List[str] = []
        self.depth = 1
        self.counter = 0
        self.largest = 1
        for buffer in program.buffers:
            if buffer.dtype not in TL_TYPE:
                raise Declined(f"buffer {buffer.name} is {buffer.dtype.value}, a type the "
                               "Triton jit renderer does not take")
            if buffer.size == 0:
                raise Declined(f"buffer {buffer.name} is empty")
        self.memory = placed_in_memory(self)

    # -- small things -------------------------------------------------------------------------

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}{self.counter}"

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def shape_of(self, buffer: str) -> Tuple[int, ...]:
        return tuple(self.program.buffer(buffer).shape)

    def padded_shape(self, buffer: str) -> Tuple[int, ...]:
        return tuple(padded(e) for e in self.shape_of(buffer))

    def tile(self, shape) -> None:
        self.largest = max(self.largest, math.prod(shape) if shape else 1)

    @staticmethod
    def register(buffer: str) -> str:
        return checked(f"b_{buffer}")

    @staticmethod
    def pointer(buffer: str) -> str:
        return checked(f"p_{buffer}")

    # -- expressions ----------------------------------------------------------------------------
    def expr(self, node: Expr, nest: Nest) -> str:
        if isinstance(node, Const):
            return self.const(node)
        if isinstance(node, Index):
            # a nest index (a tile along its axis) or a loop counter (a scalar)
            return checked(f"n_{node.name}")
        if isinstance(node, Read):
            if node.buffer in self.inputs or node.buffer in self.memory:
                return self.load(node, nest)
            return self.register_read(node, nest)
        if isinstance(node, Cast):
            return self.cast(node, nest)
        if isinstance(node, Select):
            which = self.expr(node.which, nest)
            cases = [self.expr(c, nest) for c in node.cases]
            if node.which.dtype is ScalarType.BOOL:
                if len(cases) != 2:
                    raise Declined("a select on a bool with more than two cases")
                return f"tl.where({which}, {cases[1]}, {cases[0]})"
            chain = cases[-1]
            for k in range(len(cases) - 2, -1, -1):
                chain = f"tl.where({which} <= {k}, {cases[k]}, {chain})"
            return chain
        if isinstance(node, Apply):
            return self.apply(node, nest)
        raise Declined(f"no Triton rule for the expression {type(node).__name__}")

    def load(self, node: Read, nest: Nest) -> str:
        shape = self.shape_of(node.buffer)
        if len(shape) != len(node.subscripts):
            raise Declined(f"{node.buffer} is read with {len(node.subscripts)} subscripts")
        parts = []
        stride = 1
        for axis in range(len(shape) - 1, -1, -1):
            sub, extent = node.subscripts[axis], shape[axis]
            # the chain axis of a block that may be ragged: clamped to its valid lanes
            bound = chain_bound(self, node.buffer, axis)
            if isinstance(sub, Const):
                position = min(max(int(sub.value), 0), extent - 1)
                if position and bound is not None:
                    parts.append(f"tl.minimum({position}, {bound})" if stride == 1 else
                                 f"tl.minimum({position}, {bound}) * {stride}")
                elif position:
                    parts.append(str(position * stride))
            elif extent > 1:
                text = self.expr(sub, nest)
                clamped = f"tl.minimum(tl.maximum({text}, 0), {bound or extent - 1})"
                parts.append(clamped if stride == 1 else f"{clamped} * {stride}")
            stride *= extent
        offset = " + ".join(reversed(parts)) or "0"
        return f"tl.load({self.pointer(node.buffer)} + {offset})"

    def register_read(self, node: Read, nest: Nest) -> str:
        """The register tensor of ``node.buffer`` laid onto ``nest``'s axes: axes read at
        a nest index become that axis of the nest, extent-1 axes drop, any other axis
        is picked by a one-hot sum (a trailing axis, summed away)."""
        shape = self.shape_of(node.buffer)
        pshape = self.padded_shape(node.buffer)
        if len(shape) != len(node.subscripts):
            raise Declined(f"{node.buffer} is read with {len(node.subscripts)} subscripts")
        direct: Dict[int, int] = {}         # buffer axis -> nest position
        unit, onehot = [], []
        used = set()
        for k, sub in enumerate(node.subscripts):
            if isinstance(sub, Index) and sub.name in nest.axes and sub.name not in used \
                    and nest.axes[sub.name][2] == pshape[k] \
                    and nest.axes[sub.name][1] <= shape[k]:
                direct[k] = nest.axes[sub.name][0]
                used.add(sub.name)
            elif shape[k] == 1:
                unit.append(k)
            else:
                onehot.append(k)
        value = self.register(node.buffer)
        if not shape:
            return value
        order = sorted(direct, key=direct.get) + unit + onehot
        if order != list(range(len(shape))):
            value = f"tl.permute({value}, {tuple(order)})"
        target = tuple(nest.shape[p] if p in direct.values() else 1
                       for p in range(nest.rank)) + tuple(pshape[k] for k in onehot)
        current = tuple(pshape[k] for k in order)
        if not target:
            # a scalar from a tensor of one element: a reduction of one term is that term
            if node.dtype is ScalarType.BOOL:
                return f"(tl.max(tl.reshape({value}, (1,)).to(tl.int8), 0) != 0)"
            return f"tl.max(tl.reshape({value}, (1,)), 0)"
        if target != current:
            value = f"tl.reshape({value}, {target})"
        if not onehot:
            return value
        self.tile(tuple(nest.shape) + tuple(pshape[k] for k in onehot))
        picked = self.fresh("g")
        full = len(target)
        self.emit(f"{picked} = {value}")
        if node.dtype is ScalarType.BOOL:
            self.emit(f"{picked} = {picked}.to(tl.int8)")
        conditions = []
        for j, k in enumerate(onehot):
            where = nest.rank + j
            lane = "tl.arange(0, %d).to(tl.int64)" % pshape[k]
            lane += "[" + ", ".join(":" if a == where else "None" for a in range(full)) + "]"
            position = self.expr(node.subscripts[k], nest)
            extra = len(onehot)
            spread = position if self.is_scalar(node.subscripts[k], nest) else \
                f"{position}[{', '.join([':'] * nest.rank + ['None'] * extra)}]"
            conditions.append(f"({lane} == {spread})")
        self.emit(f"{picked} = tl.where({' & '.join(conditions)}, {picked}, 0)")
        for axis in range(full - 1, nest.rank - 1, -1):
            self.emit(f"{picked} = tl.sum({picked}, {axis})")
        if node.dtype is ScalarType.BOOL:
            return f"({picked} != 0)"
        return f"{picked}.to({TL_TYPE[node.dtype]})"

    def is_scalar(self, node: Expr, nest: Nest) -> bool:
        """Whether ``node`` does not depend on the nest's indices (renders as a scalar)."""
        if isinstance(node, Index):
            return node.name not in nest.axes
        if isinstance(node, Read) and node.buffer not in self.inputs and \
                node.buffer not in self.memory:
            shape = self.shape_of(node.buffer)
            if any(isinstance(s, Index) and s.name in nest.axes and n > 1
                   for s, n in zip(node.subscripts, shape)):
                return False
        children = node.children() if hasattr(node, "children") else ()
        return all(self.is_scalar(c, nest) for c in children)

    # -- statements -----------------------------------------------------------------------------
    def steps(self, steps) -> None:
        for step in steps:
            if isinstance(step, Assign):
                self.assign(step)
            elif isinstance(step, Loop):
                self.loop(step)
            elif isinstance(step, Switch):
                self.switch(step)
            elif isinstance(step, ScatterAdd):
                scatter_add(self, step)
            else:
                raise Declined(f"no Triton rule for the statement {type(step).__name__}")

    def open_nest(self, axes) -> Nest:
        nest = Nest(axes)
        self.tile(nest.shape)
        for name, (position, _, size) in nest.axes.items():
            spread = "" if nest.rank == 1 else \
                "[" + ", ".join(":" if a == position else "None" for a in range(nest.rank)) + "]"
            self.emit(f"{checked('n_' + name)} = tl.arange(0, {size}).to(tl.int64){spread}")
        return nest

    def assign(self, step: Assign) -> None:
        buffer = self.program.buffer(step.buffer)
        if step.buffer in self.inputs:
            raise Declined(f"a statement writes the input {step.buffer}")
        shape = self.shape_of(step.buffer)
        prefix = len(step.prefix)
        if len(shape) != prefix + len(step.indices) or \
                tuple(e for _, e in step.indices) != shape[prefix:]:
            raise Declined(f"the statement{_where(step.origin)} does not cover the trailing "
                           f"axes of {step.buffer}")
        self.emit(f"# {step.origin[:150]!s}".replace("\n", " "))
        reduced = step.reduction.indices if step.reduction is not None else ()
        nest = self.open_nest(self.nest_order(step))
        dtype = TL_TYPE[buffer.dtype]
        value = self.fresh("v")
        if step.reduction is None:
            self.emit(f"{value} = {self.expr(step.value, nest)}")
        else:
            names = {n for n, _ in reduced}
            self.reduction(step.reduction, value, nest,
                           [p for n, (p, _, _) in nest.axes.items() if n in names])
            left = [n for n in nest.axes if n not in names]
            wanted = [n for n, _ in step.indices]
            if left != wanted:       # the nest's order was the weights' (nest_order)
                self.emit(f"{value} = tl.permute({value}, "
                          f"{tuple(left.index(n) for n in wanted)})")
        out_shape = tuple(padded(e) for _, e in step.indices)
        self.emit(f"{value} = tl.broadcast_to(({value}).to({dtype}), {out_shape})"
                  if out_shape else f"{value} = ({value}).to({dtype})")
        if step.buffer in self.memory:
            store(self, step, value, out_shape)
            return
        target = self.register(step.buffer)
        if not prefix:
            self.emit(f"{target} = {value}")
            return
        pshape = self.padded_shape(step.buffer)
        conditions = []
        for k, sub in enumerate(step.prefix):
            if not self.is_scalar(sub, Nest(())):
                raise Declined(f"the statement{_where(step.origin)} writes at a position "
                               "that is not a scalar")
            lane = f"tl.arange(0, {pshape[k]}).to(tl.int64)"
            if len(pshape) > 1:
                lane += "[" + ", ".join(":" if a == k else "None"
                                        for a in range(len(pshape))) + "]"
            conditions.append(f"({lane} == {self.expr(sub, Nest(()))})")
        spread = value if not out_shape else \
            f"{value}[{', '.join(['None'] * prefix + [':'] * len(out_shape))}]"
        self.emit(f"{target} = tl.where({' & '.join(conditions)}, {spread}, {target})")

    def nest_order(self, step: Assign):
        """The axes of ``step``'s nest in the order its tiles are laid out: output axes
        then reduced ones, except in a reduction, whose largest operand read at plain
        indices (a weight matrix) sets the order of its axes, so that it is used as it
        is stored -- not permuted on every step of a loop -- and the result is permuted
        instead (a vector: nothing to move)."""
        axes = tuple(step.indices) + (tuple(step.reduction.indices)
                                      if step.reduction is not None else ())
        if step.reduction is None:
            return axes
        extents = dict(axes)
        best, best_size = None, 1
        for node in walk(step.reduction.body):
            if not isinstance(node, Read):
                continue
            names = [s.name for s in node.subscripts if isinstance(s, Index)]
            if len(names) != len(node.subscripts) or len(set(names)) != len(names) or \
                    any(n not in extents for n in names):
                continue
            size = self.program.buffer(node.buffer).size
            if size > best_size:
                best, best_size = names, size
        if best is None:
            return axes
        return tuple((n, extents[n]) for n in best) + \
            tuple((n, e) for n, e in axes if n not in best)

    def reduction(self, reduction, value: str, nest: Nest, reduced) -> None:
        """``value`` := ``reduction`` over the nest positions ``reduced`` (the others
        are left, in the nest's order)."""
        op = reduction.op
        body_type = reduction.body.dtype
        if op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN):
            arg_reduction(self, reduction, value, nest, reduced)
            return
        if op not in (ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.AND,
                      ReduceOp.OR):
            raise Declined(f"the reduction {op.value} has no Triton rendering yet")
        self.emit(f"{value} = {self.expr(reduction.body, nest)}")
        self.emit(f"{value} = tl.broadcast_to({value}, {nest.shape})")
        padding = [f"(n_{n} < {extent})" for n, (p, extent, size) in nest.axes.items()
                   if p in reduced and extent != size]
        if padding:
            self.emit(f"{value} = tl.where({' & '.join(padding)}, {value}, "
                      f"{self.identity(op, body_type)})")
        if body_type is ScalarType.BOOL:
            self.emit(f"{value} = {value}.to(tl.int8)")
        combine = {ReduceOp.PROD: "ef_mul", ReduceOp.AND: "ef_and", ReduceOp.OR: "ef_or",
                   ReduceOp.MAX: "ef_fmax" if body_type.is_float else "ef_imax",
                   ReduceOp.MIN: "ef_fmin" if body_type.is_float else "ef_imin"}.get(op)
        for axis in sorted(reduced, reverse=True):
            self.emit(f"{value} = tl.sum({value}, {axis})" if combine is None else
                      f"{value} = tl.reduce({value}, {axis}, {combine})")
        if body_type is ScalarType.BOOL:
            self.emit(f"{value} = {value} != 0")

    def scalar(self, node: Expr) -> str:
        """A scalar value (a loop condition, a branch index) outside any nest."""
        return self.expr(node, Nest(()))

    def loop(self, step: Loop) -> None:
        self.emit(f"# {step.origin[:150]!s}".replace("\n", " "))
        if step.kind is LoopKind.SCAN:
            counter = checked(f"n_{step.var}")
            self.emit(f"for {counter}_ in range(0, {int(step.length)}):")
            self.depth += 1
            self.emit(f"{counter} = {counter}_ + tl.zeros((), tl.int64)")
            self.body(step)
            self.depth -= 1
        elif step.kind is LoopKind.WHILE:
            test = self.fresh("w")
            self.steps(step.condition_steps)
            self.emit(f"{test} = {self.scalar(step.condition)}")
            self.emit(f"while {test}:")
            self.depth += 1
            self.body(step)
            self.steps(step.condition_steps)
            self.emit(f"{test} = {self.scalar(step.condition)}")
            self.depth -= 1
        else:
            raise Declined(f"a {step.kind.value} loop has no Triton rendering")

    def body(self, step: Loop) -> None:
        self.steps(step.body)
        temporaries = []
        for carry, new in step.updates:
            temporary = self.fresh("u")
            self.emit(f"{temporary} = {self.register(new)}")
            temporaries.append((carry, temporary))
        for carry, temporary in temporaries:
            self.emit(f"{self.register(carry)} = {temporary}")
        if not step.body and not step.updates:
            self.emit("pass")

    def switch(self, step: Switch) -> None:
        self.emit(f"# {step.origin[:150]!s}".replace("\n", " "))
        which = self.fresh("k")
        self.emit(f"{which} = ({self.scalar(step.which)}).to(tl.int64)")
        count = len(step.branches)
        for k, body in enumerate(step.branches):
            if count == 1:
                self.emit("if True:")
            elif k == 0:
                self.emit(f"if {which} <= 0:")
            elif k == count - 1:
                self.emit("else:")
            else:
                self.emit(f"elif {which} == {k}:")
            self.depth += 1
            before = len(self.lines)
            self.steps(body)
            if len(self.lines) == before:
                self.emit("pass")
            self.depth -= 1

    # -- the kernel -----------------------------------------------------------------------------
    def render(self, batched: Tuple[Tuple[bool, ...], ...], sizes: Tuple[int, ...]) \
            -> RenderedJit:
        """The kernel; program ``pid`` is the batch element at row-major position ``pid``
        over the batch levels ``sizes`` (outermost first) -- with lanes, the block of
        ``self.lanes`` chains of the innermost level there (backends/triton/jit_lanes.py);
        ``batched[i][k]``: whether input ``i`` has an axis for level ``k`` (its leading
        axes, in level order)."""
        program = self.program
        registers = 0
        prologue = lane_prologue(self, batched, sizes, self.lanes)
        scratch = []
        for buffer in program.buffers:
            if buffer.name in self.memory and buffer.name not in program.outputs:
                scratch.append((buffer.name, buffer.dtype.numpy.name, buffer.size))
                prologue.append(f"{self.pointer(buffer.name)} = {self.pointer(buffer.name)}"
                                f" + pid * {buffer.size}")
        for buffer in program.buffers:
            if buffer.name in self.inputs or buffer.name in self.memory:
                continue
            shape = self.padded_shape(buffer.name)
            registers += math.prod(shape) if shape else 1
            self.tile(shape)
            prologue.append(f"{self.register(buffer.name)} = tl.zeros({shape}, "
                            f"{TL_TYPE[buffer.dtype]})")
        self.steps(program.steps)
        epilogue = []
        for name in program.outputs:
            if name in self.memory:
                continue             # written in place already
            shape, pshape = self.shape_of(name), self.padded_shape(name)
            pointer = self.pointer(name)
            if not shape:
                epilogue.append(f"tl.store({pointer}, {self.register(name)})")
                continue
            offsets, masks, stride = [], [], 1
            rank = len(shape)
            for k in range(rank - 1, -1, -1):
                lane = f"tl.arange(0, {pshape[k]}).to(tl.int64)"
                if rank > 1:
                    lane += "[" + ", ".join(":" if a == k else "None" for a in range(rank)) + "]"
                offsets.append(lane if stride == 1 else f"{lane} * {stride}")
                if pshape[k] != shape[k]:
                    masks.append(f"({lane} < {shape[k]})")
                if k == 0 and output_mask(self, name, lane) is not None:
                    masks.append(output_mask(self, name, lane))
                stride *= shape[k]
            mask = f", mask={' & '.join(masks)}" if masks else ""
            epilogue.append(f"tl.store({pointer} + {' + '.join(reversed(offsets))}, "
                            f"{self.register(name)}{mask})")
        params = ", ".join([self.pointer(n) for n in program.inputs] +
                           [self.pointer(n) for n in program.outputs] +
                           [self.pointer(n) for n, _, _ in scratch])
        source = "\n".join(
            ["import triton", "import triton.language as tl", HELPERS, JIT_HELPERS,
             division_helper(), ELEMENTWISE_HELPERS, "", "@triton.jit",
             f"def {KERNEL}({params}):"] +
            ["    " + line for line in prologue] + self.lines +
            ["    " + line for line in epilogue]) + "\n"
        return RenderedJit(source, KERNEL, self.largest, registers, tuple(scratch),
                           self.lanes, math.prod(grid(sizes, self.lanes)))


def render_jit(program: JitProgram, batched=None, sizes: Tuple[int, ...] = (),
               lanes: int = 1) -> RenderedJit:
    """``program`` as one Triton kernel, one program per element of the batch levels
    ``sizes`` (none: one program); ``batched[i]``: per level, whether input ``i`` has
    its axis (a bool per input for a single level); the outputs have every level.
    ``lanes`` > 1: ``program`` is the block program of that many chains of the
    innermost level (backends/triton/jit_lanes.py), one program per block.
    Raises :class:`Declined`."""
    sizes = tuple(int(n) for n in sizes)
    if batched is None:
        batched = tuple(tuple(False for _ in sizes) for _ in program.inputs)
    flags = tuple(tuple(f) if isinstance(f, (tuple, list)) else (bool(f),) * len(sizes)
                  for f in batched)
    if len(flags) != len(program.inputs) or any(len(f) != len(sizes) for f in flags):
        raise Declined("the batch flags do not match the program's inputs")
    lanes = int(lanes)
    if lanes > 1:
        if not sizes:
            raise Declined("lanes without a batch level")
        lane_inputs = [name for name, f in zip(program.inputs, flags) if f[-1]]
        for name in lane_inputs + list(program.outputs):
            shape = program.buffer(name).shape
            if not shape or shape[0] != lanes:
                raise Declined(f"{name} of the block program does not lead with its "
                               f"{lanes} chains")
        return JitRenderer(program, lanes, lane_inputs).render(flags, sizes)
    return JitRenderer(program).render(flags, sizes)


__all__ = ["Declined", "KERNEL", "RenderedJit", "padded", "render_jit"]
