"""The CPU lowering of the ``einfuse`` JAX primitive (runtime/jax_adapter.py) as an XLA
FFI custom call: under jit, shapes and dtypes are static when the primitive lowers, so
the whole call is planned then -- ranges, buffer layouts (XLA's buffers are dense,
row-major), runtime ints and strides -- and the C kernel for it is built with its own
XLA FFI handler (backends/c/ffi.py) and registered as an XLA target named after the
kernel library.  XLA then runs the kernel inside its executable: no host callback, no
copy of inputs or result (the kernel writes XLA's result buffer).

A call the FFI route cannot run keeps the host callback (``jax.pure_callback``);
:func:`cpu_route` says which route a call takes and why (``ef.explain`` prints it):
the route is the schedule's decision (schedule/jax_route.jax_cpu_route, once per
signature: the lowering is cached by it); this module builds and registers what it
decided.

Errors: the handler validates what XLA passes against the plan; a gather out of range
under bounds='check' comes back from the jitted call as an XLA error carrying einfuse's
own message, which a reporter (a ctypes callback into this module, called only then)
finds by running the NumPy reference on the call's buffers."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import jax
import jaxlib
import numpy as np

from ..backends.c import build as c_build
from ..backends.c.backend import output_dtype
from ..backends.c.ffi_support import XLA_DTYPES
from ..backends.c.threads import fixed_thread_count
from ..errors import EinfuseError, attach_statement
from ..plan import buffer_slots, call_arguments, unit_axis
from ..analysis.ranges import subscript_span
from ..lang.ast import IndexExpr, accesses
from ..plan.contraction import prepare_contraction
from ..schedule.choose import as_written
from ..schedule.jax_route import (CpuRoute, CpuRouteKind, FfiCapability, JaxCall,
                                  host_route, jax_cpu_route)
from .kernel_maker import new_kernel


@functools.lru_cache(maxsize=256)
def jax_kernel(statement: str, options):
    """The Kernel of a JAX caller's statement, shared by the adapter and the FFI route."""
    with warnings.catch_warnings():   # the caller's own statement warned already
        warnings.simplefilter("ignore")
        return new_kernel(statement, options)


# The handler's fixed tables (EF_MAX_SLOTS and EF_MAX_PARAMS in c_ffi_support.py).
MAX_SLOTS = 64


# What the handler reads, as data for the route's rule (schedule/jax_route.py).
FFI_CAPABILITY = FfiCapability(frozenset(XLA_DTYPES), MAX_SLOTS)


@dataclass(frozen=True)
class FfiPlan:
    """Everything the custom call needs, fixed at lowering time."""
    target: str
    result_shape: Tuple[int, ...]
    result_dtype: np.dtype                  # of the custom call's result buffer
    casts: Tuple[Optional[np.dtype], ...]   # per operand: converted by XLA first, or None
    layout: Tuple[int, ...]                 # see backends/c/ffi_support.py
    ints: Tuple[int, ...]
    fills: Tuple[float, float]
    verify: Tuple[int, ...] = ()    # gathers' range rules (c_ffi_support.ef_in_range)
    vints: Tuple[int, ...] = ()     # the runtime ints of the kernels for verified gathers

    def emit(self, values, kept: bool = False):
        """The custom call on ``values``; ``kept``: one XLA keeps where nothing reads
        its result (a check of index values, runtime/jax_program.py)."""
        operands = [v if cast is None else v.astype(cast)
                    for v, cast in zip(values, self.casts)]
        result = jax.ShapeDtypeStruct(self.result_shape, self.result_dtype)
        extra = {"verify": np.array(self.verify, dtype=np.int64),
                 "vints": np.array(self.vints, dtype=np.int64)} if self.verify else {}
        # (a kept check traced under vmap: once per batch element)
        kept_call = {"has_side_effect": True, "vmap_method": "sequential"} if kept else {}
        return jax.ffi.ffi_call(self.target, result, **kept_call)(
            *operands, layout=np.array(self.layout, dtype=np.int64),
            ints=np.array(self.ints, dtype=np.int64),
            fills=np.array(self.fills, dtype=np.float64), **extra)


