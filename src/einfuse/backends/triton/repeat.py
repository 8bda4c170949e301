"""The Triton backend's fast path for a repeated call (issue 11's fast path, on the
GPU; issue 15): a statement called again with torch tensors of the same shapes,
dtypes, strides and device skips binding, planning and Triton's own per-call argument
binding and specialisation.  What is left per call: the tensors looked up by name, one
output allocation, the scalar parameters' device array (kept per value), and the
compiled kernel's launcher.

On an H100 machine the full path cost about 240 us of host time per call on a
16-element statement (torch's own op: 11 us); Triton's ``kernel[grid](...)`` alone
costs 18 us against 7 us for the compiled kernel's launcher, which is what this path
calls.

Prepared only where nothing a launch depends on can change between such calls: ':='
statements of the Triton backend, torch tensors that need no conversion (already on
the kernel's device, float values, not requiring a gradient), no gathers (their bounds
handling reads the index values), no hoisted form.  A call whose tensors' addresses are
not 16-byte aligned (Triton specialises a kernel on that) takes the kernel's usual
launch."""

from __future__ import annotations

import struct
import threading
from typing import Callable, Dict, Mapping, Optional

from ...plan import buffer_slots

Runner = Callable[[Mapping[str, object]], object]

# scalar parameter values -> their device array, per prepared runner (a training loop
# passes the same few values again and again; a copy to the device per call costs about
# 19 us and synchronises with the host)
PARAMETER_ARRAYS_KEPT = 16


def repeat_runner(call, final_dtype) -> Optional[Runner]:
    """A runner for calls with this call's signature, or None where the full path must
    run.  ``final_dtype``: the torch dtype the caller gets (as ``Kernel.run`` converts).
    Call only after the full path has run this call once (its launch is remembered)."""
    import torch
    from ...plan.gathers import bounds_mode
    from . import backend as tb
    spec = call.spec
    if call.framework != "torch" or any(t.as_index for t in spec.tensors) or \
            tb.host_fallback(call):
        return None
    device = tb._kernel_device(call)
    names = [name for name, _ in buffer_slots(spec)[:-1]]
    sources = call.sources or {}
    for name in names:
        tensor = sources.get(name)
        if not isinstance(tensor, torch.Tensor) or tensor.device != device or \
                not tensor.dtype.is_floating_point or tensor.requires_grad:
            return None
    tensors = [sources[name] for name in names]
    result_dtype = tb.result_dtype(call)
    result = torch.empty(call.output_shape, dtype=result_dtype, device=device)
    if result.numel() == 0:
        return None
    bounds = bounds_mode(call)
    layouts = [tb._Layout.of(t) for t in tensors + [result]]
    ready = tb._launches.get(tb._launch_key(call, layouts, bounds))
    if ready is None:
        return None
    prepared = ready.prepared
    working = getattr(torch, call.dtypes.working.name)
    shape, params, scalars = tuple(call.output_shape), prepared.params, prepared.scalars
    convert = final_dtype if final_dtype != result_dtype else None
    launch = _launcher(prepared, ready, device, len(names) + (1 if params else 0)
                       + len(scalars) + 1, len(names))
    arrays: Dict[bytes, object] = {}
    lock = threading.Lock()

    def parameter_array(named):
        values = tuple(named[p] for p in params)
        key = struct.pack(f"{len(values)}d", *values)   # bits: -0.0 is not 0.0
        array = arrays.get(key)
        if array is None:
            array = torch.tensor(values, dtype=working, device=device)
            with lock:
                if len(arrays) >= PARAMETER_ARRAYS_KEPT:
                    arrays.clear()
                arrays[key] = array
        return (array,)

    def run(named):
        out = torch.empty(shape, dtype=result_dtype, device=device)
        launch((*[named[name] for name in names],
                *(parameter_array(named) if params else ()), *scalars, out))
        return out if convert is None else out.to(convert)
    return run


def _launcher(prepared, ready, device, count: int, inputs: int):
    """launch(args): the kernel on these positional arguments (``inputs`` caller's
    tensors, parameter array, ints and floats, output), with the remembered
    configuration."""
    kernel, grid = prepared.kernel, ready.grid
    options = dict(num_warps=ready.config.num_warps, num_stages=ready.config.num_stages,
                   **ready.constexprs)

    def usual(args):
        return kernel[grid](*args, **options)
    direct = _direct(kernel, grid, ready, device, count)
    if direct is None:
        return usual

    def launch(args):
        # Triton specialises pointers on 16-byte alignment: the caller's tensors may be
        # views at any offset (the parameter array and the output are allocated here)
        for tensor in args[:inputs]:
            if tensor.data_ptr() % 16:
                return usual(args)
        return direct(args)
    return launch


def _direct(kernel, grid, ready, device, count: int):
    """The compiled kernel's own launcher, bypassing ``JITFunction.run`` (its argument
    binding, specialisation and cache-key computation on every call), or None: under
    the interpreter, or where this Triton's compiled kernel does not have the launcher
    this code knows (then the usual launch is kept).  The launch metadata and the
    launch hooks are passed as ``JITFunction.run`` passes them, so profilers that
    hook launches still see these."""
    from .backend import interpreted
    if interpreted() or device.type != "cuda":
        return None
    try:
        from triton import knobs
        from triton.runtime import driver
        runtime = knobs.runtime
        names = [p.name for p in kernel.params]
    except (ImportError, AttributeError):
        return None
    constexprs = dict(ready.constexprs)
    if len(names) != count + len(constexprs) or \
            any(name not in constexprs for name in names[count:]):
        return None
    tail = tuple(constexprs[name] for name in names[count:])
    g0, g1, g2 = tuple(grid) + (1,) * (3 - len(grid))
    state = {}
    get_stream = driver.active.get_current_stream
    index = device.index if device.index is not None else 0

    def direct(args):
        compiled = state.get("compiled")
        if compiled is None:   # the first launch goes through Triton and keeps its kernel
            compiled = kernel[grid](*args, num_warps=ready.config.num_warps,
                                    num_stages=ready.config.num_stages, **constexprs)
            if compiled is not None and all(hasattr(compiled, a) for a in (
                    "run", "function", "packed_metadata", "launch_metadata")):
                state["compiled"] = compiled
            return
        stream = get_stream(index)
        every = (*args, *tail)
        compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata,
                     compiled.launch_metadata(grid, stream, *every),
                     runtime.launch_enter_hook, runtime.launch_exit_hook, *every)
    return direct
