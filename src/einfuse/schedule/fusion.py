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

import functools
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

import numpy as np

from ..errors import EinfuseError
from ..lang import ast
from ..plan import buffer_slots
from ..analysis.result_size import fits_in_memory
from .row_groups import row_group, triton_rows_possible
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


@dataclass(frozen=True)
class ColumnOf:
    """The statement a column member computes, and its call."""
    kernel: object
    call: object


# The longest row (bytes) of a column sum's accumulators in a fused group: each row of
# the loop reads and writes two of them, so they must stay in the core's cache.
COLUMN_ROW_BYTES = 1 << 16

# Prepared runs kept per owner (a program, a hoisted form); a new signature past this
# replaces the oldest.
RUNS_KEPT = 16


@dataclass(frozen=True)
class Step:
    """One step of a prepared run: a fused group's prepared kernel or one statement.
    ``run`` returns False when an array it reads has another layout than when it was
    prepared (nothing run then: the rest runs the full way from ``position``)."""
    position: int
    run: Callable[[Dict[str, object]], bool]


def run_statements(kernels: Sequence, env: Dict[str, object], framework: str,
                   keep: Optional[Set[str]] = None, runs: Optional[dict] = None
                   ) -> Optional["PreparedRun"]:
    """Run ``kernels`` (each reads names from ``env`` and writes its output into it) in
    order, fusing runs of them where the rules above allow.  ``keep``: the names the
    caller needs in ``env`` afterwards (None: every one); an intermediate of a group
    that neither they nor a later statement read lives as one row per thread.
    ``runs``: the caller's cache of prepared runs by call signature (NumPy only), so
    that a repeated call skips the grouping and binding and calls the kernels.
    Returns the prepared run for arrays of this call's layouts, where there is one (a
    caller that keeps it skips even the signature next time)."""
    signature = None
    if runs is not None and framework in ("numpy", "torch"):
        from ..runtime.repeat import signature_of
        signature = signature_of(env)
        if signature is not None:
            # what is kept decides what the fused groups write out: a run prepared for
            # fewer kept names would leave a later caller's intermediates unwritten
            signature = (signature, None if keep is None else frozenset(keep))
        prepared = runs.get(signature) if signature is not None else None
        if prepared is not None:
            prepared(env)
            return prepared
    record: Optional[List[Optional[Step]]] = [] if signature is not None else None
    _run_from(kernels, 0, env, framework, keep, record)
    if record is None or None in record:
        return None
    if len(runs) >= RUNS_KEPT:
        try:     # another thread may drop the same oldest one between these steps
            runs.pop(next(iter(runs)), None)
        except (StopIteration, RuntimeError):
            pass
    prepared = runs[signature] = PreparedRun(
        tuple(kernels), None if keep is None else frozenset(keep), tuple(record), framework)
    return prepared


@dataclass(frozen=True)
class PreparedRun:
    """The steps of a run of ``kernels`` prepared for one layout of its arrays (NumPy,
    or torch tensors); called with arrays of another layout, the steps from the first
    that refuses them run the full way."""
    kernels: Tuple
    keep: Optional[FrozenSet[str]]
    steps: Tuple[Step, ...]
    framework: str = "numpy"

    def __call__(self, env: Dict[str, object]) -> None:
        for step in self.steps:
            if not step.run(env):
                _run_from(self.kernels, step.position, env, self.framework, self.keep, None)
                return


def _run_from(kernels, position: int, env, framework: str, keep, record) -> None:
    """The full way from statement ``position``; each step taken is appended to
    ``record`` (None for one that cannot be prepared) where that is a list."""
    worth = _worth(kernels, env, framework)
    rows = framework == "torch" and triton_rows_possible(kernels, env)
    last_reads = _last_reads(kernels) if worth else {}
    while position < len(kernels):
        fused = 0
        if worth and len(kernels) - position >= 2:
            fused = _try_fused(kernels, position, env, keep, record, last_reads)
        elif rows and len(kernels) - position >= 2:
            fused = _try_rows(kernels, position, env, keep, record)
        if fused:
            position += fused
            continue
        kernel = kernels[position]
        _run_one(kernel, env, framework)
        if record is not None:
            record.append(Step(position, functools.partial(_run_one_step, kernel, framework)))
        position += 1


