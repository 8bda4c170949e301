"""``ef.jit``: a JAX function traced to a jaxpr, converted (``frontends/jaxpr.py``) and
compiled into one C kernel (``backends/c_loops.py``), called once per call.

How it composes with JAX (programs.md section 2):

* eager call on concrete arrays: the kernel runs directly on NumPy views of the inputs;
* under ``jax.jit`` on the CPU: the kernel is an XLA FFI custom call, run by XLA inside
  its executable (``runtime/jit_ffi.py``); a ``jax.pure_callback`` where that route is
  not available, and for arrays of other platforms (one call per call of the function,
  however many loop steps it has);
* derivatives: the call is a ``jax.custom_jvp`` whose tangent is one primitive
  (``runtime/jit_forward.py``): forward mode (``jax.jvp``, ``jacfwd``, ``linearize``)
  evaluates it with the kernel of the jaxpr of ``jax.jvp(fn)``; reverse mode
  (``jax.grad``, ``jax.vjp``) transposes it into the backward kernel, the jaxpr of
  ``jax.vjp(fn)`` - forward recomputation and the transposed loops - converted and
  compiled the same way.  Both are ``ef.jit`` calls again, so differentiable again;
* ``jax.vmap``: a ``jax.custom_batching.custom_vmap`` rule converts ``jax.vmap(fn)``
  (the batch becomes one more loop in the same kernel), never one call per element.

Imported only when ``ef.jit`` is used; it imports JAX."""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import AllocationError, EinfuseTypeError, OptionError
from ..frontends.jaxpr import JaxprConversionError
from .jit_forward import InJax, Linear, tangents_of

_lock = threading.Lock()


@dataclass(frozen=True)
class Signature:
    """What a compiled kernel is specialised on: the argument tree, each leaf's shape,
    dtype and weak type, the static arguments, and whether x64 is on."""
    tree: object
    leaves: Tuple[Tuple[Tuple[int, ...], np.dtype, bool], ...]
    static: Tuple[object, ...]
    x64: bool = False     # jax_enable_x64 changes the dtypes that fn traces to


def _leaf_key(leaf):
    if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer):
        # the common eager case, without building an abstract value
        # (the dtype object itself: numpy builds dtype.name anew on every access)
        return (leaf.shape, leaf.dtype, bool(getattr(leaf, "weak_type", False)))
    aval = jax.typeof(leaf) if hasattr(jax, "typeof") else jax.core.get_aval(leaf)
    return (tuple(aval.shape), np.dtype(aval.dtype), bool(getattr(aval, "weak_type", False)))


def _is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


def allocate_outputs(out_avals, name: str):
    """Fresh NumPy arrays for a kernel's outputs, or an AllocationError naming them."""
    try:
        return [np.empty(aval.shape, aval.dtype) for aval in out_avals]
    except MemoryError:
        shapes = ", ".join(a.str_short() for a in out_avals)
        raise AllocationError(f"the outputs of {name} ({shapes}) do not fit in "
                              "memory") from None


class CompiledFunction:
    """One flat function (leaves in, list of leaves out) for one signature: its jaxpr,
    program and kernel, and the JAX-callable forms of it."""

    def __init__(self, flat_fn: Callable, leaves, name: str = "fn"):
        self.flat_fn = flat_fn
        self.name = name
        self.closed = _without_dead_code(jax.make_jaxpr(flat_fn)(*leaves))
        self.in_avals = tuple(v.aval for v in self.closed.jaxpr.invars)
        self.out_avals = tuple(v.aval for v in self.closed.jaxpr.outvars)
        from ..backends import c_loops
        from ..frontends.jaxpr import convert
        self.program = convert(self.closed)
        self.entry = c_loops.build(self.program)
        self._backward: Optional[CompiledFunction] = None
        self._forward_mode = None      # a CompiledFunction (or InJax), made when needed
        self._batched: Dict[object, object] = {}   # BatchedFunction per batch
        self.linear = Linear(self)
        self.call = self._differentiable()

    # -- the host kernel ----------------------------------------------------------------------
    def host(self, *arrays):
        """Runs the kernel on NumPy arrays; returns a tuple of NumPy arrays."""
        import ctypes
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
            live = [t for t, aval in zip(tangents, in_avals) if _is_float(aval.dtype)]
            moving = iter(tangents_of(linear, primals, live) if live and linear.out_avals
                          else [jnp.zeros(a.shape, a.dtype) for a in linear.out_avals])
            return out, tuple(next(moving) if _is_float(aval.dtype) else
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
            full = tuple(next(moving) if _is_float(a.dtype) else
                         np.zeros(a.shape, jax.dtypes.float0) for a in in_avals)
            _, out = jax.jvp(lambda *p: tuple(flat_fn(*p)), tuple(primals), full)
            return [t for t, a in zip(out, out_avals) if _is_float(a.dtype)]
        examples = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in in_avals] + \
            [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in in_avals if _is_float(a.dtype)]
        try:
            found = CompiledFunction(jvp_flat, examples, f"the forward mode of {self.name}")
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
        flat_fn, in_avals, out_avals = self.flat_fn, self.in_avals, self.out_avals
        count = len(in_avals)

        def vjp_flat(*values):
            primals, cts = values[:count], iter(values[count:])
            full = tuple(next(cts) if _is_float(a.dtype) else
                         np.zeros(a.shape, jax.dtypes.float0) for a in out_avals)
            _, pull = jax.vjp(lambda *p: tuple(flat_fn(*p)), *primals)
            grads = pull(full)
            return [g for g, a in zip(grads, in_avals) if _is_float(a.dtype)]
        examples = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in in_avals] + \
            [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals if _is_float(a.dtype)]
        compiled = CompiledFunction(vjp_flat, examples, f"the gradient of {self.name}")
        with _lock:
            self._backward = self._backward or compiled
            return self._backward

    def batched(self, size: int, in_batched: Tuple[bool, ...]):
        """This function over a batch of ``size`` (``jax.vmap``): one kernel running
        this function's program per batch element (runtime/jit_batch.py)."""
        from .jit_batch import batched_function
        return batched_function(self, (size,), tuple((b,) for b in in_batched),
                                self._batched)


