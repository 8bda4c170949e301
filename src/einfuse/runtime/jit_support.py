"""Small pieces of ``ef.jit`` that the compiled function and its batched form share:
which dtypes carry tangents, fresh output arrays, a jaxpr without dead equations, the
program of a function vmapped over a block of elements."""

from __future__ import annotations

import jax
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


def vmapped_program(function, in_avals, batched, size: int):
    """The converted program of ``jax.vmap(function)`` over ``size`` elements of the
    inputs ``batched`` marks (the others shared; ``in_avals``: one element's inputs),
    and its constants: the block program of a vmapped call's lanes (JAX's batching
    rules: a per-element loop condition a masked loop, a branch both and a select)."""
    from ..frontends.jaxpr import convert
    vmapped = jax.vmap(lambda *x: tuple(function(*x)),
                       in_axes=tuple(0 if b else None for b in batched))
    examples = [jax.ShapeDtypeStruct(((size,) if b else ()) + tuple(a.shape), a.dtype)
                for a, b in zip(in_avals, batched)]
    program = convert(without_dead_code(jax.make_jaxpr(vmapped)(*examples)))
    return program, [array for _, array in program.constants]
