"""Renders a converted JAX function run over a batch (``jax.vmap`` of an ``ef.jit``
function) as ONE C function: the unbatched program's code inside a loop over the batch
elements, that loop shared among OpenMP threads.

Why not convert the jaxpr of ``jax.vmap(fn)``: that program carries the batch as one
more axis of every statement, so a ``scan`` body of small statements becomes a scan of
batch-wide statements, each one a separate loop nest per step; sharing such a
statement's outer loop among threads would fork and join the threads at every step (a
few microseconds each, and every join waits for the slowest thread of a shared
machine).  The batch elements are independent, so here each thread takes a contiguous
chunk of elements and runs the whole function - loops included - for each of them: one
parallel region per call, the step loop inside it, each element's carries and
intermediates in that thread's own cache.  A ``while_loop`` with a per-element
condition simply stops per element, which gives what XLA's batched loop gives (it runs
until no element's condition holds and leaves the finished elements unchanged).

Nested ``vmap`` adds batch levels: element ``b`` of a batch of sizes ``(N, M)`` is the
pair ``(b / M, b % M)``, and an input batched at only some levels is offset by those."""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

from ...errors import BackendError
from ...ir import JitProgram
from ...plan.jit_threads import batch_threads, one_by_one
from .loops import ENTRY, Renderer, load_entry
from .scalar_types import C_TYPE


@dataclass(frozen=True)
class Batch:
    """The batch levels a program runs over, outermost first: ``sizes[k]`` elements at
    level ``k``; ``batched[i][k]``: whether program input ``i`` (the function's
    arguments, then its array constants) has an axis for level ``k`` (its leading axes,
    in level order).  Every output has all the levels."""
    sizes: Tuple[int, ...]
    batched: Tuple[Tuple[bool, ...], ...]

    def __post_init__(self):
        if not self.sizes or any(not isinstance(n, int) or n < 0 for n in self.sizes):
            raise BackendError(f"batch sizes {self.sizes!r} are not counts")
        if any(len(flags) != len(self.sizes) for flags in self.batched):
            raise BackendError("each input needs one batched flag per batch level")

    @property
    def count(self) -> int:
        return math.prod(self.sizes)


def _element_offset(flags: Tuple[bool, ...], sizes: Tuple[int, ...], element_size: int) -> str:
    """The C expression of the offset, in elements, of batch element ``ef_b``'s block
    in an array that has the batch axes ``flags`` names (leading, in level order)."""
    parts = []
    stride = element_size        # the array's stride along the level being visited
    for k in reversed(range(len(sizes))):
        if not flags[k]:
            continue
        inner = math.prod(sizes[k + 1:])      # elements of ef_b per index of level k
        index = "ef_b" if inner == 1 else f"(ef_b / {inner}LL)"
        if k > 0:
            index = f"({index} % {sizes[k]}LL)"
        parts.append(f"{index} * {stride}LL")
        stride *= sizes[k]
    return " + ".join(parts) or "0"


