"""Symbolic reverse-mode derivation: gradients of a statement as statements.

    grads = derive("C[i,j] := A[i,k] * B[k,j]", "A")
    grads[0].text        # 'dA[i, k] := dC[i, j] * B[k, j]'
    run_reference(grads, {"A": A, "B": B, "dC": dC})["dA"]

A program's gradient is a program: ``derive(program, "X")`` gives a ProgramGradient.

See docs/gradients.md.
"""

from .derive import AxisOf, ExtentOf, GradientStatement, NoGradientError, RangeOf, derive
from .forward import Tangent, tangent
from .program import GradientStep, ProgramGradient
from .reference import resolve_options, run_reference

__all__ = ["derive", "run_reference", "resolve_options", "GradientStatement",
           "ProgramGradient", "GradientStep",
           "NoGradientError", "AxisOf", "ExtentOf", "RangeOf", "tangent", "Tangent"]