def _run_one(kernel, env, framework: str = "numpy") -> None:
    spec = kernel.spec
    result = kernel(arrays={name: env[name] for name in _needed(spec)})
    if framework != "numpy" and type(result) is np.ndarray:
        # a statement that read no array of the framework (a row of constants from
        # its ranges): its result joins the framework, so a later one does not mix
        from ..analysis.frameworks import framework_of, from_numpy
        like = next((v for v in env.values() if framework_of(v) == framework), None)
        result = from_numpy(result, framework, like=like)
    env[spec.output] = result


def _run_one_step(kernel, framework: str, env) -> bool:
    _run_one(kernel, env, framework)
    return True


def _try_rows(kernels, start: int, env, keep: Optional[Set[str]], record=None) -> int:
    """Run a Triton row group (schedule/row_groups.py) starting at ``start``; the
    number of statements it ran (0: none)."""
    from ..backends import triton_rows
    group = row_group(kernels, start, env, keep)
    if group is None:
        return 0
    runner = triton_rows.runner(group, env)
    if not _rows_ran(runner, env):
        return 0
    if record is not None:
        # a tensor that requires a gradient: a later call of this signature with grad
        # mode on must record the statements' autograd nodes (the full way)
        guarded = any(getattr(env.get(i.key), "requires_grad", False) for i in group.inputs)
        record.append(Step(start, functools.partial(_rows_step, runner, guarded)))
    return group.statements


def _rows_step(runner, guarded: bool, env) -> bool:
    if guarded:
        from ..runtime.torch_autograd import recording
        if recording():
            return False
    return _rows_ran(runner, env)


def _rows_ran(runner, env) -> bool:
    """Whether the group's launch ran; False where its outputs could not be allocated
    (nothing written to ``env`` then): the statements run alone and report it as theirs
    (an AllocationError), or fit one at a time."""
    try:
        runner(env)
    except Exception as error:
        if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
            return False
        raise
    return True


def _try_fused(kernels, start: int, env, keep: Optional[Set[str]], record=None,
               last_reads: Optional[Dict[str, int]] = None) -> int:
    """Run a group starting at ``start`` as one kernel; the number of statements it
    ran (0: none, the caller runs the statement alone).  ``last_reads``: _last_reads
    of ``kernels``, where the caller has it."""
    from ..backends import c_fused
    members, outputs, joined = _group(kernels, start, env)
    if not joined:
        return 0
    columns = _column_members(members)
    if last_reads is None:
        last_reads = _last_reads(kernels)
    inside = _inside(last_reads, start + joined, outputs, keep) | columns
    results = c_fused.run(members, inside)
    if results is None:
        return 0
    for number, (member, key) in enumerate(zip(members, outputs)):
        if number not in inside:
            env[key] = member.kernel.deliver(member.call, member.buffers[-1])
    for number, value in results.items():
        column = members[number].column
        env[outputs[number]] = column.kernel.deliver(column.call, value)
    if record is not None:
        runner = c_fused.prepared_runner(members, inside, [m.sources for m in members])
        keys = tuple(None if n in inside and n not in columns else key
                     for n, key in enumerate(outputs))
        record.append(None if runner is None else
                      Step(start, functools.partial(runner, keys=keys)))
    return joined


def _column_members(members) -> frozenset:
    return frozenset(n for n, m in enumerate(members) if m.column is not None)


def _last_reads(kernels) -> Dict[str, int]:
    """Each name the statements read, with the position of the last one reading it
    (found once per run: asking each group "does anything after you read this" anew
    made a long program's run quadratic)."""
    last: Dict[str, int] = {}
    for position, kernel in enumerate(kernels):
        for name in _needed(kernel.spec):
            last[name] = position
    return last


