"""Facts about the Triton target that the schedule reads before any backend is asked:
whether Triton can run here (a CUDA device, or the interpreter), in what dtype a result is
stored, and which calls run on the NumPy reference instead.  They depend only on the
installed packages, the environment and the bound call, so they sit below the schedule
and the backends both read them."""

from __future__ import annotations

import importlib.util
import os

from .capabilities import not_compiled


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def available() -> bool:
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
        return False
    if interpreted():
        return True
    import torch
    return torch.cuda.is_available()


def result_dtype(call):
    """The output's storage dtype: float16/bfloat16 results are stored as such (the
    kernel accumulates in float32 and converts once, at the store)."""
    import torch
    if call.bfloat16:
        return torch.bfloat16
    result = call.dtypes.result
    if result.kind == "f" and result.itemsize < call.dtypes.working.itemsize:
        return getattr(torch, result.name)
    return getattr(torch, call.dtypes.working.name)


def host_fallback(call) -> bool:
    """Statements whose working dtype is not float32/float64 run on the NumPy
    reference (the Triton kernels compute in floating point), and so do those a compiled
    backend cannot render (analysis/capabilities.py) and those with an
    empty input: every read of it is pad= or fill= (or none happens), and a kernel's
    clamped address into an empty array would point outside it."""
    working = call.dtypes.working
    if working.kind != "f" or working.itemsize < 4 or not_compiled(call.spec, "triton"):
        return True
    return any(0 in shape for shape in call.arrays.shapes.values())
