"""A long jit kernel as several C functions (backends/c/loops.py): a program with more
than PART_THRESHOLD top-level steps is rendered PART_STEPS steps at a time, each run of
steps in a function of its own that the entry calls in order.

GCC's time grows faster than a function's length: a chain of 2,000 materialised integer
steps as one function ran past the compiler's time limit, 400 took 17 s.  Two things
made it so: the steps of one function, and the entry's hundreds of ``malloc``/``free``
calls (one per intermediate, in one basic block, which GCC's scheduler and CSE passes
treat quadratically).  So the parts keep each function short, and the intermediates of a
split kernel live in two blocks instead: the small ones (STACK_LIMIT in all) in one array
on the entry's stack, the rest in one allocation; each part finds the buffers it uses in
the entry's ``args`` and in those two blocks.  Nothing else crosses the parts: every step
declares its own locals inside its own block."""

from __future__ import annotations

import re
from typing import List, Optional, Sequence

from .scalar_types import C_TYPE

PART_STEPS = 32          # top-level steps per function
PART_THRESHOLD = 64      # programs with more top-level steps are split
ALIGN = 16               # bytes each buffer in a block is aligned to (any scalar's)

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def split_function(renderer, signature: str, stack_limit: int) -> Optional[str]:
    """``renderer.program`` (a c_loops.Renderer's) as its part functions and the entry
    ``signature`` calling them (``args``: inputs, then outputs; returns 0, or 1 where
    the intermediates could not be allocated), or None for a program short enough to
    stay one function.  At most ``stack_limit`` bytes of intermediates go on the
    stack."""
    program = renderer.program
    steps = program.steps
    if len(steps) <= PART_THRESHOLD:
        return None
    entry = signature.split("(")[0].split()[-1]
    where, stack, heap = _places(program, stack_limit)
    functions, calls = [], []
    depth = renderer.depth
    for number, start in enumerate(range(0, len(steps), PART_STEPS)):
        renderer.lines = []
        renderer.depth = 1
        renderer.steps(steps[start:start + PART_STEPS])
        body = "\n".join(renderer.lines)
        used = {name for name in _IDENTIFIER.findall(body) if name in where}
        pointers = [_pointer(program, name, where[name]) for name in where if name in used]
        part = f"{entry}_s{number}"
        functions.append("\n".join([
            f"static void __attribute__((noinline)) {part}(void **args, char *ef_stack, "
            "char *ef_heap) {", "    (void)args; (void)ef_stack; (void)ef_heap;",
            *pointers, body, "}", ""]))
        calls.append(f"    {part}(args, ef_stack, ef_heap);")
    renderer.depth = depth
    renderer.lines = []
    lines = [f"{signature} {{",
             f"    char ef_stack[{max(1, stack)}] __attribute__((aligned({ALIGN})));",
             f"    char *ef_heap = {f'(char *)malloc({heap}ULL)' if heap else '0'};"]
    if heap:
        lines.append("    if (!ef_heap) return 1;")
    lines += [*calls, "    free(ef_heap);", "    return 0;", "}", ""]
    return "\n".join(functions + lines)


def _places(program, stack_limit: int):
    """(buffer -> (where it is: "args", "ef_stack" or "ef_heap"; its index there or its
    byte offset), the bytes of the stack block, those of the allocated one).  The small
    intermediates go on the stack, in order, while they fit, as in one function."""
    where = {}
    for k, name in enumerate(program.inputs + program.outputs):
        where[name] = ("args", k)
    sizes = {"ef_stack": 0, "ef_heap": 0}
    for buffer in program.buffers:
        if buffer.name in where:
            continue
        nbytes = _aligned(max(1, buffer.size) * buffer.dtype.numpy.itemsize)
        block = "ef_stack" if sizes["ef_stack"] + nbytes <= stack_limit else "ef_heap"
        where[buffer.name] = (block, sizes[block])
        sizes[block] += nbytes
    return where, sizes["ef_stack"], sizes["ef_heap"]


def _pointer(program, name: str, place) -> str:
    block, at = place
    t = C_TYPE[program.buffer(name).dtype]
    if block == "args":
        const = "const " if name in program.inputs else ""
        return f"    {const}{t} *restrict {name} = ({const}{t} *)args[{at}];"
    return f"    {t} *restrict {name} = ({t} *)({block} + {at}LL);"


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


__all__ = ["PART_STEPS", "PART_THRESHOLD", "split_function"]
