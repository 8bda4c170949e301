"""``shard="auto"``: the assignment of indices to mesh axes with the lowest modelled
cost (cost.py).  Each index goes on no mesh axis, on one, or on all of them together;
every combination is tried when there are at most ``EXHAUSTIVE_LIMIT`` of them, and
beyond that a greedy search starts from nothing sharded and repeatedly makes the
single change that lowers the cost most, until none does.  Assignments that are not
allowed (a mesh axis on two indices of one statement, an extent that does not divide)
are skipped.  A plan that does not fit in the cost model's memory per device
(memory.py) ranks after every plan that does, and where none fits the search refuses;
ties go to the plan that holds less per device."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from ..errors import AllocationError, EinfuseError
from .cost import CostModel, PlanCost, plan_cost
from .memory import MemoryUse, memory_use
from .mesh import Assignment, MeshAxes, MeshShape

EXHAUSTIVE_LIMIT = 729


@dataclass(frozen=True)
class Candidate:
    plan: object            # ShardPlan
    cost: PlanCost
    memory: MemoryUse
    fits: bool              # within the cost model's memory per device

    @property
    def key(self):
        # plans that fit first; ties: fewer collectives, then less memory per device,
        # then fewer indices split
        return (not self.fits, self.cost.seconds, len(self.plan.collectives),
                self.memory.peak, len(self.plan.assignment.pairs))


@dataclass(frozen=True)
class SearchResult:
    best: Candidate
    ranked: Tuple[Candidate, ...]         # the cheapest first
    exhaustive: bool
    tried: int


def choices(mesh: MeshShape) -> List[MeshAxes]:
    options: List[MeshAxes] = [()] + [(name,) for name in mesh.names]
    if len(mesh.names) > 1:
        options.append(mesh.names)
    return options


def search(indices: Tuple[str, ...], mesh: MeshShape,
           build: Callable[[Assignment], object], model: CostModel) -> SearchResult:
    options = choices(mesh)
    tried: Dict[Assignment, Optional[Candidate]] = {}

    def evaluate(pairs) -> Optional[Candidate]:
        assignment = Assignment(tuple((i, a) for i, a in pairs if a))
        if assignment not in tried:
            try:
                plan = build(assignment)
                use = memory_use(plan)
                limit = model.memory_per_device
                tried[assignment] = Candidate(plan, plan_cost(plan, model), use,
                                              limit is None or use.peak <= limit)
            except EinfuseError:
                tried[assignment] = None
        return tried[assignment]

    exhaustive = len(options) ** len(indices) <= EXHAUSTIVE_LIMIT
    if exhaustive:
        for combo in itertools.product(options, repeat=len(indices)):
            evaluate(zip(indices, combo))
    else:
        current = {i: () for i in indices}
        best = evaluate(current.items())
        while True:
            step = None
            for index in indices:
                for axes in options:
                    if axes == current[index]:
                        continue
                    found = evaluate({**current, index: axes}.items())
                    if found is not None and (best is None or found.key < best.key) and \
                            (step is None or found.key < step[2].key):
                        step = (index, axes, found)
            if step is None:
                break
            current[step[0]], best = step[1], step[2]
    ranked = tuple(sorted((c for c in tried.values() if c is not None),
                          key=lambda c: c.key))
    if not ranked:
        # not even "nothing sharded" is possible: let its error speak
        build(Assignment(()))
    if not ranked[0].fits:
        smallest = min(ranked, key=lambda c: c.memory.peak)
        raise AllocationError(
            f"no assignment of indices to the mesh fits in {model.memory_per_device:,} "
            f"bytes per device (memory=, or the device's own): the smallest of the "
            f"{len(ranked)} tried, {smallest.plan.assignment}, needs at least "
            f"{smallest.memory.peak:,} bytes on each device (peak at {smallest.memory.at})")
    return SearchResult(ranked[0], ranked, exhaustive, len(tried))
