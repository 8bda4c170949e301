"""The backward pass of a program for several inputs at once, as one sequence of
statements that the scheduler can fuse (the torch autograd node of a whole program,
program/autograd.py, runs it).

Reverse mode over the statements, last to first, as derive_program does for one
input, with three differences that make the backward cheap:

* one sweep gives the gradients of every wanted input: the gradient of a shared
  intermediate (softmax's ``de``) is computed once, not once per input;
* each contribution to a gradient is its own name (``dX_1``, ``dX_2``...) computed by
  a gather statement, and a ``Total`` statement adds them up, so that the steps are
  plain ':=' statements over the same rows that schedule/fusion.py runs as one kernel;
* names whose gradient is identically zero (a max used only as a shift inside
  ``exp``, autodiff/shift.py) are treated as constants: softmax's backward carries no
  gradient through its row maximum.

Contributions that reduce over the rows of their statement (layernorm's ``dg[j] :=
sum over i``) loop over another index first and cannot join the rows' kernel; they are
moved after the row-wise steps (they read only the seed and forward values)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional, Sequence, Set, Tuple, Union

from ..errors import EinfuseError
from ..lang.fresh_names import FreshNames
from ..lang.parser import parse
from ..lang.printer import format_statement
from .backward_steps import Contribution, Total
from .backward_fold import Folded, fold
from ..autodiff.derive import GradientStatement, derive, used_names
from ..autodiff.program_steps import (gradient_prefix, reaching_outputs, statement_options,
                                      value_names)
from ..autodiff.shift import zero_gradient_shifts


Step = Union[Contribution, Total]


@dataclass(frozen=True)
class Backward:
    """The gradients of ``wrt`` (``results[n]`` is the name of ``d<wrt[n]>``, or None
    where no output depends on it) given one seed per output (``seeds``)."""
    wrt: Tuple[str, ...]
    outputs: Tuple[str, ...]
    seeds: Tuple[str, ...]
    results: Tuple[Optional[str], ...]
    steps: Tuple[Step, ...]
    constants: FrozenSet[str]      # names whose gradient is identically zero
    reads: FrozenSet[str]          # forward names (inputs, intermediates) the steps read
    # forward names whose shapes (not values) the steps need: their ranges follow the
    # shapes of the differentiated statements' arrays
    shaped: FrozenSet[str]
    index_names: Tuple[str, ...]   # names free for the indices of a Total's statement
    taken: FrozenSet[str]          # every name in use (for new temporaries' names)
    # the steps folded to read the forward's outputs (autodiff/backward_fold.py), run
    # where exact for the call's arrays; ``reads`` and ``shaped`` cover both forms
    folded: Optional[Folded] = None

    def statements(self) -> List[str]:
        """The steps as text (gathers; scatters as their description), for display."""
        lines = []
        for step in self.steps:
            if isinstance(step, Total):
                lines.append(f"{step.target} := {' + '.join(step.parts)}")
            else:
                lines.append(str(step.statement))
        return lines


def backward_program(pieces: Sequence[str], specs: Sequence, outputs: Sequence[str],
                     wrt: Sequence[str], options: Optional[Dict[str, object]] = None
                     ) -> Backward:
    """The backward of the program whose statements are ``pieces`` (texts, with their
    analysed ``specs``) for inputs ``wrt``; every statement is a ':=' statement."""
    options = dict(options or {})
    outputs, wrt = tuple(outputs), tuple(wrt)
    constants = zero_gradient_shifts(specs, outputs)
    depends = _depends_any(specs, wrt, constants)
    reaching = reaching_outputs(specs, outputs)
    prefix = gradient_prefix(specs)
    used: Set[str] = set()
    for spec in specs:
        used |= used_names(spec)
    used |= {prefix + name for name in used}
    names = FreshNames(used)
    fresh = functools.partial(names.suffixed, bare=False)     # base_1, base_2 ...
    parts: Dict[str, List[str]] = {prefix + name: [prefix + name] for name in outputs}
    steps: List[Step] = []
    late: List[Step] = []      # contributions reducing over their statement's rows
    for spec, piece in reversed(list(zip(specs, pieces))):
        out = spec.output
        if not depends.get(out) or out not in reaching:
            continue
        seed = _total(prefix + out, parts.pop(prefix + out, []), out, steps, fresh)
        rows = spec.output_indices[0] if spec.output_indices else None
        for name in value_names(spec):
            if name in constants or not (name in wrt or depends.get(name)):
                continue
            grads = derive(piece, name, output_grad_name=seed,
                           options=statement_options(options, spec))
            for g in grads:
                key = fresh(prefix + name)
                g = _renamed(g, key)
                step = Contribution(key, prefix + name, name, g)
                parts.setdefault(prefix + name, []).append(key)
                across = rows is not None and g.kind == "gather" and \
                    rows not in parse(g.text).output_indices
                (late if across and name in wrt else steps).append(step)
    results = []
    deferred = {step.key for step in late}
    for name in wrt:
        found = parts.pop(prefix + name, [])
        # a total of row-wise parts joins their kernel; one with a deferred part waits
        where = late if deferred & set(found) else steps
        results.append(_total(prefix + name, found, name, where, fresh) if found else None)
    steps += late
    forward = {n for spec in specs for n in spec.arg_order + (spec.output,)}
    reads = frozenset(n for step in steps if isinstance(step, Contribution)
                      for n in step.statement.inputs if n in forward)
    differentiated = {s.statement.forward for s in steps if isinstance(s, Contribution)}
    shaped = frozenset(n for spec, piece in zip(specs, pieces) if piece in differentiated
                       for n in spec.arg_order) - reads
    backward = Backward(wrt, outputs, tuple(prefix + name for name in outputs),
                        tuple(results), tuple(steps), constants, reads, shaped,
                        tuple(fresh("a") for _ in range(8)), frozenset(names.taken))
    try:
        folded = fold(backward, specs, options)
    except EinfuseError:       # a folded statement the analysis refuses: as derived
        folded = None
    if folded is None:
        return backward
    reads = reads | folded.reads
    return dataclasses.replace(backward, folded=folded, reads=reads,
                               shaped=(shaped | folded.shaped) - reads)


def _depends_any(specs, wrt: Tuple[str, ...], constants) -> Dict[str, bool]:
    """For each defined name: whether it depends on one of ``wrt`` through names that
    are not constants (a constant passes no gradient on)."""
    depends: Dict[str, bool] = {name: True for name in wrt}
    for spec in specs:
        depends[spec.output] = spec.output not in constants and any(
            depends.get(n) for n in value_names(spec) if n not in constants)
    return depends


def _total(target: str, parts: List[str], like: str, steps: List[Step], fresh) -> str:
    """The name holding the sum of ``parts``: the one part itself, or a Total (into a
    new name where the caller's seed ``target`` is one of the parts)."""
    if len(parts) == 1:
        return parts[0]
    if target in parts:
        target = fresh(target)
    steps.append(Total(target, tuple(parts), like))
    return target


def _renamed(g: GradientStatement, key: str) -> GradientStatement:
    """``g`` writing ``key``: a gather's output renamed, a scatter's (and a gather's
    fallback scatters') target."""
    fallback = [dataclasses.replace(f, target=key) for f in g.fallback]
    if g.kind != "gather":
        return dataclasses.replace(g, target=key, fallback=fallback)
    statement = parse(g.text)
    text = format_statement(dataclasses.replace(statement, output=key))
    return dataclasses.replace(g, text=text, target=key, fallback=fallback,
                               description="")


__all__ = ["Backward", "Contribution", "Total", "backward_program"]
