"""Statements and programs on PyTorch DTensors (``torch.distributed.tensor``): the
plan comes from the same planner as for JAX (planner.py), each rank runs the einfuse
kernels on its local tensors, and the plan's moves are DTensor redistributions, which
torch.distributed carries out with its functional collectives (gloo on CPU, NCCL on
GPU) and differentiates (their backward is the transposed collective).

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

import numpy as np

from ..analysis.frameworks import has_dtensor
from ..errors import EinfuseError, EinfuseTypeError, OptionError, attach_statement
from .api import check_options, choose, shard_of_inputs, statements_of, with_memory
from .cost import CostModel
from .layout import MoveKind, Placement
from .memory import check_fits
from .mesh import MeshShape
from .multiprocess import failure, lost_peer
from .planner import ShardPlan, StatementPlan


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

    def __call__(self, values: Mapping[str, object]):
        try:
            device_mesh = self._device_mesh(values)
            info = check_options(device_mesh, self.shard)
            plan = self.plan(values, device_mesh, info)
        except EinfuseError as error:
            raise attach_statement(error, self.program.source) from None
        try:
            results = execute(plan, self.program.kernels, values, device_mesh, info)
            wait_for(results)
        except RuntimeError as error:
            if lost_peer(error):      # gloo/NCCL: a rank of the job died
                raise failure(error, self.program.source, rank_text()) from error
            raise
        return results[0] if len(results) == 1 else results

    def plan(self, values, device_mesh, info: MeshShape) -> ShardPlan:
        key = tuple((n, tuple(v.shape), str(v.dtype), tuple(map(str, v.placements)))
                    if is_dtensor(v) else (n, v) for n, v in sorted(values.items()))
        plan = self._plans.get(key)
        if plan is None:
            shard = self.shard
            if shard is None:
                shard = shard_of_inputs(self.program, values, info)
            model = with_memory(CostModel(), self.memory, device_mesh)
            plan = choose(self.program, placeholders(values), info, shard, model,
                          rank=False, narrow=False).plan
            check_fits(plan, model.memory_per_device)
            for _, place in plan.inputs + plan.outputs:   # a DTensor can say each one
                placements_of(place, info)
            for step in plan.steps:
                places = [step.output_placement] if isinstance(step, StatementPlan) \
                    else [step.source, step.target]
                for place in places:
                    placements_of(place, info)
            if len(self._plans) >= CACHED_PLANS:
                self._plans.pop(next(iter(self._plans)))
            self._plans[key] = plan
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


def placements_of(place: Placement, info: MeshShape):
    """The DTensor placements (one per mesh dimension) of an einfuse placement."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    result = [Replicate() for _ in info.names]
    for axis, axes in enumerate(place.layout):
        order = [info.names.index(a) for a in axes]
        if order != sorted(order):
            # a DTensor splits a tensor axis over mesh dimensions in their order
            raise OptionError(
                f"the plan splits a tensor axis over mesh axes {'*'.join(axes)}, not in "
                "the DeviceMesh's order, which a DTensor placement cannot say; list them "
                "in the mesh's order in shard=")
        for m in order:
            result[m] = Shard(axis)
    if place.pending is not None:
        for axis in place.pending.axes:
            result[info.names.index(axis)] = Partial(place.pending.op)
    return tuple(result)


def gradient_placements(place: Placement, step: StatementPlan, info: MeshShape):
    """The placements of the gradient of a statement's local input: on a mesh axis the
    statement splits but the input is not split over, each rank's gradient is its part
    of a sum (Partial); elsewhere the gradient is placed as the input is."""
    from torch.distributed.tensor import Partial, Replicate
    placements = list(placements_of(Placement(place.layout), info))
    used = {a for _, axes in step.split.pairs for a in axes}
    split = {a for axes in place.layout for a in axes}
    for m, name in enumerate(info.names):
        if name in used and name not in split:
            placements[m] = Partial("sum")
        elif place.pending is not None and name in place.pending.axes:
            placements[m] = Replicate()
    return tuple(placements)


def execute(plan: ShardPlan, kernels, values, device_mesh, info: MeshShape):
    from torch.distributed.tensor import DTensor
    env = {}
    for name, place in plan.inputs:
        value = values[name]
        wanted = placements_of(place, info)
        if tuple(value.placements) != wanted:
            value = value.redistribute(device_mesh, wanted)
        env[(name, place)] = value
    for step in plan.steps:
        if isinstance(step, StatementPlan):
            kernel = kernels[step.number - 1]
            named = {name: env[(name, place)].to_local(
                grad_placements=gradient_placements(place, step, info))
                for name, place in step.reads}
            for param in kernel.spec.params:
                value = values[param]
                named[param] = value.to_local() if is_dtensor(value) else value
            local = kernel(**named)
            env[(step.output, step.output_placement)] = DTensor.from_local(
                local, device_mesh, placements_of(step.output_placement, info),
                run_check=False, shape=step.output_shape,
                stride=tuple(int(s) for s in _strides(step.output_shape)))
        else:
            env[(step.tensor, step.target)] = move(step, env[(step.tensor, step.source)],
                                                   device_mesh, info)
    return tuple(env[key] for key in plan.outputs)


def move(step, value, device_mesh, info: MeshShape):
    """The plan's move ``step`` of the DTensor ``value``: a redistribution, which issues
    the collective the plan names -- except the all-to-all, which DTensor's
    redistribution does as an all-gather and a slice (n times the bytes): that one is
    issued here, as the functional collective it is."""
    target = placements_of(step.target, info)
    if step.kind is not MoveKind.ALL_TO_ALL or len(step.mesh_axes) != 1:
        return value.redistribute(device_mesh, target)
    import torch
    from torch.distributed import _functional_collectives as collectives
    from torch.distributed.tensor import DTensor
    dim = info.names.index(step.mesh_axes[0])
    group = step.group
    # this rank's block of axis other_axis, cut into one piece per rank along axis: the
    # piece for rank s goes to s, and the pieces received, in rank order, are this
    # rank's block of axis ``axis`` whole along other_axis
    pieces = torch.stack(value.to_local().chunk(group, dim=step.axis)).contiguous()
    received = collectives.all_to_all_single_autograd(pieces, None, None,
                                                      (device_mesh, dim))
    local = torch.cat(received.unbind(0), dim=step.other_axis)
    shape = value.shape
    return DTensor.from_local(local, device_mesh, target, run_check=False,
                              shape=shape, stride=_strides(shape))


def wait_for(results) -> None:
    """Wait for the collectives behind ``results`` (functional collectives return
    tensors that wait when first used): a failed collective raises here, in the call."""
    import torch
    with torch.no_grad():
        for result in results:
            local = result.to_local()
            wait = getattr(local, "wait", None)
            if callable(wait):
                wait()


def rank_text() -> str:
    import torch.distributed as dist
    return f"rank {dist.get_rank()} of {dist.get_world_size()}"


def _strides(shape) -> Tuple[int, ...]:
    strides, running = [], 1
    for extent in reversed(shape):
        strides.append(running)
        running *= max(int(extent), 1)
    return tuple(reversed(strides))


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
