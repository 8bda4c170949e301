"""The backward of a statement or program run on DTensors, planned by the same planner
as its forward (planner.py): the program's gradient statements (runtime/backward.py
derives them: one sweep for every input that needs a gradient, each contribution a
gather statement, a ``Total`` adding them up) become a program of ':=' statements, on
the forward's assignment, whose inputs arrive where they are -- the saved inputs and
intermediates at their placements in the forward, each output's gradient (the
cotangent) at the placement torch hands over -- and whose results leave at the
placements of the inputs as the caller passed them (a ``Partial`` input's gradient
replicated on those mesh dimensions).  The moves between are the plan's: what torch
issues in the backward is what ``explain(..., gradients=True)`` shows.

What cannot be planned (a gradient that is a scatter, a range the gradient statement
sets on a split index, a placement a DTensor cannot say) raises ``BackwardNotPlanned``
when the forward is planned, and the call keeps autograd through DTensor's own ops
(dtensor.py); explain says why."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..errors import EinfuseError
from ..lang.ast import accesses
from ..lang.parser import parse
from ..runtime.backward import Total, backward_program
from ..runtime.gradient_reference import resolve_options, statements_to_run, text_kernel
from .api import Statements, choose
from .cost import CostModel
from .layout import Move, Pending, Placement, moves_between
from .mesh import MeshShape
from .planner import ShardPlan, StatementPlan


class BackwardNotPlanned(EinfuseError):
    """The backward of this call cannot be planned on the mesh (the reason says why);
    autograd then goes through DTensor's own ops."""


@dataclass(frozen=True)
class BackwardProgram:
    """The gradient statements of a forward program for inputs ``wrt``, as ':='
    statements compiled for the global shapes: they read ``reads`` (forward names) and
    ``seeds`` (one output gradient per forward output, ``d<output>``), and
    ``results[n]`` is the name of ``d<wrt[n]>`` (None where no output depends on it)."""
    kernels: Tuple[object, ...]
    texts: Tuple[str, ...]
    reads: Tuple[str, ...]
    seeds: Tuple[str, ...]
    outputs: Tuple[str, ...]          # the forward outputs the seeds belong to
    wrt: Tuple[str, ...]
    results: Tuple[Optional[str], ...]
    params: Tuple[str, ...]

    def statements(self) -> Statements:
        inputs = tuple(dict.fromkeys(self.reads + self.seeds))
        return Statements(self.kernels, self.texts, inputs, (), "\n".join(self.texts),
                          self.params)


def forward_options(options) -> Dict[str, object]:
    """The forward's ranges/pad/bounds/fill (an ``Options``), as derive takes them."""
    passed = {key: getattr(options, key) for key in ("pad", "bounds", "fill")
              if getattr(options, key, None) is not None}
    if getattr(options, "ranges", None):
        passed["ranges"] = {n: range(lo, hi) for n, (lo, hi) in options.ranges}
    return passed


def backward_statements(program: Statements, options, wrt: Sequence[str],
                        shapes: Mapping[str, object]) -> BackwardProgram:
    """The backward of ``program`` for ``wrt`` as ':=' statements for arrays like
    ``shapes`` (placeholders of every forward name at its global shape, the scalar
    parameters as numbers)."""
    specs = [k.spec for k in program.kernels]
    try:
        backward = backward_program(program.texts, specs, program.outputs, tuple(wrt),
                                    forward_options(options))
    except EinfuseError as error:
        raise BackwardNotPlanned(f"its gradient is not derived here: {error}") from None
    backend = getattr(options, "backend", "auto")
    shapes = dict(shapes)
    seeds = dict(zip(backward.seeds, program.outputs))
    for seed, output in seeds.items():
        shapes[seed] = _like(shapes[output])
    indices: Dict[str, Tuple[str, ...]] = {
        seed: next(s.output_indices for s in specs if s.output == output)
        for seed, output in seeds.items()}
    kernels, texts = [], []
    for step in backward.steps:
        if isinstance(step, Total):
            text = _total_text(step, indices, shapes, backward.index_names)
            options_of = {}
        else:
            chosen = statements_to_run([step.statement], shapes)
            if len(chosen) != 1 or chosen[0].kind != "gather":
                raise BackwardNotPlanned(
                    f"the gradient of {step.like} through {step.statement.forward!r} is a "
                    "scatter-add, which the planner does not split")
            text = chosen[0].text
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                options_of = _local_options(text, resolve_options(chosen[0], shapes),
                                            shapes)
        try:
            kernel = text_kernel(text, options_of, backend)
        except EinfuseError as error:
            raise BackwardNotPlanned(f"gradient statement {text!r}: {error}") from None
        kernels.append(kernel)
        texts.append(text)
        spec = kernel.spec
        indices[spec.output] = spec.output_indices
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            call = kernel.bind(arrays={n: shapes[n] for n in spec.arg_order if n in shapes})
        shapes[spec.output] = np.broadcast_to(np.zeros((), call.dtypes.result),
                                              tuple(call.output_shape))
    defined = {k.spec.output for k in kernels}
    reads = tuple(dict.fromkeys(n for k in kernels for n in k.spec.arg_order
                                if n not in defined and n not in seeds and
                                n not in program.params))
    return BackwardProgram(tuple(kernels), tuple(texts), reads, tuple(backward.seeds),
                           tuple(program.outputs), tuple(backward.wrt),
                           tuple(backward.results), tuple(program.params))


