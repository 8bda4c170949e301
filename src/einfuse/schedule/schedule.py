"""The schedule of one kernel as a value: which route computes it (a generated loop
nest, BLAS, a hand-written library kernel, its hoisted form, the NumPy reference, a
Triton kernel), on which backend, with what the code decided for it (the BLAS
contraction, the loop order and blocking of the loop nest, the thread count, what is
materialised and why).  Frozen and hashable: a Kernel keeps the schedule of each call
signature (runtime/kernel.py), and ``explain`` prints it.  It is chosen in one place,
:func:`einfuse.schedule.choose.choose`; the backends and the runtime read it."""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Hashable, Optional, Tuple

from ..analysis.spec_key import index_positions
from ..plan.lower import Plan, nest_order, plan_for
from ..plan.nest_order import NestOrder


class Route(enum.Enum):
    """How a kernel is computed."""
    LOOP_NEST = "generated loop nest"
    BLAS = "BLAS"
    BLAS_THEN_ADDEND = "BLAS, then the added term"
    BLAS_WINDOWED = "BLAS over strided views (a windowed contraction)"
    BLAS_THEN_EPILOGUE = "BLAS, then the elementwise epilogue"
    LIBRARY = "hand-written library kernel"
    HOISTED = "hoisted form"
    HOST = "NumPy reference"
    TRITON = "Triton kernel"


class Library(enum.Enum):
    """The hand-written kernels (schedule/library.py registers one rule per kernel and
    backend): a route may name attention; a loop nest's prepared repeat may take the
    row gather; a gradient's scatter-add takes one of the four scatters."""
    ATTENTION = "online-softmax attention"
    GATHER_ROWS = "a gather of whole rows (the embedding form), one copy per row"
    ROW_STATISTICS = "a log-sum-exp row kernel (row maxima and sums of exponentials)"
    STRIDED_ADD = "a scatter-add into one strided view of the target"
    WINDOW_ADD = ("a scatter-add of colliding windows (col2im): one C walk, or a strided "
                  "view add per window offset")
    SCATTER_ROWS = "a scatter-add of whole rows"
    SCATTER_ADD = "a scatter-add element by element, in the values' order"


class Reason(enum.Enum):
    """Why a value is materialised (written to memory) rather than kept in registers."""
    HOISTED = "a loop-invariant reduction, computed once before the loops"
    PRODUCT = "a contraction's product, computed by BLAS before its elementwise epilogue"
    PACKED_FOR_LANES = "copied into a layout the vector lanes walk"
    OUTPUT = "the result"


@dataclass(frozen=True)
class Materialised:
    name: str
    reason: Reason

    def __str__(self) -> str:
        return f"{self.name} ({self.reason.value})"


@dataclass(frozen=True)
class LoopChoice:
    """The inputs of a C loop nest's lowering (plan/lower.plan_for) as the schedule
    chose them for a call (schedule/loop_choice.py): the statement's spec, the working
    dtype, padding, the bounds mode of its gathers, the buffers' unit-stride axes
    (after the lane packing the schedule names), the lane tile and register block, the
    indices too short for lanes, and the nest's loop order, tiling and row block.  The
    key of the compiled kernel (backends/c/backend.py): one kernel per distinct
    choice, shared by every call that makes the same one."""
    spec: object
    working: str
    pad: bool
    bounds: str
    layouts: Tuple[int, ...]
    tile: int
    block: Tuple[int, int]
    short: Tuple[str, ...]
    nest: NestOrder

    def plan(self) -> Plan:
        """The lowering of the statement under these choices (plan_for caches it)."""
        return plan_for(self.spec, self.working, self.pad, self.bounds, self.layouts,
                        self.tile, self.block, self.short, nest=self.nest)

    def with_bounds(self, bounds: str) -> "LoopChoice":
        """The choice for another bounds mode (the nest chosen anew: a kernel that tests
        its gathers blocks no rows)."""
        return with_nest(self.spec, self.working, self.pad, bounds, self.layouts,
                         self.tile, self.block, self.short)

    @functools.cached_property
    def key(self) -> Tuple[Hashable, ...]:
        """The choice with its statement as its structural key and its indices as
        positions (analysis/spec_key.py): equal for two spellings of one computation
        that made the same choices, exact in their constants, so that they share one
        compiled kernel (backends/c/backend.py; a choice itself compares its spec by
        identity, and its plan names the spelling's own indices)."""
        return choice_key(self.spec, self.working, self.pad, self.bounds, self.layouts,
                          self.tile, self.block, self.short, self.nest)

    def relaid(self, layouts: Tuple[int, ...]) -> "LoopChoice":
        """The choice for the buffers laid out as ``layouts`` instead (the nest chosen
        anew for them): what the lane-packing search weighs a packing by
        (plan/loop_plan.lane_packs)."""
        return with_nest(self.spec, self.working, self.pad, self.bounds, tuple(layouts),
                         self.tile, self.block, self.short)

    def describe(self) -> str:
        parts = [f"{self.working}", f"bounds {self.bounds}",
                 "unit-stride axes " + ", ".join(map(str, self.layouts))]
        if self.pad:
            parts.append("padded")
        if self.short:
            parts.append("short " + ", ".join(self.short))
        return "kernel " + "; ".join(parts)


