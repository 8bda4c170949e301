"""What a compiled backend cannot render yet, decided from the analysed statement
alone: such statements run on the NumPy reference, by plan (``strategy`` says so),
not as an error path.  The C backend renders every statement; Triton lacks
argmax/argmin."""

from __future__ import annotations

from typing import Optional


def not_compiled(spec, backend: str) -> Optional[str]:
    """Why ``spec`` runs on the NumPy reference under compiled backend ``backend`` ("c"
    or "triton"), or None."""
    if backend == "triton" and spec.has_position_reductions:
        return "argmax/argmin are not compiled for Triton yet"
    return None
