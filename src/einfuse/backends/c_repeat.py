"""The C backend's fast path for a repeated call (issue 11): everything a call's kernel
needs that depends only on shapes, dtypes and strides -- the compiled functions, the
runtime ints, the thread count -- prepared once, so that a call with the same
signature is a dictionary lookup (runtime/kernel.py), dtype conversions, one output
allocation and the kernel call.

Only calls whose kernel arguments cannot depend on the data are prepared: scalar
parameters only as Python floats (their values are written per call), no gathers
(bounds are checked against the index values), no repacked inputs.  A
BLAS contraction is prepared as its transposes and np.matmul."""

from __future__ import annotations

import ctypes
from typing import Callable, Mapping, Optional

import numpy as np

from ..errors import BackendError
from ..plan import buffer_slots, call_arguments, unit_axis
from ..plan.contraction import prepare_contraction
from . import c_call
from .c_threads import free_threads
from .c_backend import PARALLEL_MIN_WORK, _blas_contraction, _buffers, _pack_for_lanes, \
    kernel_functions, output_dtype

Runner = Callable[[Mapping[str, np.ndarray]], np.ndarray]


def repeat_runner(call) -> Optional[Runner]:
    """A function computing this call's result (working dtype) from arrays of the same
    shapes, dtypes and strides by name, or None where the arguments depend on data."""
    spec = call.spec
    if any(t.as_index for t in spec.tensors) or call.options.pad is not None:
        return None
    # Python floats only (their values fill the doubles per call); an int parameter can
    # decide the working dtype and is checked against it, so it takes the full path
    if any(type(call.params.get(name)) is not float for name in spec.params) or \
            (spec.params and call.dtypes.working.kind != "f"):
        return None
    contraction = _blas_contraction(call)
    if contraction is not None:     # np.matmul after the transposes, as the backend does
        prepared = prepare_contraction(contraction, call)
        return lambda named: prepared(named, named)     # scalar factors by name
    working = call.dtypes.working
    shape = tuple(call.output_shape)
    out_dtype = output_dtype(call)
    buffers = _buffers(call) + [np.empty(shape, dtype=out_dtype)]
    if buffers[-1].size == 0:
        return None
    plan, functions = kernel_functions(call, [unit_axis(b) for b in buffers])
    if _pack_for_lanes(call, plan, list(buffers)):
        return None
    ints, doubles, integers = call_arguments(plan, call, buffers)
    params = tuple(plan.params)
    fills = np.zeros(2, dtype=np.float64)
    threads = call.options.threads or (1 if call.bounds.points < PARALLEL_MIN_WORK else 0)
    adaptive = threads == 0      # the cores left by other tasks, per call (c_threads.py)
    names = tuple(tensor for tensor, _ in buffer_slots(spec)[:-1])
    pointer_array = ctypes.c_void_p * len(buffers)
    addresses = tuple(a.ctypes.data for a in (ints, doubles, integers, fills))

    def arguments(named: Mapping[str, np.ndarray]):
        """This call's inputs in the working dtype and its output, the addresses of the
        runtime arrays, and the array holding this call's parameter values (its own:
        thread-safe), which must stay alive while the kernel runs."""
        arrays = tuple(named[name].astype(working, copy=False) for name in names) + \
            (np.empty(shape, dtype=out_dtype),)
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
                    raise BackendError("a prepared C kernel raised its error flag")
            return arrays[-1]
        run_direct.keep = (ints, doubles, integers, fills, functions)
        return run_direct

    def run(named: Mapping[str, np.ndarray]) -> np.ndarray:
        arrays, given, _values = arguments(named)
        pointers = pointer_array(*[a.ctypes.data for a in arrays])
        error = ctypes.c_int32(0)
        for function in functions:
            function(pointers, *given, free_threads() if adaptive else threads,
                     ctypes.byref(error))
        if error.value:    # only gathers raise the flag, and they are not prepared
            raise BackendError("a prepared C kernel raised its error flag")
        return arrays[-1]
    run.keep = (ints, doubles, integers, fills)   # alive as long as the runner
    return run
