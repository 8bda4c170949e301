"""Statements and programs on PyTorch DTensors (``torch.distributed.tensor``): the
plan comes from the same planner as for JAX (planner.py), each rank runs the einfuse
kernels on its local tensors, and the plan's moves are DTensor redistributions or
functional collectives, which torch.distributed carries out (gloo on CPU, NCCL on GPU;
dtensor_execute.py).  A call that autograd records is one node whose backward is
planned too (dtensor_backward.py, dtensor_autograd.py); where it cannot be, autograd
goes through DTensor's ops (their backward is the transposed collective).

Placements: an einfuse layout splits a tensor axis over mesh axes (the first the major
one); a DTensor places each mesh dimension: ``Shard(axis)``, ``Replicate()`` or
``Partial(op)`` for a pending reduction.  Without ``shard=``, the assignment is read
off the inputs' placements (an index subscripting a tensor axis that is ``Shard``-ed
over a mesh dimension goes on that dimension), so inputs arrive where the plan wants
them; any other input is redistributed first (as JAX moves an input before a
``shard_map``; the plan does not count it).  Imported only for DTensor inputs or a
torch DeviceMesh; it imports torch inside its functions."""

from __future__ import annotations

import numbers
from typing import Dict, Mapping, Tuple

from ..analysis.frameworks import has_dtensor
from ..errors import EinfuseError, EinfuseTypeError, OptionError, attach_statement
from .api import check_options, choose, shard_of_inputs, statements_of, with_memory
from .cost import CostModel
from .dtensor_backward import (BackwardNotPlanned, BackwardProgram, backward_plan,
                               backward_statements, forward_shapes, gradient_inputs,
                               gradient_targets, seed_placements)
from .dtensor_execute import (check_sayable, execute, placements_of, plan_key, rank_text,
                              wait_for)
from .memory import check_fits
from .mesh import MeshShape
from .multiprocess import failure, lost_peer
from .planner import ShardPlan


def is_dtensor(value) -> bool:
    """A ``torch.distributed.tensor.DTensor`` (by its type, without importing torch)."""
    return has_dtensor((value,), {})


def any_dtensor(values) -> bool:
    return any(is_dtensor(v) for v in values)


def is_device_mesh(mesh) -> bool:
    kind = type(mesh)
    return kind.__name__ == "DeviceMesh" and (kind.__module__ or "").startswith(
        "torch.distributed")


CACHED_PLANS = 32          # plans kept per statement or program (input layouts differ)


