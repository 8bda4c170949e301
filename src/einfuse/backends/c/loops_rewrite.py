"""Program rewrites the jit kernel renderer applies before rendering (``c_loops.py``).

Each keeps every value bit for bit; they only change where values are stored.

* **Transposed operands of contractions in loops.**  ``out[i, j] = sum_r x[i, r] *
  W[j, r]`` (the gradient of a layer: ``dY @ W.T``) reads ``W`` across its rows, one
  element per row, so its inner loop cannot load a vector of ``W``: GCC gathers, and in
  a scan body that contraction cost more than the rest of the step.  When ``W`` is not
  written inside the loop that reads it (a weight, or its softplus, hoisted before the
  loop), a copy ``W_t[r, j] = W[j, r]`` is made once before the outermost loop that
  leaves ``W`` unchanged, and the statement reads ``W_t[r, j]``: the register-blocked
  form of ``c_loops_dot`` (a vector of ``W_t`` per reduced index).  Each output element
  still sums the same products in the same order.
* **Carries updated in place.**  A loop copies each new carry into its carry buffer
  after the body (``memcpy``); the gradient of a vmapped scan accumulates each chain's
  weight gradient (8 x 32 x 32 doubles) this way, 64 KB copied per step.  When the new
  value is one elementwise statement that reads the carry only at its own position, and
  nothing after it in the body reads the carry or the new value, the statement writes
  the carry directly and the copy goes.
* **Vector math outside sums.**  ``out[c] = sum_r sigmoid(h[c, r]) * w[r]`` (the last
  layer of a vmapped network: a row reduction to one value per chain) calls the vector
  ``exp`` inside the SIMD sum of each row, 2 or 4 calls per row with the partial sums
  saved around each call.  The transcendental operand becomes its own statement first,
  ``tmp[c, r] = sigmoid(h[c, r])``, one flat vector loop over all the rows (as an
  activation), and the sum reads ``tmp``; each sum adds the same products in the same
  order.
* **Contractions stored transposed** (backends/c/loops_transposed.py): a contraction
  whose every reader reads it across its rows (a layer's weight gradient, accumulated
  as ``c[a, b] += g[b, a] * s[a, b]`` in a scan's backward) is computed as its
  transpose, still a blocked contraction, and read along its rows.
* **Residuals recomputed** (backends/c/loops_residuals.py): a stacked value that is a
  few additions and multiplications of a value the same loop also stacks (JAX keeps
  both ``s`` and ``s * (1 - s)`` of a sigmoid) is recomputed from that stack where it
  is read, not stored."""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Set, Tuple

from ...ir import (Apply, Assign, Buffer, Cast, Expr, Index, JitProgram, Loop, Read, ReduceOp,
                   Select, Step, Switch, step_reads, step_writes)
from ...lang.fresh_names import FreshNames
from .loops_dot import mentions
from .loops_residuals import recomputed_residuals
from .loops_transposed import stored_transposed

MIN_ROW = 8        # output rows shorter than this are not rendered as blocked contractions
MAX_COPY = 1 << 18  # elements of a transposed copy: a weight, not a stack of residuals


def optimise(program: JitProgram) -> JitProgram:
    """``program`` with the rewrites applied (the same program when none applies)."""
    program = recomputed_residuals(program)
    program = _transpose_operands(program)
    program = stored_transposed(program, MIN_ROW)
    program = _vector_math_outside_sums(program)
    return _carries_in_place(program)


def _names(program: JitProgram) -> FreshNames:
    """Fresh buffer and index names (``ef`` prefixes: the converter never makes them)."""
    return FreshNames(b.name for b in program.buffers)


# -- transposed operands -------------------------------------------------------------------------
@dataclasses.dataclass
class _Frame:
    """A loop being rewritten: the buffers it writes, the copies to place before it,
    and which buffer each copy transposes."""
    written: Set[str]
    before: List[Step]
    made: Dict[str, str]


def _transposable(step: Assign, shape_of) -> Optional[Tuple[Read, int]]:
    """``(W's read, which argument of the product it is)`` when ``step`` is a float sum
    ``out[..., j] = sum_r x * W[..., j, r]`` with ``r`` reduced, ``j`` the output's last
    index read nowhere else, and ``x`` free of ``j``."""
    reduction = step.reduction
    if reduction is None or reduction.op is not ReduceOp.SUM or not step.indices:
        return None
    last, extent = step.indices[-1]
    body = reduction.body
    if extent < MIN_ROW or not isinstance(body, Apply) or body.op != "mul" \
            or not body.dtype.is_float or len(body.args) != 2:
        return None
    reduced = {name for name, _ in reduction.indices}
    for k in (0, 1):
        y, x = body.args[k], body.args[1 - k]
        if not isinstance(y, Read) or y.dtype is not body.dtype or len(y.subscripts) < 2:
            continue
        *others, row, column = y.subscripts
        if row != Index(last) or not isinstance(column, Index) or \
                column.name not in reduced or mentions(x, last) or \
                any(mentions(s, last) or mentions(s, column.name) for s in others):
            continue
        shape = shape_of(y.buffer)
        if shape[-1] < 2 or math.prod(shape) > MAX_COPY:
            continue
        return y, k
    return None


