"""Small pieces of ``ef.jit`` that the compiled function and its batched form share:
which dtypes carry tangents, fresh output arrays, a jaxpr without dead equations."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..errors import AllocationError


def is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


def allocate_outputs(out_avals, name: str):
    """Fresh NumPy arrays for a kernel's outputs, or an AllocationError naming them."""
    try:
        return [np.empty(aval.shape, aval.dtype) for aval in out_avals]
    except MemoryError:
        shapes = ", ".join(a.str_short() for a in out_avals)
        raise AllocationError(f"the outputs of {name} ({shapes}) do not fit in "
                              "memory") from None


def without_dead_code(closed):
    """``closed`` without equations whose results nothing uses (a vjp's unused forward
    outputs, float0 zeros of integer inputs): they would cost time, or not convert."""
    try:
        from jax._src.interpreters import partial_eval as pe
        from jax.extend.core import ClosedJaxpr
        jaxpr, _ = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars),
                                instantiate=True)
        return ClosedJaxpr(jaxpr, closed.consts)
    except (ImportError, AttributeError, TypeError):   # a JAX without it: convert as is
        return closed
