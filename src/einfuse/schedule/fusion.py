"""Fusion groups: which consecutive statements of a program (or of a statement's hoisted
form) run as one loop nest, and the run of a sequence of statements by those groups.

A group shares its outermost parallel loop (row fusion, plan/fuse.py): softmax's
row maximum, row sum and normalised row are three loop bodies in one loop over rows,
so each row is read from memory once and then from cache.  A statement joins the
group of the statement before it when, for this call,

* both are ':=' statements with output indices, run by the C backend as one loop nest
  (no BLAS contraction, no input packed for lanes), in the same working dtype, which
  is also their result dtype (an intermediate is kept as the statement would give it);
* their outermost loops are parallel loops of the same extent over indices whose
  range starts at 0;
* every read of an intermediate written earlier in the group is a value read (not
  an index array) whose subscript on the producer's outer axis is exactly the
  reader's outer index: the row it reads is the row just written, in this thread.

A statement that sums over the group's row index and keeps the others (layernorm's
``db[j] := dy[i,j]``) and cannot join as a loop over its own outputs joins as a
*column sum* (plan/fuse_columns.py): its elementwise body is a member like any other,
whose values are added into per-thread accumulators instead of stored; statements
reading its result run after the group.

Anything else runs statement by statement, as before; so does every framework other
than NumPy (autograd and JAX trace the statements one by one) and every call whose
fused kernel reports an out-of-bounds gather (the statements then raise their own
error)."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

import numpy as np

from .. import ir
from ..errors import EinfuseError
from ..ir import LoopKind
from ..lang import ast
from ..lang.fresh_names import FreshNames
from ..lang.printer import format_expr, format_statement
from ..lang.sugar import counted, is_count
from ..plan import buffer_slots, row_kernel as row_kernels, unit_axis
from ..plan.loop_plan import input_buffers, lane_packs
from ..plan.thread_rows import fitting_rows, row_bytes
from ..analysis.capabilities import can_build
from ..analysis.result_size import fits_in_memory
from .choose import blas_contraction
from .fusion_reasons import KernelBreak, Split
from .loop_choice import loop_choice
from .row_groups import row_group_and_break, triton_rows_possible
from .units import needed as _needed, statement_units as _units

# Below this much work (points of the statements' iteration spaces) a fused kernel saves
# too little to be worth binding the group for.
MIN_FUSED_ELEMENTS = 1 << 12
# The most statements one group holds; the next starts a new group.  The C compiler's
# time grows faster than the size of a function (a chain of 1,000 statements as one
# kernel took 17 s to compile), while a row re-read from memory once per 64 statements
# costs nothing measurable; and the groups of a long regular chain print the same source,
# so they share one compiled kernel.
MAX_GROUP_STATEMENTS = 64


@dataclass(frozen=True)
class Member:
    """One statement of a fusion group, bound for this call."""
    kernel: object           # the statement's runtime Kernel
    call: object             # its BoundCall (intermediates of the group: placeholders)
    plan: object             # its C plan for this call's layouts
    buffers: Tuple           # its input arrays (working dtype) and output, by slot
    outer: str               # the index of its outermost (shared) loop
    extent: int
    reads: Dict[int, Tuple[int, int]]   # slot -> (producer member, producer's out slot)
    # per input slot, the environment's key it is read from (None: a member's output)
    sources: Tuple[Optional[str], ...] = ()
    # a sum over the rows (plan/fuse_columns.py): the statement as written, bound;
    # ``kernel`` and ``call`` are then its elementwise body with the rows kept
    column: Optional["ColumnOf"] = None
    # the schedule's loop choice ``plan`` is the lowering of (schedule/loop_choice.py):
    # what the fused group's compiled kernel is keyed by (backends/c/fused.py)
    choice: object = None


@dataclass(frozen=True)
class ColumnOf:
    """The statement a column member computes, and its call."""
    kernel: object
    call: object


# The longest row (bytes) of a column sum's accumulators in a fused group: each row of
# the loop reads and writes two of them, so they must stay in the core's cache.
COLUMN_ROW_BYTES = 1 << 16

def column_members(members) -> frozenset:
    return frozenset(n for n, m in enumerate(members) if m.column is not None)


def last_read_positions(kernels) -> Dict[str, int]:
    """Each name the statements read, with the position of the last one reading it
    (found once per run: asking each group "does anything after you read this" anew
    made a long program's run quadratic)."""
    last: Dict[str, int] = {}
    for position, kernel in enumerate(kernels):
        for name in _needed(kernel.spec):
            last[name] = position
    return last


def inside_group(last_reads: Dict[str, int], end: int, outputs: Sequence[str],
            keep: Optional[Set[str]]):
    """The members (by position) of a group ending before ``end`` whose outputs nothing
    after it reads (``last_reads``: last_reads of the statements): a hoisted form's
    temporaries ('#' keys), and intermediates neither ``keep`` nor a later statement
    names."""
    return frozenset(n for n, key in enumerate(outputs)
                     if "#" in key or (keep is not None and key not in keep and
                                       last_reads.get(key, -1) < end))


@dataclass(frozen=True)
class FusionGroup:
    """One kernel of a run: its statements (0-based), and the intermediates that live
    as one row per thread inside it (never written to memory whole), with the bytes of
    one row."""
    statements: Tuple[int, ...]
    thread_rows: Tuple[Tuple[str, int], ...] = ()
    # statements that sum over the rows into per-thread accumulators (fuse_columns)
    column_sums: Tuple[int, ...] = ()
    # the row kernel that runs the group (plan/row_kernel.py: "softmax", "layernorm";
    # "triton" for a Triton row group), if one does
    row_kernel: Optional[str] = None
    # a Triton row group's lowering (plan/row_group.RowGroup): one printed kernel, whose
    # source backends/triton/rows.py prints
    row_group: Optional[object] = field(default=None, compare=False)
    # why the group ends where it does (the statement after it that did not join, or the
    # statement that runs alone and why); None where the program ends or nothing says
    ended_by: Optional[KernelBreak] = None


@dataclass(frozen=True)
class BoundGroup:
    """A C fusion group as the schedule decided it for one call: its bound members
    (iterating a BoundGroup iterates them), their keys in the environment, the
    statements it covers, the members whose outputs nothing after it reads (they
    live as one row per thread; the column sums among them) and the hand-written
    row kernel that runs it (plan/row_kernel.py), or None: the merged loop nests of
    plan/fuse.py.  backends/c/fused.py runs what it is handed."""
    members: Tuple[Member, ...]
    outputs: Tuple[str, ...]
    statements: int
    inside: FrozenSet[int]
    row_kernel: Optional[object] = None     # plan/row_kernel.RowKernel

    def __len__(self) -> int:
        return len(self.members)

    def __iter__(self):
        return iter(self.members)

    def __getitem__(self, index):
        return self.members[index]


def bound_group(kernels: Sequence, start: int, env, keep: Optional[Set[str]] = None,
                last_reads: Optional[Dict[str, int]] = None) -> Optional[BoundGroup]:
    """The fusion group starting at statement ``start`` for arrays ``env``, or None;
    ``keep`` as for run_statements, ``last_reads``: last_read_positions(kernels)
    where the caller has it."""
    return group_and_break(kernels, start, env, keep, last_reads)[0]


def group_and_break(kernels: Sequence, start: int, env, keep: Optional[Set[str]] = None,
                    last_reads: Optional[Dict[str, int]] = None
                    ) -> Tuple[Optional[BoundGroup], Optional[KernelBreak]]:
    """bound_group's group, and why it ends where it does (or why there is none)."""
    members, outputs, joined, ended_by = group_from(kernels, start, env)
    if not joined:
        return None, ended_by
    columns = column_members(members)
    if last_reads is None:
        last_reads = last_read_positions(kernels)
    inside = inside_group(last_reads, start + joined, outputs, keep) | columns
    return BoundGroup(tuple(members), tuple(outputs), joined, inside,
                      row_kernels.match(members, inside)), ended_by


def fusion_groups(kernels: Sequence, env: Dict[str, object],
                  keep: Optional[Set[str]] = None) -> List[FusionGroup]:
    """The kernels that would run for arrays like those in ``env`` (their contents are
    not read), for explain; ``keep`` as for run_statements."""
    env = dict(env)
    if triton_rows_possible(kernels, env):
        return _triton_groups(kernels, env, keep)
    groups: List[FusionGroup] = []
    position = 0
    worth = worth_fusing(kernels, env, "numpy")
    last_reads = last_read_positions(kernels)
    while position < len(kernels):
        group, ended_by = None, None
        if worth:
            group, ended_by = group_and_break(kernels, position, env, keep, last_reads)
        elif position == 0 and len(kernels) >= 2:
            ended_by = KernelBreak(1, Split.LITTLE_WORK)
        if group is not None:
            members, outputs, joined = group.members, group.outputs, group.statements
            columns = column_members(members)
            for number, (member, key) in enumerate(zip(members, outputs)):
                env[key] = member.buffers[-1] if number not in columns else \
                    np.empty(member.column.call.output_shape, member.column.call.dtypes.result)
            rows = fitting_rows(members, group.inside)
            summed = {outputs[k] for k in columns}
            groups.append(FusionGroup(tuple(range(position, position + joined)),
                                      tuple((outputs[k], row_bytes(members[k]))
                                            for k in sorted(rows - columns)
                                            if "#" not in outputs[k]),
                                      tuple(n for n in range(position, position + joined)
                                            if kernels[n].spec.output in summed),
                                      None if group.row_kernel is None else
                                      group.row_kernel.pattern.value,
                                      ended_by=ended_by))
            position += joined
            continue
        _alone(kernels[position], env,
               lambda call: _empty(call.output_shape, call.dtypes.result))
        groups.append(FusionGroup((position,), ended_by=ended_by))
        position += 1
    return groups


def _empty(shape, dtype) -> np.ndarray:
    """An array for planning the groups after it (explain): a MemoryError where NumPy
    cannot make one (more bytes than an array holds: its ValueError), as where memory
    is short."""
    try:
        return np.empty(shape, dtype)
    except ValueError:
        raise MemoryError(f"an array of shape {tuple(shape)} ({np.dtype(dtype)}) is "
                          "larger than an array can be") from None


def _alone(kernel, env: Dict[str, object], placeholder) -> None:
    """A statement that runs alone, for fusion_groups: bound (its warnings were given
    when it was compiled) and, for ':=', ``placeholder(call)`` of its output in
    ``env``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        call = kernel.bind(arrays={name: env[name] for name in _needed(kernel.spec)})
    if kernel.spec.assign == ":=":
        env[kernel.spec.output] = placeholder(call)


def _triton_groups(kernels: Sequence, env: Dict[str, object],
                   keep: Optional[Set[str]]) -> List[FusionGroup]:
    """fusion_groups for torch tensors on the Triton backend: its row groups
    (schedule/row_groups.py) and the statements that run alone."""
    import torch

    from ..analysis.frameworks import tensor_placeholder
    device = next(v.device for v in env.values() if isinstance(v, torch.Tensor))

    def placeholder(shape, dtype):
        return tensor_placeholder(shape, dtype, device)
    groups: List[FusionGroup] = []
    position = 0
    while position < len(kernels):
        group, ended_by = row_group_and_break(kernels, position, env, keep)
        if group is not None:
            working = getattr(torch, group.working)
            for member in group.members:
                if "#" not in member.key:
                    env[member.key] = placeholder(member.shape, working)
            size = torch.empty((), dtype=working).element_size()
            groups.append(FusionGroup(
                tuple(range(position, position + group.statements)),
                tuple((m.key, size * (group.extents[1] if m.grid else 1))
                      for m in group.members if m.stored is None and "#" not in m.key),
                row_kernel="triton", row_group=group, ended_by=ended_by))
            position += group.statements
            continue
        from ..analysis.triton_facts import result_dtype
        _alone(kernels[position], env,
               lambda call: placeholder(call.output_shape, result_dtype(call)))
        groups.append(FusionGroup((position,), ended_by=ended_by))
        position += 1
    return groups


def group_from(kernels, start: int, env):
    """(members, their keys in the environment, statements joined, why the group ends)
    of the group that starts at ``start``; no statements joined when there is no group
    of two or more loop nests worth fusing.  A statement with a hoisted form
    (rewrite/hoist.py) joins as its statements, all or none of them.  The last item is
    the KernelBreak of the statement that did not join (None: the program ended)."""
    if not can_build("c"):
        return [], [], 0, KernelBreak(start, Split.NO_COMPILER, alone=True)
    members: List[Member] = []
    outputs: List[str] = []            # each member's key in ``scratch``
    scratch = dict(env)
    produced: Dict[str, int] = {}
    summed: Set[str] = set()           # outputs of column members: complete only after
    joined = 0
    ended_by: Optional[KernelBreak] = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for number, kernel in enumerate(kernels[start:start + MAX_GROUP_STATEMENTS]):
            units = _units(kernel, scratch, number)
            if units is None:
                ended_by = KernelBreak(start + number, Split.UPDATES
                                       if kernel.spec.assign != ":=" else Split.NOT_BOUND,
                                       alone=not members)
                break
            size = len(members)
            for unit, names, key in units:
                if any(names.get(n, n) in summed for n in _needed(unit.spec)):
                    member = Split.READS_COLUMN_SUM
                else:
                    member = _join(unit, names, members, produced, scratch)
                    column = _column_of(unit) if not isinstance(member, Member) else None
                    if column is not None:
                        member = _join(column, names, members, produced, scratch, unit)
                if not isinstance(member, Member):
                    ended_by = KernelBreak(start + number, member, alone=size == 0)
                    break
                members.append(member)
                outputs.append(key)
                if member.column is not None:
                    summed.add(key)
                    scratch[key] = np.empty(member.column.call.output_shape,
                                            member.column.call.dtypes.result)
                    continue
                produced[key] = len(members) - 1
                scratch[key] = member.buffers[-1]
            else:
                joined += 1
                continue
            del members[size:], outputs[size:]
            break
        else:
            if start + joined < len(kernels):
                ended_by = KernelBreak(start + joined, Split.GROUP_FULL)
    if len(members) >= 2 and \
            sum(m.call.bounds.points for m in members) < MIN_FUSED_ELEMENTS:
        return [], [], 0, KernelBreak(start + 1, Split.LITTLE_WORK)
    if len(members) < 2:
        return [], [], 0, ended_by
    return members, outputs, joined, ended_by


def worth_fusing(kernels, env, framework: str) -> bool:
    # binding a group costs more than fusing saves on small arrays: decided once, by
    # the largest array given
    return framework == "numpy" and len(kernels) >= 2 and max(
        (_elements(v) for v in env.values()), default=0) >= MIN_FUSED_ELEMENTS


def _elements(value) -> int:
    """Elements of an array of any framework (a torch tensor's ``size`` is a method)."""
    shape = np.shape(value) if hasattr(value, "shape") else ()
    return int(np.prod(shape, dtype=np.int64))


def _join(kernel, names: Dict[str, str], members: List[Member], produced: Dict[str, int],
          scratch, original=None):
    """``kernel`` bound as the next member of the group, or the Split rule it breaks
    where it cannot join; ``names`` maps the statement's names to keys of ``scratch``
    where they differ.  ``original``: the column sum whose elementwise body ``kernel``
    is (_column_of)."""
    spec = kernel.spec
    if spec.assign != ":=":
        return Split.UPDATES
    if not spec.output_indices:
        return Split.NO_OUTPUT_INDEX
    for info in spec.tensors:
        if names.get(info.name, info.name) in produced and info.as_index:
            return Split.GATHERS_INTERMEDIATE
    try:
        call = kernel.bind(arrays={name: scratch[names.get(name, name)]
                                   for name in _needed(spec)})
        column = None if original is None else ColumnOf(original, original.bind(
            arrays={name: scratch[names.get(name, name)] for name in _needed(spec)}))
    except (EinfuseError, KeyError):
        return Split.NOT_BOUND
    if original is None:
        with_counts = _counted(kernel, call, lambda name: scratch[names.get(name, name)])
        if with_counts is not None:
            kernel, call = with_counts
            spec = kernel.spec
    if column is not None and not _same_ranges(column.call, call):
        return Split.COLUMN_UNFIT
    if column is not None and _summed_contraction(column.call):
        return Split.SUMMED_PRODUCT    # a product summed over rows (W[i,o] * v[i]): BLAS
    if call.framework != "numpy":
        return Split.FRAMEWORK
    if call.dtypes.result != call.dtypes.working:
        return Split.ROUNDED
    if call.dtypes.working.kind not in "fiu":
        return Split.DTYPE_KIND
    if members and call.dtypes.working != members[0].call.dtypes.working:
        return Split.OTHER_DTYPE
    if members and call.options.pad != members[0].call.options.pad or \
            members and call.options.fill != members[0].call.options.fill:
        return Split.OTHER_PADDING
    if not fits_in_memory(call) or column is not None and not fits_in_memory(column.call):
        return Split.MEMORY     # alone, the statement refuses it (AllocationError)
    prepared = _prepare(call, blas_contraction(call))
    if isinstance(prepared, Split):
        return prepared
    choice, plan, buffers, outer = prepared
    lo, hi = call.bounds.range_map[outer]
    if lo != 0 or (members and hi != members[0].extent):
        return Split.OTHER_ROWS
    reads = _intermediate_reads(spec, plan, names, produced, members, outer)
    if reads is None:
        return Split.OTHER_ROW_READ
    sources = tuple(None if slot in reads else names.get(tensor, tensor)
                    for slot, (tensor, _) in enumerate(buffer_slots(spec)[:-1]))
    member = Member(kernel, call, plan, tuple(buffers), outer, hi, reads, sources, column,
                    choice)
    if column is not None and (outer != spec.output_indices[0] or
                               call.dtypes.working.kind != "f" or
                               column.call.dtypes.result != call.dtypes.working or
                               not fitting_rows([member], frozenset({0})) or
                               row_bytes(member) > COLUMN_ROW_BYTES):
        # the summed index is not the loop over rows, no row per thread, or rows so
        # long that the accumulators would stream through memory on every row
        return Split.COLUMN_UNFIT
    return member


def _counted(kernel, call, given):
    """(kernel, call) of ``kernel``'s statement with each count (lang/sugar.is_count:
    ``mean``'s divisor) as its value for ``call``'s ranges, bound to the same arrays;
    ``given(name)``: the array or number bound to a name; None where it has no count
    (or the counted statement does not bind).  A count is
    no pass over the row in the group: ``mean``'s sum and count are one loop, as
    ``sum[j](X[i,j]) / n`` is, and the row kernels match it as that.  One kernel per
    statement and count values, kept on the statement's kernel."""
    spec = kernel.spec
    if kernel.options.pad is not None or not any(is_count(n) for n in spec.rhs.walk()):
        return None
    statement = format_statement(dataclasses.replace(
        spec.statement, rhs=counted(spec.rhs, call.bounds.range_map), source=""))
    made = kernel.__dict__.setdefault("_counted_kernels", {})
    try:
        if statement not in made:
            # (a kernel of the statement's own class: the schedule builds no runtime type)
            made[statement] = type(kernel)(statement, kernel.options)
        found = made[statement]
        bound = found.bind(arrays={name: given(name) for name in _needed(found.spec)})
    except (EinfuseError, KeyError):
        return None
    if bound.dtypes.working != call.dtypes.working or \
            bound.dtypes.result != call.dtypes.result:
        return None       # (the member must give what the statement gives alone)
    return found, bound


def _prepare(call, contraction=None):
    """(loop choice, its plan, buffers, outer index) of a statement that can be a
    member of a group (the nest as the schedule chooses it alone), or
    the Split rule it breaks: it must run on the C backend as one kernel that is a
    single parallel loop, with no input packed for lanes; ``contraction``: the
    contraction the call's schedule hands to BLAS, or None."""
    # a product that sums nothing (A[i,j] * B[i,j], a[i] * B[i,j]) is elementwise
    if call.options.backend not in ("auto", "c"):
        return Split.OTHER_BACKEND
    if call.spec.has_position_reductions:
        return Split.POSITION_REDUCTION
    if contraction is not None and contraction.k:
        return Split.BLAS
    try:
        out = np.empty(call.output_shape, dtype=call.dtypes.working)
    except (ValueError, MemoryError):
        # NumPy's 'array is too big' (more bytes than an array holds) or no memory: the
        # statement runs alone, where the result's own check says so (AllocationError)
        return Split.MEMORY
    if out.size == 0:
        return Split.EMPTY
    buffers = input_buffers(call) + [out]
    choice = loop_choice(call, [unit_axis(b) for b in buffers])
    plan = choice.plan()
    if lane_packs(call, choice, buffers) or len(plan.program.kernels) != 1:
        return Split.NOT_ONE_LOOP
    body = plan.program.kernels[0].body
    if len(body) != 1 or not isinstance(body[0], ir.Loop) or body[0].kind != LoopKind.PARALLEL:
        return Split.NO_PARALLEL_LOOP
    number = int(body[0].var[1:])
    return choice, plan, buffers, call.spec.all_indices[number]


def _same_ranges(original, call) -> bool:
    """Whether the elementwise body runs over exactly the column sum's iteration space
    (its summed index is an output index there, inferred anew)."""
    mine, theirs = call.bounds.range_map, original.bounds.range_map
    return set(mine) == set(theirs) and all(mine[n] == theirs[n] for n in mine)


def _column_of(kernel):
    """The elementwise body of a column sum, ``t[i, j...] := body`` for
    ``out[j...] := sum[i](body)`` (the sum implicit or written), compiled once per
    statement; None for any other statement.  Only a plain sum of a body without
    reductions, gathers or padding qualifies, over an index that no array of two or
    more axes has on its last axis (the rows are read whole, each a contiguous
    stretch; a row sum such as ``h[i] := sum[k](X[i,k])`` keeps its own plan)."""
    cached = kernel.__dict__.get("_column_body", False)
    if cached is not False:
        return cached
    body = None
    spec = kernel.spec
    rhs = spec.rhs
    if spec.assign == ":=" and spec.output_indices and isinstance(rhs, ast.Reduce) and \
            rhs.op == "sum" and len(rhs.indices) == 1 and \
            spec.reduction_indices == rhs.indices and \
            not any(True for _ in ast.reductions(rhs.body)) and \
            not any(t.as_index for t in spec.tensors) and kernel.options.pad is None and \
            not any(len(a.indices) >= 2 and rhs.indices[0] in a.indices[-1].index_names
                    for a in ast.accesses(rhs.body)):
        taken = {t.name for t in spec.tensors} | set(spec.params) | {spec.output}
        name = FreshNames(taken).underscored(f"{spec.output}_row")
        indices = ", ".join(rhs.indices + spec.output_indices)
        try:
            # (a kernel of the statement's own class: the schedule builds no runtime type)
            body = type(kernel)(f"{name}[{indices}] := {format_expr(rhs.body)}",
                                kernel.options)
        except EinfuseError:
            body = None
    kernel.__dict__["_column_body"] = body
    return body


def _intermediate_reads(spec, plan, names, produced, members, outer):
    """slot -> (producer, its output slot) for every intermediate of the group that
    ``spec`` reads, or None when one is read at another row than the one just
    written."""
    reads = {}
    for access in ast.accesses(spec.rhs):
        key = names.get(access.tensor, access.tensor)
        if key not in produced:
            continue
        producer = members[produced[key]]
        axis = producer.kernel.spec.output_indices.index(producer.outer)
        if access.indices[axis].plain_index != outer:
            return None
        slot = plan.slots.index((access.tensor, "value"))
        reads[slot] = (produced[key], len(producer.plan.slots) - 1)
    return reads


def _summed_contraction(call) -> bool:
    """Whether the call's schedule hands it to BLAS as a contraction that sums."""
    contraction = blas_contraction(call)
    return contraction is not None and bool(contraction.k)
