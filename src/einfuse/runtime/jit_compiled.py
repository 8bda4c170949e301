"""One flat function of ``ef.jit`` compiled for one signature: its jaxpr, program and
C kernel, and the JAX-callable forms of it (eager, under jax.jit, its derivatives and
batched form); runtime/jit.py keys them by signature."""

from __future__ import annotations

import threading
from typing import Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import AllocationError
from ..frontends.jaxpr_values import JaxprConversionError
from .jit_batch import batched_function
from .jit_forward import InJax, Linear, tangents_of
from .jit_support import allocate_outputs, is_float, without_dead_code

_lock = threading.Lock()


class CompiledFunction:
    """One flat function (leaves in, list of leaves out) for one signature: its jaxpr,
    program and kernel, and the JAX-callable forms of it."""

    def __init__(self, flat_fn: Callable, leaves, name: str = "fn", backend: str = "auto"):
        self.flat_fn = flat_fn
        self.name = name
        self.backend = backend     # "auto", "c" or "triton" (schedule/jit_device.py)
        self.closed = without_dead_code(jax.make_jaxpr(flat_fn)(*leaves))
        self.in_avals = tuple(v.aval for v in self.closed.jaxpr.invars)
        self.out_avals = tuple(v.aval for v in self.closed.jaxpr.outvars)
        from ..backends.c import loops as c_loops
        from ..frontends.jaxpr import convert
        self.program = convert(self.closed)
        self.entry = c_loops.build(self.program)
        self._backward: Optional[CompiledFunction] = None
        self._forward_mode = None      # a CompiledFunction (or InJax), made when needed
        self._batched: Dict[object, object] = {}   # BatchedFunction per batch
        self._vmapped_backward: Dict[object, object] = {}
        self.linear = Linear(self)
        self.call = self._differentiable()
        # whether jax.vmap of this function converts jax.vmap(fn) over blocks of the
        # batch (runtime/jit_batch.py), or runs this program once per element
        self.batch_in_blocks = True

    # -- the host kernel ----------------------------------------------------------------------
    def host(self, *arrays):
        """Runs the kernel on NumPy arrays; returns a tuple of NumPy arrays."""
        import ctypes
        if self.backend != "c":
            from .jit_triton import route_of
            found = route_of(self).attempt(arrays, as_jax=False)
            if found is not None:
                return found
        inputs = [np.ascontiguousarray(a, dtype=aval.dtype)
                  for a, aval in zip(arrays, self.in_avals)]
        outputs = allocate_outputs(self.out_avals, self.name)
        arguments = self.entry_arguments(inputs, outputs)
        pointers = (ctypes.c_void_p * len(arguments))(*[a.ctypes.data for a in arguments])
        if self.entry(pointers) != 0:
            raise AllocationError(f"the kernel of {self.name} could not allocate its "
                                  "intermediates")
        return tuple(outputs)

    def entry_arguments(self, inputs, outputs) -> list:
        """The entry's ``void **`` arguments in order: the inputs, the program's constant
        arrays, the outputs (the XLA handler lays XLA's buffers out by this too)."""
        constants = [np.ascontiguousarray(array) for _, array in self.program.constants]
        return list(inputs) + constants + list(outputs)

    def run(self, leaves):
        """Outputs as JAX arrays: directly on concrete arrays, else through JAX."""
        if not any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
            if self.backend != "c":
                from .jit_triton import route_of
                found = route_of(self).attempt(leaves, as_jax=True)   # (GPU arrays:
                if found is not None:                                   # no copy)
                    return found
            return [jnp.asarray(out) for out in self.host(*leaves)]
        return list(self.call(*leaves))

    # -- JAX forms ------------------------------------------------------------------------------
    def _kernel_call(self):
        from .jit_ffi import kernel_call
        return kernel_call(self, self.batched)

    def _differentiable(self):
        self.kernel = self._kernel_call()
        kernel, linear = self.kernel, self.linear
        in_avals, out_avals = self.in_avals, self.out_avals

        @jax.custom_jvp
        def call(*leaves):
            return kernel(*leaves)

        @call.defjvp
        def tangents(primals, tangents):
            # ``call``, not ``kernel``: under a second differentiation the primal is
            # differentiated too, which the bare kernel cannot be
            out = call(*primals)
            live = [t for t, aval in zip(tangents, in_avals) if is_float(aval.dtype)]
            moving = iter(tangents_of(linear, primals, live) if live and linear.out_avals
                          else [jnp.zeros(a.shape, a.dtype) for a in linear.out_avals])
            return out, tuple(next(moving) if is_float(aval.dtype) else
                              np.zeros(aval.shape, jax.dtypes.float0) for aval in out_avals)
        return call

    def forward_mode(self):
        """The compiled forward mode: (primals, float tangents) -> float output tangents
        (the jaxpr of ``jax.jvp(fn)``, converted; JAX runs it where that does not)."""
        with _lock:
            if self._forward_mode is not None:
                return self._forward_mode
        flat_fn, in_avals, out_avals = self.flat_fn, self.in_avals, self.out_avals
        count = len(in_avals)

        def jvp_flat(*values):
            primals, moving = values[:count], iter(values[count:])
            full = tuple(next(moving) if is_float(a.dtype) else
                         np.zeros(a.shape, jax.dtypes.float0) for a in in_avals)
            _, out = jax.jvp(lambda *p: tuple(flat_fn(*p)), tuple(primals), full)
            return [t for t, a in zip(out, out_avals) if is_float(a.dtype)]
        examples = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in in_avals] + \
            [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in in_avals if is_float(a.dtype)]
        try:
            found = CompiledFunction(jvp_flat, examples, f"the forward mode of {self.name}",
                                     self.backend)
        except JaxprConversionError:
            found = InJax(jvp_flat)
        with _lock:
            self._forward_mode = self._forward_mode or found
            return self._forward_mode

    def backward(self) -> "CompiledFunction":
        """The compiled backward pass: (primals, float cotangents) -> float gradients."""
        with _lock:
            if self._backward is not None:
                return self._backward
        compiled = compile_backward(self.flat_fn, self.in_avals, self.out_avals,
                                    f"the gradient of {self.name}", self.backend)
        with _lock:
            self._backward = self._backward or compiled
            return self._backward

    def vmapped_backward(self, size: int, axes: Tuple[Optional[int], ...]):
        """The compiled backward of ``jax.vmap(fn, in_axes=axes)`` over a batch of
        ``size`` (None where its jaxpr does not convert).  An input the batch does not
        map (a shared weight) gets one gradient, summed inside the kernel (a gather's
        becomes one scatter-add), not one per batch element summed afterwards."""
        key = (size, axes)
        with _lock:
            found = self._vmapped_backward.get(key)
        if found is None:
            flat_fn = self.flat_fn

            def vmapped(*values):
                return list(jax.vmap(lambda *x: tuple(flat_fn(*x)), in_axes=axes,
                                     axis_size=size)(*values))
            in_avals = [jax.core.ShapedArray(((size,) if axis == 0 else ()) + a.shape,
                                             a.dtype)
                        for a, axis in zip(self.in_avals, axes)]
            out_avals = [jax.core.ShapedArray((size,) + a.shape, a.dtype)
                         for a in self.out_avals]
            try:
                found = compile_backward(vmapped, in_avals, out_avals,
                                         f"the gradient of the vmapped {self.name}",
                                         self.backend)
                # its program is already over a block of the batch: batched again
                # (runtime/jit_backward_blocks.py), it runs once per block
                found.batch_in_blocks = False
            except JaxprConversionError:
                found = False
            with _lock:
                found = self._vmapped_backward.setdefault(key, found)
        return found or None

    def batched(self, size: int, in_batched: Tuple[bool, ...]):
        """This function over a batch of ``size`` (``jax.vmap``): one kernel running
        this function's program per batch element (runtime/jit_batch.py)."""
        return batched_function(self, (size,), tuple((b,) for b in in_batched),
                                self._batched)


def compile_backward(flat_fn: Callable, in_avals, out_avals, name: str,
                     backend: str = "auto") -> CompiledFunction:
    """The backward pass of ``flat_fn`` at ``in_avals``, compiled: (primals, float
    cotangents) -> float gradients; the jaxpr of ``jax.vjp(flat_fn)`` converted."""
    count = len(in_avals)

    def vjp_flat(*values):
        primals, cts = values[:count], iter(values[count:])
        full = tuple(next(cts) if is_float(a.dtype) else
                     np.zeros(a.shape, jax.dtypes.float0) for a in out_avals)
        _, pull = jax.vjp(lambda *p: tuple(flat_fn(*p)), *primals)
        grads = pull(full)
        return [g for g, a in zip(grads, in_avals) if is_float(a.dtype)]
    examples = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in in_avals] + \
        [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals if is_float(a.dtype)]
    return CompiledFunction(vjp_flat, examples, name, backend)
