"""How an ``ef.jit`` kernel runs under JAX's transformations: the ``einfuse_jit``
primitive, which on the CPU lowers to an XLA FFI custom call of the kernel's own entry
point (the shared handler of backends/c/jit_ffi.py), so that XLA runs the kernel inside
its executable: no host callback, no Python, no copy of inputs or outputs (the kernel
reads XLA's operand buffers and writes its result buffers).

* Evaluated on concrete arrays (``jax.grad`` without ``jax.jit``): the kernel runs on
  their host buffers, as an eager call does.
* Lowered for the CPU (``jax.jit``, and everything jitted around a ``jax.grad`` or
  ``jax.vmap``): the custom call ``einfuse_jit`` with the kernel's token; the first
  lowering registers the kernel with the handler.  Where that route is not available
  (no ``jax.ffi``, the support library does not build, a dtype the handler does not
  take, or ``EINFUSE_JIT_CALLBACK=1`` in the environment) the kernel is a
  ``jax.pure_callback``, as before; :func:`route_for` says which and why.
* Lowered for another platform (JAX GPU arrays): the host callback (the C kernel runs
  on host copies; there is no device lowering of loop kernels yet).
* ``jax.vmap``: the ``custom_vmap`` rule around the primitive (and the primitive's own
  batching rule, should a transformation reach it directly) builds the batched kernel,
  which lowers the same way.

Why a token in a table and not the entry's address as an attribute: an executable can
outlive the process that compiled it (JAX's persistent compilation cache); the token is
a digest of what the kernel is (its library file, its layout, its constants), so the
same kernel gets the same token in every process, and an unknown token is an error
message rather than a jump to a stale address.

Imported only by ``runtime/jit.py`` (it imports JAX)."""

from __future__ import annotations

import ctypes
import enum
import hashlib
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import batching, mlir

from ..backends.c import build as c_build
from ..backends.c.jit_ffi import (TARGET, EntryLayout, Source, converts, library_location,
                                  register, registered_token, support_library)

try:
    from jax.extend.core import Primitive
except ImportError:   # jax < 0.4.36
    from jax.core import Primitive

FORCE_CALLBACK = "EINFUSE_JIT_CALLBACK"     # set to 1: ef.jit kernels take the callback


class JitRouteKind(enum.Enum):
    FFI = "XLA FFI custom call"
    CALLBACK = "host callback (jax.pure_callback)"


@dataclass(frozen=True)
class JitRoute:
    """How one ef.jit kernel runs when JAX lowers it for the CPU."""
    kind: JitRouteKind
    reason: str
    token: Optional[int] = None      # the handler's key for this kernel (FFI only)

    def describe(self) -> str:
        where = f" {TARGET} (token {self.token:#x})" if self.token is not None else ""
        return f"{self.kind.value}{where}: {self.reason}"


@dataclass(frozen=True)
class Slot:
    """A stand-in for an operand or result in ``entry_arguments`` (which puts the
    kernel's constant arrays among them in the entry's order)."""
    source: Source
    index: int


# -- the primitive --------------------------------------------------------------------------
einfuse_jit_p = Primitive("einfuse_jit")
einfuse_jit_p.multiple_results = True


def kernel_call(function, vmapped):
    """``function``'s kernel (a CompiledFunction or BatchedFunction: leaves in, a tuple
    of leaves out) as a JAX callable whose ``jax.vmap`` is ``vmapped(size, which
    arguments are batched).kernel``: one more kernel with the batch inside."""
    @jax.custom_batching.custom_vmap
    def kernel(*leaves):
        return tuple(einfuse_jit_p.bind(*leaves, function=function, vmapped=vmapped))

    @kernel.def_vmap
    def batched(axis_size, in_batched, *leaves):
        flags = tuple(bool(b) for b in in_batched)
        outs = vmapped(int(axis_size), flags).kernel(*leaves)
        return _unbatch(outs, outputs_batched(function, flags), int(axis_size))
    return kernel


