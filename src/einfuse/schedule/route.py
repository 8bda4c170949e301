"""Which backend runs a bound call; the rest of a kernel's route (library kernel,
hoisted form, BLAS, loop nest) is chosen by schedule/choose.py, which asks this first."""

from __future__ import annotations

from ..analysis.binding import BoundCall
from ..analysis.frameworks import TORCH
from ..analysis.triton_facts import available


def backend_name(requested: str, call: BoundCall) -> str:
    """``auto`` means Triton for CUDA tensors (when Triton is there), else C or NumPy."""
    if requested == "auto" and call.framework == TORCH and any(
            getattr(value, "is_cuda", False) for value in (call.sources or {}).values()):
        if available():
            return "triton"
    return requested
