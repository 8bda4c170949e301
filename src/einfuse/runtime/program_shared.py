"""A run of a backward's kernels with its repeated expensive expressions computed once
(autodiff/cse.py), where every use reads the shared value over exactly the ranges it
is defined on; otherwise the kernels as derived."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..autodiff.cse import share
from .gradient_reference import text_kernel
from ..errors import EinfuseError
from ..lang.parser import parse
from ..lang.printer import format_statement
from .kernel_maker import compile_statement


@dataclass(frozen=True)
class Entry:
    """One kernel of a run: ``kernel`` as compiled, and for a gradient statement its
    text and resolved options (None: a recomputed forward statement or a Total, which
    is not rewritten; ``definition``: it may serve as a shared value's definition)."""
    kernel: object
    text: Optional[str] = None
    options: Optional[Dict[str, object]] = None
    definition: bool = False


def shared_kernels(entries: List[Entry], shapes: Dict[str, object], backend: str,
                   taken) -> Tuple:
    """The kernels of the run, with shared expressions where that is exact."""
    original = tuple(e.kernel for e in entries)
    rewritable = [n for n, e in enumerate(entries) if e.text is not None or e.definition]
    if len(rewritable) < 2:
        return original
    statements = [parse(entries[n].text) if entries[n].text is not None
                  else entries[n].kernel.spec.statement for n in rewritable]
    fixed = [entries[n].text is None for n in rewritable]
    rewritten, shares = share(statements, fixed, set(taken))
    if not shares:
        return original
    try:
        return _compiled(entries, rewritable, statements, rewritten, shares, shapes,
                         backend) or original
    except EinfuseError:       # a temporary the arrays cannot define: as derived
        return original


def _compiled(entries, rewritable, statements, rewritten, shares, shapes, backend):
    # map each rewritten statement back to its entry (temporaries have none)
    origin: List[Optional[int]] = []
    pending = list(zip(rewritable, statements))
    for statement in rewritten:
        if pending and statement.output == pending[0][1].output:
            origin.append(pending.pop(0)[0])
        else:
            origin.append(None)
    ranges: Dict[str, Dict[str, Tuple[int, int]]] = {}
    kernels: Dict[int, object] = {}
    for position, statement in enumerate(rewritten):
        if origin[position] is None:          # a new temporary: ranges from its arrays
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                kernel = compile_statement(format_statement(statement), backend=backend)
                call = kernel.bind(arrays={n: shapes[n] for n in kernel.spec.arg_order})
            shapes[statement.output] = np.broadcast_to(np.zeros((), call.dtypes.result),
                                                       call.output_shape)
            kernels[position] = kernel
            ranges[statement.output] = call.bounds.range_map
        elif entries[origin[position]].text is None:
            kernel = entries[origin[position]].kernel
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                call = kernel.bind(arrays={n: shapes[n] for n in kernel.spec.arg_order})
            ranges[statement.output] = call.bounds.range_map
    for item in shares:
        definition = next(s for s in rewritten if s.output == item.name)
        own = ranges[item.name]
        for position, indices in item.uses:
            used = entries[origin[position]].options.get("ranges", {})
            for axis, index in zip(definition.output_indices, indices):
                bounds = used.get(index)
                if bounds is None or (bounds.start, bounds.stop) != tuple(own[axis]):
                    return None
    by_entry = {origin[p]: p for p in range(len(rewritten)) if origin[p] is not None}
    before: Dict[int, List] = {}       # temporaries placed before an entry's statement
    waiting: List = []
    for position, statement in enumerate(rewritten):
        if origin[position] is None:
            waiting.append(kernels[position])
        else:
            before[origin[position]], waiting = waiting, []
    result: List = []
    for n, entry in enumerate(entries):
        result += before.get(n, [])
        if n in by_entry and entry.text is not None:
            text = format_statement(rewritten[by_entry[n]])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result.append(text_kernel(text, entry.options, backend))
        else:
            result.append(entry.kernel)
    return tuple(result)
