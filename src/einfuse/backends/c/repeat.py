"""The C backend's fast path for a repeated call (issue 11): everything a call's kernel
needs that depends only on shapes, dtypes and strides -- the compiled functions, the
runtime ints, the thread count -- prepared once, so that a call with the same
signature is a dictionary lookup (runtime/kernel.py), dtype conversions, one output
allocation and the kernel call.

Only calls whose kernel arguments cannot depend on the data are prepared: scalar
parameters only as Python floats (their values are written per call), no repacked
inputs.  A gather's kernel tests each index value itself and raises its error flag for
one out of bounds; the runner then raises :class:`GatherFlagged`, and the caller runs
the call's full path, which names the offending value.  A BLAS contraction (or one plus
a broadcast term) is prepared as its transposes and one matmul (backends/c/blas.py)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import numpy as np

from ...errors import BackendError
from ...plan import buffer_slots, call_arguments
from ...plan.gathers import array_extremes, gather_spans, spans_in_range, unsigned_slots
from ...analysis.frameworks import TORCH, for_torch_caller
from . import call as c_call
from ...plan.contraction_addend import ContractionAddend
from ...schedule.schedule import Library, Schedule
from ...plan.loop_plan import input_buffers
from .backend import kernel_functions, nest_for, output_dtype
from .blas import addend_runner, contraction_runner, route_for
from .blas_route import NUMPY_BLAS
from .gather_rows import gather_rows_runner
from .rows import statement_runner
from .windowed import windowed_route, windowed_runner
from ...plan.windowed_contraction import WindowedContraction
from .merge_axes import merged_call
from .threads import fixed_thread_count, free_threads

Runner = Callable[[Mapping[str, np.ndarray]], np.ndarray]


@dataclass(frozen=True)
class PreparedRunner:
    """``run(named)``: the call's result, of ``dtype``, from arrays of the prepared
    signature looked up by name (other names in ``named`` are ignored)."""
    run: Runner
    dtype: np.dtype


# Below this much work a gather's prepared kernel tests every index value itself; from
# it on (where the tests would cost more than one min/max pass per index array, and
# keep the copy loop from vectorising) the runner makes that pass per call and runs the
# kernel without tests, as the full path does.
GATHER_WORK_PREPARED = 1 << 11


class GatherFlagged(BackendError):
    """A prepared kernel's gather read an index value out of bounds (and nothing out
    of bounds): the call's full path finds the value and raises the exact error."""


