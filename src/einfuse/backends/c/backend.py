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
from ...plan import buffer_slots, call_arguments, unit_axis
# the lane tile and the register block, chosen from the machine's facts (re-exported:
# the C modules and the schedule read them here)
from ...plan.blocking import block_for, tile_for  # noqa: F401
from ...plan.kernel_key import KernelKey
from ...plan.contraction import run_contraction
from ...plan.contraction_addend import ContractionAddend
from ...plan.gathers import bounds_mode
from . import build as c_build
from .blas import blas_library, run_contraction_addend
from .pack import pack_axis
from .threads import thread_count
from .render import render_c

# The widest vector the target CPU has (analysis/machine.py: -march=native, or EINFUSE_CPU).
_VECTOR_BYTES = machine().vector_bytes

_kernels: Dict[KernelKey, Tuple] = {}   # compiled kernels (plan/kernel_key.py)
_kernels_lock = threading.Lock()
_warned = []
_ARGTYPES = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_void_p,
             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int32)]


def _buffers(call) -> List[np.ndarray]:
    """One array per kernel buffer slot (the output excluded)."""
    working = call.dtypes.working
    result = []
    for tensor, kind in buffer_slots(call.spec)[:-1]:
        array = np.asarray(call.arrays[tensor])
        dtype = np.int64 if kind == "index" else working
        result.append(array.astype(dtype, copy=False))
    return result


def output_dtype(call) -> np.dtype:
    """The kernel's output buffer: the working dtype, or int64 for argmax/argmin
    positions (exact whatever the values' dtype)."""
    return np.dtype(np.int64) if call.spec.result_is_position else call.dtypes.working


def _bounds(call) -> str:
    """The kernel's bounds mode; a C kernel tests each gathered value itself under
    check/promise too, so it reads uint64 index arrays as unsigned then as well."""
    return bounds_mode(call, unsigned_checks=True)


def kernel_key(call, layouts, bounds=None) -> KernelKey:
    """The key of this call's loop-nest kernel for these buffer layouts (and a bounds
    mode other than the one this call's data allows): what its lowering reads."""
    working = call.dtypes.working
    return KernelKey(call.spec, working.name, call.options.pad is not None,
                     bounds or _bounds(call), tuple(layouts), tile_for(working),
                     block_for(working), _short_indices(call))


def _plan(call, layouts, bounds=None):
    return kernel_key(call, layouts, bounds).plan()


# An index with fewer values than this is not worth spreading over SIMD lanes.
SHORT_EXTENT = 8


def _short_indices(call) -> Tuple[str, ...]:
    return tuple(name for name in call.spec.all_indices
                 if call.bounds.extent(name) < SHORT_EXTENT)


# Pack an input only when it is small next to the work: its copy must cost little.
PACK_WORK_RATIO = 8


def _pack_for_lanes(call, plan, buffers: List[np.ndarray]) -> bool:
    """Copy (in place in ``buffers``) each input that a vectorised lane loop walks along a
    strided axis into a layout where that axis has unit stride, so lanes load one
    contiguous vector instead of gathering (gauss: y[j, d] walked along j).  Returns
    whether anything was packed."""
    if not plan.lane_indices:
        return plan.mode == "scalar" and _pack_to_tile(call, buffers)
    from ...lang.ast import accesses
    work = call.bounds.points
    slots = buffer_slots(call.spec)
    packed = False
    for access in accesses(call.spec.rhs):
        slot = slots.index((access.tensor, "value")) if (access.tensor, "value") in slots \
            else None
        if slot is None or access.tensor == call.spec.output:
            continue
        array = buffers[slot]
        if array.size * PACK_WORK_RATIO > work:
            continue
        for axis, sub in enumerate(access.indices):
            walks = any(dict(sub.terms).get(lane) in (1, -1) for lane in plan.lane_indices)
            if walks and array.shape[axis] > 1 and unit_axis(array) != axis:
                buffers[slot] = pack_axis(array, axis, _pack_threads(call, array))
                packed = True
                break
    return packed or _pack_to_tile(call, buffers, plan)