def _inside(last_reads: Dict[str, int], end: int, outputs: Sequence[str],
            keep: Optional[Set[str]]):
    """The members (by position) of a group ending before ``end`` whose outputs nothing
    after it reads (``last_reads``: _last_reads of the statements): a hoisted form's
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
    # the row kernel that runs the group (backends/c_rows.py), if one does
    row_kernel: Optional[str] = None
    # the group's generated source, where it is one printed kernel (a Triton row group)
    source: Optional[str] = None


def fusion_groups(kernels: Sequence, env: Dict[str, object],
                  keep: Optional[Set[str]] = None) -> List[FusionGroup]:
    """The kernels that would run for arrays like those in ``env`` (their contents are
    not read), for explain; ``keep`` as for run_statements."""
    from ..backends import c_fused, c_rows
    env = dict(env)
    if triton_rows_possible(kernels, env):
        return _triton_groups(kernels, env, keep)
    groups: List[FusionGroup] = []
    position = 0
    worth = _worth(kernels, env, "numpy")
    last_reads = _last_reads(kernels)
    while position < len(kernels):
        members, outputs, joined = _group(kernels, position, env) if worth else ([], [], 0)
        if joined:
            columns = _column_members(members)
            for number, (member, key) in enumerate(zip(members, outputs)):
                env[key] = member.buffers[-1] if number not in columns else \
                    np.empty(member.column.call.output_shape, member.column.call.dtypes.result)
            inside = _inside(last_reads, position + joined, outputs, keep) | columns
            rows = c_fused.fitting_rows(members, inside)
            row_group = c_rows.match(members, inside)
            summed = {outputs[k] for k in columns}
            groups.append(FusionGroup(tuple(range(position, position + joined)),
                                      tuple((outputs[k], c_fused.row_bytes(members[k]))
                                            for k in sorted(rows - columns)
                                            if "#" not in outputs[k]),
                                      tuple(n for n in range(position, position + joined)
                                            if kernels[n].spec.output in summed),
                                      None if row_group is None else row_group.pattern.value))
            position += joined
            continue
        _alone(kernels[position], env,
               lambda call: _empty(call.output_shape, call.dtypes.result))
        groups.append(FusionGroup((position,)))
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

    from ..backends import triton_rows
    from ..analysis.frameworks import tensor_placeholder
    device = next(v.device for v in env.values() if isinstance(v, torch.Tensor))

    def placeholder(shape, dtype):
        return tensor_placeholder(shape, dtype, device)
    groups: List[FusionGroup] = []
    position = 0
    while position < len(kernels):
        group = row_group(kernels, position, env, keep)
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
                row_kernel="triton", source=triton_rows.source(group)))
            position += group.statements
            continue
        from ..backends.triton_backend import _result_dtype
        _alone(kernels[position], env,
               lambda call: placeholder(call.output_shape, _result_dtype(call)))
        groups.append(FusionGroup((position,)))
        position += 1
    return groups


def _group(kernels, start: int, env):
    """(members, their keys in the environment, statements joined) of the group that
    starts at ``start``; no statements joined when there is no group of two or more
    loop nests worth fusing.  A statement with a hoisted form (rewrite/hoist.py)
    joins as its statements, all or none of them."""
    from ..backends import c_fused
    if not c_fused.available():
        return [], [], 0
    members: List[Member] = []
    outputs: List[str] = []            # each member's key in ``scratch``
    scratch = dict(env)
    produced: Dict[str, int] = {}
    summed: Set[str] = set()           # outputs of column members: complete only after
    joined = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for number, kernel in enumerate(kernels[start:start + MAX_GROUP_STATEMENTS]):
            units = _units(kernel, scratch, number)
            if units is None:
                break
            size = len(members)
            for unit, names, key in units:
                if any(names.get(n, n) in summed for n in _needed(unit.spec)):
                    member = None
                else:
                    member = _join(unit, names, members, produced, scratch)
                    column = _column_of(unit) if member is None else None
                    if column is not None:
                        member = _join(column, names, members, produced, scratch, unit)
                if member is None:
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
    if len(members) < 2 or sum(m.call.bounds.points for m in members) < MIN_FUSED_ELEMENTS:
        return [], [], 0
    return members, outputs, joined


def _worth(kernels, env, framework: str) -> bool:
    # binding a group costs more than fusing saves on small arrays: decided once, by
    # the largest array given
    return framework == "numpy" and len(kernels) >= 2 and max(
        (_elements(v) for v in env.values()), default=0) >= MIN_FUSED_ELEMENTS


def _elements(value) -> int:
    """Elements of an array of any framework (a torch tensor's ``size`` is a method)."""
    shape = np.shape(value) if hasattr(value, "shape") else ()
    return int(np.prod(shape, dtype=np.int64))


def _join(kernel, names: Dict[str, str], members: List[Member], produced: Dict[str, int],
          scratch, original=None) -> Optional[Member]:
    """``kernel`` bound as the next member of the group, or None where it cannot join;
    ``names`` maps the statement's names to keys of ``scratch`` where they differ.
    ``original``: the column sum whose elementwise body ``kernel`` is (_column_of)."""
    from ..backends import c_fused
    spec = kernel.spec
    if spec.assign != ":=" or not spec.output_indices:
        return None
    for info in spec.tensors:
        if names.get(info.name, info.name) in produced and info.as_index:
            return None
    try:
        call = kernel.bind(arrays={name: scratch[names.get(name, name)]
                                   for name in _needed(spec)})
        column = None if original is None else ColumnOf(original, original.bind(
            arrays={name: scratch[names.get(name, name)] for name in _needed(spec)}))
    except (EinfuseError, KeyError):
        return None
    if column is not None and (not _same_ranges(column.call, call) or
                               c_fused.is_contraction(column.call)):
        return None     # a product summed over rows (W[i,o] * v[i]) stays with BLAS
    if call.framework != "numpy" or call.dtypes.result != call.dtypes.working or \
            call.dtypes.working.kind not in "fiu":
        return None
    if members and call.dtypes.working != members[0].call.dtypes.working:
        return None
    if members and call.options.pad != members[0].call.options.pad or \
            members and call.options.fill != members[0].call.options.fill:
        return None
    if not fits_in_memory(call) or column is not None and not fits_in_memory(column.call):
        return None     # alone, the statement refuses it (AllocationError)
    prepared = c_fused.prepare(kernel, call)
    if prepared is None:
        return None
    plan, buffers, outer = prepared
    lo, hi = call.bounds.range_map[outer]
    if lo != 0 or (members and hi != members[0].extent):
        return None
    reads = _intermediate_reads(spec, plan, names, produced, members, outer)
    if reads is None:
        return None
    sources = tuple(None if slot in reads else names.get(tensor, tensor)
                    for slot, (tensor, _) in enumerate(buffer_slots(spec)[:-1]))
    member = Member(kernel, call, plan, tuple(buffers), outer, hi, reads, sources, column)
    if column is not None and (outer != spec.output_indices[0] or
                               call.dtypes.working.kind != "f" or
                               column.call.dtypes.result != call.dtypes.working or
                               not c_fused.fitting_rows([member], frozenset({0})) or
                               c_fused.row_bytes(member) > COLUMN_ROW_BYTES):
        # the summed index is not the loop over rows, no row per thread, or rows so
        # long that the accumulators would stream through memory on every row
        return None
    return member


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
        from ..lang.printer import format_expr
        from ..runtime.kernel import Kernel
        taken = {t.name for t in spec.tensors} | set(spec.params) | {spec.output}
        name = f"{spec.output}_row"
        while name in taken:
            name += "_"
        indices = ", ".join(rhs.indices + spec.output_indices)
        try:
            body = Kernel(f"{name}[{indices}] := {format_expr(rhs.body)}", kernel.options)
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
