"""What a compiled backend cannot render yet, decided from the analysed statement
alone: such statements run on the NumPy reference, by plan (``strategy`` says so),
not as an error path.  The C backend renders every statement; Triton lacks
argmax/argmin."""

from __future__ import annotations

from typing import Callable, Dict, Optional

# Whether a compiled backend can build here (the C backend: a C compiler with OpenMP
# found), answered by the backend's own probe, which backends/__init__.py registers at
# import: probing compiles a test program, which only the backend knows how to do.
# The schedule (which backend ``auto`` means, whether a fused group can be built)
# asks here, below every backend.
_PROBES: Dict[str, Callable[..., bool]] = {}


def not_compiled(spec, backend: str) -> Optional[str]:
    """Why ``spec`` runs on the NumPy reference under compiled backend ``backend`` ("c"
    or "triton"), or None."""
    if backend == "triton" and spec.has_position_reductions:
        return "argmax/argmin are not compiled for Triton yet"
    return None


def register_probe(backend: str, probe: Callable[..., bool]) -> None:
    """``probe(announce=True)``: whether ``backend`` can build here; ``announce``: warn
    (once) where it cannot, as choosing ``auto`` does."""
    _PROBES[backend] = probe


def can_build(backend: str, announce: bool = False) -> bool:
    """Whether the compiled backend ``backend`` can build kernels here (False where no
    probe is registered for it)."""
    probe = _PROBES.get(backend)
    return probe is not None and probe(announce=announce)
