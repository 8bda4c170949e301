"""Symbolic reverse-mode derivation: gradients of a statement as statements.

    grads = derive("C[i,j] := A[i,k] * B[k,j]", "A")
    grads[0].text        # 'dA[i, k] := dC[i, j] * B[k, j]'
    ef.run_reference(grads, {"A": A, "B": B, "dC": dC})["dA"]   # runtime/gradient_reference.py

Derivation only: running gradients is the runtime's (runtime/gradient_reference.py), and
a program's gradient, itself a program, is program/gradient.py's (``ef.derive``).

See docs/gradients.md.
"""

from .derive import AxisOf, ExtentOf, GradientStatement, NoGradientError, RangeOf, derive
from .forward import Tangent, tangent

__all__ = ["derive", "GradientStatement", "NoGradientError", "AxisOf", "ExtentOf", "RangeOf", "tangent", "Tangent"]
