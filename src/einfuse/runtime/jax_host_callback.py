"""A host callback for the einfuse primitive's lowering that hands the callback the
operands as NumPy arrays straight from XLA.

``jax.pure_callback`` first copies its operands onto CPU device 0 (``device_put``).
Inside a ``shard_map`` over several CPU devices that copy waits behind device 0's
running program, which may itself be waiting in a collective for the device whose
callback is copying: a deadlock (seen with 8 CPU devices and operands of a few MB,
docs/sharding.md).  Lowering the callback with ``mlir.emit_python_callback`` skips the
copy.  The primitive exists only inside lowerings (``mlir.lower_fun`` of the einfuse
primitive's host route), so it needs no differentiation or batching rules.

Imported only with JAX."""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np
from jax.interpreters import mlir

try:
    from jax.extend.core import Primitive
except ImportError:   # jax < 0.4.36
    from jax.core import Primitive

try:   # where the callback runs under shard_map and jit's SPMD partitioning
    from jax._src.callback import _callback_op_sharding
except ImportError:   # pragma: no cover - another jax layout: XLA's default placement
    _callback_op_sharding = None

host_callback_p = Primitive("einfuse_host_callback")


def host_callback(function: Callable, result: jax.ShapeDtypeStruct, *operands):
    """``function(*numpy_operands)`` on the host, returning one array of ``result``."""
    return host_callback_p.bind(*operands, function=function, result=result)


def _abstract(*avals, function, result):
    return jax.core.ShapedArray(result.shape, result.dtype)


def _lowering(ctx, *operands, function, result):
    def run(*arrays):
        value = np.asarray(function(*arrays), dtype=result.dtype)
        return (value.reshape(result.shape),)
    sharding = None
    if _callback_op_sharding is not None:
        sharding = _callback_op_sharding(ctx.module_context.axis_context, None,
                                         ctx.avals_out)
    outputs, _, _ = mlir.emit_python_callback(
        ctx, run, None, list(operands), ctx.avals_in, ctx.avals_out,
        has_side_effect=False, returns_token=False, sharding=sharding)
    return outputs


host_callback_p.def_abstract_eval(_abstract)
mlir.register_lowering(host_callback_p, _lowering, cacheable=False)