def _like(value):
    dtype = np.dtype(value.dtype)
    return np.broadcast_to(np.zeros((), dtype if dtype.kind in "fc" else np.float64),
                           np.shape(value))


def _local_options(text: str, options: Dict[str, object], shapes) -> Dict[str, object]:
    """``options`` without the ranges the statement's arrays give anyway (an index
    subscripting an axis of that whole extent from 0): on a device the arrays are its
    blocks, so their ranges are its blocks' too, where a range fixed for the global
    shapes would not be.  A range left (one the arrays do not give) is refused by the
    planner where its index is split."""
    ranges = dict(options.get("ranges", {}))
    statement = parse(text)
    given: Dict[str, int] = {}
    for access in accesses(statement.rhs):
        shape = np.shape(shapes.get(access.tensor, ()))
        for axis, sub in enumerate(access.indices):
            if sub.plain_index is not None and axis < len(shape):
                given.setdefault(sub.plain_index, shape[axis])
    for index, bounds in list(ranges.items()):
        if bounds.start == 0 and given.get(index) == bounds.stop:
            del ranges[index]
    result = dict(options)
    if ranges:
        result["ranges"] = ranges
    else:
        result.pop("ranges", None)
    return result


def _total_text(total: Total, indices: Mapping[str, Tuple[str, ...]], shapes,
                spare: Tuple[str, ...]) -> str:
    """``target[...] := part1[...] + part2[...]`` over the indices of the first part's
    own statement (so that the total splits as that part does), else spare names."""
    rank = np.ndim(shapes[total.parts[0]])
    chosen = indices.get(total.parts[0], ())
    if len(chosen) != rank or len(set(chosen)) != rank:
        chosen = spare[:rank]
    subscript = f"[{', '.join(chosen)}]" if rank else ""
    return f"{total.target}{subscript} := " + " + ".join(p + subscript for p in total.parts)


def placements_in(plan: ShardPlan) -> Dict[str, List[Placement]]:
    """Where each name of ``plan`` lives once its step ran (inputs where the plan reads
    them first, results of statements and of moves), without pending reductions where a
    reduced placement exists too: what the forward saves for the backward."""
    found: Dict[str, List[Placement]] = {}
    for name, place in plan.inputs:
        found.setdefault(name, []).append(place)
    for step in plan.steps:
        name, place = (step.output, step.output_placement) if isinstance(
            step, StatementPlan) else (step.tensor, step.target)
        if place not in found.setdefault(name, []):
            found[name].append(place)
    for name, places in found.items():
        plain = [p for p in places if p.pending is None]
        if plain:
            found[name] = plain
    return found


def plan_backward(forward: ShardPlan, program: BackwardProgram, mesh: MeshShape,
                  given: Mapping[str, Sequence[Placement]],
                  targets: Mapping[str, Placement], model: CostModel) -> ShardPlan:
    """The backward's plan: the gradient statements on the forward's assignment, each
    input moved from where it is (``given``: the saved names' placements, each seed's
    own) to where the plan reads it, and each gradient moved to ``targets[wrt]``."""
    statements = program.statements()
    used = set(statements.indices)
    shard = {i: axes for i, axes in forward.assignment.pairs if i in used}
    values = {}
    for name in statements.inputs:
        info = forward.tensor(name) if name not in program.seeds else forward.tensor(
            program.outputs[program.seeds.index(name)])
        dtype = np.dtype(info.dtype)
        values[name] = np.broadcast_to(np.zeros((), dtype if name not in program.seeds or
                                                dtype.kind in "fc" else np.float64),
                                       info.shape)
    for name in program.params:
        values[name] = 1.0
    try:
        plan = choose(statements, values, mesh, shard, model, rank=False,
                      narrow=False).plan
    except EinfuseError as error:
        raise BackwardNotPlanned(f"the gradient statements do not plan on the mesh: "
                                 f"{error}") from None
    before: List[Move] = []
    inputs = []
    for name, want in plan.inputs:
        have = list(given[name])
        if want in have:
            inputs.append((name, want))
            continue
        info = plan.tensor(name)
        itemsize = np.dtype(info.dtype).itemsize
        options = [(moves_between(name, info.shape, itemsize, source, want, mesh,
                                  f"the backward reads {name} at {want}"), source)
                   for source in have]
        moves, source = min(options, key=lambda pair: (sum(m.bytes_sent for m in pair[0]),
                                                       len(pair[0])))
        before += moves
        inputs.append((name, source))
    where = placements_after(plan)
    after: List[Move] = []
    outputs = []
    for name, result in zip(program.wrt, program.results):
        if result is None or name not in targets:
            continue
        source, target = where[result], targets[name]
        info = plan.tensor(result)
        if source != target:
            after += moves_between(result, info.shape, np.dtype(info.dtype).itemsize,
                                   source, target, mesh, f"{name}'s gradient at {target}")
        outputs.append((result, target))
    return replace(plan, inputs=tuple(inputs), steps=tuple(before) + plan.steps +
                   tuple(after), outputs=tuple(outputs))


