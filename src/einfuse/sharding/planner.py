"""The collective planner: which block of each statement a device computes, what each
statement reads at which placement, and the moves (collectives and local slices) in
between.

Rules, each for correctness first:

* An index is split in a statement only where every use of it is a plain subscript
  (``X[i, k]``, not ``x[i + a]`` or ``j <= i``), so a device's block of the index is a
  block of each array; and, for a reduced index, only where its reduction (a sum, max
  or min) is the outermost operation of the right side, so a device's partial result
  combines with the others' by the same reduction.  Elsewhere the statement runs with
  that index whole, reading the arrays gathered along it (explain says so).
* A partial sum is reduced where its value is first needed: a statement that is linear
  in it (sums, differences, products with values that are not partial, division by
  them, sums over indices; not ``relu``, not ``+ bias``) and does not split its own
  indices over the partial's mesh axes computes a partial result in turn, so the
  reduction moves past it.  Anything else reduces it first (an all-reduce, or a
  reduce-scatter where the reader wants it split over those same mesh axes)."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import EinfuseError, OptionError, ShapeError, attach_statement
from ..lang.ast import Access, Binary, IndexValue, Reduce, Unary, accesses, reductions
from .layout import Move, Pending, Placement, moves_between
from .mesh import Assignment, MeshAxes, MeshShape, axes_text, check_statement_axes
from ..analysis.cost import count_flops, device_flops
from ..schedule.choose import runs_hoisted

SPLITTABLE_REDUCTIONS = ("sum", "max", "min")


@dataclass(frozen=True)
class StatementPlan:
    """One statement as every device runs it on its blocks."""
    number: int                              # 1-based
    text: str
    split: Assignment                        # the indices this statement splits
    notes: Tuple[str, ...]                   # why an assigned index is not split here
    reads: Tuple[Tuple[str, Placement], ...]
    output: str
    output_shape: Tuple[int, ...]            # global
    output_placement: Placement
    local_output_shape: Tuple[int, ...]
    flops: int                               # the whole statement, one device alone
    local_flops: int                         # what each device computes
    deferred: Tuple[str, ...] = ()           # partial sums read without reducing them


Step = Union[Move, StatementPlan]


@dataclass(frozen=True)
class TensorShape:
    name: str
    shape: Tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class ShardPlan:
    mesh: MeshShape
    assignment: Assignment
    inputs: Tuple[Tuple[str, Placement], ...]
    steps: Tuple[Step, ...]
    outputs: Tuple[Tuple[str, Placement], ...]
    tensors: Tuple[TensorShape, ...]

    @property
    def statements(self) -> Tuple[StatementPlan, ...]:
        return tuple(s for s in self.steps if isinstance(s, StatementPlan))

    @property
    def collectives(self) -> Tuple[Move, ...]:
        return tuple(s for s in self.steps if isinstance(s, Move) and s.kind.is_collective)

    @property
    def local_flops(self) -> int:
        return sum(s.local_flops for s in self.statements)

    @property
    def bytes_sent(self) -> int:
        return sum(m.bytes_sent for m in self.collectives)

    @property
    def input_bytes(self) -> int:
        """Bytes of the input blocks one device holds."""
        total = 0
        for name, place in self.inputs:
            info = self.tensor(name)
            total += int(np.prod(place.local_shape(info.shape, self.mesh), dtype=np.int64)) \
                * np.dtype(info.dtype).itemsize
        return total

    def tensor(self, name: str) -> TensorShape:
        return next(t for t in self.tensors if t.name == name)


@dataclass(frozen=True)
class BoundStatement:
    """What the planner needs of one statement for the global shapes: its kernel, the
    bounds (ranges) and result, found once and shared by every assignment tried."""
    number: int
    text: str
    kernel: object
    bounds: object
    output_shape: Tuple[int, ...]
    result_dtype: np.dtype
    hoisted: object                          # the hoisted statements FLOPs count, or None


_NARROWED = {np.dtype(np.float64): np.dtype(np.float32), np.dtype(np.int64): np.dtype(np.int32),
             np.dtype(np.uint64): np.dtype(np.uint32),
             np.dtype(np.complex128): np.dtype(np.complex64)}


def run_dtype(dtype) -> np.dtype:
    """The dtype an array of ``dtype`` has in a sharded run, which is JAX's: 64-bit
    types are 32-bit unless JAX's x64 mode is on (read without importing JAX)."""
    dtype = np.dtype(dtype)
    jax = sys.modules.get("jax")
    if jax is not None:
        x64 = bool(jax.config.jax_enable_x64)
    else:
        x64 = os.environ.get("JAX_ENABLE_X64", "").lower() in ("1", "true", "yes", "on")
    return dtype if x64 else _NARROWED.get(dtype, dtype)