@dataclass(frozen=True)
class DotPlan:
    """A multiply-add contraction of two tensors, which the C backend hands to BLAS:
    under jit, XLA's own matrix product, after the same windows and transposes
    (plan/contraction.py's PreparedContraction, in jax.numpy)."""
    prepared: object
    names: Tuple[str, ...]

    def emit(self, values):
        import jax.numpy as jnp
        from ..lang import ast
        p, named = self.prepared, dict(zip(self.names, values))
        left, right = (named[o.tensor].astype(p.working)[o.window].transpose(o.order)
                       .reshape(o.sizes) for o in (p.left, p.right))
        product = jnp.matmul(left, right, precision=jax.lax.Precision.HIGHEST,
                             preferred_element_type=p.working)
        for factor in p.contraction.scale:
            value = factor.value if isinstance(factor, ast.Number) else named[factor.name]
            product = product * jnp.asarray(value).astype(p.working)
        return product.reshape(p.shape).transpose(p.order)


@dataclass(frozen=True)
class _Report:
    """What the reporter needs to rebuild a call's inputs from XLA's buffers."""
    statement: str
    options: object
    names: Tuple[str, ...]
    shapes: Tuple[Tuple[int, ...], ...]
    dtypes: Tuple[np.dtype, ...]


def cpu_route(kernel, names: Sequence[str], avals):
    """(CpuRoute, plan) for ``kernel`` on inputs with these abstract values (shape,
    dtype), in ``names`` order: the plan (FfiPlan or DotPlan, whose ``emit(values)``
    is the result) is None for the host callback."""
    key = tuple((tuple(a.shape), np.dtype(a.dtype)) for a in avals)
    return _route_for(kernel.statement, kernel.options, tuple(names), key,
                      bool(jax.config.jax_enable_x64))


def _callback(reason: str):
    return CpuRoute(CpuRouteKind.CALLBACK, reason), None


def _canonical(dtype) -> np.dtype:
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


@functools.lru_cache(maxsize=512)
def _route_for(statement, options, names, avals, x64):
    # x64 is only part of the cache key: the dtypes JAX can hold (_canonical) follow it
    from ..analysis.result_size import check_result_size
    kernel = jax_kernel(statement, options)
    early = host_route(options.backend, c_build.find_compiler() is not None)
    if early is not None:
        return early.route, None
    spec = kernel.spec
    call = kernel.bind(**{name: np.broadcast_to(np.zeros((), dtype), shape)
                          for name, (shape, dtype) in zip(names, avals)})
    schedule = as_written(kernel, call)     # (schedule/choose.py decides the route)
    slots = buffer_slots(spec)
    working, out = call.dtypes.working, output_dtype(call)
    decision = jax_cpu_route(JaxCall(
        schedule.backend, schedule.route, working, out,
        _canonical(working), tuple(spec.params),
        tuple((name, _canonical(dtype)) for name, (_, dtype) in zip(names, avals)),
        tuple(slots[:-1])), FFI_CAPABILITY)
    if decision.checks_result_size:
        check_result_size(call)
    route = decision.route
    if route.kind is CpuRouteKind.CALLBACK:
        return route, None
    if route.kind is CpuRouteKind.DOT:
        return route, DotPlan(prepare_contraction(schedule.blas, call), names)
    position = {name: k for k, name in enumerate(names)}
    arrival, casts = decision.arrival, decision.casts
    layout = []
    buffers = []
    for tensor, kind in slots[:-1]:     # (each read as the decision found it can be)
        want = np.dtype(np.int64) if kind == "index" else working
        layout += [position[tensor], XLA_DTYPES[want.name]]
        buffers.append(_dense(avals[position[tensor]][0], want))
    buffers.append(_dense(call.output_shape, out))
    from ..backends.c.ffi import ffi_kernel
    header, version = _headers()
    try:
        built = ffi_kernel(call, [unit_axis(b) for b in buffers], header, version)
    except c_build.CompileError as error:   # the callback's own compile says it again
        return _callback(f"the kernel with its XLA handler could not be built: {error}")
    plan = built.plan
    if any(len(k.buffers) != len(slots) for k in plan.program.kernels):
        return _callback("the kernel takes intermediate buffers")
    ints, _, _ = call_arguments(plan, call, buffers)
    params = [position[name] for name in plan.params]
    result_dtype = _canonical(out)
    # fixed when traced (0: OpenMP's default); XLA calls the kernel without Python
    threads = fixed_thread_count(options.threads, call.bounds.points) or 0
    token = _remember(_Report(statement, options, names, tuple(a[0] for a in avals),
                              tuple(arrival)))
    head = [token, threads, len(names), len(slots), len(params)]
    for (shape, _), dtype in zip(avals, arrival):
        head += [XLA_DTYPES[dtype.name], len(shape), *shape]
    tail = [XLA_DTYPES[result_dtype.name], XLA_DTYPES[out.name], len(call.output_shape),
            *call.output_shape]
    target = "einfuse_" + built.key[:32]
    _register(target, built.handler)
    fills = (float(options.pad) if options.pad is not None else 0.0, float(options.fill))
    verify, vints = (), ()
    if built.verified is not None:
        verify = _range_rules(call, position)
        vints = tuple(int(v) for v in call_arguments(built.verified, call, buffers)[0])
    found = FfiPlan(target, tuple(call.output_shape), result_dtype, tuple(casts),
                    tuple(head + layout + params + tail), tuple(int(v) for v in ints), fills,
                    verify, vints if verify else ())
    return CpuRoute(CpuRouteKind.FFI, route.reason, target), found