def render(program: JitProgram, batch: Batch) -> str:
    """``int ef_jit(void **args, int threads)``: ``args`` as for the unbatched kernel
    (inputs, then outputs, each with its batch axes); ``threads`` 0 uses OpenMP's
    default team, 1 runs on the calling thread."""
    if len(batch.batched) != len(program.inputs):
        raise BackendError(f"the batch gives {len(batch.batched)} inputs flags; the "
                           f"program has {len(program.inputs)} inputs")
    # the threading, decided before rendering (plan/jit_threads.py): the batch elements
    # shared among threads, or the statements' own loops
    team = batch_threads(program, batch.count)
    renderer = Renderer(program, threads_inside=not team)
    renderer.depth = 3
    declarations, allocations, frees = renderer.storage(
        set(program.inputs + program.outputs), on_failure="ef_ok = 0;")
    renderer.steps(renderer.program.steps)   # (as rewritten by the renderer)
    pointers: List[str] = []
    for k, (name, flags) in enumerate(zip(program.inputs, batch.batched)):
        buffer = program.buffer(name)
        t = C_TYPE[buffer.dtype]
        offset = _element_offset(flags, batch.sizes, max(1, buffer.size))
        pointers.append(f"const {t} *restrict {name} = (const {t} *)args[{k}] + {offset};")
    every_level = tuple(True for _ in batch.sizes)
    for k, name in enumerate(program.outputs):
        buffer = program.buffer(name)
        t = C_TYPE[buffer.dtype]
        offset = _element_offset(every_level, batch.sizes, max(1, buffer.size))
        pointers.append(f"{t} *restrict {name} = ({t} *)args[{len(program.inputs) + k}]"
                        f" + {offset};")
    # elements of some work are handed out one at a time (plan/jit_threads.one_by_one)
    schedule = "dynamic, 1" if one_by_one(program) else "static"
    lines = [renderer.head(), "#include <omp.h>", "",
             f"int {ENTRY}(void **args, int threads) {{",
             "    int ef_failed = 0;",
             "    int ef_team = threads > 0 ? threads : omp_get_max_threads();",
             "    (void)ef_team;"]
    if team:
        # one parallel region for the whole call: the loops run inside each element
        lines.append("    #pragma omp parallel num_threads(ef_team) if(ef_team > 1)")
    lines += ["    {", "        int ef_ok = 1;",
              *("        " + line for line in declarations + allocations)]
    if team:
        lines.append(f"        #pragma omp for schedule({schedule})")
    lines += [f"        for (long long ef_b = 0; ef_b < {batch.count}LL; ++ef_b) {{",
              "            if (!ef_ok) continue;",
              *("            " + line for line in pointers),
              *renderer.lines,
              "        }",
              "        if (!ef_ok) {"]
    if team:
        lines.append("            #pragma omp atomic write")
    lines += ["            ef_failed = 1;", "        }",
              *("        " + line for line in frees),
              "    }", "    return ef_failed;", "}", ""]
    return "\n".join(lines)


def build(program: JitProgram, batch: Batch):
    """The compiled entry point (a ctypes function taking ``void **`` and the thread
    count)."""
    return load_entry(lambda: render(program, batch), ctypes.c_int)


@dataclass(frozen=True)
class Blocks:
    """A batch of ``count`` elements run as blocks of ``block``: ``full`` is the
    program of ``jax.vmap(fn)`` over ``block`` elements, ``rest`` the one over the last
    ``count % block`` (None when ``block`` divides ``count``); ``batched[i]``: whether
    argument ``i`` has the batch axis (leading).  Element sizes are those of one
    element: ``input_sizes`` of the arguments, ``output_sizes`` of the outputs."""
    count: int
    block: int
    full: JitProgram
    rest: Optional[JitProgram]
    batched: Tuple[bool, ...]
    input_sizes: Tuple[int, ...]
    output_sizes: Tuple[int, ...]


ARENA_ALIGN = 64          # bytes: each arena buffer starts on a cache line


