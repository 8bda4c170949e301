"""Elementwise statements over a whole buffer as one flat loop (jit kernel renderer).

``out[c, j] = f(a[c, j], b[c, j], ...)`` over a batch of short rows - a vmapped layer's
activation, 8 rows of 12 - renders as a nest whose inner SIMD loop has only 12
iterations: one vector and a remainder of 4, each remainder element a scalar call of
``exp``.  When the target and every array the value reads are the whole of same-shaped
row-major buffers, read at the statement's own indices, the nest is one loop over the
flat position instead (96 iterations: 12 whole vectors).  The result is the same value
per element; only the loop shape changes."""

from __future__ import annotations

import math

from ...ir import Apply, Assign, Cast, Const, Expr, Index, Read, Select


def reads_only_at(node: Expr, identity, extents, shape_of, names) -> bool:
    """Whether the indices ``names`` appear in ``node`` only as the whole subscript
    ``identity`` of reads of buffers whose shape is ``extents``."""
    def walk(node: Expr) -> bool:
        if isinstance(node, Index):
            return node.name not in names
        if isinstance(node, Const):
            return True
        if isinstance(node, Read):
            if tuple(node.subscripts) == identity:
                return shape_of(node.buffer) == extents
            return all(walk(s) for s in node.subscripts)
        if isinstance(node, Apply):
            return all(walk(a) for a in node.args)
        if isinstance(node, Cast):
            return walk(node.arg)
        if isinstance(node, Select):
            return walk(node.which) and all(walk(c) for c in node.cases)
        return False
    return walk(node)


def flattens(renderer, step: Assign) -> bool:
    """Whether ``step`` is an elementwise statement over a whole buffer that reads
    whole same-shaped buffers only at its own indices (and is not given threads)."""
    if step.reduction is not None or step.value is None or step.prefix:
        return False
    extents = tuple(e for _, e in step.indices)
    if sum(e > 1 for e in extents) < 2 or step.parallel:
        return False
    program = renderer.program
    if program.buffer(step.buffer).shape != extents:
        return False
    identity = tuple(Index(n) for n, _ in step.indices)
    return reads_only_at(step.value, identity, extents,
                          lambda name: program.buffer(name).shape,
                          {n for n, _ in step.indices})


def render_flat(renderer, step: Assign) -> None:
    identity = tuple(Index(n) for n, _ in step.indices)
    total = math.prod(e for _, e in step.indices)
    shared = renderer.offset

    def offset(buffer, subscripts):
        return "ef_f" if tuple(subscripts) == identity else shared(buffer, subscripts)
    renderer.offset = offset      # this statement's reads at the flat position
    try:
        value = renderer.expr(step.value)
    finally:
        del renderer.offset
    renderer.emit("#pragma omp simd")
    renderer.emit(f"for (long long ef_f = 0; ef_f < {total}LL; ++ef_f) {{")
    renderer.emit(f"    {step.buffer}[ef_f] = {value};")
    renderer.emit("}")
