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
the kernel's device, float values or int32/int64 index arrays, not requiring a
gradient), no hoisted form.  A gather's bounds mode is the kernel's choice (its launch
key): under bounds='clip'/'wrap'/'fill' it depends on the dtypes alone, which the
signature fixes; under 'check'/'promise' the kernel the first call took reads without a
per-element test because every index value was in range ('verified'), so each repeat
reduces its index arrays to their (min, max) again (one device read of two values per
array, what the full path reads) and raises :class:`GatherOutOfRange` before anything is
allocated or launched where a span leaves its axis: the caller then runs the full path,
which raises the statement's bounds error (or, under 'promise', takes its own launch).
A lazily negated view (``z.conj().imag``, which the signature does not tell apart)
raises it too: the full path resolves it.  A call whose tensors' addresses are not
16-byte aligned where the first call's were (Triton specialises a kernel on that)
takes the kernel's usual launch (launch.py)."""

from __future__ import annotations

import math
import struct
import threading
from typing import Callable, Dict, Mapping, Optional, Tuple

from ...errors import BackendError
from ...plan import buffer_slots

Runner = Callable[[Mapping[str, object]], object]

# scalar parameter values -> their device array, per prepared runner (a training loop
# passes the same few values again and again; a copy to the device per call costs about
# 19 us and synchronises with the host)
PARAMETER_ARRAYS_KEPT = 16


class GatherOutOfRange(BackendError):
    """A repeated call the prepared runner does not launch (nothing allocated or run):
    an index value outside the range the prepared kernel was chosen for, or a lazily
    negated view.  The caller runs the statement's full path, which says why or runs it."""


def tensor_extremes(tensor) -> Optional[Tuple[int, int]]:
    """(min, max) of an int32/int64 index tensor, reduced where it lives (a CUDA
    tensor's two values are read in one transfer), or None when it is empty (an access
    through it reads nothing)."""
    if tensor.numel() == 0:
        return None
    low, high = tensor.aminmax()
    if tensor.is_cuda:
        import torch
        low, high = torch.stack((low, high)).tolist()
    return int(low), int(high)


def repeat_runner(call, final_dtype) -> Optional[Runner]:
    """A runner for calls with this call's signature, or None where the full path must
    run.  ``final_dtype``: the torch dtype the caller gets (as ``Kernel.run`` converts).
    Call only after the full path has run this call once (its launch is remembered)."""
    import torch
    from ...plan.gathers import bounds_mode, gather_spans, spans_in_range
    from . import backend as tb
    spec = call.spec
    if call.framework != "torch" or tb.host_fallback(call):
        return None
    device = tb._kernel_device(call)
    slots = buffer_slots(spec)[:-1]
    names = [name for name, _ in slots]
    sources = call.sources or {}
    for name, kind in slots:
        tensor = sources.get(name)
        if not isinstance(tensor, torch.Tensor) or tensor.device != device or \
                tensor.requires_grad or tensor.is_neg():
            return None
        if (tensor.dtype not in (torch.int32, torch.int64)) if kind == "index" else \
                not tensor.dtype.is_floating_point:
            return None     # (the full path converts those: its copy is not the caller's)
    tensors = [sources[name] for name in names]
    result_dtype = tb.result_dtype(call)
    result = torch.empty(call.output_shape, dtype=result_dtype, device=device)
    if result.numel() == 0:
        return None
    template, empty_like = output_template(result.shape, result_dtype, device), \
        torch.empty_like
    bounds = bounds_mode(call)
    # the gathered spans whose index values each repeat checks (under check/promise)
    spans = gather_spans(call) if call.options.bounds in ("check", "promise") and \
        any(kind == "index" for _, kind in slots) else ()
    if spans and bounds != "verified":
        return None     # the first call's values were out of range: the full path
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

    def in_range(named) -> bool:
        return spans_in_range(spans, lambda name: tensor_extremes(named[name]))

    def run(named):
        given = [named[name] for name in names]
        for tensor in given:
            if tensor.is_neg():
                raise GatherOutOfRange("a lazily negated view")
        if spans and not in_range(named):
            raise GatherOutOfRange("an index value outside the prepared kernel's range")
        out = empty_like(template)
        launch(*given, *(parameter_array(named) if params else ()), *scalars, out)
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
