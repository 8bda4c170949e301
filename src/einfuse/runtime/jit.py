"""``ef.jit``: a JAX function traced to a jaxpr, converted (``frontends/jaxpr.py``) and
compiled into one C kernel (``backends/c/loops.py``), called once per call.

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
from typing import Callable, Dict, Tuple

import jax
import numpy as np

from ..errors import EinfuseTypeError, OptionError
from ..frontends.jaxpr_values import JaxprConversionError
from .jit_compiled import CompiledFunction
from .jit_support import without_dead_code

_lock = threading.Lock()


@dataclass(frozen=True)
class Signature:
    """What a compiled kernel is specialised on: the argument tree, each traced leaf's
    shape, dtype and weak type, the static arguments, whether x64 is on, and which
    leaves are static (non-array leaves: an Equinox module's functions) with their
    types and values."""
    tree: object
    leaves: Tuple[Tuple[Tuple[int, ...], np.dtype, bool], ...]
    static: Tuple[object, ...]
    x64: bool = False     # jax_enable_x64 changes the dtypes that fn traces to
    traced: Tuple[bool, ...] = ()
    fixed: Tuple[Tuple[type, object], ...] = ()


def _leaf_key(leaf):
    if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer):
        # the common eager case, without building an abstract value
        # (the dtype object itself: numpy builds dtype.name anew on every access)
        return (leaf.shape, leaf.dtype, bool(getattr(leaf, "weak_type", False)))
    aval = jax.typeof(leaf) if hasattr(jax, "typeof") else jax.core.get_aval(leaf)
    return (tuple(aval.shape), np.dtype(aval.dtype), bool(getattr(aval, "weak_type", False)))


class JitFunction:
    """``ef.jit(fn)``: call it like ``fn``.  ``explain(*args)`` shows the program."""

    def __init__(self, fn: Callable, static_argnums=(), static_argnames=(),
                 fallback: bool = False, backend: str = "auto"):
        if not callable(fn):
            raise EinfuseTypeError(f"ef.jit takes a function, not {type(fn).__name__}")
        if not isinstance(fallback, bool):
            raise OptionError(f"ef.jit: fallback= takes True or False, not {fallback!r}")
        from ..schedule.jit_device import BACKENDS
        if not isinstance(backend, str) or backend not in BACKENDS:
            raise OptionError(f"ef.jit: backend= takes one of {', '.join(BACKENDS)}, not "
                              f"{backend!r}")
        self.backend = backend
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
        return out_tree.unflatten(compiled.run(leaves))

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
        all_leaves, tree = jax.tree_util.tree_flatten((dynamic_args, dynamic_kwargs))
        # eqx.filter_jit's rule: array (and Python scalar) leaves are traced, every other
        # leaf (an Equinox module's activation function, a string) is static, part of
        # the key, put back in place when fn is traced
        traced = tuple(_is_traced(leaf) for leaf in all_leaves)
        leaves = [leaf for leaf, t in zip(all_leaves, traced) if t]
        fixed = tuple((type(leaf), leaf) for leaf, t in zip(all_leaves, traced) if not t)
        if fixed:
            _check_hashable(fixed, all_leaves, traced, tree)
        try:
            # the static values' types too: 1 == True == 1.0, but fn may tell them apart
            key = Signature(tree, tuple(_leaf_key(leaf) for leaf in leaves),
                            tuple((kind, where, type(value), value)
                                  for kind, where, value in static),
                            bool(jax.config.jax_enable_x64), traced, fixed)
        except TypeError:
            raise EinfuseTypeError("ef.jit takes arrays, scalars and pytrees of them as "
                                   "its non-static arguments") from None
        with _lock:
            found = self._cache.get(key)
        if found is None:
            out_trees = []
            fn = self.fn

            def flat_fn(*flat):
                moving, kept = iter(flat), iter(value for _, value in fixed)
                full_leaves = [next(moving) if t else next(kept) for t in traced]
                dyn_args, dyn_kwargs = jax.tree_util.tree_unflatten(tree, full_leaves)
                full = list(dyn_args)
                for kind, where, value in static:
                    if kind == "arg":
                        full.insert(where, value)
                    else:
                        dyn_kwargs = {**dyn_kwargs, where: value}
                out = fn(*full, **dyn_kwargs)
                out_leaves, out_tree = jax.tree_util.tree_flatten(out)
                # non-array outputs (a module's functions, returned with it) come back as
                # they were at trace time, as eqx.filter_jit returns them
                arrays = tuple(_is_output_array(leaf) for leaf in out_leaves)
                if not out_trees:
                    out_trees.append(_OutputTree(
                        out_tree, arrays,
                        tuple(leaf for leaf, a in zip(out_leaves, arrays) if not a)))
                return [leaf for leaf, a in zip(out_leaves, arrays) if a]
            examples = [_struct(leaf) for leaf in leaves]
            name = getattr(fn, "__name__", "fn")
            try:
                compiled = CompiledFunction(flat_fn, examples, name, self.backend)
            except JaxprConversionError:
                if not self.fallback:
                    raise
                from .jit_split import SplitFunction
                compiled = SplitFunction(
                    without_dead_code(jax.make_jaxpr(flat_fn)(*examples)), name)
            found = (compiled, out_trees[0])
            with _lock:
                found = self._cache.setdefault(key, found)
        compiled, out_tree = found
        return compiled, out_tree, leaves


@dataclass(frozen=True)
class _OutputTree:
    """How a compiled function's array outputs go back into ``fn``'s output: its tree,
    which leaves are arrays, and the other leaves as tracing found them."""
    tree: object
    arrays: Tuple[bool, ...]
    fixed: Tuple[object, ...]

    def unflatten(self, outputs):
        moving, kept = iter(outputs), iter(self.fixed)
        return jax.tree_util.tree_unflatten(
            self.tree, [next(moving) if a else next(kept) for a in self.arrays])


_ARRAYS = (jax.Array, jax.core.Tracer, np.ndarray, np.generic, bool, int, float, complex)


def _is_traced(leaf) -> bool:
    """An argument leaf that ef.jit traces: a JAX or NumPy array (a tracer of an outer
    transformation included) or a Python or NumPy scalar, as jax.jit traces them."""
    return isinstance(leaf, _ARRAYS)


def _is_output_array(leaf) -> bool:
    return isinstance(leaf, _ARRAYS)


def _check_hashable(fixed, all_leaves, traced, tree):
    """Static leaves are part of the cache key: one that cannot be hashed is refused,
    named by its path (keying it by identity would reuse a kernel traced with an
    object that may since have changed)."""
    for kind, value in fixed:
        try:
            hash(value)
        except TypeError:
            paths = [jax.tree_util.keystr(path) for path, _ in
                     jax.tree_util.tree_flatten_with_path(
                         jax.tree_util.tree_unflatten(tree, list(all_leaves)))[0]]
            where = next(p for p, leaf, t in zip(paths, all_leaves, traced)
                         if not t and leaf is value)
            raise EinfuseTypeError(
                f"ef.jit: the argument leaf at {where or 'the top'} is a "
                f"{kind.__name__}, neither an array nor a scalar, so it is static, and a "
                "static leaf must be hashable (it is part of the cache key); make it "
                "hashable, or close over it in fn") from None


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


def jit(fn=None, *, static_argnums=(), static_argnames=(), fallback: bool = False,
        backend: str = "auto"):
    """Compile a JAX function (``jax.numpy``/``jax.lax`` code, loops included) into one
    einfuse kernel; usable as ``@ef.jit`` or ``ef.jit(fn, static_argnums=...)``.
    ``backend``: "auto" (the host C kernel, or one Triton kernel for GPU arrays where
    schedule/jit_device.py's rule says so), "c", or "triton" (forced).  See
    docs/jit.md."""
    if fn is None:
        return functools.partial(jit, static_argnums=static_argnums,
                                 static_argnames=static_argnames, fallback=fallback,
                                 backend=backend)
    return JitFunction(fn, static_argnums, static_argnames, fallback, backend)


__all__ = ["jit", "JitFunction", "CompiledFunction", "JaxprConversionError"]
