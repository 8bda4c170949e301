"""``ef.explain(fn, *example_args)`` for a JAX function: the converted program in index
notation, the one kernel it runs as, its loops, what is hoisted out of them, its costs,
and each jaxpr equation mapped to the statement that holds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from ..pictures import Block, jit_page, save_page

from ..analysis.cost import step_flops, typed_work
from ..ir import (Apply, Assign, Cast, Const, Expr, Index, JitProgram, Loop, LoopKind, Read,
                  ScatterAdd, Select, Switch)

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">",
          "ge": ">=", "eq": "==", "ne": "!=", "and": "&", "or": "|", "idiv": "//",
          "imod": "%", "rem": "%"}


def node_text(node: Expr) -> str:
    if isinstance(node, Const):
        return repr(node.value)
    if isinstance(node, Index):
        return node.name
    if isinstance(node, Read):
        return f"{node.buffer}[{', '.join(node_text(s) for s in node.subscripts)}]"
    if isinstance(node, Cast):
        return f"{node.dtype.value}({node_text(node.arg)})"
    if isinstance(node, Select):
        if len(node.cases) == 2:
            return (f"where({node_text(node.which)}, {node_text(node.cases[1])}, "
                    f"{node_text(node.cases[0])})")
        return f"select({', '.join(node_text(n) for n in (node.which,) + node.cases)})"
    if isinstance(node, Apply):
        args = [node_text(a) for a in node.args]
        if node.op in _INFIX and len(args) == 2:
            return f"({args[0]} {_INFIX[node.op]} {args[1]})"
        if node.op == "neg":
            return f"-{args[0]}"
        if node.op == "integer_pow":
            return f"{args[0]}**{args[1]}"
        return f"{'sigmoid' if node.op == 'logistic' else node.op}({', '.join(args)})"
    return "?"


def _statement(step: Assign) -> str:
    prefix = [node_text(p) for p in step.prefix]
    target = f"{step.buffer}[{', '.join(prefix + [n for n, _ in step.indices])}]"
    if step.reduction is None:
        return f"{target} := {node_text(step.value)}"
    reduced = ", ".join(n for n, _ in step.reduction.indices)
    return f"{target} := {step.reduction.op.value}[{reduced}]({node_text(step.reduction.body)})"


class _Walker:
    def __init__(self):
        self.lines: List[str] = []
        self.loops = 0
        self.hoisted: List[str] = []

    def steps(self, steps, depth: int) -> None:
        pad = "  " * depth
        for step in steps:
            if isinstance(step, Assign):
                self.lines.append(f"{pad}{_statement(step)}")
                if step.origin:
                    self.lines.append(f"{pad}    # {step.origin}")
            elif isinstance(step, ScatterAdd):
                target = f"{step.buffer}[{', '.join(node_text(t) for t in step.target)}]"
                self.lines.append(f"{pad}{target} {'=' if step.replace else '+='} "
                                  f"{node_text(step.value)}   for "
                                  f"{', '.join(f'{n} < {e}' for n, e in step.indices)}")
            elif isinstance(step, Loop):
                self.loops += 1
                if step.kind is LoopKind.SCAN:
                    self.lines.append(f"{pad}loop {step.var} in 0..{step.length - 1} "
                                      f"({step.origin}), inside the kernel:")
                else:
                    self.lines.append(f"{pad}loop while {node_text(step.condition)} "
                                      "(while_loop; the condition is evaluated in the kernel):")
                    self.steps(step.condition_steps, depth + 1)
                self.steps(step.body, depth + 1)
                for carry, new in step.updates:
                    self.lines.append(f"{pad}  {carry} <- {new}   (carry)")
            elif isinstance(step, Switch):
                self.lines.append(f"{pad}switch on {node_text(step.which)} ({step.origin}):")
                for k, body in enumerate(step.branches):
                    self.lines.append(f"{pad}  branch {k}:")
                    self.steps(body, depth + 2)


def _node_reads(node: Expr, found: set) -> None:
    if isinstance(node, Read):
        found.add(node.buffer)
        children = node.subscripts
    elif isinstance(node, Apply):
        children = node.args
    elif isinstance(node, Select):
        children = (node.which,) + node.cases
    elif isinstance(node, Cast):
        children = (node.arg,)
    else:
        children = ()
    for child in children:
        _node_reads(child, found)


def _reads(step) -> set:
    """Every buffer a step reads (loops and branches: their bodies too)."""
    found: set = set()
    if isinstance(step, Assign):
        _node_reads(step.value if step.reduction is None else step.reduction.body, found)
    elif isinstance(step, ScatterAdd):
        for node in step.target + (step.valid, step.value):
            _node_reads(node, found)
    elif isinstance(step, Loop):
        for inner in step.condition_steps + step.body:
            found |= _reads(inner)
        if step.condition is not None:
            _node_reads(step.condition, found)
        found |= {new for _, new in step.updates}
    elif isinstance(step, Switch):
        for body in step.branches:
            for inner in body:
                found |= _reads(inner)
    return found


def _writes(step) -> set:
    """Every buffer a step writes (loops and branches: their bodies, and the carries)."""
    if isinstance(step, (Assign, ScatterAdd)):
        return {step.buffer}
    found: set = set()
    if isinstance(step, Loop):
        found = {carry for carry, _ in step.updates}
        for inner in step.condition_steps + step.body:
            found |= _writes(inner)
    elif isinstance(step, Switch):
        for body in step.branches:
            for inner in body:
                found |= _writes(inner)
    return found


@dataclass(frozen=True)
class FlowArray:
    """A buffer of the program as the dataflow picture draws it: which top-level steps
    (0-based) write and read it."""
    name: str
    shape: Tuple[int, ...]
    dtype: str
    nbytes: int
    role: str                  # "input", "output" or "intermediate"
    writers: Tuple[int, ...]
    readers: Tuple[int, ...]


def _step_label(step) -> str:
    if isinstance(step, Assign):
        return _statement(step)
    if isinstance(step, ScatterAdd):
        return f"{step.buffer}[...] {'=' if step.replace else '+='} (scatter)"
    if isinstance(step, Loop):
        return (f"loop {step.var} in 0..{step.length - 1}" if step.kind is LoopKind.SCAN
                else f"loop while {node_text(step.condition)}") + f"  ({step.origin})"
    return f"switch on {node_text(step.which)}"


def flow(program: JitProgram):
    """(a label per top-level step, the buffers as FlowArray): the dataflow of the one
    kernel."""
    labels = [_step_label(step) for step in program.steps]
    reads = [_reads(step) for step in program.steps]
    writes = [_writes(step) for step in program.steps]
    arrays = []
    for b in program.buffers:
        role = "input" if b.name in program.inputs else \
            "output" if b.name in program.outputs else "intermediate"
        arrays.append(FlowArray(b.name, tuple(b.shape), b.dtype.value,
                                b.size * b.dtype.numpy.itemsize, role,
                                tuple(k for k, w in enumerate(writes) if b.name in w),
                                tuple(k for k, r in enumerate(reads) if b.name in r)))
    return labels, arrays


def hoisted_buffers(program: JitProgram) -> List[str]:
    """Statements before the first loop whose results a loop reads (not the carries'
    initial values): loop-invariant work, computed once."""
    first_loop = next((k for k, s in enumerate(program.steps) if isinstance(s, Loop)), None)
    if first_loop is None:
        return []
    read_in_loops = set()
    for step in program.steps:
        if isinstance(step, Loop):
            read_in_loops |= _reads(step)
    return [s.buffer for s in program.steps[:first_loop] if isinstance(s, Assign)
            and s.buffer in read_in_loops and not s.buffer.startswith("c")]


def _operations_of(program: JitProgram) -> int:
    return typed_work(program.steps)      # the one count (analysis/cost.py)


def explain_program(program: JitProgram, name: str) -> str:
    walker = _Walker()
    walker.steps(program.steps, 1)
    hoisted = hoisted_buffers(program)
    out = [f"ef.jit of {name}: 1 kernel (one generated C function, called once per call)",
           "", "Inputs"]
    for buffer_name in program.inputs:
        b = program.buffer(buffer_name)
        out.append(f"  {buffer_name}  {b.dtype.value}{list(b.shape)}")
    out.append("Outputs")
    for buffer_name in program.outputs:
        b = program.buffer(buffer_name)
        out.append(f"  {buffer_name}  {b.dtype.value}{list(b.shape)}")
    out += ["", "Program (in order; loops run inside the kernel)"] + walker.lines
    out += ["", f"Loops: {walker.loops}"]
    if hoisted:
        out.append("Computed once, before the first loop (loop-invariant work hoisted out): "
                   + ", ".join(hoisted))
    temps = [b for b in program.buffers if b.name not in program.inputs and
             b.name not in program.outputs]
    nbytes = sum(b.size * b.dtype.numpy.itemsize for b in temps)
    out.append(f"Intermediates: {len(temps)} buffers, {nbytes} bytes in all")
    out.append(f"Cost: about {typed_work(program.steps)} operations (while loops counted once)")
    out += ["", "Jaxpr equations -> where they went ('inline': part of the expression of "
            "the statement that reads it)"]
    out += [f"  {eqn}  ->  {where}" for eqn, where in program.mapping]
    return "\n".join(out)


class JitExplanation(str):
    """``ef.explain(fn, ...)``: the text (a ``str``, as before) that also draws itself
    (``_repr_html_``, ``save``): the program's loops as boxes holding their bodies, the
    work hoisted out of them marked."""

    def __new__(cls, text: str, name: str, blocks: Optional[List[Block]],
                arrays: List[str], program: Optional[JitProgram] = None):
        made = super().__new__(cls, text)
        made.name = name
        made.blocks = blocks        # the program's outline (None: split by fallback=True)
        made.arrays = arrays        # its inputs and outputs, one line each
        # the dataflow (step labels, FlowArray per buffer) and the operations counted
        made.flow_steps, made.flow_arrays = flow(program) if program else ([], [])
        made.operations = _operations_of(program) if program else None
        return made

    def _repr_html_(self) -> str:
        return jit_page(self).fragment()

    def save(self, path: str) -> None:
        save_page(jit_page(self), path)


def outline(program: JitProgram) -> List[Block]:
    """The program's steps as blocks: loops hold their bodies; statements before the first
    loop that a loop reads are marked hoisted (computed once)."""
    hoisted_names = set(hoisted_buffers(program))

    def blocks(steps, top: bool) -> List[Block]:
        out: List[Block] = []
        for step in steps:
            if isinstance(step, Assign):
                text = _statement(step)
                hoisted = top and step.buffer in hoisted_names
                out.append(Block(("hoisted: " if hoisted else "") + text,
                                 "hoisted" if hoisted else "body",
                                 f"{text}; operations={step_flops(step)}" +
                                 (f"; from {step.origin}" if step.origin else "")))
            elif isinstance(step, ScatterAdd):
                target = f"{step.buffer}[{', '.join(node_text(t) for t in step.target)}]"
                text = f"{target} {'=' if step.replace else '+='} {node_text(step.value)}"
                out.append(Block(text, "body", text))
            elif isinstance(step, Loop):
                if step.kind is LoopKind.SCAN:
                    label = f"loop {step.var} in 0..{step.length - 1}"
                else:
                    label = f"loop while {node_text(step.condition)}"
                inner = blocks(step.condition_steps + step.body, False)
                inner += [Block(f"{carry} <- {new}   (carry)", "serial",
                                f"carry {carry} <- {new}") for carry, new in step.updates]
                out.append(Block(label, "loop", f"{label} ({step.origin}); "
                                 f"steps={len(step.body)}", inner))
            elif isinstance(step, Switch):
                arms = [Block(f"branch {n}", "branch", f"branch {n}", blocks(body, False))
                        for n, body in enumerate(step.branches)]
                label = f"switch on {node_text(step.which)}"
                out.append(Block(label, "branch", label, arms))
        return out

    return blocks(program.steps, True)


def is_jax_function(candidate) -> bool:
    """Whether ``ef.explain`` was given a function to trace (a plain callable or an
    ``ef.jit`` function), not a statement or one of einfuse's compiled objects (whose
    calls keep their own error message)."""
    if isinstance(candidate, str) or not callable(candidate):
        return False
    kind = type(candidate)
    return kind.__name__ == "JitFunction" or not kind.__module__.startswith("einfuse")


def explain_function(fn, args, kwargs) -> "JitExplanation":
    # (JAX is imported only to explain a JAX function)
    from ..runtime.jit import JitFunction
    from ..runtime.jit_split import SplitFunction
    jitted = fn if isinstance(fn, JitFunction) else JitFunction(fn)
    compiled = jitted.compiled(*args, **kwargs)
    name = getattr(jitted.fn, "__name__", "fn")
    if isinstance(compiled, SplitFunction):       # split by fallback=True
        return JitExplanation(explain_split(compiled), name, None, [])
    from ..runtime.jit_ffi import route_lines
    program = compiled.program
    arrays = [f"{role} {n}: {program.buffer(n).dtype.value}{list(program.buffer(n).shape)}"
              for role, names in (("input", program.inputs), ("output", program.outputs))
              for n in names]
    return JitExplanation("\n".join([explain_program(program, name), "",
                                     *route_lines(compiled)]), name, outline(program), arrays,
                          program)


def explain_split(split) -> str:
    """The explanation of an ``ef.jit(fallback=True)`` function split into parts."""
    from ..runtime.jit_ffi import route_lines
    lines = [f"ef.jit(fallback=True) of {split.name}: split into {len(split.parts)} parts "
             f"({sum(p.compiled is not None for p in split.parts)} einfuse kernels, "
             f"{sum(p.compiled is None for p in split.parts)} run by JAX)"]
    for number, part in enumerate(split.parts, 1):
        lines.append("")
        if part.compiled is not None:
            lines.append(f"Part {number}: einfuse kernel")
            lines += ["  " + line for line in
                      explain_program(part.compiled.program, f"part {number}").split("\n")
                      + [""] + route_lines(part.compiled)]
        else:
            lines.append(f"Part {number}: run by JAX (the split falls here)")
            lines += [f"  {text}" for text in part.equations]
            if part.why:
                lines.append(f"  because: {part.why.split(';')[0]}")
    return "\n".join(lines)
