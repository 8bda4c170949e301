"""einfuse: tensor index notation compiled to fused kernels.

    import einfuse as ef
    C = ef.ein("C[i,j] := A[i,k] * B[k,j]", A=A, B=B)
    print(ef.explain("D[i,j] := (w[k,i] - x[k,j])**2", w=w, x=x))
"""

from .autodiff import GradientStatement
from .errors import EinfuseError, EinfuseWarning, NoGradientError
from .api import (compile, derive, ein, einsum, explain, jit, rearrange, reduce, repeat,
                  run_reference)
from .runtime.kernel import Kernel
from .frontends.named import Dim, Named, dims, named, softmax, where, wrap
from .frontends.named import FUNCTIONS as _NAMED_FUNCTIONS
from .named_api import evaluate

# the notation's functions on named expressions (docs/dims.md): ef.exp, ef.tanh, ...
globals().update(_NAMED_FUNCTIONS)

__version__ = "0.1.0"

__all__ = ["ein", "compile", "explain", "einsum", "rearrange", "reduce", "repeat", "derive", "run_reference", "GradientStatement",
           "Kernel", "jit", "EinfuseError", "EinfuseWarning", "NoGradientError", "__version__",
           "dims", "wrap", "named", "evaluate", "Dim", "Named", "softmax"] + \
    sorted(_NAMED_FUNCTIONS)
