"""Running a plan on DTensors (dtensor.py plans it): the DTensor placements of an
einfuse placement, each statement as einfuse's kernel on the local tensors, and each
move as a redistribution or a functional collective.  Imports torch inside its
functions."""

from __future__ import annotations

from typing import Tuple

from ..analysis.frameworks import has_dtensor
from ..errors import OptionError
from .layout import MoveKind, Placement
from .mesh import MeshShape
from .planner import ShardPlan, StatementPlan


def plan_key(values) -> Tuple:
    """A call's signature: names, shapes, dtypes and placements (numbers by value)."""
    return tuple((n, tuple(v.shape), str(v.dtype), tuple(map(str, v.placements)))
                 if has_dtensor((v,), {}) else (n, v) for n, v in sorted(values.items()))


def check_sayable(plan: ShardPlan, info: MeshShape) -> None:
    """Every placement of ``plan`` is one a DTensor can say (placements_of raises)."""
    for _, place in plan.inputs + plan.outputs:
        placements_of(place, info)
    for step in plan.steps:
        places = [step.output_placement] if isinstance(step, StatementPlan) \
            else [step.source, step.target]
        for place in places:
            placements_of(place, info)


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


def execute(plan: ShardPlan, kernels, values, device_mesh, info: MeshShape,
            keep_env: bool = False):
    """Run ``plan``: its results (DTensors), and with ``keep_env`` also every value by
    (name, placement)."""
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
                named[param] = value.to_local() if has_dtensor((value,), {}) else value
            local = kernel(**named)
            env[(step.output, step.output_placement)] = DTensor.from_local(
                local, device_mesh, placements_of(step.output_placement, info),
                run_check=False, shape=step.output_shape,
                stride=tuple(int(s) for s in strides_of(step.output_shape)))
        else:
            env[(step.tensor, step.target)] = move(step, env[(step.tensor, step.source)],
                                                   device_mesh, info)
    results = tuple(env[key] for key in plan.outputs)
    return (results, env) if keep_env else results


def move(step, value, device_mesh, info: MeshShape):
    """The plan's move ``step`` of the DTensor ``value``: a redistribution, which issues
    the collective the plan names -- except two, issued here as the functional
    collectives they are: the all-to-all, which DTensor's redistribution does as an
    all-gather and a slice (n times the bytes), and a collective over several mesh axes,
    which a redistribution issues once per mesh dimension (``one_collective``)."""
    target = placements_of(step.target, info)
    if len(step.mesh_axes) > 1 and step.kind is not MoveKind.ALL_TO_ALL:
        done = one_collective(step, value, device_mesh, info, target)
        if done is not None:
            return done
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
                              shape=shape, stride=strides_of(shape))


def one_collective(step, value, device_mesh, info: MeshShape, target):
    """``step`` (an all-reduce, all-gather or reduce-scatter over several mesh axes) as
    one functional collective over the group of those axes (the DeviceMesh's flattened
    sub-mesh, made once per mesh), as the plan counts it; None where it is left to the
    redistribution: a mesh without dimension names (torch flattens only named ones), or
    a value autograd records through DTensor's ops (these collectives have no
    backward; a planned backward, dtensor_autograd.py, records none)."""
    import torch
    if not getattr(device_mesh, "mesh_dim_names", None) or (
            torch.is_grad_enabled() and value.requires_grad):
        return None
    from torch.distributed import _functional_collectives as collectives
    from torch.distributed.tensor import DTensor
    axes = tuple(sorted(step.mesh_axes, key=info.names.index))    # the mesh's order
    group = device_mesh[axes]._flatten()
    local = value.to_local()
    if step.kind is MoveKind.ALL_REDUCE:
        result = collectives.all_reduce(local, step.op, group)
    elif step.kind is MoveKind.ALL_GATHER:
        result = collectives.all_gather_tensor(local, step.axis, group)
    elif step.kind is MoveKind.REDUCE_SCATTER:
        result = collectives.reduce_scatter_tensor(local, step.op, step.axis, group)
    else:
        return None
    shape = value.shape
    return DTensor.from_local(result, device_mesh, target, run_check=False, shape=shape,
                              stride=strides_of(shape))


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


def strides_of(shape) -> Tuple[int, ...]:
    strides, running = [], 1
    for extent in reversed(shape):
        strides.append(running)
        running *= max(int(extent), 1)
    return tuple(reversed(strides))


__all__ = ["check_sayable", "execute", "gradient_placements", "move", "one_collective",
           "placements_of", "plan_key", "rank_text", "wait_for"]