def _transpose_operands(program: JitProgram) -> JitProgram:
    names = _names(program)
    shapes = {b.name: b.shape for b in program.buffers}
    new_buffers: List[Buffer] = []
    dtype_of = {b.name: b.dtype for b in program.buffers}

    def rewrite(steps: Tuple[Step, ...], frames: List["_Frame"]) -> Tuple[Step, ...]:
        """``steps`` inside the loops ``frames`` (outermost first), contractions
        rewritten; each loop's hoisted copies are placed just before it."""
        out: List[Step] = []
        for step in steps:
            if isinstance(step, Assign) and frames:
                found = _transposable(step, shapes.__getitem__)
                if found is not None:
                    # the outermost enclosing loop that leaves W unchanged (the loops
                    # inside it leave it unchanged too)
                    frame = next((f for f in frames if found[0].buffer not in f.written),
                                 None)
                    if frame is not None:
                        step = use_copy(step, *found, frame.before, frame.made)
                out.append(step)
            elif isinstance(step, Loop):
                frame = _Frame(set(step_writes(step)), [], {})
                inner = frames + [frame]
                replaced = dataclasses.replace(
                    step, condition_steps=rewrite(step.condition_steps, inner),
                    body=rewrite(step.body, inner))
                out += frame.before
                out.append(replaced)
            elif isinstance(step, Switch):
                out.append(dataclasses.replace(
                    step, branches=tuple(rewrite(b, frames) for b in step.branches)))
            else:
                out.append(step)
        return tuple(out)

    def use_copy(step: Assign, y: Read, k: int, before: List[Step],
                 made: Dict[str, str]) -> Assign:
        source = y.buffer
        copy = made.get(source)
        if copy is None:
            shape = shapes[source]
            copy = names.numbered("ef_wt")
            copy_shape = shape[:-2] + (shape[-1], shape[-2])
            shapes[copy] = copy_shape
            new_buffers.append(Buffer(copy, dtype_of[source], shape=copy_shape))
            axes = tuple((names.numbered("ef_ti"), e) for e in copy_shape)
            *lead, a, b = (Index(n) for n, _ in axes)
            before.append(Assign(copy, (), axes,
                                 Read(source, tuple(lead) + (b, a), y.dtype),
                                 origin=f"{source} transposed for a contraction in a loop"))
            made[source] = copy
        *others, row, column = y.subscripts
        read = Read(copy, tuple(others) + (column, row), y.dtype)
        body = step.reduction.body
        args = (read, body.args[1]) if k == 0 else (body.args[0], read)
        return dataclasses.replace(step, reduction=dataclasses.replace(
            step.reduction, body=dataclasses.replace(body, args=args)))

    steps = rewrite(program.steps, [])
    if not new_buffers:
        return program
    return dataclasses.replace(program, buffers=program.buffers + tuple(new_buffers),
                               steps=steps)


# -- carries in place ------------------------------------------------------------------------------
def _carries_in_place(program: JitProgram) -> JitProgram:
    reads: Dict[str, int] = {}
    for step in program.steps:
        for name in step_reads(step):
            reads[name] = reads.get(name, 0) + 1
    shapes = {b.name: (b.shape, b.dtype) for b in program.buffers}
    dropped: Set[str] = set()
    fixed = {name for name in program.inputs + program.outputs}

    def loop(step: Loop) -> Loop:
        body = list(walk(step.body))
        updates = list(step.updates)
        for carry, new in step.updates:
            if new in fixed or carry in fixed or shapes[new] != shapes[carry] or \
                    sum(n == new for _, n in step.updates) != 1 or \
                    sum(c == carry for c, _ in step.updates) != 1 or \
                    reads.get(new, 0) != 1:        # read only by this update
                continue
            writers = [k for k, s in enumerate(body) if new in set(step_writes(s))]
            if len(writers) != 1 or not isinstance(body[writers[0]], Assign) or \
                    any({new, carry} & set(step_writes(s)) for s in step.condition_steps):
                continue
            at = writers[0]
            target = body[at]
            if not _elementwise_over(target, carry, shapes[new][0]) or \
                    any(carry in set(step_writes(s)) for s in body) or \
                    any(carry in set(step_reads(s)) or new in set(step_reads(s))
                        for s in body[at + 1:]):
                continue
            body[at] = dataclasses.replace(target, buffer=carry)
            updates.remove((carry, new))
            dropped.add(new)
        return dataclasses.replace(step, body=tuple(body), updates=tuple(updates))

    def walk(steps):
        for step in steps:
            if isinstance(step, Loop):
                yield loop(dataclasses.replace(step, condition_steps=tuple(
                    walk(step.condition_steps))))
            elif isinstance(step, Switch):
                yield dataclasses.replace(step, branches=tuple(tuple(walk(b))
                                                               for b in step.branches))
            else:
                yield step

    steps = tuple(walk(program.steps))
    if not dropped:
        return program
    return dataclasses.replace(program, steps=steps, buffers=tuple(
        b for b in program.buffers if b.name not in dropped))