def placements_after(plan: ShardPlan) -> Dict[str, Placement]:
    """Each statement output's placement where its statement leaves it."""
    return {s.output: s.output_placement for s in plan.statements}


def placement_parts(placements, mesh: MeshShape, keep_partial: bool):
    """The einfuse placement of a DTensor's ``placements`` (one per mesh dimension):
    ``Shard(axis)`` puts the dimension's mesh axis on that tensor axis (in the mesh's
    order, the first the major one, as DTensor does); ``Partial`` is a pending
    reduction (``keep_partial``) or nothing (a gradient's target: replicated there).
    Read by duck typing (no torch import); a placement einfuse has no word for (a
    strided shard, a Partial mean) raises BackwardNotPlanned."""
    names = mesh.names
    layout: Dict[int, List[str]] = {}
    pending_axes, op = [], None
    for m, place in enumerate(placements):
        kind = type(place).__name__
        if kind == "Shard":
            layout.setdefault(place.dim, []).append(names[m])
        elif kind == "Partial":
            reduce = str(getattr(place, "reduce_op", "sum"))
            if reduce not in ("sum", "max", "min") or op not in (None, reduce):
                raise BackwardNotPlanned(f"a Partial({reduce!r}) placement is not planned")
            op = reduce
            pending_axes.append(names[m])
        elif kind != "Replicate":
            raise BackwardNotPlanned(f"a {kind} placement is not planned")
    return layout, (Pending(op, tuple(pending_axes)) if pending_axes and keep_partial
                    else None)


def dtensor_placement(value, mesh: MeshShape, keep_partial: bool) -> Placement:
    layout, pending = placement_parts(value.placements, mesh, keep_partial)
    return Placement(tuple(tuple(layout.get(axis, ())) for axis in range(value.ndim)),
                     pending)


def forward_shapes(forward: ShardPlan, params: Sequence[str]) -> Dict[str, object]:
    """Placeholders of every name of the forward plan at its global shape and dtype."""
    shapes: Dict[str, object] = {t.name: np.broadcast_to(np.zeros((), t.dtype), t.shape)
                                 for t in forward.tensors}
    shapes.update({name: 1.0 for name in params})
    return shapes


def seed_placements(forward: ShardPlan, program: BackwardProgram) -> Dict[str, Placement]:
    """Each output gradient where the output is (the cotangent's usual placement)."""
    outputs = dict(forward.outputs)
    return {seed: outputs[output] for seed, output in zip(program.seeds, program.outputs)}


def backward_plan(forward: ShardPlan, program: BackwardProgram, mesh: MeshShape,
                  seeds: Mapping[str, Placement], targets: Mapping[str, Placement],
                  model: CostModel) -> ShardPlan:
    """:func:`plan_backward` with the saved names where the forward leaves them and
    the seeds at ``seeds``."""
    given = dict(placements_in(forward))
    for seed in program.seeds:
        given[seed] = [seeds[seed]]
    return plan_backward(forward, program, mesh, given, targets, model)


def gradient_inputs(values: Mapping[str, object], forward: ShardPlan) -> Tuple[str, ...]:
    """The inputs a backward is planned for: the DTensors that require a gradient, or
    (none does: explaining) every floating input."""
    names = [n for n, _ in forward.inputs]
    floating = [n for n in names if np.dtype(forward.tensor(n).dtype).kind in "fc"]
    wanted = [n for n in floating if getattr(values.get(n), "requires_grad", False)]
    return tuple(wanted or floating)


def gradient_targets(values: Mapping[str, object], forward: ShardPlan, mesh: MeshShape,
                     wrt: Sequence[str]) -> Dict[str, Placement]:
    """Where each input's gradient goes: the caller's DTensor's placement (a Partial
    dimension replicated), else where the forward read it."""
    read = dict(forward.inputs)
    targets = {}
    for name in wrt:
        value = values.get(name)
        targets[name] = dtensor_placement(value, mesh, False) \
            if hasattr(value, "placements") else Placement(read[name].layout)
    return targets


__all__ = ["BackwardNotPlanned", "BackwardProgram", "backward_plan", "backward_statements",
           "dtensor_placement", "forward_shapes", "gradient_inputs", "gradient_targets",
           "placements_in", "plan_backward", "seed_placements"]
