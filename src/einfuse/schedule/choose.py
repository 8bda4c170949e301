"""The one place a kernel's route is chosen: :func:`choose` returns the
:class:`~einfuse.schedule.schedule.Schedule` of a Kernel's bound call -- a library
kernel (schedule/library.py), the hoisted form, or the statement as written on its
backend: BLAS where the statement is a contraction (or one plus a broadcast term) and
the C backend runs it, else the C loop nest, the NumPy reference or a Triton kernel.
The backends and the runtime read the value; nothing here runs, and nothing here
asks a backend: the facts are analysis/'s and plan/'s."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Optional

from ..analysis.binding import BoundCall
from ..analysis.ranges import points
from ..analysis.thread_policy import fixed_thread_count
from ..analysis.triton_facts import host_fallback
from ..lang.printer import format_statement
from ..plan.contraction import Contraction, match_contraction
from ..plan.contraction_addend import match_contraction_addend
from ..plan.windowed_contraction import (WindowedContraction, WindowMethod, window_method,
                                         windowed_contraction, with_method)
from ..plan.windowed_panels import PanelForm, panel_form
from .library import library_for, prepared_library
from .loop_choice import loop_schedule, packed_inputs
from .route import backend_name, resolved_name
from .schedule import Materialised, Reason, Route, Schedule

_BACKEND_ROUTES = {"numpy": Route.HOST, "triton": Route.TRITON}

# A Schedule per distinct set of fields, made once: a frozen dataclass's constructor
# costs a microsecond, and a call without a signature to cache by chooses every time.
_schedule = functools.lru_cache(maxsize=2048)(Schedule)


def blas_choice(call: BoundCall):
    """The contraction (plan/contraction.py), or contraction plus added term
    (plan/contraction_addend.py), or windowed contraction (plan/windowed_contraction.py,
    the one of these that takes pad=: it pads the arrays), that BLAS computes for this
    call on the C backend, or None: a float working dtype (BLAS knows no integers)."""
    if call.dtypes.working.kind != "f":
        return None
    if call.options.pad is None:
        found = match_contraction(call.spec) or match_contraction_addend(call.spec)
        if found is not None:
            return found
    return windowed_choice(call)


def windowed_choice(call: BoundCall) -> Optional[WindowedContraction]:
    """The windowed contraction (plan/windowed_contraction.py: a convolution's form,
    its gradients) BLAS computes for this call, with the way chosen for its ranges
    (one patch matrix or a GEMM per window offset), or None."""
    found = windowed_contraction(call.spec, call.options.pad is not None)
    if found is None:
        return None
    ranges = call.bounds.range_map
    form = panel_form(found, ranges)
    if form is not None and _panels_pay(form, ranges):
        return replace(with_method(found, WindowMethod.PATCHES), panels=form)
    return with_method(found, window_method(found, ranges, call.dtypes.working.itemsize))


# The panel form (plan/windowed_panels.py) from this many multiply-adds an image: its
# GEMMs (one per value of the window's outer index) then cost what one GEMM over
# im2col's patches does (conv2d 8x32x32x32 by 64 filters of 3x3, one thread: 2.2 ms
# either way), and it packs a third of the patches and no col2im.  Below it the
# extra BLAS calls per image cost more than the packing saves.
PANEL_WORK = 1 << 20
# ... and from this many rows of a panel (each GEMM's K: the channels times the folded
# window): a conv1d of 3 channels would run GEMMs of K = 3.  (A 2-D first layer, 3
# channels by 7x7 filters, K = 21, ran as fast either way.)
PANEL_DEPTH = 32
# A panel with nothing folded beside the channels (a 1-D convolution's) gives GEMMs of K
# = channels alone, against im2col's one GEMM of K = channels x taps: measured on a Zen 4
# host (one thread, conv1d of 16-48 channels by 3-5 taps over 8192 positions) im2col was
# 5-30% faster below 64 channels and as fast from 64 on; a 2-D panel (K = channels x
# the folded window, 48 for 16 channels by 3x3) was 0-9% faster than im2col.
PANEL_DEPTH_UNFOLDED = 64
# ... and from this many multiply-adds a GEMM (an image's work over the looped window
# index's values): a forward read as a weight gradient's form (a strided row has no
# other reading) loops over the output positions, thousands of GEMMs of a few
# thousand multiply-adds each, where one call's cost is not paid back.
PANEL_GEMM_WORK = 1 << 16


def _panels_pay(form: PanelForm, ranges) -> bool:
    offsets = points(form.offsets, ranges)
    if points((form.row[2],), ranges) < 2 or offsets == 0:
        return False
    each = points(form.own + form.channels + form.positions, ranges)     # one GEMM's
    depth = points(form.channels + form.offsets[1:], ranges)
    return each * offsets >= PANEL_WORK and each >= PANEL_GEMM_WORK and \
        depth >= (PANEL_DEPTH if form.folded else PANEL_DEPTH_UNFOLDED)


def blas_contraction(call: BoundCall) -> Optional[Contraction]:
    """The BLAS choice where it is a contraction alone (no added term), else None."""
    choice = blas_choice(call)
    return choice if isinstance(choice, Contraction) else None


def runs_hoisted(form, call: BoundCall) -> bool:
    """Whether ``call`` runs in ``form`` (a statement's hoisted form or its BLAS
    epilogue form, runtime/hoisted.py): the form's dtypes apply to the call and the
    positions it holds in a temporary are exact for the call's ranges.  The one rule
    every route that may take a hoisted form asks (the schedule, the program units,
    the row groups, sharding's planner, a JAX call)."""
    return form is not None and form.runs(call)


def epilogue_form_for(kernel, call: BoundCall, backend: str):
    """The kernel's epilogue form (runtime/hoisted.epilogue_form: its contractions on
    BLAS, then the elementwise rest) where this call runs it: the C backend (whose BLAS
    route it feeds) and a float working dtype BLAS takes, no pad=; else None."""
    if backend != "c" or call.options.pad is not None or \
            call.dtypes.working.kind != "f":
        return None
    form = getattr(kernel, "epilogue_form", None)
    return form if runs_hoisted(form, call) else None


def resolved_backend(kernel, call: BoundCall, backend: Optional[str] = None) -> str:
    """The name of the backend that runs the call (``auto`` resolved)."""
    return resolved_name(backend or backend_name(kernel.options.backend, call))


def choose(kernel, call: BoundCall, backend: Optional[str] = None) -> Schedule:
    """The schedule of ``kernel`` (a Kernel: statement, spec, options, hoisted_form)
    for ``call``; ``backend``: a backend name to use instead of the kernel's options.
    A C loop nest's schedule carries its loop choice (schedule/loop_choice.py: what
    the lowering reads, the compiled kernel's key) and what the lowering made of it."""
    name = resolved_backend(kernel, call, backend)
    form = kernel.hoisted_form
    epilogue = epilogue_form_for(kernel, call, name)
    hoisted = epilogue is None and runs_hoisted(form, call)
    library = library_for(kernel.statement, call.framework, name)
    # a C loop nest carries its loop choice (a fallback's nest is chosen where it runs)
    schedule = as_written(kernel, call, name, name == "c" and library is None and
                          epilogue is None and not hoisted)
    if epilogue is not None:
        products = tuple(Materialised(t.output, Reason.PRODUCT)
                         for t in epilogue.epilogue.temporaries)
        earlier = tuple(Materialised(t.output, Reason.HOISTED)
                        for t in epilogue.hoisted.temporaries
                        if t not in epilogue.epilogue.temporaries)
        schedule = _schedule(name, Route.BLAS_THEN_EPILOGUE, epilogue.texts,
                             blas=epilogue.epilogue, materialised=earlier + products,
                             fallback=schedule)
    elif hoisted:
        temporaries = tuple(Materialised(t.output, Reason.HOISTED)
                            for t in form.hoisted.temporaries)
        schedule = _schedule(name, Route.HOISTED, form.texts, materialised=temporaries,
                            fallback=schedule)
    if library is not None:
        schedule = _schedule(name, Route.LIBRARY, (_text(kernel),), library=library,
                            fallback=schedule)
    return schedule


def as_written(kernel, call: BoundCall, backend: Optional[str] = None,
               detail: bool = False) -> Schedule:
    """The schedule of the statement as written (no library kernel, no hoisted form):
    what ``Kernel.run`` runs; ``detail``: a C loop nest with its loop choice
    (schedule/loop_choice.py; without it the backend chooses it from the buffers it
    holds, through the same function)."""
    name = resolved_backend(kernel, call, backend)
    statements = (_text(kernel),)
    if name != "c":
        route = _BACKEND_ROUTES.get(name, Route.LOOP_NEST)
        if route is Route.TRITON and host_fallback(call):
            route = Route.HOST      # what no Triton kernel computes (analysis/triton_facts)
        return _schedule(name, route, statements)
    blas = blas_choice(call)
    if blas is not None:
        route = Route.BLAS if isinstance(blas, Contraction) else \
            Route.BLAS_WINDOWED if isinstance(blas, WindowedContraction) else \
            Route.BLAS_THEN_ADDEND
        return _schedule(name, route, statements, blas=blas)
    threads = fixed_thread_count(call.options.threads, call.bounds.points)
    # a gather's prepared repeat may copy whole rows, a log-sum-exp's run the row
    # statistics kernel (schedule/library.py)
    prepared = prepared_library(call, name) if call.spec.reduction_indices or \
        any(t.as_index for t in call.spec.tensors) else None
    if not detail or 0 in tuple(call.output_shape):     # (an empty result runs no nest)
        return _schedule(name, Route.LOOP_NEST, statements, threads=threads,
                         prepared=prepared)
    loops = loop_schedule(call)
    return Schedule(name, Route.LOOP_NEST, statements, loops=loops, threads=threads,
                    materialised=tuple(Materialised(p, Reason.PACKED_FOR_LANES)
                                       for p in packed_inputs(call, loops)),
                    prepared=prepared)


def _text(kernel) -> str:
    return _statement_text(kernel.spec)


@functools.lru_cache(maxsize=1024)
def _statement_text(spec) -> str:
    return format_statement(spec.statement)