class JitFunction:
    """``ef.jit(fn)``: call it like ``fn``.  ``explain(*args)`` shows the program."""

    def __init__(self, fn: Callable, static_argnums=(), static_argnames=(),
                 fallback: bool = False):
        if not callable(fn):
            raise EinfuseTypeError(f"ef.jit takes a function, not {type(fn).__name__}")
        if not isinstance(fallback, bool):
            raise OptionError(f"ef.jit: fallback= takes True or False, not {fallback!r}")
        self.fallback = fallback
        self.fn = fn
        self.static_argnums = _as_tuple(static_argnums)
        self.static_argnames = _as_tuple(static_argnames)
        # as jax.jit does: a static argument is static however it is passed, by position
        # or by name (fn's signature maps one to the other)
        self._positional = _positional_names(fn)
        self._cache: Dict[Signature, Tuple[CompiledFunction, object]] = {}
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        compiled, out_tree, leaves = self._compiled(args, kwargs)
        return jax.tree_util.tree_unflatten(out_tree(), compiled.run(leaves))

    def compiled(self, *args, **kwargs) -> CompiledFunction:
        """The compiled form for these arguments (explain and benchmarks use it)."""
        return self._compiled(args, kwargs)[0]

    def _split(self, args, kwargs):
        count = len(args)
        nums = tuple(n % count if -count <= n < count else n for n in self.static_argnums)
        static = []
        dynamic_args = []
        names = self._positional
        for k, arg in enumerate(args):
            if k in nums or (k < len(names) and names[k] in self.static_argnames):
                static.append(("arg", k, arg))
            else:
                dynamic_args.append(arg)
        dynamic_kwargs = {}
        for name, value in kwargs.items():
            if name in self.static_argnames or \
                    (name in names and names.index(name) in self.static_argnums):
                static.append(("kw", name, value))
            else:
                dynamic_kwargs[name] = value
        try:
            hash(tuple(static))
        except TypeError:
            raise EinfuseTypeError("ef.jit: static arguments must be hashable") from None
        return tuple(static), dynamic_args, dynamic_kwargs

    def _compiled(self, args, kwargs):
        static, dynamic_args, dynamic_kwargs = self._split(args, kwargs)
        leaves, tree = jax.tree_util.tree_flatten((dynamic_args, dynamic_kwargs))
        try:
            # the static values' types too: 1 == True == 1.0, but fn may tell them apart
            key = Signature(tree, tuple(_leaf_key(leaf) for leaf in leaves),
                            tuple((kind, where, type(value), value)
                                  for kind, where, value in static),
                            bool(jax.config.jax_enable_x64))
        except TypeError:
            raise EinfuseTypeError("ef.jit takes arrays, scalars and pytrees of them as "
                                   "its non-static arguments") from None
        with _lock:
            found = self._cache.get(key)
        if found is None:
            out_trees = []
            fn = self.fn

            def flat_fn(*flat):
                dyn_args, dyn_kwargs = jax.tree_util.tree_unflatten(tree, flat)
                full = list(dyn_args)
                for kind, where, value in static:
                    if kind == "arg":
                        full.insert(where, value)
                    else:
                        dyn_kwargs = {**dyn_kwargs, where: value}
                out = fn(*full, **dyn_kwargs)
                out_leaves, out_tree = jax.tree_util.tree_flatten(out)
                if not out_trees:
                    out_trees.append(out_tree)
                return out_leaves
            examples = [_struct(leaf) for leaf in leaves]
            name = getattr(fn, "__name__", "fn")
            try:
                compiled = CompiledFunction(flat_fn, examples, name)
            except JaxprConversionError:
                if not self.fallback:
                    raise
                from .jit_split import SplitFunction
                compiled = SplitFunction(
                    _without_dead_code(jax.make_jaxpr(flat_fn)(*examples)), name)
            found = (compiled, out_trees[0])
            with _lock:
                found = self._cache.setdefault(key, found)
        compiled, out_tree = found
        return compiled, (lambda: out_tree), leaves


def _without_dead_code(closed):
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


def _struct(leaf) -> jax.ShapeDtypeStruct:
    shape, dtype, weak = _leaf_key(leaf)
    return jax.ShapeDtypeStruct(shape, dtype, weak_type=weak)


def _positional_names(fn) -> Tuple[str, ...]:
    """The names of ``fn``'s positional parameters, in order (() when it has no
    signature that Python can read)."""
    import inspect
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in parameters
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def _as_tuple(value) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (int, str)):
        return (value,)
    return tuple(value)


def jit(fn=None, *, static_argnums=(), static_argnames=(), fallback: bool = False):
    """Compile a JAX function (``jax.numpy``/``jax.lax`` code, loops included) into one
    einfuse kernel; usable as ``@ef.jit`` or ``ef.jit(fn, static_argnums=...)``.  See
    docs/jit.md."""
    if fn is None:
        return functools.partial(jit, static_argnums=static_argnums,
                                 static_argnames=static_argnames, fallback=fallback)
    return JitFunction(fn, static_argnums, static_argnames, fallback)


__all__ = ["jit", "JitFunction", "CompiledFunction", "JaxprConversionError"]