def _elementwise_over(step: Assign, carry: str, shape: Tuple[int, ...]) -> bool:
    """Whether ``step`` sets every element of its whole buffer (of ``shape``) from a
    value that reads ``carry`` only at the element being set."""
    if step.reduction is not None or step.value is None or step.prefix or \
            tuple(e for _, e in step.indices) != tuple(shape):
        return False
    identity = tuple(Index(n) for n, _ in step.indices)

    def clean(node: Expr) -> bool:
        if isinstance(node, Read):
            if node.buffer == carry and tuple(node.subscripts) != identity:
                return False
            return all(clean(s) for s in node.subscripts)
        if isinstance(node, Apply):
            return all(clean(a) for a in node.args)
        if isinstance(node, Cast):
            return clean(node.arg)
        if isinstance(node, Select):
            return clean(node.which) and all(clean(c) for c in node.cases)
        return True
    return clean(step.value)


# -- vector math outside sums ---------------------------------------------------------------------
TRANSCENDENTAL = frozenset({
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan",
    "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erf", "erfc",
    "pow", "atan2", "cbrt"})
MAX_OPERAND = 4096         # elements of a materialised operand (it lives on the stack)


def _calls(node: Expr) -> bool:
    if isinstance(node, Apply):
        return node.op in TRANSCENDENTAL or any(_calls(a) for a in node.args)
    if isinstance(node, Cast):
        return _calls(node.arg)
    if isinstance(node, Select):
        return _calls(node.which) or any(_calls(c) for c in node.cases)
    if isinstance(node, Read):
        return any(_calls(s) for s in node.subscripts)
    return False


def _split_operand(step: Assign, names: FreshNames) -> Optional[Tuple[Assign, Assign, Buffer]]:
    """``(tmp := operand, the sum reading tmp, tmp's buffer)`` for a float sum over one
    index whose product has one operand with vector math in it."""
    reduction = step.reduction
    if reduction is None or reduction.op is not ReduceOp.SUM or \
            len(reduction.indices) != 1 or reduction.indices[0][1] < MIN_ROW:
        return None
    body = reduction.body
    if not isinstance(body, Apply) or body.op != "mul" or not body.dtype.is_float or \
            len(body.args) != 2:
        return None
    heavy = [k for k in (0, 1) if _calls(body.args[k])]
    if len(heavy) != 1:
        return None
    operand = body.args[heavy[0]]
    reduced = reduction.indices[0]
    # the operand over the output indices it depends on (loop counters are constants)
    axes = tuple((n, e) for n, e in step.indices if e > 1 and mentions(operand, n)) + \
        (reduced,)
    if any(mentions(operand, n) for n, e in step.indices if e == 1) or \
            math.prod(e for _, e in axes) > MAX_OPERAND:
        return None
    buffer = Buffer(names.numbered("ef_op"), operand.dtype, shape=tuple(e for _, e in axes))
    make = Assign(buffer.name, (), axes, operand,
                  origin="the vector math of a sum's operand, before the sum")
    read = Read(buffer.name, tuple(Index(n) for n, _ in axes), operand.dtype)
    args = (read, body.args[1]) if heavy[0] == 0 else (body.args[0], read)
    use = dataclasses.replace(step, reduction=dataclasses.replace(
        reduction, body=dataclasses.replace(body, args=args)))
    return make, use, buffer


def _vector_math_outside_sums(program: JitProgram) -> JitProgram:
    names = _names(program)
    made: List[Buffer] = []

    def walk(steps):
        out: List[Step] = []
        for step in steps:
            if isinstance(step, Assign):
                split = _split_operand(step, names)
                if split is not None:
                    make, step, buffer = split
                    out.append(make)
                    made.append(buffer)
                out.append(step)
            elif isinstance(step, Loop):
                out.append(dataclasses.replace(step, condition_steps=walk(
                    step.condition_steps), body=walk(step.body)))
            elif isinstance(step, Switch):
                out.append(dataclasses.replace(step, branches=tuple(
                    walk(b) for b in step.branches)))
            else:
                out.append(step)
        return tuple(out)

    steps = walk(program.steps)
    if not made:
        return program
    return dataclasses.replace(program, steps=steps, buffers=program.buffers + tuple(made))
