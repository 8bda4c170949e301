"""Gradients of a forward whose output ranges do not start at 0 for a call.

``y[j] := x[j+1] * x[j+2]`` gives ``j`` the range -1..n-3 (notation.md 6.3): position
``p`` of ``y`` holds index value ``p - 1``, while derive's statements read ``dy`` at
index values (``dy[k - 1]``).  Ranges follow shapes, so this is known per call: the
statement is then derived again with ``dOUT`` read at positions, ``dy[j + 1]`` for the
index value ``j`` (``dx[k] := dy[k] * x[k + 1] + dy[k - 1] * x[k - 1]``), and those
statements replace the derivation's for calls of these starts.  The statement itself is
not rewritten: its ranges are inferred exactly as for the forward."""

from __future__ import annotations

import dataclasses
import functools
from typing import Dict, List, Mapping, Tuple

from ..analysis.spec import analyse
from ..errors import EinfuseError
from ..lang import parse
from ..lang.printer import format_statement
from .derive import GradientStatement, Deriver

# Derivations kept per gradient statement, one per set of starts.
_KEPT = 16


def output_starts(g: GradientStatement, ranges: Mapping[str, Tuple[int, int]]
                  ) -> Dict[str, int]:
    """{output index: first value} of ``g``'s forward where that is not 0 (``ranges``:
    the forward's ranges for a call).  A gradient of a gradient has none: its outputs
    are the frame indices, which run over whole axes."""
    if g.parent is not None:
        return {}
    return {index: ranges[index][0] for index in output_indices(g.forward)
            if ranges[index][0] != 0}


@functools.lru_cache(maxsize=1024)
def output_indices(statement: str) -> Tuple[str, ...]:
    """The output indices of a statement's text (asked per backward)."""
    return parse(statement).output_indices


def rebased(g: GradientStatement, starts: Mapping[str, int]) -> List[GradientStatement]:
    """The statements computing the gradient that ``g`` and the others derived with it
    compute together, for calls whose forward output indices start at ``starts``: all
    of them for the first statement (``g.part == 0``), none for the others.  Each adds
    into ``g.target`` (a program's backward names its parts)."""
    if g.part != 0:
        return []
    key = tuple(sorted(starts.items()))
    cache = g.__dict__.setdefault("_rebased", {})
    found = cache.get(key)
    if found is None:
        found = _derive(g, dict(starts))
        if len(cache) >= _KEPT:
            cache.clear()
        cache[key] = found
    return found


def _derive(g: GradientStatement, starts: Dict[str, int]) -> List[GradientStatement]:
    spec = analyse(parse(g.forward))
    try:
        found = Deriver(spec, g.wrt, g.output_grad, dict(g.forward_options), None,
                         starts).run()
    except EinfuseError as error:
        if error.source is None:
            error.source = g.forward
        raise
    return [_writing(r, g.target) for r in found]


def _writing(g: GradientStatement, target: str) -> GradientStatement:
    """``g`` adding into ``target``; a gather's text names it as its output too (a
    program's fused backward reads its kernels' outputs by name)."""
    fallback = [dataclasses.replace(f, target=target) for f in g.fallback]
    if g.kind != "gather" or parse(g.text).output == target:
        return dataclasses.replace(g, target=target, fallback=fallback)
    text = format_statement(dataclasses.replace(parse(g.text), output=target))
    return dataclasses.replace(g, text=text, target=target, fallback=fallback,
                               description=text)
