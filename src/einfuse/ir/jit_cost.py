"""The operation count of the jit IR: what a step computes, and a whole program's work
per element, for the renderer's threading decision and for explain's costs."""

from __future__ import annotations

import math

from .jit import Apply, Assign, Branch, Cast, Loop, LoopKind, Node, Read, Select


def operations(node: Node) -> int:
    if isinstance(node, (Apply, Select, Cast)):
        children = node.args if isinstance(node, Apply) else (
            (node.which,) + node.cases if isinstance(node, Select) else (node.arg,))
        own = 0 if isinstance(node, Apply) and node.dtype.value[0] == "int64" and \
            node.op in ("add", "mul", "idiv", "imod", "min", "max") else 1
        return own + sum(operations(c) for c in children)
    if isinstance(node, Read):
        return sum(operations(s) for s in node.subscripts)
    return 0


def step_flops(step: Assign) -> int:
    points = math.prod(e for _, e in step.indices)
    if step.reduction is None:
        return points * operations(step.value)
    return points * math.prod(e for _, e in step.reduction.indices) * \
        (operations(step.reduction.body) + 1)


def work(steps, repeat: int = 1) -> int:
    """Operations of ``steps`` run ``repeat`` times: scan bodies times their lengths, a
    ``while_loop``'s condition and body once (its trip count is not known), every branch."""
    total = 0
    for step in steps:
        if isinstance(step, Assign):
            total += step_flops(step) * repeat
        elif isinstance(step, Loop):
            if step.kind is LoopKind.SCAN:
                inner = repeat * step.length
            else:
                total += work(step.condition_steps, repeat)
                inner = repeat
            total += work(step.body, inner)
        elif isinstance(step, Branch):
            for body in step.branches:
                total += work(body, repeat)
    return total
