"""Forward mode of an ``ef.jit`` function, with reverse mode kept on the fused backward.

An ``ef.jit`` call is a ``jax.custom_jvp`` (runtime/jit.py).  Its JVP rule returns the
kernel's outputs and their tangents as one primitive, ``einfuse_jit_jvp``, linear in the
tangents (its inputs: the primals, then the tangents of the float inputs):

* evaluated (``jax.jvp``, ``jax.jacfwd``, the function ``jax.linearize`` returns), it
  runs the forward-mode kernel: the jaxpr of ``jax.jvp(fn)`` converted and compiled as
  any ``ef.jit`` function (JAX's own jvp of ``fn`` where that jaxpr does not convert);
* transposed (``jax.grad``, ``jax.vjp``, ``jax.linear_transpose``, which linearize and
  transpose), it runs the function's compiled backward, the kernel ``custom_vjp`` ran
  before: reverse mode never evaluates a tangent, nor compiles the forward-mode kernel;
* batched (``jax.vmap``), it is the same primitive over :class:`BatchedLinear`: ``vmap``
  of those two kernels (each a batched kernel through its ``custom_vmap`` rule);
* differentiated again (``jax.hessian``, ``jacfwd`` of ``jacfwd``), its tangent is the
  forward-mode kernel's own JVP (that kernel is an ``ef.jit`` call too).

A ``custom_vjp`` could not do this: JAX refuses forward mode through one, and at trace
time reverse mode and ``jax.linearize`` look the same.  Imported by runtime/jit.py."""

from __future__ import annotations

import threading
from typing import Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

from .jit_backward_blocks import blocked_cotangents

try:
    from jax.extend.core import Primitive
except ImportError:   # jax < 0.4.36
    from jax.core import Primitive

_lock = threading.Lock()


def is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


class Linear:
    """The tangent map of one compiled function (a ``CompiledFunction``) at its primals:
    float-input tangents to float-output tangents."""

    def __init__(self, function):
        self.function = function
        self.count = len(function.in_avals)
        self.out_avals = tuple(jax.core.ShapedArray(a.shape, a.dtype)
                               for a in function.out_avals if is_float(a.dtype))
        self._batched: Dict[Tuple, "BatchedLinear"] = {}

    def tangent(self, *values):
        """The output tangents for ``values`` (primals, then float-input tangents)."""
        return list(self.function.forward_mode().run(list(values)))

    def cotangent(self, primals, cotangents):
        """The float inputs' cotangents for the float outputs' ``cotangents``."""
        return list(self.function.backward().run(list(primals) + list(cotangents)))

    def batched(self, size: int, dims: Tuple) -> "BatchedLinear":
        return batched_linear(self, size, dims)


class BatchedLinear:
    """``inner`` over a batch of ``size``: ``dims`` says, per value (primals, then
    tangents), whether it has the batch as its leading axis (0) or not (None)."""

    def __init__(self, inner, size: int, dims: Tuple):
        self.inner, self.size, self.dims = inner, size, dims
        self.count = inner.count
        self.out_avals = tuple(jax.core.ShapedArray((size,) + tuple(a.shape), a.dtype)
                               for a in inner.out_avals)
        self._batched: Dict[Tuple, "BatchedLinear"] = {}

    def tangent(self, *values):
        return list(jax.vmap(self.inner.tangent, in_axes=self.dims,
                             axis_size=self.size)(*values))

    def cotangent(self, primals, cotangents):
        if isinstance(self.inner, Linear):
            found = self._fused_cotangent(primals, cotangents)
            if found is not None:
                return found
        primal_dims = list(self.dims[:self.count])
        run = jax.vmap(self.inner.cotangent, in_axes=(primal_dims, 0), axis_size=self.size)
        found = run(list(primals), list(cotangents))
        # a tangent without the batch axis (an input vmap does not map) was used by every
        # batch element: its cotangent is the sum of theirs
        return [g if d is not None else g.sum(0)
                for g, d in zip(found, self.dims[self.count:])]

    def _fused_cotangent(self, primals, cotangents):
        """The cotangents from one kernel, the backward of the vmapped function: vmap of
        the element's backward would give an input the batch does not map (a shared
        embedding table) one gradient per element, then sum them (B x its size)."""
        function = self.inner.function
        floats = [k for k, a in enumerate(function.in_avals) if is_float(a.dtype)]
        primal_dims = self.dims[:self.count]
        tangent_dims = dict(zip(floats, self.dims[self.count:]))
        # an input is mapped when its primal or its tangent has the batch
        axes = tuple(0 if d is not None or tangent_dims.get(k) is not None else None
                     for k, d in enumerate(primal_dims))
        primals = [jnp.broadcast_to(p, (self.size,) + tuple(jnp.shape(p)))
                   if axis == 0 and d is None else p
                   for p, axis, d in zip(primals, axes, primal_dims)]
        # over blocks of the batch where it has two or more (its residuals per block)
        found = blocked_cotangents(function, self.size, axes, floats, primals, cotangents)
        if found is None:
            backward = function.vmapped_backward(self.size, axes)
            if backward is None:
                return None
            found = backward.run(list(primals) + list(cotangents))
        # mapped for its primal only: the tangent was shared, so is its cotangent
        return [g.sum(0) if axes[k] == 0 and tangent_dims[k] is None else g
                for g, k in zip(found, floats)]

    def batched(self, size: int, dims: Tuple) -> "BatchedLinear":
        return batched_linear(self, size, dims)


