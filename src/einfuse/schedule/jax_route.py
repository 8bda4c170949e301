"""The route a JAX caller's call takes on the CPU under jit (runtime/jax_ffi.py runs
it): XLA's own dot for what the C backend hands to BLAS, the C kernel as an XLA FFI
custom call, or the host callback (``jax.pure_callback``), decided here as a frozen
:class:`JaxRouteDecision` from the call's signature (the options, the call's as-written
schedule, the working and result dtypes, each input's canonical dtype, the buffer
slots) and what the FFI handler reads, declared as data (:class:`FfiCapability`).

A decision of FFI is the route the call takes if its kernel builds: building it is the
runtime's (a compile error, or a kernel needing intermediate buffers, still sends the
call to the host callback, with that reason).  The result's size is a value check the
runtime makes once the inputs are readable (``checks_result_size``), not a route."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import FrozenSet, Optional, Tuple

import numpy as np

from .schedule import Route


class CpuRouteKind(enum.Enum):
    FFI = "XLA FFI custom call"
    DOT = "XLA dot_general"
    CALLBACK = "host callback (jax.pure_callback)"


@dataclass(frozen=True)
class CpuRoute:
    """How the primitive runs on the CPU under jit (and in every JAX transformation)."""
    kind: CpuRouteKind
    reason: str                       # why this route
    target: Optional[str] = None      # the XLA custom-call target, for FFI

    def describe(self) -> str:
        where = f" {self.target}" if self.target else ""
        return f"under jax.jit on the CPU: {self.kind.value}{where} ({self.reason})"


@dataclass(frozen=True)
class FfiCapability:
    """What the FFI handler takes: buffers of these dtypes (by name), at most
    ``max_slots`` arrays and as many parameters."""
    dtypes: FrozenSet[str]
    max_slots: int


@dataclass(frozen=True)
class JaxCall:
    """The facts of one call the route is decided from.  ``inputs``: per operand (in
    the primitive's order) its name and canonical dtype; ``slots``: the kernel's
    buffer slots but the result (tensor name, kind); ``canonical_working``: the
    working dtype as JAX holds it (it follows jax_enable_x64)."""
    schedule_backend: str
    schedule_route: Route
    working: np.dtype
    result: np.dtype
    canonical_working: np.dtype
    params: Tuple[str, ...]
    inputs: Tuple[Tuple[str, np.dtype], ...]
    slots: Tuple[Tuple[str, str], ...]


@dataclass(frozen=True)
class JaxRouteDecision:
    """The route and why; for FFI and DOT the dtype each input arrives in and its cast
    (by XLA, before the call; None where none), and ``checks_result_size``: whether the
    runtime checks the result's size before running it."""
    route: CpuRoute
    arrival: Tuple[np.dtype, ...] = ()
    casts: Tuple[Optional[np.dtype], ...] = ()
    checks_result_size: bool = False


def _callback(reason: str, checks_result_size: bool = False) -> JaxRouteDecision:
    return JaxRouteDecision(CpuRoute(CpuRouteKind.CALLBACK, reason),
                            checks_result_size=checks_result_size)


def host_route(backend: str, compiler: bool) -> Optional[JaxRouteDecision]:
    """The host callback where the options' ``backend`` or a missing C compiler sends
    every call there (decided before a call is bound), else None: then
    :func:`jax_cpu_route`."""
    if backend not in ("auto", "c"):
        return _callback(f"backend={backend!r} runs on the host")
    if not compiler:
        return _callback("no C compiler with OpenMP was found")
    return None


def jax_cpu_route(call: JaxCall, capability: FfiCapability) -> JaxRouteDecision:
    """The route of a bound ``call`` that :func:`host_route` left (the module's rule;
    the first reason that applies)."""
    if call.schedule_backend != "c":
        return _callback("the statement runs on another backend")
    if call.working.name not in capability.dtypes or \
            call.result.name not in capability.dtypes:
        return _callback(f"the kernel computes in {call.working}, which the FFI handler "
                         "does not convert")
    if call.params and call.working.kind in "iub":
        # integer parameters are checked against the working dtype by value, per call
        return _callback("integer scalar parameters are checked by value on the host")
    arrival, casts = [], []
    for name, dtype in call.inputs:
        cast = None
        if dtype.name not in capability.dtypes:
            if dtype.kind != "f" or name in call.params:
                return _callback(f"{name} is {dtype}, which the FFI handler does not read")
            cast = dtype = call.canonical_working    # float16/bfloat16: widened by XLA
        arrival.append(dtype)
        casts.append(cast)
    read = dict(arrival=tuple(arrival), casts=tuple(casts), checks_result_size=True)
    if call.schedule_route is Route.BLAS and call.canonical_working == call.working:
        return JaxRouteDecision(CpuRoute(
            CpuRouteKind.DOT, "a contraction, which the C backend hands to BLAS"), **read)
    if len(call.slots) + 1 > capability.max_slots or \
            len(call.params) > capability.max_slots:
        return _callback(f"the kernel takes more than {capability.max_slots} arrays or "
                         "parameters", True)
    position = {name: k for k, (name, _) in enumerate(call.inputs)}
    for tensor, kind in call.slots:
        want = np.dtype(np.int64) if kind == "index" else call.working
        have = arrival[position[tensor]]
        if have.kind == "f" and want.kind != "f":
            return _callback(f"{tensor} is {have}, read as {want}", True)
    return JaxRouteDecision(CpuRoute(CpuRouteKind.FFI,
                                     "the C kernel runs inside XLA's executable"), **read)