def _as_run(value):
    """A placeholder with the dtype the sharded run gives it."""
    if not hasattr(value, "dtype") or run_dtype(value.dtype) == value.dtype:
        return value
    return np.broadcast_to(np.zeros((), run_dtype(value.dtype)), np.shape(value))


def bind_statements(kernels: Sequence, texts: Sequence[str],
                    values: Mapping[str, object], narrow: bool = True) -> Tuple[
                        List[BoundStatement], Dict[str, TensorShape]]:
    """Bind each statement to the global shapes (placeholders), in order, with each
    intermediate a placeholder of its inferred shape; dtypes are those of the JAX run
    (``run_dtype``; with ``narrow`` False, for a torch run, the arrays' own), so that
    the bytes moved are the run's."""
    as_run = _as_run if narrow else (lambda value: value)
    values = {name: as_run(value) for name, value in values.items()}
    env = dict(values)
    bound, shapes = [], {}
    too_big: Dict[str, Tuple[int, Tuple[int, ...]]] = {}
    for name, value in values.items():
        if hasattr(value, "shape"):
            shapes[name] = TensorShape(name, tuple(value.shape), np.dtype(value.dtype).name)
    for number, (kernel, text) in enumerate(zip(kernels, texts), 1):
        spec = kernel.spec
        if spec.assign != ":=":
            raise attach_statement(OptionError(
                f"'{spec.assign}' writes into an existing array; with mesh= every statement "
                "creates its result with ':='", span=spec.statement.output_span), text)
        huge = next((n for n in spec.arg_order if n in too_big), None)
        if huge is not None:
            raise attach_statement(ShapeError(
                f"{huge} (statement {too_big[huge][0]}) would have the shape "
                f"{too_big[huge][1]}: more bytes than an array can hold, so statement "
                f"{number} cannot read it"), text)
        call = kernel.bind(arrays={n: env[n] for n in spec.arg_order if n in env})
        form = kernel.hoisted_form
        hoisted = form.hoisted if runs_hoisted(form, call) else None
        result = run_dtype(call.dtypes.result) if narrow else np.dtype(call.dtypes.result)
        bound.append(BoundStatement(number, text, kernel, call.bounds,
                                    tuple(call.output_shape), result, hoisted))
        if math.prod(call.output_shape) * result.itemsize > np.iinfo(np.int64).max:
            too_big[spec.output] = (number, tuple(call.output_shape))   # a result only
        else:
            env[spec.output] = np.broadcast_to(np.zeros((), result), call.output_shape)
        shapes[spec.output] = TensorShape(spec.output, tuple(call.output_shape), result.name)
    return bound, shapes


