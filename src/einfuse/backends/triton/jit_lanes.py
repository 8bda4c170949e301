"""Where each program of the Triton jit kernel (backends/triton/jit_render.py) finds its
batch elements: the prologue that offsets every pointer by the program's position over
the batch levels, with or without **lanes**.

Without lanes a program runs one batch element (one chain) of the unbatched program.
With ``lanes`` = L, the innermost batch level is cut into blocks of L chains and a
program runs one block: the program rendered is then the *block program* -- the jaxpr
of ``jax.vmap`` of the function over L chains, converted (runtime/jit_triton.py makes
it) -- whose inputs batched on that level and whose outputs have a leading axis of L,
the chain axis of every tile.  JAX's own batching rules have already written a loop or a
branch whose condition differs per chain as masked execution (a ``while`` that runs
until no lane is left, each carry kept by a ``select`` where its lane is done; a
``cond`` as both branches and a ``select``), exactly what ``jax.jit`` of the ``vmap``
computes.

The last block may be ragged (fewer than L chains left, ``lanes_valid`` of them): its
missing lanes read the last real chain's inputs again (the chain subscript of a batched
input, and of an output read back, is clamped to ``lanes_valid - 1``), so they repeat
that chain's work exactly -- a per-chain loop condition of theirs ends when the real
chain's does -- and nothing of theirs is stored (every store to an output is masked to
the valid lanes)."""

from __future__ import annotations

import math
from typing import List, Tuple

VALID = "lanes_valid"     # the kernel's name for the number of real chains in the block


def grid(sizes: Tuple[int, ...], lanes: int) -> Tuple[int, ...]:
    """The program grid over the batch levels: the innermost level in blocks of lanes."""
    if lanes == 1 or not sizes:
        return tuple(sizes)
    return tuple(sizes[:-1]) + (-(-sizes[-1] // lanes),)


def prologue(renderer, batched, sizes: Tuple[int, ...], lanes: int) -> List[str]:
    """The kernel's first lines: the program's level positions ``lv<k>``, then every
    input and output pointer moved to the program's first chain (scratch arrays are the
    caller's: per program)."""
    program = renderer.program
    levels = grid(sizes, lanes)
    lines = ["pid = tl.program_id(0).to(tl.int64)"]
    inner = [math.prod(levels[k + 1:]) for k in range(len(levels))]
    for k, size in enumerate(levels):
        level = f"pid // {inner[k]}" if inner[k] != 1 else "pid"
        lines.append(f"lv{k} = {level}" if k == 0 else f"lv{k} = ({level}) % {size}")
    last = len(sizes) - 1
    if lanes > 1:
        lines.append(f"{VALID} = tl.minimum({sizes[-1]} - lv{last} * {lanes}, {lanes})")
    for name, flags in zip(program.inputs, batched):
        element = program.buffer(name).size
        if lanes > 1 and flags[-1]:
            element //= lanes            # the block program holds L chains of it
        terms = []
        for k, moving in enumerate(flags):
            if moving:
                stride = element * math.prod(n for n, f in zip(sizes[k + 1:], flags[k + 1:])
                                             if f)
                if k == last and lanes > 1:
                    stride *= lanes
                terms.append(f"lv{k} * {stride}")
        if terms:
            lines.append(f"{renderer.pointer(name)} = {renderer.pointer(name)} + "
                         f"{' + '.join(terms)}")
    # the program's first chain, row-major over all levels
    if lanes > 1:
        first = [f"lv{k} * {math.prod(sizes[k + 1:])}" for k in range(last)] + \
            [f"lv{last} * {lanes}"]
        chain = "(" + " + ".join(first) + ")"
    else:
        chain = "pid"
    for name in program.outputs:
        size = program.buffer(name).size // lanes
        lines.append(f"{renderer.pointer(name)} = {renderer.pointer(name)} + {chain} * {size}")
    return lines


def chain_bound(renderer, buffer: str, axis: int):
    """The largest chain subscript a read of ``buffer`` along ``axis`` may take in a
    block that may be ragged (``lanes_valid - 1``), or None where the axis is not the
    chain axis of a batched input or of an output."""
    if renderer.lanes > 1 and axis == 0 and buffer in renderer.lane_buffers:
        return f"({VALID} - 1)"
    return None


def output_mask(renderer, buffer: str, lane: str):
    """The mask keeping a store to ``buffer`` on the valid lanes (``lane``: the chain
    position, a tile or a scalar), or None where every lane is stored."""
    if renderer.lanes > 1 and buffer in renderer.program.outputs:
        return f"({lane} < {VALID})"
    return None


__all__ = ["VALID", "chain_bound", "grid", "output_mask", "prologue"]