def outputs_batched(function, in_batched) -> Tuple[bool, ...]:
    """Which outputs of ``function`` depend on its batched inputs (a forward pass over
    its jaxpr; an equation with a batched input has every output batched, as JAX's own
    rules have at worst).  An output that does not is the same for every batch element,
    and JAX must see it unbatched: ``vmap(..., out_axes=None)`` accepts only those."""
    base = getattr(function, "base", function)       # a BatchedFunction: its CompiledFunction
    jaxpr = base.closed.jaxpr
    marked = {v for v, flag in zip(jaxpr.invars, in_batched) if flag}

    def reads(v):
        return type(v).__name__ != "Literal" and v in marked
    for eqn in jaxpr.eqns:
        if any(reads(v) for v in eqn.invars):
            marked.update(eqn.outvars)
    return tuple(reads(v) for v in jaxpr.outvars)


def _unbatch(outs, flags, size: int):
    """The batched kernel's outputs, those not batched (``flags``) as their first batch
    element, with the flags JAX is told; with no batch element all stay batched."""
    if size == 0 or all(flags):
        return tuple(outs), tuple(True for _ in outs)
    return tuple(o if f else o[0] for o, f in zip(outs, flags)), tuple(flags)


def _abstract(*avals, function, vmapped):
    return [jax.core.ShapedArray(a.shape, a.dtype) for a in function.out_avals]


def _impl(*values, function, vmapped):
    found = _device_call(function, values)
    if found is not None:
        return found
    return [jnp.asarray(out) for out in function.host(*(np.asarray(v) for v in values))]


def _device_call(function, values):
    """The Triton kernel's outputs on the arrays as they are (GPU arrays stay on the
    GPU), where runtime/jit_triton.py's route takes them; else None."""
    base = getattr(function, "base", function)
    if getattr(base, "backend", "c") == "c":
        return None
    from .jit_triton import batched_route_of, route_of
    route = batched_route_of(function) if function is not base else route_of(function)
    return route.attempt(values, as_jax=True)


def _batch(values, dims, *, function, vmapped):
    size = next(v.shape[d] for v, d in zip(values, dims) if d is not None)
    moved = [v if d is None else jnp.moveaxis(v, d, 0)
             for v, d in zip(values, dims)]
    flags = tuple(d is not None for d in dims)
    outs, batched = _unbatch(vmapped(int(size), flags).kernel(*moved),
                             outputs_batched(function, flags), int(size))
    return list(outs), [0 if b else None for b in batched]   # None: not mapped


def _host_callback(*values, function, vmapped):
    structs = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in function.out_avals)
    return jax.pure_callback(function.host, structs, *values, vmap_method="sequential")


_callback_lowering = mlir.lower_fun(_host_callback, multiple_results=True)


def _cpu_lowering(ctx, *operands, function, vmapped):
    route = route_for(function)
    if route.kind is JitRouteKind.FFI:
        return jax.ffi.ffi_lowering(TARGET)(ctx, *operands, token=np.int64(route.token))
    return _callback_lowering(ctx, *operands, function=function, vmapped=vmapped)


einfuse_jit_p.def_abstract_eval(_abstract)
einfuse_jit_p.def_impl(_impl)
batching.primitive_batchers[einfuse_jit_p] = _batch
mlir.register_lowering(einfuse_jit_p, _callback_lowering)
mlir.register_lowering(einfuse_jit_p, _cpu_lowering, platform="cpu")


# -- the route --------------------------------------------------------------------------------
_lock = threading.Lock()
# per kernel object, weakly: what XLA may call later is the handler's record, whose
# constants _held keeps by token; the kernel object itself dies with JAX's caches
_routes: "weakref.WeakKeyDictionary[object, JitRoute]" = weakref.WeakKeyDictionary()
_held: Dict[int, Tuple] = {}     # token -> (identity, the constant arrays its record reads)
_registered_targets: set = set()     # the target names registered with XLA


def route_for(function) -> JitRoute:
    """The CPU route of ``function``'s kernel (made, and registered with the handler,
    once per kernel)."""
    with _lock:
        found = _routes.get(function)
    if found is not None:
        return found
    route = _decide(function)
    with _lock:
        return _routes.setdefault(function, route)


def _callback(reason: str) -> JitRoute:
    return JitRoute(JitRouteKind.CALLBACK, reason)