def choice_key(spec, working: str, pad: bool, bounds: str, layouts: Tuple[int, ...],
               tile: int, block: Tuple[int, int], short: Tuple[str, ...],
               nest: NestOrder) -> Tuple[Hashable, ...]:
    """LoopChoice.key: the lowering inputs, the statement by its structural key and
    the indices (short, the nest's order and row block) by their positions."""
    rows = index_positions(spec, (nest.rows,))[0] if nest.rows is not None else None
    return ("loop nest", spec.key, working, pad, bounds, layouts, tile, block,
            index_positions(spec, short), index_positions(spec, nest.order), nest.tiled,
            rows)


def with_nest(spec, working: str, pad: bool, bounds: str, layouts: Tuple[int, ...],
              tile: int, block: Tuple[int, int], short: Tuple[str, ...]) -> LoopChoice:
    """The LoopChoice of these lowering inputs, its nest as plan/lower.nest_order finds
    it for them."""
    return LoopChoice(spec, working, pad, bounds, layouts, tile, block, short,
                      nest_order(spec, working, pad, bounds, layouts, tile, block, short))


@dataclass(frozen=True)
class TritonChoice:
    """The inputs of a Triton kernel's lowering (plan/lower.plan_for with ``plain``
    and ``blocks``: every output loop a program's block, reductions plain loops) as the
    schedule chose them for a call (schedule/loop_choice.triton_choice): the
    statement's spec, the working dtype, padding, the bounds mode of its gathers, the
    buffers' unit-stride axes, the output tile (rows, lanes) and the nest's loop order
    and tiling.  The backend renders one kernel per choice and buffer dtypes
    (backends/triton/backend.py)."""
    spec: object
    working: str
    pad: bool
    bounds: str
    layouts: Tuple[int, ...]
    block: Tuple[int, int]
    nest: NestOrder

    def plan(self) -> Plan:
        """The lowering of the statement under these choices (plan_for caches it)."""
        return plan_for(self.spec, self.working, self.pad, self.bounds, self.layouts,
                        self.block[1], self.block, plain=True, blocks=True, nest=self.nest)


def triton_with_nest(spec, working: str, pad: bool, bounds: str, layouts: Tuple[int, ...],
                     block: Tuple[int, int]) -> TritonChoice:
    """The TritonChoice of these lowering inputs, its nest as plan/lower.nest_order
    finds it for a block-per-program lowering."""
    return TritonChoice(spec, working, pad, bounds, layouts, block,
                        nest_order(spec, working, pad, bounds, layouts, block[1], block,
                                   plain=True, blocks=True))