class _ArenaRenderer(Renderer):
    """A block's function whose large intermediates (those past the stack) live in an
    arena the caller passes (``char *ef_arena``), ``arena_bytes`` long: a thread
    allocates one arena for all the blocks it runs.  Allocating per block (4 MB of
    stacked residuals per value for a scan's gradient over 2000 steps) cost a fresh
    mapping and its page faults for every block, a quarter of the gradient's time."""

    arena_bytes = 0

    def storage(self, declared, on_failure: str = "goto fail;"):
        declarations, offset = [], 0
        for buffer, t, nbytes, on_stack in self.placed(declared):
            if on_stack:
                declarations.append(f"{t} {buffer.name}[{max(1, buffer.size)}];")
            else:
                declarations.append(f"{t} *{buffer.name} = ({t} *)(ef_arena + {offset}LL);")
                offset += -(-nbytes // ARENA_ALIGN) * ARENA_ALIGN
        self.arena_bytes = offset
        if not offset:
            declarations.append("(void)ef_arena;")
        return declarations, [], []


def render_blocks(blocks: Blocks) -> str:
    """``int ef_jit(void **args, int threads)`` with ``args``: the arguments, the
    outputs, the array constants of ``full``, then those of ``rest``.  The blocks are
    shared among threads, each one running the whole function (its loops included)
    on its block; inside a block the statements span the block's elements, so a
    contraction reuses each weight it loads for all of them (c_loops_dot).  Each
    thread allocates one arena for the large intermediates of all its blocks."""
    parts = [blocks.full] + ([blocks.rest] if blocks.rest is not None else [])
    whole = blocks.count // blocks.block
    total = whole + (1 if blocks.rest is not None else 0)
    team = batch_threads(blocks.full, total)
    helpers, functions, arena = {}, [], 0
    for k, part in enumerate(parts):
        renderer = _ArenaRenderer(part, threads_inside=not team)
        functions.append(renderer.function(f"static int ef_part{k}(void **args, "
                                           "char *ef_arena)"))
        helpers.update(renderer.helpers)
        arena = max(arena, renderer.arena_bytes)
    head = Renderer(blocks.full)
    head.helpers = helpers
    users = len(blocks.batched)
    outputs = len(blocks.output_sizes)
    lines = [head.head(), "#include <omp.h>", "", *functions,
             f"int {ENTRY}(void **args, int threads) {{",
             "    int ef_failed = 0;",
             "    int ef_team = threads > 0 ? threads : omp_get_max_threads();",
             "    (void)ef_team;"]
    if team:
        lines.append("    #pragma omp parallel num_threads(ef_team) if(ef_team > 1)")
    lines += ["    {",
              f"    char *ef_arena = {f'(char *)malloc({arena}ULL)' if arena else '0'};"]
    if arena:
        lines += ["    if (!ef_arena) {"]
        if team:
            lines.append("        #pragma omp atomic write")
        lines += ["        ef_failed = 1;", "    }"]
    if team:
        lines.append("    #pragma omp for schedule(dynamic, 1)")
    lines.append(f"    for (long long ef_b = 0; ef_b < {total}LL; ++ef_b) {{")
    if arena:
        lines.append("        if (!ef_arena) continue;")
    constants_before = 0
    for k, part in enumerate(parts):
        pointers = []
        for i, (batched, size) in enumerate(zip(blocks.batched, blocks.input_sizes)):
            t = C_TYPE[part.buffer(part.inputs[i]).dtype]
            pointers.append(f"(void *)((const {t} *)args[{i}] + ef_b * "
                            f"{blocks.block * size}LL)" if batched else f"args[{i}]")
        constants = len(part.constants)
        pointers += [f"args[{users + outputs + constants_before + j}]"
                     for j in range(constants)]
        constants_before += constants
        for j, size in enumerate(blocks.output_sizes):
            t = C_TYPE[part.buffer(part.outputs[j]).dtype]
            pointers.append(f"(void *)(({t} *)args[{users + j}] + ef_b * "
                            f"{blocks.block * size}LL)")
        condition = f"if (ef_b < {whole}LL)" if k == 0 else "else"
        if len(parts) == 1:
            condition = ""
        lines.append(f"        {condition} {{")
        lines.append(f"            void *ef_args[] = {{{', '.join(pointers)}}};")
        lines.append(f"            if (ef_part{k}(ef_args, ef_arena)) {{")
        if team:
            lines.append("                #pragma omp atomic write")
        lines += ["                ef_failed = 1;", "            }", "        }"]
    lines += ["    }", "    free(ef_arena);", "    }", "    return ef_failed;", "}", ""]
    return "\n".join(lines)


def build_blocks(blocks: Blocks):
    """The compiled entry point of ``render_blocks``."""
    return load_entry(lambda: render_blocks(blocks), ctypes.c_int)
