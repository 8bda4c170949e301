"""Reverse mode of a statement on JAX arrays whose gradient scatters (a gather's: an
embedding lookup ``E[b, d] := W[idx[b], d]`` has ``dW[idx[b], d] += dE[b, d]``), as
one compiled ``ef.jit`` kernel.

Without this, the transpose runs the gradient statements through
``gradient_reference``'s JAX operations: the values statement as one primitive, then
``target.at[positions].add(values)`` with one index tuple per *element* (positions of
the values' full shape, masks and clamps computed by XLA around it), which XLA runs as
an element-by-element scatter: several times ``jax.jit``'s own gradient, a row scatter.
Here the same computation is traced once per signature, its jaxpr (the values
statement and the scatter-add) converted by ``frontends/jaxpr.py`` and compiled into
one C kernel, in which the scatter is a loop adding each value at its position; under
``jax.jit`` it is an XLA FFI call.  The kernel is an ``ef.jit`` call, so it can be
differentiated again.  A gradient whose jaxpr does not convert (its values statement
holds a gather under ``bounds="check"``, say) keeps the general path.

Imported by runtime/jax_adapter.py when a transpose asks for a scattering gradient."""

from __future__ import annotations

import threading
from typing import Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from ..frontends.jaxpr_values import JaxprConversionError
from . import gradients

_lock = threading.Lock()
# signature -> CompiledFunction, or False where the gradient's jaxpr does not convert
_COMPILED: Dict[Tuple, object] = {}
_KEPT = 256


def scatters(statement: str, options, wanted: Sequence[str]) -> bool:
    """Whether the gradient of ``statement`` for one of ``wanted`` has a scatter."""
    key = gradients.options_key(options)
    return any(g.kind != "gather" for name in wanted
               for g in gradients.gradient_statements(statement, name, key))


def _leaf(value):
    aval = jax.typeof(value) if hasattr(jax, "typeof") else jax.core.get_aval(value)
    return tuple(aval.shape), np.dtype(aval.dtype), bool(getattr(aval, "weak_type", False))


def fused_cotangents(cotangent, arrays, wanted, statement: str,
                     options) -> Optional[Dict[str, object]]:
    """{name: cotangent} for ``wanted`` from one compiled kernel, or None where that
    kernel cannot be made (then the caller takes the general path).  ``arrays``: the
    statement's inputs, a ShapeDtypeStruct for each one being differentiated."""
    names = tuple(sorted(arrays))
    given = tuple(n for n in names if not isinstance(arrays[n], jax.ShapeDtypeStruct))
    shapes = tuple((n, tuple(arrays[n].shape), np.dtype(arrays[n].dtype))
                   for n in names if n not in given)
    leaves = [arrays[n] for n in given] + [cotangent]
    try:
        kinds = tuple(_leaf(leaf) for leaf in leaves)
    except TypeError:
        return None
    key = (statement, options, tuple(wanted), given, shapes, kinds,
           bool(jax.config.jax_enable_x64))
    with _lock:
        found = _COMPILED.get(key)
    if found is None:
        found = _compile(statement, options, tuple(wanted), given, dict(
            (n, jax.ShapeDtypeStruct(shape, dtype)) for n, shape, dtype in shapes), kinds)
        with _lock:
            if len(_COMPILED) >= _KEPT:
                _COMPILED.pop(next(iter(_COMPILED)), None)
            found = _COMPILED.setdefault(key, found)
    if found is False:
        return None
    return dict(zip(wanted, found.run(leaves)))


def _compile(statement, options, wanted, given, structs, kinds):
    from .jit_compiled import CompiledFunction

    def gradient(*values):
        named = dict(zip(given, values[:-1]))
        named.update(structs)
        found = gradients.compute_gradients(statement, options, named, values[-1],
                                            list(wanted))
        return [jnp.asarray(found[n]).astype(named[n].dtype).reshape(named[n].shape)
                for n in wanted]
    examples = [jax.ShapeDtypeStruct(shape, dtype, weak_type=weak)
                for shape, dtype, weak in kinds]
    try:
        return CompiledFunction(gradient, examples, "the gradient of " + statement)
    except JaxprConversionError:
        return False


__all__ = ["fused_cotangents", "scatters"]