@dataclass(frozen=True)
class LoopSchedule:
    """The generated C loop nest of a call: ``choice``, what it is lowered from (and
    compiled by: the kernel's key), ``packs``, the (buffer slot, axis) copies a run
    makes first so that the buffers have ``choice.layouts``, from ``given``, the
    unit-stride axes the call's buffers have; and, for explain, what the lowering made
    of it (mode, loops, parallel and lane indices, tile, register block)."""
    mode: str                       # "tiled", "scalar" or "elementwise"
    order: Tuple[str, ...]          # the loops, outermost first (the statement's names)
    parallel: Tuple[str, ...]       # the indices OpenMP may split over threads
    lanes: Tuple[str, ...]          # the indices walked by vectorised lane loops
    tile: Optional[int] = None      # lanes of a 1-D output tile
    block: Optional[Tuple[str, str, int, int]] = None   # (rows index, lanes index, rows, lanes)
    choice: Optional[LoopChoice] = None
    packs: Tuple[Tuple[int, int], ...] = ()
    given: Tuple[int, ...] = ()

    def describe(self) -> str:
        parts = [self.mode, "loops " + (", ".join(self.order) or "none")]
        parts.append("parallel over " + (", ".join(self.parallel) or "nothing"))
        if self.block is not None:
            rows, lanes, r, n = self.block
            parts.append(f"register block {rows} x {lanes} of {r} x {n}")
        elif self.tile is not None:
            parts.append(f"tile of {self.tile} lanes")
        return "; ".join(parts)


@dataclass(frozen=True)
class Schedule:
    """The schedule of one kernel for one call signature.

    ``statements``: the statements the kernel computes (the hoisted form's, in order,
    for Route.HOISTED and Route.BLAS_THEN_EPILOGUE); ``blas``: the plan-level
    contraction (plan/contraction.py or plan/contraction_addend.py) BLAS computes on the
    BLAS routes, the contractions and their epilogue (plan/contraction_epilogue.py) on
    Route.BLAS_THEN_EPILOGUE; ``threads``: the fixed
    thread count, or None where the free cores decide call by call; ``fallback``: the
    schedule that runs where the route declines a call at run time (a library kernel
    that checks the data, a hoisted form whose temporary cannot be computed);
    ``prepared``: the library kernel a prepared repeat of the loop nest takes
    (Library.GATHER_ROWS, Library.ROW_STATISTICS) where the data lets it (printed last:
    the result is the loop nest's, the time the library kernel's)."""
    backend: str
    route: Route
    statements: Tuple[str, ...]
    library: Optional[Library] = None
    blas: object = None
    loops: Optional[LoopSchedule] = None
    threads: Optional[int] = None
    materialised: Tuple[Materialised, ...] = ()
    fallback: Optional["Schedule"] = None
    prepared: Optional[Library] = None

    def without_library(self) -> "Schedule":
        """The schedule that runs where the library kernel declines (self where there is
        none)."""
        return self.fallback if self.route is Route.LIBRARY and self.fallback is not None \
            else self

    def as_written(self) -> "Schedule":
        """The schedule of the statement as written: past a library kernel or a hoisted
        form to the fallback that runs when they decline (what ``Kernel.run`` runs)."""
        schedule = self
        while schedule.route in (Route.LIBRARY, Route.HOISTED,
                                 Route.BLAS_THEN_EPILOGUE) and \
                schedule.fallback is not None:
            schedule = schedule.fallback
        return schedule

    def describe(self) -> str:
        """One line: the route and what was decided for it."""
        what = self.library.value if self.library is not None else self.route.value
        parts = [f"{what} on backend {self.backend}"]
        if self.blas is not None:
            parts.append(self.blas.describe())
        if self.loops is not None:
            parts.append(self.loops.describe())
        if self.route is Route.LOOP_NEST and self.backend == "c":
            parts.append("threads " + (str(self.threads) if self.threads is not None
                                       else "as the free cores allow, per call"))
        if self.materialised:
            parts.append("materialised: " + ", ".join(map(str, self.materialised)))
        if len(self.statements) > 1:
            parts.append(f"{len(self.statements)} statements")
        if self.prepared is not None:
            parts.append(f"calls with these arrays' layouts run {self.prepared.value} where "
                         "their values let it")
        text = "; ".join(parts)
        if self.fallback is not None:
            text += f" (else {self.fallback.describe()})"
        return text

    __str__ = describe
