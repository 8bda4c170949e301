"""Which parts of an ``ef.jit`` program run on threads, decided before rendering.

The decision reads the one operation count (analysis/cost.py) and is written into the
program (:attr:`einfuse.ir.Assign.parallel`) or returned as a value, so a renderer only
prints it (backends/c/loops.py shares an Assign's outermost loop among OpenMP threads
where ``parallel`` is set; loops_batch.py shares the batch elements where
``batch_threads`` says so).

* A statement gets threads with enough work: PARALLEL_WORK operations, or
  PARALLEL_WORK_IN_LOOP inside a loop of the kernel (there each step would fork and join
  the threads, and every join waits for the slowest thread of a shared machine), and an
  outermost loop of 2 or more.  Tiny statements (the seed's 12-wide layers) stay on one
  thread: a fork and join would cost more than the statement.
* A reduction rendered with its last output loop inside the reduced loops (a row of
  accumulators, :func:`accumulator_row`) whose only loop is that row gets none.
* Where the caller already runs the code on a thread team (the batch elements shared
  among threads), no statement gets threads."""

from __future__ import annotations

import dataclasses
from typing import Tuple

from .. import ir
from ..analysis.cost import step_flops, typed_work

PARALLEL_WORK = 1 << 16    # operations of a statement before its outer loop gets threads
PARALLEL_WORK_IN_LOOP = 1 << 20   # ... inside a loop of the kernel
DYNAMIC_WORK = 1 << 14     # operations of one batch element above which threads take
                           # elements one by one rather than in chunks
ROW_MIN, ROW_MAX = 4, 4096  # output rows a reduction keeps as a row of accumulators


def accumulator_row(step: ir.Assign) -> bool:
    """Whether ``step`` is a reduction rendered as a row of accumulators: its last
    output loop (ROW_MIN..ROW_MAX long) inside the reduced loops (not argmax/argmin,
    whose result is a position)."""
    return step.reduction is not None and bool(step.indices) and \
        ROW_MIN <= step.indices[-1][1] <= ROW_MAX and \
        step.reduction.op not in (ir.ReduceOp.ARGMAX, ir.ReduceOp.ARGMIN)


def statement_threads(step: ir.Assign, in_loop: bool) -> bool:
    """Whether a statement's outermost loop is worth threads (module docstring)."""
    real = [extent for _, extent in step.indices if extent != 1]
    if not real or real[0] < 2:
        return False
    if accumulator_row(step) and len(real) == 1 and step.indices[-1][1] == real[0]:
        return False    # a row reduction's only loop is its accumulator row
    return step_flops(step) >= (PARALLEL_WORK_IN_LOOP if in_loop else PARALLEL_WORK)


def decide(program: ir.JitProgram, threads_inside: bool = True) -> ir.JitProgram:
    """``program`` with each statement's ``parallel`` decided; ``threads_inside`` False:
    the caller runs the program on a thread team, so no statement gets threads."""

    def steps(body: Tuple[ir.Step, ...], in_loop: bool) -> Tuple[ir.Step, ...]:
        return tuple(step_of(step, in_loop) for step in body)

    def step_of(step, in_loop: bool):
        if isinstance(step, ir.Assign):
            parallel = threads_inside and statement_threads(step, in_loop)
            return step if step.parallel == parallel else \
                dataclasses.replace(step, parallel=parallel)
        if isinstance(step, ir.Loop):
            return dataclasses.replace(step, condition_steps=steps(step.condition_steps, True),
                                       body=steps(step.body, True))
        if isinstance(step, ir.Switch):
            return dataclasses.replace(step, branches=tuple(steps(b, in_loop)
                                                            for b in step.branches))
        return step

    return dataclasses.replace(program, steps=steps(program.steps, False))


def batch_threads(program: ir.JitProgram, elements: int) -> bool:
    """Whether a batch of ``elements`` runs of ``program`` (or blocks of them) is shared
    among threads: two or more, and at least PARALLEL_WORK operations in all (a fork
    and join costs more than smaller work).  A ``while_loop``'s body counts once."""
    return elements >= 2 and typed_work(program.steps) * elements >= PARALLEL_WORK


def one_by_one(program: ir.JitProgram) -> bool:
    """Whether threads take a batch's elements one at a time (an atomic increment each)
    rather than in chunks: for elements of some work, so that a thread descheduled on a
    shared machine (or an element whose while_loop runs longer) delays only its own."""
    return typed_work(program.steps) >= DYNAMIC_WORK


__all__ = ["DYNAMIC_WORK", "PARALLEL_WORK", "PARALLEL_WORK_IN_LOOP", "accumulator_row",
           "batch_threads", "decide", "one_by_one", "statement_threads"]
