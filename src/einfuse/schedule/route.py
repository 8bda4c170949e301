"""Which backend runs a bound call (``auto`` resolved); the rest of a kernel's route (library kernel,
hoisted form, BLAS, loop nest) is chosen by schedule/choose.py, which asks this first."""

from __future__ import annotations

from ..analysis.binding import BoundCall
from ..analysis.capabilities import can_build
from ..analysis.options import BACKENDS
from ..errors import OptionError
from ..analysis.frameworks import TORCH
from ..analysis.triton_facts import available


def backend_name(requested: str, call: BoundCall) -> str:
    """``auto`` means Triton for CUDA tensors (when Triton is there), else C or NumPy."""
    if requested == "auto" and call.framework == TORCH and any(
            getattr(value, "is_cuda", False) for value in (call.sources or {}).values()):
        if available():
            return "triton"
    return requested


def resolved_name(requested: str) -> str:
    """The backend ``requested`` names: ``auto`` is the C backend where a C compiler is
    found (analysis/capabilities.py), else the NumPy reference (warning once)."""
    if requested == "auto":
        return "c" if can_build("c", announce=True) else "numpy"
    if requested not in BACKENDS:
        raise OptionError(f"backend={requested!r} is not available in this build of "
                          f"einfuse (available: {', '.join(sorted(set(BACKENDS) - {'auto'}))})")
    return requested