def _pack_to_tile(call, buffers: List[np.ndarray], plan=None) -> bool:
    """Pack (in place in ``buffers``) the inputs whose layout keeps a lane tile off an
    output index (cdist's y[j, d] read along j), or, given a row-blocked ``plan``, those
    it reads across its rows along their unit-stride axis (backends/c/lane_layout.py);
    whether anything was packed."""
    from .lane_layout import packing_for_lanes, packing_for_rows
    args = (call.spec, tuple(unit_axis(b) for b in buffers), [b.shape for b in buffers],
            call.bounds.points, lambda layouts: _plan(call, layouts), PACK_WORK_RATIO)
    packing = packing_for_lanes(*args) if plan is None else packing_for_rows(plan, *args)
    for slot, axis in (packing or {}).items():
        buffers[slot] = pack_axis(buffers[slot], axis, _pack_threads(call, buffers[slot]))
    return bool(packing)


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
            function.argtypes = _ARGTYPES
            function.restype = None
            functions.append(function)
        with _kernels_lock:
            found = _kernels.setdefault(key, (plan, functions))
    return found


class CBackend:
    name = "c"

    @staticmethod
    def available() -> bool:
        ok = c_build.find_compiler() is not None
        if not ok and not _warned:
            _warned.append(True)
            import warnings
            warnings.warn("einfuse: no C compiler with OpenMP found (set CC); "
                          "backend='auto' falls back to the NumPy backend", EinfuseWarning,
                          stacklevel=3)
        return ok

    @staticmethod
    def run(call, blas=None) -> np.ndarray:
        """The call's result by its schedule (schedule/choose.py): ``blas``, the
        contraction (plan/contraction.py) or contraction plus term
        (plan/contraction_addend.py) the schedule hands to BLAS, else None: the loop
        nest."""
        if c_build.find_compiler() is None:
            raise BackendError("backend='c' needs a C compiler with OpenMP support (cc, gcc "
                               "or clang on PATH, or CC=...); use backend='numpy'")
        if isinstance(blas, ContractionAddend):   # BLAS, then the term added (blas.py)
            return run_contraction_addend(blas, call)
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
        work = call.bounds.points
        threads = thread_count(options.threads, work)
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
        return f"{blas.describe()} ({blas_library(blas, call)}), after the needed transposes"

    @staticmethod
    def strategy(call) -> str:
        layouts, packed = _explained_layouts(call)
        plan = _plan(call, layouts)
        kernel = plan.program.kernels[0]
        parallel = [n for n in call.spec.output_indices if n in call.spec.race_free_indices]
        rows, lanes = block_for(call.dtypes.working)
        tiled = f"output index {plan.inner} tiled by {tile_for(call.dtypes.working)} lanes" \
            if plan.row_index is None else \
            f"output indices {plan.row_index} x {plan.inner} in register blocks of " \
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
    plan = _plan(call, _explained_layouts(call)[0])
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


def explained_plan(call):
    """(plan, names of the inputs packed) of the loop nest a run of this call takes, laid
    out from shapes without copying anything (explain, the schedule's loop facts)."""
    layouts, packed = _explained_layouts(call)
    return _plan(call, layouts), packed


def _explained_layouts(call) -> Tuple[Tuple[int, ...], Tuple[str, ...]]:
    """(layouts, names of the inputs packed) of the plan a run takes where packing turns
    a scalar plan into a lane tile (backends/c/lane_layout.py), decided from shapes
    without copying anything, for explain."""
    from .lane_layout import packing_for_lanes
    layouts = tuple(_buffers_layout_only(call))
    if _plan(call, layouts).mode != "scalar":
        return layouts, ()
    slots = buffer_slots(call.spec)
    shapes = [np.shape(call.arrays[tensor]) for tensor, _ in slots[:-1]]
    packing = packing_for_lanes(call.spec, layouts, shapes + [tuple(call.output_shape)],
                                call.bounds.points, lambda trial: _plan(call, trial),
                                PACK_WORK_RATIO) or {}
    return (tuple(packing.get(slot, axis) for slot, axis in enumerate(layouts)),
            tuple(slots[slot][0] for slot in sorted(packing)))


def _buffers_layout_only(call) -> List[int]:
    """The unit-stride axes the buffers will have, without converting anything."""
    working = call.dtypes.working
    layouts = []
    for tensor, kind in buffer_slots(call.spec)[:-1]:
        array = np.asarray(call.arrays[tensor])
        dtype = np.dtype(np.int64 if kind == "index" else working)
        if array.dtype != dtype:
            layouts.append(array.ndim - 1 if array.ndim and array.shape[-1] > 1 else -1)
        else:
            layouts.append(unit_axis(array))
    shape = call.output_shape
    layouts.append(len(shape) - 1 if shape and shape[-1] > 1 else -1)
    return layouts
