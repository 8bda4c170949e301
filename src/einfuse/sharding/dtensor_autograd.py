"""A DTensor call that autograd records, as one ``torch.autograd.Function``: the
forward runs the forward plan (dtensor.py's ``execute``) and keeps what the backward
reads at the placements the forward leaves it; the backward runs the backward's plan
(dtensor_backward.py) on those and on the output gradients at the placements torch
hands over, planned (and cached) for them, and returns each input's gradient at the
input's own placement.  So every collective of the backward is one the planner chose
and ``explain(..., gradients=True)`` shows.  Imported only when such a call is
recorded (it imports torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Tuple

import torch

from ..errors import NoGradientError, attach_statement
from .dtensor_execute import execute, plan_key, rank_text, wait_for
from .dtensor_backward import (BackwardNotPlanned, BackwardProgram, dtensor_placement,
                               gradient_targets, placements_in)
from .mesh import MeshShape
from .multiprocess import failure, lost_peer
from .planner import ShardPlan


@dataclass(frozen=True)
class _Call:
    """One recorded call: its run (the DTensorRun), forward plan and backward
    program, the values by name, the mesh, and the plan key of the call."""
    run: object
    plan: ShardPlan
    program: BackwardProgram
    values: Mapping[str, object]
    device_mesh: object
    info: MeshShape
    key: Tuple
    targets: Mapping[str, object]


class PlannedFunction(torch.autograd.Function):
    """The autograd node of a DTensor call whose backward is planned."""

    @staticmethod
    def forward(ctx, call: _Call, *tensors):
        results, env = execute(call.plan, call.run.program.kernels, call.values,
                               call.device_mesh, call.info, keep_env=True)
        wait_for(results)
        where = placements_in(call.plan)
        keys = tuple((name, place) for name in call.program.reads for place in where[name])
        ctx.call, ctx.keys = call, keys
        ctx.save_for_backward(*[env[k] for k in keys])
        ctx.outputs = tuple((tuple(r.shape), r.dtype, tuple(r.placements)) for r in results)
        for result in results:
            if not result.dtype.is_floating_point:
                ctx.mark_non_differentiable(result)
        return results

    @staticmethod
    def backward(ctx, *grads):
        call = ctx.call
        if torch.is_grad_enabled():
            raise attach_statement(NoGradientError(
                "the backward of a call on DTensors runs its plan once and is not "
                "differentiated again (create_graph=True); take higher derivatives "
                "without DTensors"), call.run.program.source)
        try:
            return (None,) + _gradients(call, dict(zip(ctx.keys, ctx.saved_tensors)),
                                        grads, ctx.outputs)
        except RuntimeError as error:
            if lost_peer(error):
                raise failure(error, call.run.program.source, rank_text()) from error
            raise


def _gradients(call: _Call, saved: Dict, grads, outputs) -> Tuple:
    from torch.distributed.tensor import DTensor, Replicate
    program, info, mesh = call.program, call.info, call.device_mesh
    values, seeds = {}, {}
    for seed, grad, (shape, dtype, placements) in zip(program.seeds, grads, outputs):
        if grad is None:       # an output the loss does not read: a zero gradient
            local = torch.zeros(placements_local_shape(shape, placements, mesh),
                                dtype=dtype)
            grad = DTensor.from_local(local, mesh, placements, run_check=False,
                                      shape=shape)
        elif not isinstance(grad, DTensor):
            grad = DTensor.from_local(grad, mesh, [Replicate()] * mesh.ndim,
                                      run_check=False)
        try:
            place = dtensor_placement(grad, info, True)
        except BackwardNotPlanned:   # (a Partial mean...): replicated first, unplanned
            grad = grad.redistribute(mesh, [Replicate()] * mesh.ndim)
            place = dtensor_placement(grad, info, True)
        seeds[seed] = place
        values[seed] = grad
    plan = call.run.backward_plan(call.plan, program, info, call.key, seeds, call.targets)
    for name, place in plan.inputs:
        if name not in values:
            values[name] = saved[(name, place)]
    for name in program.params:
        values[name] = call.values[name]
    results = dict(zip((n for n, _ in plan.outputs),
                       execute(plan, program.kernels, values, mesh, info)))
    wait_for(tuple(results.values()))
    found = []
    for name, result in zip(program.wrt, program.results):
        value = results.get(result) if result is not None else None
        like = call.values[name]
        if value is not None and value.dtype != like.dtype:
            value = value.to(like.dtype)
        found.append(value)
    return tuple(found)


def placements_local_shape(shape, placements, mesh) -> Tuple[int, ...]:
    local = list(shape)
    for m, place in enumerate(placements):
        if place.is_shard():
            local[place.dim] //= mesh.size(m)
    return tuple(local)


def run_recorded(run, plan: ShardPlan, program: BackwardProgram, values, device_mesh,
                 info: MeshShape):
    """The results of ``plan`` on ``values`` as one autograd node (see the module)."""
    targets = gradient_targets(values, plan, info, program.wrt)
    call = _Call(run, plan, program, dict(values), device_mesh, info,
                 plan_key(values), targets)
    tensors = [values[name] for name in program.wrt]
    return PlannedFunction.apply(call, *tensors)


__all__ = ["PlannedFunction", "run_recorded"]