def batched_linear(inner, size: int, dims: Tuple) -> BatchedLinear:
    """One BatchedLinear per (inner, size, dims), so that a traced program's primitive
    parameters stay the same objects trace after trace."""
    key = (size, dims)
    with _lock:
        found = inner._batched.get(key)
        if found is None:
            found = inner._batched[key] = BatchedLinear(inner, size, dims)
    return found


class InJax:
    """A forward-mode function whose jaxpr does not convert: JAX runs it, as ``jax.jvp``
    of the function would, with ``.run``/``.call`` like a compiled function's."""

    def __init__(self, flat_fn):
        self.call = lambda *leaves: tuple(flat_fn(*leaves))

    def run(self, leaves):
        return list(self.call(*leaves))


einfuse_jit_jvp_p = Primitive("einfuse_jit_jvp")
einfuse_jit_jvp_p.multiple_results = True


def tangents_of(linear: Linear, primals, tangents):
    """The float outputs' tangents of ``linear``'s function at ``primals`` for the
    float inputs' ``tangents``: the primitive (JAX evaluates, transposes or batches it)."""
    return einfuse_jit_jvp_p.bind(*primals, *tangents, linear=linear)


def _abstract(*avals, linear):
    return list(linear.out_avals)


def _impl(*values, linear):
    return linear.tangent(*values)


def _zeros_for(value, aval):
    if type(value) is ad.Zero:
        return jnp.zeros(aval.shape, aval.dtype)
    return value


def _transpose(cotangents, *args, linear):
    primals, tangents = args[:linear.count], args[linear.count:]
    wanted = [ad.is_undefined_primal(t) for t in tangents]
    if not any(wanted) or all(type(c) is ad.Zero for c in cotangents):
        return [None] * len(args)
    cotangents = [_zeros_for(c, a) for c, a in zip(cotangents, linear.out_avals)]
    found = linear.cotangent(primals, cotangents)
    return [None] * len(primals) + [g if w else None for g, w in zip(found, wanted)]


def _jvp(values, tangents, *, linear):
    """The tangent map's own tangent: the forward-mode kernel's JVP (its primitive)."""
    avals = [_aval(v) for v in values]
    tangents = [t if type(t) is not ad.Zero else jnp.zeros(a.shape, a.dtype)
                if is_float(a.dtype) else np.zeros(a.shape, jax.dtypes.float0)
                for t, a in zip(tangents, avals)]
    out, out_tangents = jax.jvp(linear.tangent, tuple(values), tuple(tangents))
    return list(out), list(out_tangents)


def _aval(value):
    return jax.typeof(value) if hasattr(jax, "typeof") else jax.core.get_aval(value)


def _batch(values, dims, *, linear):
    size = next(v.shape[d] for v, d in zip(values, dims) if d is not None)
    moved = [v if d is None else jnp.moveaxis(v, d, 0)
             for v, d in zip(values, dims)]
    flags = tuple(None if d is None else 0 for d in dims)
    outs = einfuse_jit_jvp_p.bind(*moved, linear=linear.batched(int(size), flags))
    return outs, [0] * len(outs)


einfuse_jit_jvp_p.def_abstract_eval(_abstract)
einfuse_jit_jvp_p.def_impl(_impl)
mlir.register_lowering(einfuse_jit_jvp_p, mlir.lower_fun(_impl, multiple_results=True))
ad.primitive_transposes[einfuse_jit_jvp_p] = _transpose
ad.primitive_jvps[einfuse_jit_jvp_p] = _jvp
batching.primitive_batchers[einfuse_jit_jvp_p] = _batch

__all__ = ["Linear", "BatchedLinear", "InJax", "tangents_of", "einfuse_jit_jvp_p"]
