"""The cost model that ``shard="auto"`` minimises and ``explain`` shows.

Every device runs the same program on its blocks, so the time of a plan is one
device's: its FLOPs at a sustained rate, plus, for each collective, a latency and the
bytes that device sends at the link bandwidth (the alpha-beta model; the bytes are
those of the bandwidth-optimal ring algorithms, see :class:`~.layout.Move`).  Nothing
overlaps in this model, and a local slice costs nothing.  The defaults describe an
accelerator with a fast interconnect; pass your own ``CostModel`` for another."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import OptionError
from .memory import memory_limit


@dataclass(frozen=True)
class CostModel:
    flops_per_second: float = 1e13      # sustained FLOP/s of one device
    bytes_per_second: float = 1e11      # bytes one device sends per second (link)
    latency_seconds: float = 1e-5       # fixed cost of one collective
    # bytes one device may hold (memory.py); None: not checked.  memory= overrides it
    memory_per_device: Optional[int] = None

    def __post_init__(self):
        if self.memory_per_device is not None:
            memory_limit(self.memory_per_device, None)      # its error
        for name in ("flops_per_second", "bytes_per_second", "latency_seconds"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or \
                    not value >= 0 or (name != "latency_seconds" and value == 0):
                raise OptionError(f"CostModel {name}={value!r}: a positive number")


@dataclass(frozen=True)
class PlanCost:
    compute_seconds: float
    communication_seconds: float

    @property
    def seconds(self) -> float:
        return self.compute_seconds + self.communication_seconds


def plan_cost(plan, model: CostModel) -> PlanCost:
    compute = plan.local_flops / model.flops_per_second
    comm = sum(model.latency_seconds + m.bytes_sent / model.bytes_per_second
               for m in plan.collectives)
    return PlanCost(compute, comm)


def seconds_text(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"
