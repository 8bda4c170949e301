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
from .frontends.named import Dim, Named, dims, named, softmax, where, wrap
from .frontends.named import FUNCTIONS as _NAMED_FUNCTIONS
from .named_api import evaluate

# the notation's functions on named expressions (docs/dims.md): ef.exp, ef.tanh, ...
globals().update(_NAMED_FUNCTIONS)

__version__ = "0.1.0"


def jit(fn=None, *, static_argnums=(), static_argnames=(), fallback=False, **unknown):
    """A JAX function compiled into one einfuse kernel, loops included (docs/jit.md);
    imports JAX only when called."""
    if unknown:     # (an EinfuseError, a TypeError as Python's own would be)
        from .errors import unexpected_keywords
        raise unexpected_keywords("jit()", unknown, ("static_argnums", "static_argnames",
                                                     "fallback"))
    from .runtime.jit import jit as _jit
    return _jit(fn, static_argnums=static_argnums, static_argnames=static_argnames,
                fallback=fallback)

__all__ = ["ein", "compile", "explain", "einsum", "rearrange", "reduce", "repeat", "derive", "run_reference", "GradientStatement",
           "Kernel", "jit", "EinfuseError", "EinfuseWarning", "NoGradientError", "__version__",
           "dims", "wrap", "named", "evaluate", "Dim", "Named", "softmax"] + \
    sorted(_NAMED_FUNCTIONS)
