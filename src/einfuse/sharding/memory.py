"""Memory in the sharding cost model: the bytes one device holds while it runs a plan,
and the per-device limit plans are checked against (``memory=``, or the device's own).

Every device holds the same amount (the blocks are equal), so one device's count is the
plan's.  Counted: the input blocks (the caller's arrays: resident throughout), and each
value a step makes -- a statement's result block, a collective's or slice's result --
from the step that makes it to its last reader (the results to the end).  The peak is
the largest total at any step.  Not counted: the kernels' own scratch space (a
contraction's packed operands, a hoisted reduction's temporary) and the framework's
buffers for collectives in flight, so the peak is a lower bound of what a device
needs; a plan that exceeds the limit by this count cannot fit."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

from ..errors import AllocationError, OptionError
from .planner import StatementPlan


@dataclass(frozen=True)
class MemoryUse:
    inputs: int            # bytes of the input blocks one device holds
    peak: int              # the most bytes one device holds at once
    at: str                # the step where the peak is reached


def _block_bytes(plan, name: str, place) -> int:
    info = plan.tensor(name)
    shape = place.local_shape(info.shape, plan.mesh)
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(info.dtype).itemsize


def memory_use(plan) -> MemoryUse:
    """The per-device memory of ``plan`` (a ShardPlan), by the count above."""
    steps = plan.steps
    last: Dict[Tuple, int] = {}
    made: list = []
    for number, step in enumerate(steps):
        if isinstance(step, StatementPlan):
            reads = list(step.reads)
            made.append(((step.output, step.output_placement), step.text.strip()))
        else:
            reads = [(step.tensor, step.source)]
            made.append(((step.tensor, step.target),
                         f"{step.kind.value} of {step.tensor}"))
        for key in reads:
            last[key] = number
    inputs = sum(_block_bytes(plan, n, p) for n, p in plan.inputs)
    given = set(plan.inputs)
    live: Dict[Tuple, int] = {}
    peak, at = inputs, "the inputs"
    for number, (key, label) in enumerate(made):
        if key not in given:
            live[key] = _block_bytes(plan, *key)
        total = inputs + sum(live.values())
        if total > peak:
            peak, at = total, label
        for done in [k for k in live if last.get(k, -1) <= number and
                     k not in plan.outputs]:
            del live[done]
    return MemoryUse(inputs, peak, at)


def fits(plan, limit: Optional[int]) -> bool:
    return limit is None or memory_use(plan).peak <= limit


def check_fits(plan, limit: Optional[int]) -> None:
    """Refuse to run ``plan`` where one device's memory would not hold it."""
    if limit is None:
        return
    use = memory_use(plan)
    if use.peak > limit:
        raise AllocationError(
            f"the plan {plan.assignment} needs at least {use.peak:,} bytes on each device "
            f"(inputs {use.inputs:,}; the peak at {use.at}), more than the {limit:,} "
            "bytes per device of memory= (or the device's own); shard more indices, or "
            "shard='auto', which keeps to the limit")


def memory_limit(memory, mesh) -> Optional[int]:
    """The per-device limit in bytes: ``memory=`` when given, else the device's own
    where its framework reports one (a GPU's), else None (not checked)."""
    if memory is not None:
        if isinstance(memory, bool) or not isinstance(memory, numbers.Integral) or \
                memory <= 0:
            raise OptionError(f"memory= is the bytes one device may hold (a positive "
                              f"integer), not {memory!r}")
        return int(memory)
    return device_memory(mesh)


def device_memory(mesh) -> Optional[int]:
    """The memory of one device of ``mesh`` as its framework reports it: a JAX device's
    ``memory_stats()["bytes_limit"]``, a CUDA device's total memory for a torch
    DeviceMesh; None for CPUs (they report none) and dict meshes."""
    devices = getattr(mesh, "devices", None)
    if devices is not None and hasattr(devices, "flat"):          # jax.sharding.Mesh
        device = next(iter(devices.flat), None)
        stats = getattr(device, "memory_stats", None)
        try:
            found = stats() if callable(stats) else None
        except Exception:     # noqa: BLE001 - a backend without statistics
            found = None
        limit = (found or {}).get("bytes_limit")
        return int(limit) if limit else None
    if getattr(mesh, "device_type", None) == "cuda":                # torch DeviceMesh
        import torch
        return int(torch.cuda.get_device_properties(torch.cuda.current_device())
                   .total_memory)
    return None
