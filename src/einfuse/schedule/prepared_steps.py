"""How a prepared torch backward's gradient step runs (runtime/torch_prepared.py),
decided here from the step's schedule (its kernel's, once per signature:
schedule/choose.py): a product the schedule hands to BLAS (dx = dy W^T, dW = x^T dy, a
strided convolution's values dy W) runs on BLAS as a torch caller's does
(backends/c/blas.py: torch's BLAS where the product is large enough), every other step
on its kernel's own prepared runner."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

from .schedule import Route, Schedule

# The routes whose product BLAS computes (then an added term, or over strided views).
BLAS_ROUTES = frozenset((Route.BLAS, Route.BLAS_THEN_ADDEND, Route.BLAS_WINDOWED))


class StepRoute(enum.Enum):
    TORCH_BLAS = "BLAS as a torch caller's (the schedule's contraction)"
    PREPARED = "the gradient kernel's own prepared runner"


@dataclass(frozen=True)
class StepDecision:
    """The step's route, the contraction BLAS computes (TORCH_BLAS) and why."""
    route: StepRoute
    blas: Optional[object] = None
    reason: str = ""


def prepared_step_route(schedule: Schedule) -> StepDecision:
    """The route of a gradient step whose kernel's schedule for the step's signature
    is ``schedule``."""
    if schedule.backend != "c":
        return StepDecision(StepRoute.PREPARED,
                            reason=f"the step runs on the {schedule.backend} backend")
    if schedule.route not in BLAS_ROUTES:
        return StepDecision(StepRoute.PREPARED,
                            reason=f"the step's route is {schedule.route.value}")
    return StepDecision(StepRoute.TORCH_BLAS, schedule.blas,
                        f"the step's route is {schedule.route.value}")
