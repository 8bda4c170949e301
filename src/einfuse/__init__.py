"""einfuse: tensor index notation compiled to fused kernels.

    import einfuse as ef
    C = ef.ein("C[i,j] := A[i,k] * B[k,j]", A=A, B=B)
    print(ef.explain("D[i,j] := (w[k,i] - x[k,j])**2", w=w, x=x))
"""

from .autodiff import GradientStatement, derive, run_reference
from .errors import EinfuseError, EinfuseWarning, NoGradientError
from .explain import explain
from .frontends import einsum, rearrange, reduce, repeat
from .runtime.kernel import Kernel, compile, ein

__version__ = "0.1.0"

__all__ = ["ein", "compile", "explain", "einsum", "rearrange", "reduce", "repeat", "derive", "run_reference", "GradientStatement",
           "Kernel", "EinfuseError", "EinfuseWarning", "NoGradientError", "__version__"]