class DTensorRun:
    """A statement or program run on DTensors over one DeviceMesh: plans are cached per
    input shapes, dtypes and placements."""

    def __init__(self, compiled, mesh=None, shard=None, memory=None):
        self.compiled = compiled
        self.program = statements_of(compiled)
        self.mesh = mesh
        self.shard = shard
        self.memory = memory
        self._plans: Dict[Tuple, ShardPlan] = {}
        # per (plan key, inputs needing a gradient): the backward program, or why not
        self._backwards: Dict[Tuple, object] = {}
        self._backward_plans: Dict[Tuple, ShardPlan] = {}

    def __call__(self, values: Mapping[str, object]):
        try:
            device_mesh = self._device_mesh(values)
            info = check_options(device_mesh, self.shard)
            key = plan_key(values)
            plan = self.plan(values, device_mesh, info, key)
            recorded = self.recorded(plan, key, values, info)
        except EinfuseError as error:
            raise attach_statement(error, self.program.source) from None
        try:
            if recorded is not None:     # autograd records one node: its backward planned
                from .dtensor_autograd import run_recorded
                results = run_recorded(self, plan, recorded, values, device_mesh, info)
            else:
                results = execute(plan, self.program.kernels, values, device_mesh, info)
            wait_for(results)
        except RuntimeError as error:
            if lost_peer(error):      # gloo/NCCL: a rank of the job died
                raise failure(error, self.program.source, rank_text()) from error
            raise
        return results[0] if len(results) == 1 else results

    def plan(self, values, device_mesh, info: MeshShape, key=None) -> ShardPlan:
        key = plan_key(values) if key is None else key
        plan = self._plans.get(key)
        if plan is None:
            shard = self.shard
            if shard is None:
                shard = shard_of_inputs(self.program, values, info)
            model = with_memory(CostModel(), self.memory, device_mesh)
            plan = choose(self.program, placeholders(values), info, shard, model,
                          rank=False, narrow=False).plan
            check_fits(plan, model.memory_per_device)
            check_sayable(plan, info)
            if len(self._plans) >= CACHED_PLANS:
                self._plans.pop(next(iter(self._plans)))
            self._plans[key] = plan
        return plan

    def recorded(self, plan: ShardPlan, key, values, info: MeshShape):
        """The backward (a BackwardProgram) of a call that autograd records, for the
        DTensors that require a gradient; None where autograd records nothing, or
        where the backward cannot be planned (then autograd goes through DTensor's own
        ops, as :func:`execute` leaves them)."""
        import torch
        if not torch.is_grad_enabled() or not any(
                getattr(v, "requires_grad", False) for v in values.values()):
            return None
        wrt = gradient_inputs(values, plan)
        wrt = tuple(n for n in wrt if getattr(values[n], "requires_grad", False))
        if not wrt:
            return None
        found = self._backwards.get((key, wrt))
        if found is None:
            if len(self._backwards) >= CACHED_PLANS:
                self._backwards.pop(next(iter(self._backwards)))
            found = self._backwards[(key, wrt)] = self._backward_program(
                plan, key, values, info, wrt)
        return found if isinstance(found, BackwardProgram) else None

    def _backward_program(self, plan, key, values, info, wrt):
        try:
            program = backward_statements(self.program, self.compiled.options, wrt,
                                          forward_shapes(plan, self.program.params))
            # planned once for seeds where the outputs are, to know that it plans
            self.backward_plan(plan, program, info, key,
                               seed_placements(plan, program),
                               gradient_targets(values, plan, info, wrt))
        except BackwardNotPlanned as why:
            return why
        except OptionError as error:      # a placement no DTensor can say
            return BackwardNotPlanned(str(error))
        return program

    def backward_plan(self, forward: ShardPlan, program, info: MeshShape, key, seeds,
                      targets) -> ShardPlan:
        """The backward's plan for seeds at ``seeds`` (cached per signature)."""
        signature = (key, program.wrt, tuple(sorted(seeds.items(), key=str)))
        plan = self._backward_plans.get(signature)
        if plan is None:
            plan = backward_plan(forward, program, info, seeds, targets, CostModel())
            check_sayable(plan, info)
            if len(self._backward_plans) >= CACHED_PLANS:
                self._backward_plans.pop(next(iter(self._backward_plans)))
            self._backward_plans[signature] = plan
        return plan

    def _device_mesh(self, values):
        meshes = []
        for name, value in values.items():
            if is_dtensor(value):
                if value.device_mesh not in meshes:
                    meshes.append(value.device_mesh)
            elif not isinstance(value, numbers.Number):
                raise EinfuseTypeError(
                    f"{name} is a {type(value).__module__}.{type(value).__name__} among "
                    "DTensor inputs; every array of a sharded torch call is a DTensor (a "
                    "tensor that is the same on every rank: DTensor.from_local(t, mesh, "
                    "[Replicate()] * mesh.ndim), or distribute_tensor)")
        if self.mesh is not None:
            if not is_device_mesh(self.mesh):
                raise EinfuseTypeError(
                    f"DTensor inputs run on their DeviceMesh; mesh= is a "
                    f"{type(self.mesh).__name__} (pass their DeviceMesh, or no mesh=)")
            meshes.insert(0, self.mesh)
        if not meshes:
            raise EinfuseTypeError("mesh= is a torch DeviceMesh, but no input is a DTensor; "
                                   "distribute the inputs on it (distribute_tensor)")
        if any(m != meshes[0] for m in meshes[1:]):
            raise OptionError("the DTensor inputs (and mesh=) are on different DeviceMeshes; "
                              "redistribute them onto one")
        return meshes[0]


def placeholders(values) -> dict:
    """Read-only zero arrays of the global shapes and the dtypes of ``values``."""
    from ..analysis.frameworks import placeholder
    return {n: v if isinstance(v, numbers.Number) else placeholder(v)
            for n, v in values.items()}


_RUNS: Dict[int, Tuple[object, DTensorRun]] = {}
CACHED_RUNS = 64


def run_on_dtensors(compiled, values):
    """``compiled`` (a Kernel or Program, called without mesh=) on ``values``, some of
    them DTensors: planned for their DeviceMesh and placements (the plans kept per
    compiled object, as a sharded computation keeps its own)."""
    found = _RUNS.get(id(compiled))
    if found is None or found[0] is not compiled:
        if len(_RUNS) >= CACHED_RUNS:
            _RUNS.pop(next(iter(_RUNS)))
        found = _RUNS[id(compiled)] = (compiled, DTensorRun(compiled))
    return found[1](values)


__all__ = ["DTensorRun", "any_dtensor", "execute", "is_device_mesh", "is_dtensor",
           "placements_of", "run_on_dtensors"]
