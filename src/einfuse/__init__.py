"""einfuse: tensor index notation compiled to fused kernels.

    import einfuse as ef
    C = ef.ein("C[i,j] := A[i,k] * B[k,j]", A=A, B=B)
    print(ef.explain("D[i,j] := (w[k,i] - x[k,j])**2", w=w, x=x))
"""

from .errors import EinfuseError, EinfuseWarning
from .explain import explain
from .runtime.kernel import Kernel, compile, ein

__version__ = "0.1.0"

__all__ = ["ein", "compile", "explain", "Kernel", "EinfuseError", "EinfuseWarning",
           "__version__"]
