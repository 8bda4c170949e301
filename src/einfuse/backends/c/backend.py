"""The C backend: lower a statement to the loop-nest IR, render it as C with
OpenMP, compile it once (cached on disk and in memory), and run it on the
caller's arrays.

Per call, value arrays are converted to the working dtype and index arrays to
int64 in Python (no copy when they already are), so one kernel serves every
input dtype; strides, sizes and range starts are runtime arguments, so one
kernel serves every shape and layout with the same unit-stride axes.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Dict, List, Optional, Tuple

import numpy as np

from ...analysis.machine import machine
from ...errors import BackendError, EinfuseWarning
from ...plan import call_arguments, unit_axis
# the lane tile and the register block, chosen from the machine's facts (re-exported:
# the C modules read them here)
from ...plan.blocking import block_for, tile_for  # noqa: F401
from ...plan.loop_plan import (buffers_layout_only, call_bounds, input_buffers,
                               short_indices)
from ...plan.contraction import run_contraction
from ...plan.contraction_addend import ContractionAddend
from ...schedule.cache_key import CacheKey, compiled_nest_key, loop_nest_key
from ...schedule.loop_choice import loop_choice, loop_schedule, packed_inputs
from ...schedule.schedule import LoopChoice, LoopSchedule, Schedule
from . import build as c_build
from .blas import blas_library, run_contraction_addend
from .pack import pack_axis
from .threads import fixed_thread_count, thread_count, threads_for
from .windowed import run_windowed, windowed_library
from ...plan.windowed_contraction import WindowedContraction
from .render import render_c

# The widest vector the target CPU has (analysis/machine.py: -march=native, or EINFUSE_CPU):
# the hand-written kernels' vector width (attention, rows).
VECTOR_BYTES = machine().vector_bytes

# The C modules' names for the lowering's facts (plan/loop_plan.py).
_buffers = input_buffers
_short_indices = short_indices
_buffers_layout_only = buffers_layout_only

# compiled kernels by the schedule's loop choice (schedule/schedule.LoopChoice, in the
# one cache-key type, schedule/cache_key.py): one per distinct choice, whichever call
# made it
_kernels: Dict[CacheKey, Tuple] = {}
# which entry of _kernels holds the functions compiled for a structural key
# (CacheKind.COMPILED_NEST -> a CacheKind.LOOP_NEST key): what a structurally equal
# choice of another spelling finds (an index only: a cleared _kernels compiles anew)
_compiled_by_structure: Dict[CacheKey, CacheKey] = {}
_kernels_lock = threading.Lock()
_warned = []
KERNEL_ARGTYPES = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_void_p,
             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int32)]


def output_dtype(call) -> np.dtype:
    """The kernel's output buffer: the working dtype, or int64 for argmax/argmin
    positions (exact whatever the values' dtype)."""
    return np.dtype(np.int64) if call.spec.result_is_position else call.dtypes.working


def kernel_key(call, layouts, bounds=None) -> LoopChoice:
    """The loop choice (schedule/loop_choice.py) of this call for buffers laid out as
    ``layouts`` and ``bounds`` (default: the mode this call's data allows): the key its
    compiled kernel is cached by."""
    return loop_choice(call, layouts, bounds)


def _plan(call, layouts, bounds=None):
    """The plan of the schedule's loop choice for this call's buffers laid out as
    ``layouts`` (before any packing)."""
    return loop_choice(call, layouts, bounds).plan()


def nest_for(call, schedule: Optional[Schedule], buffers: List[np.ndarray],
             bounds: Optional[str] = None) -> LoopSchedule:
    """The loop nest the call's schedule chose (its LoopSchedule), or, where it carries
    none that fits these buffers -- no schedule, a fallback's nest, buffers laid out
    otherwise than it saw them, or another bounds mode (default: the one this call's
    data allows; 'verified' depends on the index values) -- the one
    schedule/loop_choice.py chooses for them."""
    bounds = bounds or call_bounds(call)
    loops = schedule.loops if schedule is not None else None
    if loops is None or loops.choice is None or loops.choice.bounds != bounds or \
            loops.given != tuple(unit_axis(b) for b in buffers):
        loops = loop_schedule(call, buffers, bounds)
    return loops


def packed_for(call, loops: LoopSchedule, buffers: List[np.ndarray]) -> LoopChoice:
    """Make the copies ``loops`` names (in place in ``buffers``) and return the choice
    for the buffers as they are then: the schedule's, unless a copy's unit-stride axis
    came out otherwise (then the choice for the layouts it has)."""
    for slot, axis in loops.packs:
        buffers[slot] = pack_axis(buffers[slot], axis, _pack_threads(call, buffers[slot]))
    choice = loops.choice
    if loops.packs:
        layouts = tuple(unit_axis(b) for b in buffers)
        if layouts != choice.layouts:
            choice = loop_choice(call, layouts, choice.bounds)
    return choice


def _pack_threads(call, array: np.ndarray) -> int:
    """A copy's threads, chosen as a kernel's (the cores other tasks leave)."""
    return thread_count(call.options.threads, array.size)


def _run_layouts(call, buffers: List[np.ndarray]) -> Tuple[int, ...]:
    """The buffers' unit-stride axes the kernel is planned for, after packing (in place
    in ``buffers``) the inputs its loop nest's choice names."""
    return packed_for(call, loop_schedule(call, buffers), buffers).layouts


def kernel_functions(choice: LoopChoice):
    """(plan, [ctypes function per IR kernel]) of the loop nest ``choice`` names (the
    schedule's LoopChoice), compiled once per distinct choice; and once for every
    spelling of the statement whose choice is structurally equal (LoopChoice.key):
    their plans lower to the same loop nest, each run passing its own plan's runtime
    ints (the plan returned is ``choice``'s own)."""
    key = loop_nest_key(choice)
    found = _kernels.get(key)
    if found is None:
        plan = choice.plan()
        functions = _shared_functions(choice, plan)
        with _kernels_lock:
            found = _kernels.setdefault(key, (plan, functions))
    return found


def _shared_functions(choice: LoopChoice, plan):
    """The compiled functions of ``plan``: those compiled for a structurally equal
    choice, where its plan is the same loop nest (the same IR, the same runtime ints at
    the same index positions: the check keeps a lowering that read a name apart), else
    compiled now and shared under the choice's structural key."""
    shared = compiled_nest_key(choice)
    holder = _compiled_by_structure.get(shared)
    found = _kernels.get(holder) if holder is not None else None
    if found is not None and found[0].program == plan.program and \
            positional_ints(holder.value, found[0]) == positional_ints(choice, plan):
        return found[1]
    library = c_build.load(render_c(plan.program, c_build.vector_math()), plan.fast_math)
    functions = []
    for kernel in plan.program.kernels:
        function = getattr(library, kernel.name)
        function.argtypes = KERNEL_ARGTYPES
        function.restype = None
        functions.append(function)
    if found is None:   # (none yet, or its entry was cleared: this one holds it now)
        with _kernels_lock:
            _compiled_by_structure[shared] = loop_nest_key(choice)
    return functions


def positional_ints(choice: LoopChoice, plan) -> Tuple:
    """The plan's runtime ints with their indices as positions in the statement."""
    positions = {name: n for n, name in enumerate(choice.spec.all_indices)}
    return tuple((how[0],) + tuple(("index", positions[part]) if isinstance(part, str)
                                   and part in positions else part for part in how[1:])
                 for how in plan.int_args)


class CBackend:
    name = "c"

    @staticmethod
    def available(announce: bool = True) -> bool:
        """Whether a C compiler with OpenMP is found; ``announce``: warn once where
        not (``auto`` then means the NumPy backend)."""
        ok = c_build.find_compiler() is not None
        if not ok and announce and not _warned:
            _warned.append(True)
            import warnings
            warnings.warn("einfuse: no C compiler with OpenMP found (set CC); "
                          "backend='auto' falls back to the NumPy backend", EinfuseWarning,
                          stacklevel=3)
        return ok

    @staticmethod
    def run(call, schedule: Optional[Schedule] = None) -> np.ndarray:
        """The call's result by its schedule (schedule/schedule.Schedule, chosen by
        schedule/choose.py): the contraction (plan/contraction.py) or contraction plus
        term (plan/contraction_addend.py) it hands to BLAS, else the loop nest on the
        thread count it fixed (or, where it fixed none, the cores other tasks leave,
        call by call).  Without a schedule: the loop nest, threads as the call's
        options and the free cores say."""
        blas = schedule.blas if schedule is not None else None
        if c_build.find_compiler() is None:
            raise BackendError("backend='c' needs a C compiler with OpenMP support (cc, gcc "
                               "or clang on PATH, or CC=...); use backend='numpy'")
        if isinstance(blas, ContractionAddend):   # BLAS, then the term added (blas.py)
            return run_contraction_addend(blas, call)
        if isinstance(blas, WindowedContraction):     # strided views, then BLAS
            return run_windowed(blas, call)
        if blas is not None:
            return run_contraction(blas, call)
        out = np.empty(call.output_shape, dtype=output_dtype(call))
        if out.size == 0:
            return out
        buffers = _buffers(call) + [out]
        try:
            plan, functions = kernel_functions(
                packed_for(call, nest_for(call, schedule, buffers), buffers))
        except c_build.CompileError as error:
            raise BackendError(str(error)) from None
        ints, doubles, integers = call_arguments(plan, call, buffers)
        options = call.options
        fills = np.array([options.pad if options.pad is not None else 0.0, options.fill],
                         dtype=np.float64)
        pointers = (ctypes.c_void_p * len(buffers))(*[b.ctypes.data for b in buffers])
        fixed = schedule.threads if schedule is not None else \
            fixed_thread_count(options.threads, call.bounds.points)
        threads = threads_for(fixed)
        error = ctypes.c_int32(0)
        for function in functions:
            function(pointers, ints.ctypes.data, doubles.ctypes.data, integers.ctypes.data,
                     fills.ctypes.data, threads, ctypes.byref(error))
        if error.value:
            # A gather left its axis under bounds='check'/'promise'; the kernel read
            # nothing out of bounds.  The reference finds the first offending value
            # and raises the exact error.
            from ..numpy.backend import NumpyExecutor
            NumpyExecutor.for_call(call).run()
            raise BackendError("the C kernel flagged an out-of-bounds gather that the "
                               "reference did not find")
        return out

    @staticmethod
    def loop_nest(call):
        return _loop_nest(call)

    @staticmethod
    def blas_source(blas) -> str:
        """What :meth:`source` is for a call the schedule hands to BLAS."""
        return f"/* no generated source: {blas.describe()} (numpy.matmul) */"

    @staticmethod
    def source(call) -> str:
        """The C source this call's loop nest is compiled from."""
        buffers = _buffers(call) + [np.empty(call.output_shape, dtype=output_dtype(call))]
        plan = packed_for(call, loop_schedule(call, buffers), buffers).plan()
        return render_c(plan.program, c_build.vector_math())

    @staticmethod
    def built(call) -> Optional[bool]:
        """Is this call's C kernel compiled already (in this process or in the disk
        cache)?  (A call the schedule hands to BLAS generates none: not asked.)"""
        buffers = _buffers(call) + [np.empty(call.output_shape, dtype=output_dtype(call))]
        plan = packed_for(call, loop_schedule(call, buffers), buffers).plan()
        return c_build.is_built(render_c(plan.program, c_build.vector_math()), plan.fast_math)

    @staticmethod
    def blas_strategy(call, blas) -> str:
        """What :meth:`strategy` is for a call the schedule hands to BLAS."""
        if isinstance(blas, WindowedContraction):
            return f"{blas.describe()} ({windowed_library(blas, call)})"
        return f"{blas.describe()} ({blas_library(blas, call)}), after the needed transposes"

    @staticmethod
    def strategy(call) -> str:
        loops = loop_schedule(call)
        plan, packed = loops.choice.plan(), packed_inputs(call, loops)
        kernel = plan.program.kernels[0]
        parallel = [n for n in call.spec.output_indices if n in call.spec.race_free_indices]
        rows, lanes = block_for(call.dtypes.working)
        tiled = f"output index {plan.inner} tiled by {tile_for(call.dtypes.working)} lanes" \
            if plan.row_index is None else \
            ("output " if plan.row_index in call.spec.output_indices else "") + \
            f"indices {plan.row_index} x {plan.inner} in register blocks of " \
            f"{rows} x {lanes}"
        how = {"tiled": f"{tiled} with register accumulators, reductions outside the "
                        "vectorised lane loop",
               "scalar": "register accumulators per output element, reductions innermost",
               "elementwise": "no reduction, innermost loop vectorised"}[plan.mode]
        if packed:
            how += f" (after copying {', '.join(packed)} into a layout the lanes walk)"
        return (f"fused C kernel ({len(kernel.body)} loop nest(s)), OpenMP-parallel over "
                f"{', '.join(parallel) or 'nothing (scalar result)'}; {how}; compiled "
                f"{'with' if plan.fast_math else 'without'} reciprocal math")


def _loop_nest(call):
    """The compiled loop nest as pseudo-code with the statement's names and sizes."""
    from ..pseudo_render import render_pseudo
    plan = loop_schedule(call).choice.plan()
    kernel = plan.program.kernels[0]
    ranges = call.bounds.range_map
    values = {}
    for generated, how in zip(kernel.ints, plan.int_args):
        if how[0] == "lo":
            values[generated] = ranges[how[1]][0]
        elif how[0] == "n":
            values[generated] = max(0, ranges[how[1]][1] - ranges[how[1]][0])
    return render_pseudo(plan.program, [tensor for tensor, _ in plan.slots],
                         call.spec.all_indices, plan.params, values)
