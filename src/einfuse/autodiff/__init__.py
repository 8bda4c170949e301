"""Symbolic reverse-mode derivation: gradients of a statement as statements.

    grads = derive("C[i,j] := A[i,k] * B[k,j]", "A")
    grads[0].text        # 'dA[i, k] := dC[i, j] * B[k, j]'
    run_reference(grads, {"A": A, "B": B, "dC": dC})["dA"]

See docs/gradients.md.
"""

from .derive import AxisOf, ExtentOf, GradientStatement, NoGradientError, RangeOf, derive
from .forward import Tangent, tangent
from .reference import resolve_options, run_reference

__all__ = ["derive", "run_reference", "resolve_options", "GradientStatement",
           "NoGradientError", "AxisOf", "ExtentOf", "RangeOf", "tangent", "Tangent"]
