"""The Triton backend's fast path for a repeated call (issue 11's fast path, on the
GPU; issue 15): a statement called again with torch tensors of the same shapes,
dtypes, strides and device skips binding, planning and Triton's own per-call argument
binding and specialisation.  What is left per call: the tensors looked up by name, one
output allocation, the scalar parameters' device array (kept per value), and the
prepared launch (launch.py: the compiled kernel's own launcher after the first call).

On an H100 machine the full path cost about 240 us of host time per call on a
16-element statement (torch's own op: 11 us); Triton's ``kernel[grid](...)`` alone
costs 18 us against 7 us for the compiled kernel's launcher, which is what this path
calls.

Prepared only where nothing a launch depends on can change between such calls: ':='
statements of the Triton backend, torch tensors that need no conversion (already on
the kernel's device, float values, not requiring a gradient), no gathers (their bounds
handling reads the index values), no hoisted form.  A call whose tensors' addresses are
not 16-byte aligned where the first call's were (Triton specialises a kernel on that)
takes the kernel's usual launch (launch.py)."""

from __future__ import annotations

import math
import struct
import threading
from typing import Callable, Dict, Mapping, Optional, Tuple

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
    template, empty_like = output_template(result.shape, result_dtype, device), \
        torch.empty_like
    bounds = bounds_mode(call)
    layouts = [tb._Layout.of(t) for t in tensors + [result]]
    ready = tb._launches.get(tb._launch_key(call, layouts, bounds))
    if ready is None:
        return None
    prepared = ready.prepared
    working = getattr(torch, call.dtypes.working.name)
    shape, params, scalars = tuple(call.output_shape), prepared.params, prepared.scalars
    convert = final_dtype if final_dtype != result_dtype else None
    # the prepared launch (launch.py): direct after its first call on a GPU, the
    # interpreter's call under TRITON_INTERPRET=1
    launch = ready.launcher
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
        out = empty_like(template)
        launch(*[named[name] for name in names],
               *(parameter_array(named) if params else ()), *scalars, out)
        return out if convert is None else out.to(convert)
    return run


def output_template(shape: Tuple[int, ...], dtype, device):
    """A tensor of ``shape``, ``dtype`` and ``device`` holding one element (every axis
    broadcast), whose ``torch.empty_like`` is a new contiguous tensor of that shape:
    torch lays out anew a tensor that is not dense.  An empty shape's template is an
    empty contiguous tensor itself."""
    import torch
    if math.prod(shape) == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.empty((1,) * len(shape), dtype=dtype, device=device).expand(shape)
