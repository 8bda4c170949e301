"""``ef.explain(fn, *example_args)`` for a JAX function: the converted program in index
notation, the one kernel it runs as, its loops, what is hoisted out of them, its costs,
and each jaxpr equation mapped to the statement that holds it."""

from __future__ import annotations

from typing import List

from ..ir.jit_cost import step_flops
from ..ir.jit import (Apply, Assign, Branch, Cast, Const, Index, JitProgram, Loop, LoopKind, Node,
                      Read, ScatterAdd, Select)

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">",
          "ge": ">=", "eq": "==", "ne": "!=", "and": "&", "or": "|", "idiv": "//",
          "imod": "%", "rem": "%"}


def node_text(node: Node) -> str:
    if isinstance(node, Const):
        return repr(node.value)
    if isinstance(node, Index):
        return node.name
    if isinstance(node, Read):
        return f"{node.buffer}[{', '.join(node_text(s) for s in node.subscripts)}]"
    if isinstance(node, Cast):
        return f"{node.dtype.value[0]}({node_text(node.arg)})"
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
        self.total = 0

    def steps(self, steps, depth: int, repeat: int) -> None:
        pad = "  " * depth
        for step in steps:
            if isinstance(step, Assign):
                flops = step_flops(step)
                self.total += flops * repeat
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
                    self.lines.append(f"{pad}loop {step.counter} in 0..{step.length - 1} "
                                      f"({step.origin}), inside the kernel:")
                    inner = repeat * step.length
                else:
                    self.lines.append(f"{pad}loop while {node_text(step.condition)} "
                                      "(while_loop; the condition is evaluated in the kernel):")
                    self.steps(step.condition_steps, depth + 1, repeat)
                    inner = repeat
                self.steps(step.body, depth + 1, inner)
                for carry, new in step.updates:
                    self.lines.append(f"{pad}  {carry} <- {new}   (carry)")
            elif isinstance(step, Branch):
                self.lines.append(f"{pad}switch on {node_text(step.which)} ({step.origin}):")
                for k, body in enumerate(step.branches):
                    self.lines.append(f"{pad}  branch {k}:")
                    self.steps(body, depth + 2, repeat)


def _node_reads(node: Node, found: set) -> None:
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
    elif isinstance(step, Branch):
        for body in step.branches:
            for inner in body:
                found |= _reads(inner)
    return found


def explain_program(program: JitProgram, name: str) -> str:
    walker = _Walker()
    walker.steps(program.steps, 1, 1)
    # hoisted: statements before the first loop whose results a loop reads
    first_loop = next((k for k, s in enumerate(program.steps) if isinstance(s, Loop)), None)
    read_in_loops = set()
    for step in program.steps:
        if isinstance(step, Loop):
            read_in_loops |= _reads(step)
    hoisted = [s.buffer for s in program.steps[:first_loop or 0] if isinstance(s, Assign)
               and s.buffer in read_in_loops and not s.buffer.startswith("c")] \
        if first_loop is not None else []
    out = [f"ef.jit of {name}: 1 kernel (one generated C function, called once per call)",
           "", "Inputs"]
    for buffer_name in program.inputs:
        b = program.buffer(buffer_name)
        out.append(f"  {buffer_name}  {b.dtype.value[0]}{list(b.shape)}")
    out.append("Outputs")
    for buffer_name in program.outputs:
        b = program.buffer(buffer_name)
        out.append(f"  {buffer_name}  {b.dtype.value[0]}{list(b.shape)}")
    out += ["", "Program (in order; loops run inside the kernel)"] + walker.lines
    out += ["", f"Loops: {walker.loops}"]
    if hoisted:
        out.append("Computed once, before the first loop (loop-invariant work hoisted out): "
                   + ", ".join(hoisted))
    temps = [b for b in program.buffers if b.name not in program.inputs and
             b.name not in program.outputs]
    nbytes = sum(b.size * b.dtype.numpy.itemsize for b in temps)
    out.append(f"Intermediates: {len(temps)} buffers, {nbytes} bytes in all")
    out.append(f"Cost: about {walker.total} operations (while loops counted once)")
    out += ["", "Jaxpr equations -> where they went ('inline': part of the expression of "
            "the statement that reads it)"]
    out += [f"  {eqn}  ->  {where}" for eqn, where in program.mapping]
    return "\n".join(out)


def is_jax_function(candidate) -> bool:
    """Whether ``ef.explain`` was given a function to trace (a plain callable or an
    ``ef.jit`` function), not a statement or one of einfuse's compiled objects (whose
    calls keep their own error message)."""
    if isinstance(candidate, str) or not callable(candidate):
        return False
    kind = type(candidate)
    return kind.__name__ == "JitFunction" or not kind.__module__.startswith("einfuse")


def explain_function(fn, args, kwargs) -> str:
    # (JAX is imported only to explain a JAX function)
    from ..runtime.jit import JitFunction
    from ..runtime.jit_split import SplitFunction
    jitted = fn if isinstance(fn, JitFunction) else JitFunction(fn)
    compiled = jitted.compiled(*args, **kwargs)
    if isinstance(compiled, SplitFunction):       # split by fallback=True
        return explain_split(compiled)
    from ..runtime.jit_ffi import route_lines
    return "\n".join([explain_program(compiled.program, getattr(jitted.fn, "__name__", "fn")),
                      "", *route_lines(compiled)])


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