def repeat_runner(call, schedule: Optional[Schedule] = None) -> Optional[PreparedRunner]:
    """A runner computing this call's result (working dtype) from arrays of the same
    shapes, dtypes and strides by name, or None where the arguments depend on data;
    ``schedule``: the call's as-written schedule (schedule/choose.py): what it hands to
    BLAS, the thread count it fixed, the row gather it chose (Library.GATHER_ROWS).  Without one: the loop nest, threads as the
    call's options say."""
    blas = schedule.blas if schedule is not None else None
    spec = call.spec
    gathers = any(t.as_index for t in spec.tensors)
    rows = gather_rows_runner(call, GatherFlagged) \
        if schedule is not None and schedule.prepared is Library.GATHER_ROWS else None
    if rows is not None:     # the embedding form: a test and a memcpy per row
        return PreparedRunner(rows, np.dtype(output_dtype(call)))
    statistics = statement_runner(call, GatherFlagged) \
        if schedule is not None and schedule.prepared is Library.ROW_STATISTICS else None
    if statistics is not None:      # a log-sum-exp: one read of each row (rows.py)
        return PreparedRunner(statistics, np.dtype(call.dtypes.working))
    mode, spans = (_checking_mode(call) if gathers else None), None
    if gathers and call.bounds.points >= GATHER_WORK_PREPARED and \
            call.options.bounds in ("check", "promise"):
        if unsigned_slots(call):
            return None
        # the full path's kernel, which tests no index value, behind the same min/max
        # pass per index array (a few us against the gather's work)
        mode, spans = "verified", gather_spans(call)
    # Python floats only (their values fill the doubles per call); an int parameter can
    # decide the working dtype and is checked against it, so it takes the full path
    if any(type(call.params.get(name)) is not float for name in spec.params) or \
            (spec.params and call.dtypes.working.kind != "f"):
        return None
    if blas is not None:
        return blas_runner(call, blas, call.framework == TORCH or for_torch_caller())
    merged = merged_call(call)     # fewer, longer loops (merge_axes.py), on views
    if merged is not None:
        inner = repeat_runner(merged.call)
        if inner is None:
            return None
        run_merged, adapt, shape = inner.run, merged.adapt, tuple(call.output_shape)

        def run_reshaped(named):
            return run_merged(adapt(named)).reshape(shape)
        inner_describe = getattr(run_merged, "describe", None)
        if inner_describe is not None:      # (its views share their arrays' memory:
            # runtime/torch_node.py makes the same kernel calls on the arrays as they are)
            run_reshaped.describe = lambda: dict(inner_describe(), shape=shape)
        return PreparedRunner(run_reshaped, inner.dtype)
    working = call.dtypes.working
    shape = tuple(call.output_shape)
    out_dtype = output_dtype(call)
    buffers = input_buffers(call) + [np.empty(shape, dtype=out_dtype)]
    if buffers[-1].size == 0:
        return None
    loops = nest_for(call, schedule, buffers, mode)    # (the schedule's loop choice)
    if loops.packs:     # (a packed input: the full path, per call)
        return None
    plan, functions = kernel_functions(loops.choice)
    ints, doubles, integers = call_arguments(plan, call, buffers)
    params = tuple(plan.params)
    options = call.options      # (as the backend's full path passes them)
    fills = np.array([options.pad if options.pad is not None else 0.0, options.fill],
                     dtype=np.float64)
    fixed = schedule.threads if schedule is not None else \
        fixed_thread_count(call.options.threads, call.bounds.points)
    # else the cores left by other tasks, per call (c_threads.py)
    threads, adaptive = fixed or 0, fixed is None
    slots = buffer_slots(spec)[:-1]
    names = tuple(tensor for tensor, _ in slots)
    # index arrays as int64 (uint64 ones as their bit patterns), values in the working dtype
    dtypes = tuple(np.dtype(np.int64) if kind == "index" else working for _, kind in slots)
    pointer_array = ctypes.c_void_p * len(buffers)
    addresses = tuple(a.ctypes.data for a in (ints, doubles, integers, fills))

    def arguments(named: Mapping[str, np.ndarray]):
        """This call's inputs in the working dtype and its output, the addresses of the
        runtime arrays, and the array holding this call's parameter values (its own:
        thread-safe), which must stay alive while the kernel runs."""
        if spans is not None and not spans_in_range(
                spans, lambda name: array_extremes(named[name])):
            raise GatherFlagged("an index value out of bounds")
        arrays = tuple(named[name].astype(dtype, copy=False)
                       for name, dtype in zip(names, dtypes)) + (np.empty(shape, out_dtype),)
        if not params:
            return arrays, addresses, None
        values = np.array([named[name] for name in params], dtype=np.float64)
        return arrays, (addresses[0], values.ctypes.data) + addresses[2:], values

    # (more arrays than the extension takes: through ctypes)
    call_kernel = c_call.caller() if len(buffers) <= c_call.MAX_BUFFERS else None
    if call_kernel is not None:
        entries = tuple(ctypes.cast(f, ctypes.c_void_p).value for f in functions)

        def run_direct(named: Mapping[str, np.ndarray]) -> np.ndarray:
            arrays, given, _values = arguments(named)
            for entry in entries:
                if call_kernel(entry, arrays, *given, free_threads() if adaptive else threads):
                    raise GatherFlagged("a prepared C kernel raised its error flag")
            return arrays[-1]
        run_direct.keep = (ints, doubles, integers, fills, functions)
        # the same kernel calls as runtime/torch_node.py makes them from C++ (not with
        # parameters, whose values fill the doubles per call, nor a per-call check)
        run_direct.describe = None if params or spans is not None else lambda: {
            "entries": entries, "addresses": addresses, "adaptive": adaptive,
            "threads": threads, "inputs": tuple(zip(names, dtypes)), "shape": shape,
            "dtype": np.dtype(out_dtype)}
        return PreparedRunner(run_direct, np.dtype(out_dtype))

    def run(named: Mapping[str, np.ndarray]) -> np.ndarray:
        arrays, given, _values = arguments(named)
        pointers = pointer_array(*[a.ctypes.data for a in arrays])
        error = ctypes.c_int32(0)
        for function in functions:
            function(pointers, *given, free_threads() if adaptive else threads,
                     ctypes.byref(error))
        if error.value:    # only gathers raise the flag
            raise GatherFlagged("a prepared C kernel raised its error flag")
        return arrays[-1]
    run.keep = (ints, doubles, integers, fills)   # alive as long as the runner
    return PreparedRunner(run, np.dtype(out_dtype))


def blas_runner(call, blas, torch_route: bool) -> PreparedRunner:
    """The runner of a statement its schedule hands to BLAS (``blas``: a contraction,
    or one plus a broadcast term: backends/c/blas.py), as the backend's full path runs
    it; with ``torch_route`` (a call on torch tensors) the products large enough run on
    torch's BLAS."""
    if isinstance(blas, WindowedContraction):
        route = windowed_route(blas, call, torch_route)
        runner = windowed_runner(blas, call, route)
        if torch_route and route is NUMPY_BLAS:
            runner = _quiet(runner)
        return PreparedRunner(runner, np.dtype(call.dtypes.working))
    if isinstance(blas, ContractionAddend):
        return PreparedRunner(addend_runner(
            blas, call, route_for(blas.contraction, call, torch_route)),
            np.dtype(call.dtypes.working))
    return PreparedRunner(contraction_runner(
        blas, call, route_for(blas, call, torch_route)), np.dtype(call.dtypes.working))


def _quiet(runner):
    """``runner`` with NumPy's floating-point warnings off: a torch caller's products on
    NumPy's BLAS (one thread: windowed_route) give NaN where a pad meets an infinity, as
    torch's do, without NumPy's "invalid value" warning, which torch's never raised."""
    def run(named):
        with np.errstate(all="ignore"):
            return runner(named)
    return run


def _checking_mode(call) -> str:
    """The kernel bounds mode in which a gather tests each index value itself whatever
    the values of this call (plan/gathers.py's bounds_mode without its 'verified')."""
    bounds = call.options.bounds
    slots = unsigned_slots(call)
    return f"{bounds}:u{','.join(map(str, slots))}" if slots else bounds
