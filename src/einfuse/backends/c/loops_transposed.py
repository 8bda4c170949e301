"""A contraction whose every reader reads it across its rows is stored transposed.

The weight gradient of a layer in a scan's backward is ``g[i, j] = sum_r d[r, i] *
h[r, j]``, and JAX's transpose of the scan reads it as ``g[j, i]`` in the statement
that accumulates it (``c[a, b] += g[b, a] * s[a, b]``: the transposed contraction,
times the softplus's derivative).  That read walks ``g`` down a column, one element
per row, so the accumulation cannot load a vector of ``g``: a scalar loop, a tenth of
the vmapped seed's gradient (256 x 2000 x 32, float64, one thread).

When every read of ``g`` has that form (its first subscript the reader's innermost
index, its second another index), ``g`` is computed transposed instead, ``g_t[j, i] =
sum_r h[r, j] * d[r, i]``, which is still a register-blocked contraction
(backends/c/loops_dot.py: ``d``'s contiguous rows along the output row), and each read
``g[p, q]`` becomes ``g_t[q, p]``: contiguous in the reader's inner loop.  Every
element sums the same products in the same order (a product's two factors swapped:
the same bits), so values do not change; only where they are stored.  Applied by
backends/c/loops_rewrite.optimise."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Set, Tuple

from ...ir import (Apply, Assign, Cast, Expr, Index, JitProgram, Loop, Read, ReduceOp,
                   ScatterAdd, Select, Step, Switch, map_reads)
from ...plan.jit_vectors import jit_vectors
from .loops_dot import contraction_operands, mentions


def stored_transposed(program: JitProgram, min_row: int) -> JitProgram:
    """``program`` with each qualifying contraction stored transposed (itself when
    none qualifies); ``min_row``: the shortest output row worth a blocked contraction."""
    shapes = {b.name: b.shape for b in program.buffers}
    fixed: Set[str] = set(program.inputs) | set(program.outputs)
    writes: Dict[str, int] = {}
    candidates: Dict[str, Assign] = {}
    # the reads of each buffer: True where transposed-form, False anywhere else
    forms: Dict[str, List[bool]] = {}

    def note_reads(node: Expr, inner: Optional[str]) -> None:
        if isinstance(node, Read):
            subs = node.subscripts
            transposed = inner is not None and len(subs) == 2 and subs[0] == Index(inner) \
                and isinstance(subs[1], Index) and subs[1].name != inner
            forms.setdefault(node.buffer, []).append(transposed)
            for sub in subs:
                note_reads(sub, None)
        elif isinstance(node, Apply):
            for arg in node.args:
                note_reads(arg, inner)
        elif isinstance(node, Cast):
            note_reads(node.arg, inner)
        elif isinstance(node, Select):
            note_reads(node.which, inner)
            for case in node.cases:
                note_reads(case, inner)

    def visit(steps) -> None:
        for step in steps:
            if isinstance(step, Assign):
                writes[step.buffer] = writes.get(step.buffer, 0) + 1
                for sub in step.prefix:
                    note_reads(sub, None)
                if step.value is not None:
                    note_reads(step.value, step.indices[-1][0] if step.indices else None)
                if step.reduction is not None:
                    note_reads(step.reduction.body, None)
                    if _swappable(step, shapes, min_row):
                        candidates[step.buffer] = step
            elif isinstance(step, ScatterAdd):
                writes[step.buffer] = writes.get(step.buffer, 0) + 2
                for node in step.target + (step.valid, step.value):
                    note_reads(node, None)
            elif isinstance(step, Loop):
                visit(step.condition_steps)
                visit(step.body)
                if step.condition is not None:
                    note_reads(step.condition, None)
                for carry, new in step.updates:
                    fixed.update((carry, new))
            elif isinstance(step, Switch):
                note_reads(step.which, None)
                for body in step.branches:
                    visit(body)
    visit(program.steps)
    chosen = {name for name in candidates
              if name not in fixed and writes.get(name) == 1 and forms.get(name)
              and all(forms[name])}
    if not chosen:
        return program

    def read(node: Read, subs) -> Expr:
        return dataclasses.replace(node, subscripts=(subs[1], subs[0]) if node.buffer in chosen
                                   else subs)

    def swap(node: Expr) -> Expr:
        return map_reads(node, read)

    def rewrite(steps) -> Tuple[Step, ...]:
        out: List[Step] = []
        for step in steps:
            if isinstance(step, Assign):
                if step.buffer in chosen:
                    step = dataclasses.replace(
                        step, indices=step.indices[::-1],
                        origin=step.origin + " (stored transposed: read across its rows)")
                elif step.value is not None:
                    step = dataclasses.replace(step, value=swap(step.value))
            elif isinstance(step, Loop):
                step = dataclasses.replace(step, condition_steps=rewrite(step.condition_steps),
                                           body=rewrite(step.body))
            elif isinstance(step, Switch):
                step = dataclasses.replace(step, branches=tuple(rewrite(b)
                                                                for b in step.branches))
            out.append(step)
        return tuple(out)
    buffers = tuple(dataclasses.replace(b, shape=b.shape[::-1]) if b.name in chosen else b
                    for b in program.buffers)
    return dataclasses.replace(program, buffers=buffers, steps=rewrite(program.steps))


def _swappable(step: Assign, shapes, min_row: int) -> bool:
    """Whether ``step`` is a 2-D float sum that, its output indices swapped, is still a
    blocked contraction, and both forms sum each element's terms in order."""
    if step.prefix or len(step.indices) != 2 or step.reduction.op is not ReduceOp.SUM:
        return False
    (_, rows), (_, columns) = step.indices
    if rows < min_row or columns < 2 or tuple(shapes[step.buffer]) != (rows, columns):
        return False
    swapped = dataclasses.replace(step, indices=step.indices[::-1])
    dtype = step.reduction.body.dtype
    if contraction_operands(swapped, dtype) is None:
        return False
    return _in_order(step, dtype) and _in_order(swapped, dtype)


def _in_order(step: Assign, dtype) -> bool:
    """Whether ``step``'s rendering sums each element's terms one after the other: the
    plain nest, or a blocked contraction over a batch of rows (loops_dot's ``row``); a
    single blocked row may split its sum into partial sums (a rounding difference)."""
    found = contraction_operands(step, dtype)
    if found is None:
        return True
    (outer, outer_extent), (_, extent) = step.indices
    return outer_extent > 1 and not mentions(found[1], outer) and \
        extent >= jit_vectors().lanes(dtype.numpy.itemsize)
