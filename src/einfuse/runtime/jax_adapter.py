"""JAX integration: a statement on JAX arrays is a ``jax.custom_vjp`` function whose
forward and backward run einfuse's compiled kernels on the host through
``jax.pure_callback``.

Why a host callback and not the FFI: the C kernels are built at run time (per statement
and layout) and loaded with ctypes; a callback calls them with NumPy views of the device
buffers (on the CPU, no copy) and needs no per-kernel XLA registration or C++ shim.  It
works under ``jax.jit``, ``jax.grad``, ``jax.value_and_grad`` and ``jax.vmap``.

vmap: the callbacks use ``vmap_method="expand_dims"``, so a batched call reaches the host
once with leading batch axes; einfuse runs it as the same statement with one more index
per batch axis (:func:`einfuse.lang.rewrite.batch_statement`), one kernel, no loop.

On a GPU with jax_triton installed, statements run as Triton kernels called from XLA
instead (:mod:`einfuse.runtime.jax_gpu`), with no host round trip.

Imported only when the caller's arrays are JAX arrays."""

from __future__ import annotations

import functools
from typing import Dict, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import EinfuseTypeError
from ..lang import parse
from ..lang.printer import format_statement
from ..lang.rewrite import batch_statement, fresh_indices
from . import gradients, jax_gpu
from .frameworks import placeholder


def call(kernel, named: Dict[str, object]):
    spec = kernel.spec
    if spec.assign != ":=":
        raise EinfuseTypeError(f"'{spec.assign}' cannot write into a JAX array, which is "
                               "immutable; use ':=' and .at[].set()",
                               span=spec.statement.output_span)
    names = tuple(spec.arg_order)
    values = tuple(jnp.asarray(named[name]) for name in names)
    value_inputs = {t.name for t in spec.tensors if t.as_value} | set(spec.params)
    differentiable = tuple(name in value_inputs and jnp.issubdtype(v.dtype, jnp.floating)
                           for name, v in zip(names, values))
    if jax_gpu.jax_triton_installed() and jax_gpu.on_gpu(values):
        device = jax_gpu.device_call(kernel, names, values)
        if device is not None:
            return jax_gpu.function(kernel, names, differentiable, device)(*values)
    if not any(isinstance(v, jax.core.Tracer) for v in values):
        # an eager call (no jit, grad or vmap): run it here, so that an error is raised
        # as itself, not wrapped in a callback's JaxRuntimeError
        return jnp.asarray(kernel.run(kernel.bind(**dict(zip(names, values)))))
    return _function(kernel, names, differentiable)(*values)


def _ranks(kernel, names) -> Tuple[int, ...]:
    spec = kernel.spec
    ranks = {t.name: t.rank for t in spec.tensors}
    return tuple(ranks.get(name, 0) for name in names)


def _struct(kernel, names, values) -> jax.ShapeDtypeStruct:
    """Shape and dtype of the result, from the inputs' shapes and dtypes alone."""
    bound = kernel.bind(**{name: placeholder(v) for name, v in zip(names, values)})
    dtype = jax.dtypes.canonicalize_dtype(bound.dtypes.result)
    return jax.ShapeDtypeStruct(bound.output_shape, dtype)


@functools.lru_cache(maxsize=256)
def _batched(statement: str, levels: int) -> str:
    parsed = parse(statement)
    return format_statement(batch_statement(parsed, fresh_indices(parsed, levels)))


def batched_kernel(kernel, levels: int):
    """``kernel``'s statement with ``levels`` leading batch indices, same options."""
    from .kernel import Kernel
    return Kernel(_batched(kernel.statement, levels), kernel.options)


def _host_inputs(kernel, names, arrays) -> Tuple[str, Dict[str, np.ndarray], Tuple]:
    """The statement to run and its inputs: with leading batch axes (vmap), the batched
    statement and every input broadcast over the whole batch."""
    arrays = [np.asarray(a) for a in arrays]
    ranks = _ranks(kernel, names)
    levels = arrays[0].ndim - ranks[0] if arrays else 0
    if levels == 0:
        return kernel.statement, dict(zip(names, arrays)), ()
    batch = np.broadcast_shapes(*[a.shape[:levels] for a in arrays])
    full = {name: np.broadcast_to(a, batch + a.shape[levels:])
            for name, a in zip(names, arrays)}
    return _batched(kernel.statement, levels), full, batch


def _function(kernel, names: Sequence[str], differentiable: Sequence[bool]):
    from .kernel import Kernel

    def run_forward(*arrays):
        statement, inputs, _ = _host_inputs(kernel, names, arrays)
        runner = kernel if statement == kernel.statement else Kernel(statement, kernel.options)
        return np.asarray(runner(**inputs))

    def run_backward(output_grad, *arrays):
        statement, inputs, batch = _host_inputs(kernel, names, arrays)
        wanted = [n for n, d in zip(names, differentiable) if d]
        spec = kernel.spec
        found = gradients.compute_gradients(statement, kernel.options, spec.output, inputs,
                                            np.asarray(output_grad), wanted)
        return tuple(found[name].astype(np.asarray(arrays[names.index(name)]).dtype)
                     .reshape(batch + np.shape(arrays[names.index(name)])[len(batch):])
                     for name in wanted)

    @jax.custom_vjp
    def apply(*values):
        return jax.pure_callback(run_forward, _struct(kernel, names, values), *values,
                                 vmap_method="expand_dims")

    def forward(*values):
        return apply(*values), values

    def backward(values, output_grad):
        wanted = [v for v, d in zip(values, differentiable) if d]
        structs = tuple(jax.ShapeDtypeStruct(v.shape, v.dtype) for v in wanted)
        found = iter(jax.pure_callback(run_backward, structs, output_grad, *values,
                                       vmap_method="expand_dims") if structs else ())
        return tuple(next(found) if d else None for d in differentiable)

    apply.defvjp(forward, backward)
    return apply