def _range_rules(call, position) -> Tuple[int, ...]:
    """plan/gathers.py's gathers_in_range as data for the handler: per gathered
    subscript, the span of its index part, the axis length and (operand, coefficient)
    per gather; () when a bound does not fit the handler's int64s."""
    ranges = call.bounds.range_map
    rules, count = [], 0
    for access in accesses(call.spec.rhs):
        for axis, sub in enumerate(access.indices):
            if not sub.gathers:
                continue
            low, high = subscript_span(IndexExpr(sub.terms, (), sub.constant), ranges)
            rules += [low, high, call.arrays.shapes[access.tensor][axis], len(sub.gathers)]
            for gathered, coeff in sub.gathers:
                rules += [position[gathered.tensor], coeff]
            count += 1
    rules = [count] + rules
    return tuple(rules) if all(abs(v) < 2**62 for v in rules) else ()


def _dense(shape, dtype) -> np.ndarray:
    """A stand-in with XLA's row-major layout for planning (its data is never read)."""
    dtype = np.dtype(dtype)
    strides, step = [], dtype.itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), tuple(shape),
                                           tuple(reversed(strides)), writeable=False)


@functools.lru_cache(maxsize=1)
def _headers() -> Tuple[str, str]:
    header = os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")
    return header, jaxlib.__version__


_registered: set = set()
_lock = threading.Lock()


def _register(target: str, handler) -> None:
    with _lock:
        if target in _registered:
            return
        _install_reporter()
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(handler), platform="cpu",
                                    api_version=1)
        _registered.add(target)


# -- errors from inside XLA ------------------------------------------------------------
_reports: Dict[int, _Report] = {}
_REPORTER = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p),
                             ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)


def _remember(report: _Report) -> int:
    """The report's token: a digest of what it describes, so that the same call gets
    the same token in every process (an executable from JAX's persistent compilation
    cache carries the token of the process that compiled it)."""
    digest = hashlib.sha256(repr((report.statement, report.options, report.names,
                                  report.shapes, [d.str for d in report.dtypes])).encode())
    token = int.from_bytes(digest.digest()[:7], "little")
    with _lock:
        _reports[token] = report
    return token


def _message(token: int, args) -> str:
    """einfuse's message for the failed call ``token`` on XLA's buffers ``args``."""
    from ..backends.numpy.backend import NumpyExecutor
    report = _reports[token]
    named = {}
    for k, (name, shape, dtype) in enumerate(zip(report.names, report.shapes,
                                                 report.dtypes)):
        count = int(np.prod(shape, dtype=np.int64))
        if count == 0:
            named[name] = np.zeros(shape, dtype)
            continue
        raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(args[k])
        named[name] = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    kernel = jax_kernel(report.statement, report.options)
    try:
        NumpyExecutor.for_call(kernel.bind(**named)).run()
    except EinfuseError as error:
        return str(attach_statement(error, report.statement))
    return "einfuse: the C kernel flagged an out-of-bounds gather that the reference " \
           "did not find"


def _report(token, args, count, message, capacity) -> int:
    try:
        text = _message(int(token), args).encode("utf-8", "replace")[:capacity - 1]
        ctypes.memmove(message, text + b"\0", len(text) + 1)
        return len(text)
    except Exception:    # never raise into XLA: the handler's own message is used
        return 0


_reporter = _REPORTER(_report)


def _install_reporter() -> None:
    from ..backends.c.ffi import support_library
    support_library(*_headers()).einfuse_ffi_set_reporter(
        ctypes.cast(_reporter, ctypes.c_void_p))


def route_note(kernel, call) -> str:
    """explain()'s line on the route this call's statement takes under jax.jit."""
    import jax.numpy as jnp
    names = tuple(kernel.spec.arg_order)
    values = [jnp.asarray((call.sources or {})[name]) for name in names]   # as call() does
    try:
        route = cpu_route(kernel, names, values)[0]
    except EinfuseError as error:
        return f"under jax.jit on the CPU this call fails: {error.message}"
    return route.describe()
