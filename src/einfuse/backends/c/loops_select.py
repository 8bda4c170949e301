"""Which arms of a ``select`` the jit kernel renderer may evaluate unconditionally.

``(c) ? x[k] : 0.0`` in a loop makes GCC if-convert the read into a *masked* load, and
GCC 12.2 (Debian 12's compiler) vectorises such loads in nested loops with the mask of
the wrong vector: ``t[i, j] = a[i, j] > 0 ? g[i, j] : 0`` over a 5 x 3 buffer dropped
some of the selected elements (the gradient of ``relu(x @ w + b)`` came out wrong).
Reading every arm first and then choosing, ``({ T s0 = x[k]; T s1 = 0.0; c ? s0 :
s1; })``, gives an unconditional load and a blend, which GCC vectorises correctly (and
as fast).  That is only allowed where every read of the arms stays inside its buffer
whatever the condition: a read guarded by the select itself (``concatenate``, ``pad``,
a gather's ``mode="fill"``) keeps the conditional form.

Bounds come from the extents of the loop indices (every index name of the program with
its largest extent) through ``add``/``mul``/``min``/``max``/``idiv``/``imod`` of
constants; anything else (an index read from data) is unknown, hence unsafe."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from ...ir import (INDEX, Apply, Assign, Cast, Const, Expr, Index, JitProgram, Loop, LoopKind,
                   Read, ScatterAdd, Select, Switch)

Interval = Optional[Tuple[int, int]]


def index_extents(program: JitProgram) -> Dict[str, int]:
    """Every loop index of ``program`` with its largest extent."""
    extents: Dict[str, int] = {}

    def note(indices):
        for name, extent in indices:
            extents[name] = max(extents.get(name, 0), int(extent))

    def walk(steps):
        for step in steps:
            if isinstance(step, Assign):
                note(step.indices)
                if step.reduction is not None:
                    note(step.reduction.indices)
            elif isinstance(step, ScatterAdd):
                note(step.indices)
            elif isinstance(step, Loop):
                if step.kind is LoopKind.SCAN and step.length is not None:
                    note([(step.var, step.length)])
                walk(step.condition_steps)
                walk(step.body)
            elif isinstance(step, Switch):
                for body in step.branches:
                    walk(body)
    walk(program.steps)
    return extents


def bounds(node: Expr, extents: Dict[str, int]) -> Interval:
    """The smallest and largest value of an index expression, or None if unknown."""
    if isinstance(node, Const):
        if isinstance(node.value, bool) or not isinstance(node.value, int):
            return None
        return (node.value, node.value)
    if isinstance(node, Index):
        extent = extents.get(node.name)
        return (0, extent - 1) if extent else None
    if isinstance(node, Apply) and node.dtype is INDEX and len(node.args) == 2:
        a, b = (bounds(arg, extents) for arg in node.args)
        if a is None or b is None:
            return None
        if node.op == "add":
            return (a[0] + b[0], a[1] + b[1])
        if node.op == "mul":
            products = [x * y for x in a for y in b]
            return (min(products), max(products))
        if node.op == "min":
            return (min(a[0], b[0]), min(a[1], b[1]))
        if node.op == "max":
            return (max(a[0], b[0]), max(a[1], b[1]))
        if node.op in ("idiv", "imod") and b[0] == b[1] and b[0] > 0:
            if node.op == "imod":
                return (0, b[0] - 1)
            return (a[0] // b[0], a[1] // b[0])     # floor division is monotonic
    return None


def reads_in_bounds(node: Expr, extents: Dict[str, int], shape_of) -> bool:
    """Whether every read in ``node`` stays inside its buffer for every value of the
    loop indices (so ``node`` may be evaluated whatever a select decides)."""
    if isinstance(node, (Const, Index)):
        return True
    if isinstance(node, Read):
        for sub, extent in zip(node.subscripts, shape_of(node.buffer)):
            found = bounds(sub, extents)
            if found is None or found[0] < 0 or found[1] >= extent:
                return False
        return all(reads_in_bounds(s, extents, shape_of) for s in node.subscripts)
    if isinstance(node, Cast):
        return reads_in_bounds(node.arg, extents, shape_of)
    if isinstance(node, Apply):
        return all(reads_in_bounds(a, extents, shape_of) for a in node.args)
    if isinstance(node, Select):
        return reads_in_bounds(node.which, extents, shape_of) and \
            all(reads_in_bounds(c, extents, shape_of) for c in node.cases)
    return False
