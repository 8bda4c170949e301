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
from ...plan.kernel_key import KernelKey
from ...plan.loop_plan import (PACK_WORK_RATIO, buffers_layout_only, explained_layouts,  # noqa: F401
                               explained_plan, input_buffers, kernel_key, lane_packs,
                               loop_plan, short_indices)
from ...plan.contraction import run_contraction
from ...plan.contraction_addend import ContractionAddend
from ...schedule.schedule import Schedule
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
_plan = loop_plan
_short_indices = short_indices
_explained_layouts = explained_layouts
_buffers_layout_only = buffers_layout_only

_kernels: Dict[KernelKey, Tuple] = {}   # compiled kernels (plan/kernel_key.py)
_kernels_lock = threading.Lock()
_warned = []
KERNEL_ARGTYPES = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_void_p,
             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int32)]


def output_dtype(call) -> np.dtype:
    """The kernel's output buffer: the working dtype, or int64 for argmax/argmin
    positions (exact whatever the values' dtype)."""
    return np.dtype(np.int64) if call.spec.result_is_position else call.dtypes.working


def _pack_for_lanes(call, plan, buffers: List[np.ndarray]) -> bool:
    """Copy (in place in ``buffers``) the inputs plan/loop_plan.lane_packs names into
    the layout the plan's lanes walk; whether anything was packed."""
    packs = lane_packs(call, plan, buffers)
    for slot, axis in packs:
        buffers[slot] = pack_axis(buffers[slot], axis, _pack_threads(call, buffers[slot]))
    return bool(packs)


def _pack_threads(call, array: np.ndarray) -> int:
    """A copy's threads, chosen as a kernel's (the cores other tasks leave)."""
    return thread_count(call.options.threads, array.size)


def _run_layouts(call, buffers: List[np.ndarray]) -> Tuple[int, ...]:
    """The buffers' unit-stride axes the kernel is planned for, after packing (in place
    in ``buffers``) the inputs a lane loop would otherwise walk along a strided axis."""
    layouts = tuple(unit_axis(b) for b in buffers)
    if _pack_for_lanes(call, _plan(call, layouts), buffers):
        layouts = tuple(unit_axis(b) for b in buffers)
    return layouts


def kernel_functions(call, layouts, bounds=None):
    """(plan, [ctypes function per IR kernel]) for this call's statement and layout;
    ``bounds``: a kernel bounds mode other than the one this call's data allows."""
    key = kernel_key(call, layouts, bounds)
    found = _kernels.get(key)
    if found is None:
        plan = key.plan()
        library = c_build.load(render_c(plan.program, c_build.vector_math()),
                               plan.fast_math)
        functions = []
        for kernel in plan.program.kernels:
            function = getattr(library, kernel.name)
            function.argtypes = KERNEL_ARGTYPES
            function.restype = None
            functions.append(function)
        with _kernels_lock:
            found = _kernels.setdefault(key, (plan, functions))
    return found


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
            plan, functions = kernel_functions(call, _run_layouts(call, buffers))
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
        plan = _plan(call, _run_layouts(call, buffers))
        return render_c(plan.program, c_build.vector_math())

    @staticmethod
    def built(call) -> Optional[bool]:
        """Is this call's C kernel compiled already (in this process or in the disk
        cache)?  (A call the schedule hands to BLAS generates none: not asked.)"""
        buffers = _buffers(call) + [np.empty(call.output_shape, dtype=output_dtype(call))]
        plan = _plan(call, _run_layouts(call, buffers))
        return c_build.is_built(render_c(plan.program, c_build.vector_math()), plan.fast_math)

    @staticmethod
    def blas_strategy(call, blas) -> str:
        """What :meth:`strategy` is for a call the schedule hands to BLAS."""
        if isinstance(blas, WindowedContraction):
            return f"{blas.describe()} ({windowed_library(blas, call)})"
        return f"{blas.describe()} ({blas_library(blas, call)}), after the needed transposes"

    @staticmethod
    def strategy(call) -> str:
        layouts, packed = explained_layouts(call)
        plan = _plan(call, layouts)
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
    plan = _plan(call, explained_layouts(call)[0])
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