def plan_program(statements: Sequence[BoundStatement], shapes: Mapping[str, TensorShape],
                 outputs: Sequence[str], mesh: MeshShape, assignment: Assignment,
                 source: str) -> ShardPlan:
    placements: Dict[str, List[Placement]] = {}
    inputs: List[Tuple[str, Placement]] = []
    steps: List[Step] = []
    for st in statements:
        spec = st.kernel.spec
        try:
            check_statement_axes(assignment, spec.all_indices, st.text)
            split, notes = _split_indices(spec, assignment)
            # only the indices split here make blocks (a shifted read runs its index whole)
            _check_divisible(st, split, mesh)
        except EinfuseError as error:
            raise attach_statement(error, st.text) from None
        _check_ranges(st, split)
        reads = _required(spec, split)
        deferred: List[str] = []
        pending_axes: MeshAxes = ()
        used_axes = {a for _, axes in split.pairs for a in axes}
        for name, want in reads.items():
            if name not in placements:            # a program input: arrives as wanted
                placements[name] = [want]
                inputs.append((name, want))
                continue
            have = placements[name]
            if want in have:
                continue
            partial = have[0].pending
            if partial is not None and not deferred and partial.op == "sum" and \
                    have[0].layout == want.layout and not set(partial.axes) & used_axes and \
                    _linear(spec.rhs, name) and _own_reduction(spec, split) in (None, "sum"):
                deferred.append(name)
                pending_axes = partial.axes
                reads[name] = have[0]
                continue
            why = f"statement {st.number} reads {name} at {want}"
            best = min((moves_between(name, shapes[name].shape,
                                      np.dtype(shapes[name].dtype).itemsize, source_at,
                                      want, mesh, why) for source_at in have),
                       key=lambda ms: (sum(m.bytes_sent for m in ms), len(ms)))
            steps.extend(best)
            kept = [p for p in have if p.pending is None]
            placements[name] = kept + [m.target for m in best if m.target not in kept]
        own = _own_reduction(spec, split)
        own_axes = tuple(a for i in spec.reduction_indices for a in split.get(i))
        pending = None
        if own is not None or deferred:
            pending = Pending(own or "sum", tuple(dict.fromkeys(pending_axes + own_axes)))
        out_place = Placement(tuple(split.get(i) for i in spec.output_indices), pending)
        divisors = {i: mesh.size(a) for i, a in split.pairs}
        flops = count_flops(spec, st.bounds, st.hoisted)
        local = device_flops(spec, st.bounds, divisors, st.hoisted)
        steps.append(StatementPlan(
            st.number, st.text, split, tuple(notes),
            tuple((n, reads[n]) for n in reads), spec.output, st.output_shape, out_place,
            out_place.local_shape(st.output_shape, mesh), flops, local, tuple(deferred)))
        placements[spec.output] = [out_place]
    results = []
    for name in outputs:
        have = placements[name]
        place = next((p for p in have if p.pending is None), None)
        if place is None:
            target = Placement(have[0].layout)
            moves = moves_between(name, shapes[name].shape,
                                  np.dtype(shapes[name].dtype).itemsize, have[0], target,
                                  mesh, f"{name} is a result")
            steps.extend(moves)
            place = target
            placements[name] = [target]
        results.append((name, place))
    return ShardPlan(mesh, assignment, tuple(inputs), tuple(steps), tuple(results),
                     tuple(shapes.values()))


def _check_divisible(st: BoundStatement, assignment: Assignment, mesh: MeshShape) -> None:
    for index in st.kernel.spec.all_indices:
        axes = assignment.get(index)
        if axes and st.bounds.extent(index) % mesh.size(axes):
            raise ShapeError(f"index {index} has extent {st.bounds.extent(index)}, which does "
                             f"not divide into {mesh.size(axes)} equal blocks over mesh axes "
                             f"{axes_text(axes)}; einfuse does not pad: choose sizes that "
                             "divide, or another axis")


def _check_ranges(st: BoundStatement, split: Assignment) -> None:
    given = dict(st.kernel.options.ranges)
    for index, _ in split.pairs:
        if index in given:
            raise attach_statement(OptionError(
                f"ranges= sets the range of index {index}, which is sharded; a device's "
                "block of a sharded index comes from its arrays' blocks, so leave its range "
                "to the arrays, or do not shard it"), st.text)