def _decide(function) -> JitRoute:
    if os.environ.get(FORCE_CALLBACK, "") not in ("", "0"):
        return _callback(f"{FORCE_CALLBACK} is set")
    ffi = getattr(jax, "ffi", None)
    if ffi is None or not hasattr(ffi, "ffi_lowering") or not hasattr(ffi, "include_dir"):
        return _callback("this JAX has no jax.ffi")
    for aval in tuple(function.in_avals) + tuple(function.out_avals):
        if not converts(np.dtype(aval.dtype).name):
            return _callback(f"the handler does not take {np.dtype(aval.dtype)} arrays")
    try:
        library = handler_library()
    except (c_build.CompileError, ValueError, OSError) as error:
        return _callback(f"the XLA handler could not be built: {error}")
    layout, constants = _layout(function)
    entry = ctypes.cast(function.entry, ctypes.c_void_p).value
    held = [np.ascontiguousarray(c) for c in constants]
    identity = (library_location(entry), layout, tuple(_digest(c) for c in held))
    failure = f"einfuse AllocationError: the kernel of {function.name} could not " \
              "allocate its intermediates"
    token = registered_token(
        identity, held, _held, _lock,
        lambda token, kept: register(library, token, entry, layout,
                                     [c.ctypes.data for c in kept], failure,
                                     (entry, identity)))
    if token is None:
        return _callback("no free token for the XLA handler")   # 8 collisions of 56 bits
    return JitRoute(JitRouteKind.FFI, "the C kernel runs inside XLA's executable", token)


def handler_library(target: str = TARGET) -> ctypes.CDLL:
    """The ef.jit XLA handler's library (built once, backends/c/jit_ffi.py), registered
    with XLA under ``target`` once per process: ef.jit kernels under TARGET, a program's
    fusion groups under their own name (runtime/jax_groups.py)."""
    header = os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")
    import jaxlib
    library = support_library(header, jaxlib.__version__)
    with _lock:
        if target not in _registered_targets:
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(library.einfuse_jit_handler),
                                        platform="cpu", api_version=1)
            _registered_targets.add(target)
    return library


def _layout(function) -> Tuple[EntryLayout, Sequence[np.ndarray]]:
    """The handler's view of ``function``'s entry, from the function's own
    ``entry_arguments`` (the order its host call uses), and its constant arrays."""
    operands = [Slot(Source.OPERAND, k) for k in range(len(function.in_avals))]
    results = [Slot(Source.RESULT, k) for k in range(len(function.out_avals))]
    slots, constants = [], []
    for item in function.entry_arguments(operands, results):
        if isinstance(item, Slot):
            slots.append((item.source, item.index))
        else:
            slots.append((Source.CONSTANT, len(constants)))
            constants.append(item)
    shape = lambda a: (np.dtype(a.dtype).name, tuple(int(n) for n in a.shape))  # noqa: E731
    takes_threads = len(function.entry.argtypes) == 2     # c_loops_batch: (args, threads)
    layout = EntryLayout(tuple(shape(a) for a in function.in_avals),
                         tuple(shape(a) for a in function.out_avals), tuple(slots),
                         takes_threads)
    return layout, constants


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(repr((array.dtype.str, array.shape)).encode() +
                          array.tobytes()).hexdigest()



def route_lines(function) -> list:
    """explain()'s lines on how ``function``'s kernel runs (its gradient's kernel and a
    vmapped call's kernel decide the same way, each when it is first lowered)."""
    try:
        route = route_for(function).describe()
    except Exception as error:      # explain describes; the call itself will raise
        route = f"not decided ({type(error).__name__}: {error})"
    return ["How it runs",
            "  eager call on concrete arrays: the kernel on the arrays' host buffers",
            f"  under jax.jit on the CPU (jax.grad/vmap inside it too): {route}",
            "  arrays of another platform (GPU): host callback (jax.pure_callback), the "
            "C kernel on host copies"] + _device_lines(function)


def _device_lines(function) -> list:
    """The eager call's choice between the host kernel and one Triton kernel
    (runtime/jit_triton.py, schedule/jit_device.py)."""
    from .jit_triton import batched_route_of, route_of
    base = getattr(function, "base", function)
    if getattr(base, "backend", "c") == "c":
        return []
    route = batched_route_of(function) if function is not base else route_of(function)
    return route.describe()
