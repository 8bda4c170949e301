"""Running statements by the schedule's groups: ``run_statements`` runs a sequence of
statement kernels in order, a fused group (schedule/fusion.py decides it) as one C kernel,
a Triton row group (schedule/row_groups.py) as one Triton launch, every other statement
alone; a repeated call of one layout replays the prepared steps (PreparedRun)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

import numpy as np

from ..analysis.frameworks import framework_of, from_numpy, torch_recording
from ..backends.c import fused as c_fused, fused_prepared as c_fused_prepared
from ..backends.triton import rows as triton_rows
from ..schedule.fusion import bound_group, column_members, last_read_positions, worth_fusing
from ..schedule.row_groups import row_group, triton_rows_possible
from ..schedule.units import needed
from .signatures import signature_of


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
    # a Triton row group's step: its runner (backends/triton/rows.RowRunner), which
    # RowLaunches calls directly where autograd records nothing
    rows: Optional[object] = None


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

    def resume(self, number: int, env: Dict[str, object]) -> None:
        """The full way from step ``number`` on (the steps before it have run)."""
        _run_from(self.kernels, self.steps[number].position, env, self.framework,
                  self.keep, None)


class RowLaunches:
    """Prepared runs (in order) whose every step is a Triton row group, as their
    groups' runners called one after another: a repeated call is the runners' loads,
    allocations and launches, without each step's layers (its partial, the autograd
    guard, the launch check).  Only for callers under which autograd records nothing
    -- an autograd node's forward, its backward without ``create_graph`` -- so that no
    step's guard (a tensor requiring a gradient under grad mode: the statements' own
    nodes) could refuse.  A runner that refuses (a label outside its axis, an
    allocation that failed: _rows_ran) leaves its run to the full way from its step,
    on detached tensors as the full path always gets them; the later runs follow."""
    __slots__ = ("runs", "launches")

    def __init__(self, runs: Tuple[PreparedRun, ...]):
        self.runs = runs
        self.launches = tuple((step.rows, number, position)
                              for position, run in enumerate(runs)
                              for number, step in enumerate(run.steps))

    @staticmethod
    def of(runs) -> Optional["RowLaunches"]:
        """The runs as RowLaunches, or None where one is not a PreparedRun of torch
        row-group steps alone."""
        if not runs or not all(
                isinstance(run, PreparedRun) and run.framework == "torch" and run.steps
                and all(step.rows is not None for step in run.steps) for run in runs):
            return None
        return RowLaunches(tuple(runs))

    def __call__(self, env: Dict[str, object]) -> None:
        for runner, number, position in self.launches:
            try:        # (_rows_ran, inlined: this is every repeated node's launch)
                if runner(env) is not False:
                    continue
            except Exception as error:
                if not _out_of_memory(error):
                    raise
            # the runner refused: nothing of it was written
            for name, value in env.items():
                if getattr(value, "requires_grad", False):
                    env[name] = value.detach()
            self.runs[position].resume(number, env)
            for run in self.runs[position + 1:]:
                run(env)
            return


def _run_from(kernels, position: int, env, framework: str, keep, record) -> None:
    """The full way from statement ``position``; each step taken is appended to
    ``record`` (None for one that cannot be prepared) where that is a list."""
    worth = worth_fusing(kernels, env, framework)
    rows = framework == "torch" and triton_rows_possible(kernels, env)
    last_reads = last_read_positions(kernels) if worth else {}
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
    result = kernel(arrays={name: env[name] for name in needed(spec)})
    if framework != "numpy" and type(result) is np.ndarray:
        # a statement that read no array of the framework (a row of constants from
        # its ranges): its result joins the framework, so a later one does not mix
        like = next((v for v in env.values() if framework_of(v) == framework), None)
        result = from_numpy(result, framework, like=like)
    env[spec.output] = result


def _run_one_step(kernel, framework: str, env) -> bool:
    _run_one(kernel, env, framework)
    return True


def _try_rows(kernels, start: int, env, keep: Optional[Set[str]], record=None) -> int:
    """Run a Triton row group (schedule/row_groups.py) starting at ``start``; the
    number of statements it ran (0: none)."""
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
        record.append(Step(start, functools.partial(_rows_step, runner, guarded), runner))
    return group.statements


def _rows_step(runner, guarded: bool, env) -> bool:
    if guarded:
        if torch_recording():
            return False
    return _rows_ran(runner, env)


def _rows_ran(runner, env) -> bool:
    """Whether the group's launch ran; False where its outputs could not be allocated
    or a label is outside its axis (nothing written to ``env`` then): the statements
    run alone and report it as theirs (an AllocationError, an out-of-bounds error), or
    fit one at a time."""
    try:
        if runner(env) is False:      # a label out of bounds: the statements say so
            return False
    except Exception as error:
        if _out_of_memory(error):
            return False
        raise
    return True


def _out_of_memory(error: Exception) -> bool:
    return isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError"


def _try_fused(kernels, start: int, env, keep: Optional[Set[str]], record=None,
               last_reads: Optional[Dict[str, int]] = None) -> int:
    """Run a group starting at ``start`` as one kernel; the number of statements it
    ran (0: none, the caller runs the statement alone).  ``last_reads``: last_reads
    of ``kernels``, where the caller has it."""
    group = bound_group(kernels, start, env, keep, last_reads)
    if group is None:
        return 0
    members, outputs, joined, inside = group.members, group.outputs, group.statements, \
        group.inside
    columns = column_members(members)
    results = c_fused.run(group, inside)     # (the group names its row kernel, if any)
    if results is None:
        return 0
    for number, (member, key) in enumerate(zip(members, outputs)):
        if number not in inside:
            env[key] = member.kernel.deliver(member.call, member.buffers[-1])
    for number, value in results.items():
        column = members[number].column
        env[outputs[number]] = column.kernel.deliver(column.call, value)
    if record is not None:
        runner = c_fused_prepared.prepared_runner(group, inside, [m.sources for m in members])
        keys = tuple(None if n in inside and n not in columns else key
                     for n, key in enumerate(outputs))
        record.append(None if runner is None else
                      Step(start, functools.partial(runner, keys=keys)))
    return joined