def _split_indices(spec, assignment: Assignment) -> Tuple[Assignment, List[str]]:
    """The assigned indices this statement can split (module docstring), and a note for
    each one it runs whole."""
    notes: List[str] = []
    split: Dict[str, MeshAxes] = {}
    values = {node.name for node in spec.rhs.walk() if isinstance(node, IndexValue)}
    for index in dict.fromkeys(spec.all_indices):
        axes = assignment.get(index)
        if not axes:
            continue
        odd = next((u for u in spec.uses(index) if u.subscript.plain_index != index), None)
        twice = next((a for a in accesses(spec.rhs) if sum(
            sub.plain_index == index for sub in a.indices) > 1), None)
        if odd is not None:
            notes.append(f"{index} is not split here: {odd.access} reads it at subscript "
                         f"{odd.subscript}, so a block of {index} is not a block of "
                         f"{odd.access.tensor}")
        elif twice is not None:
            # a device would need the diagonal blocks of the array, which no
            # PartitionSpec describes (a mesh axis splits one array axis at most)
            notes.append(f"{index} is not split here: {twice} reads it at two axes, and a "
                         f"mesh axis splits only one axis of {twice.tensor}")
        elif index in values:
            notes.append(f"{index} is not split here: its value is used in the arithmetic")
        elif index in spec.reduction_indices and not (
                len([r for r in reductions(spec.rhs) if index in r.indices]) == 1 and
                _combinable(spec.rhs, spec.reduction_of(index))):
            notes.append(f"{index} is not split here: the right side is not a sum[{index}] "
                         "that it depends on linearly, nor a max or min over it as its "
                         "outermost operation, so partial results would not combine")
        else:
            split[index] = axes
    nodes = []   # partial results of two reductions would multiply or divide each other
    for index in spec.reduction_indices:
        if index in split and spec.reduction_of(index) not in nodes:
            nodes.append(spec.reduction_of(index))
    for node in nodes[1:]:
        for index in node.indices:
            if split.pop(index, None):
                notes.append(f"{index} is not split here: {nodes[0].op}"
                             f"[{', '.join(nodes[0].indices)}] already leaves a partial "
                             "result, and two partial results do not combine")
    while True:   # one tensor read at two different placements: run those indices whole
        seen: Dict[str, Placement] = {}
        clash = None
        for access in accesses(spec.rhs):
            want = _placement_of(access, split)
            if seen.setdefault(access.tensor, want) != want:
                clash = (access, seen[access.tensor], want)
                break
        if clash is None:
            break
        access, first, second = clash
        dropped = [access.indices[p].plain_index for p in range(len(second.layout))
                   if first.layout[p] != second.layout[p] and
                   access.indices[p].plain_index in split]
        if not dropped:     # the difference comes from another access's subscripts
            dropped = [i for i in split if any(sub.plain_index == i for a in accesses(
                spec.rhs) if a.tensor == access.tensor for sub in a.indices)]
        if not dropped:
            raise AssertionError(f"sharding planner: no index to drop for {access}")
        for index in dropped:
            split.pop(index)
            notes.append(f"{index} is not split here: {access.tensor} is read with "
                         f"different subscripts in one statement")
    return Assignment(tuple((i, split[i]) for i in dict.fromkeys(spec.all_indices)
                            if i in split)), notes


def _placement_of(access: Access, split: Mapping[str, MeshAxes]) -> Placement:
    return Placement(tuple(split.get(sub.plain_index, ()) if sub.plain_index else ()
                           for sub in access.indices))


def _required(spec, split: Assignment) -> Dict[str, Placement]:
    table = split.as_dict
    return {access.tensor: _placement_of(access, table) for access in accesses(spec.rhs)}


def _combinable(rhs, node: Reduce) -> bool:
    """Whether partial results of ``rhs``, each with ``node`` over a block of its
    indices, combine into the result: ``rhs`` is linear in a sum, or is the max or min."""
    if node is rhs:
        return node.op in SPLITTABLE_REDUCTIONS
    return node.op == "sum" and _linear(rhs, node)


def _own_reduction(spec, split: Assignment) -> Optional[str]:
    """The op of the reduction whose split indices leave a partial result."""
    for index in spec.reduction_indices:
        if split.get(index):
            return spec.reduction_of(index).op
    return None


def _contains(expr, name) -> bool:
    return any(n is name or isinstance(n, Access) and n.tensor == name
               for n in expr.walk())


def _linear(expr, name) -> bool:
    """Whether ``expr`` is linear and homogeneous in ``name``: a tensor's name, or one
    reduction node of it (so that the sum of its values at partial sums is its value at
    the sum)."""
    if expr is name:
        return True
    if isinstance(expr, Access):
        return expr.tensor == name and not any(
            _contains(a, name) for sub in expr.indices for a, _ in sub.gathers)
    if isinstance(expr, Unary):
        return _linear(expr.operand, name)
    if isinstance(expr, Binary):
        if expr.op in ("+", "-"):
            return _linear(expr.left, name) and _linear(expr.right, name)
        if expr.op == "*":
            return (_linear(expr.left, name) and not _contains(expr.right, name)) or \
                (_linear(expr.right, name) and not _contains(expr.left, name))
        if expr.op == "/":
            return _linear(expr.left, name) and not _contains(expr.right, name)
        return False
    if isinstance(expr, Reduce):
        return expr.op == "sum" and _linear(expr.body, name)
    return False
