"""Building the C libraries that XLA calls (runtime/jax_ffi.py): the support library
(backends/c/ffi_support.py, compiled once per jaxlib) and, per planned kernel, the
kernel's usual source plus a stub whose ``einfuse_ffi_handler`` is the XLA FFI handler.
Both go through c_build (disk cache, file locks, the same flags); nothing here imports
JAX -- the caller passes the header path and jaxlib version."""

from __future__ import annotations

import ctypes
import functools
import threading
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

from ...plan import Plan
from ...plan.gathers import unsigned_slots
from . import build as c_build
from .backend import kernel_key
from .ffi_support import kernel_stub, support_source
from .render import render_c

_lock = threading.Lock()
_handlers: Dict[Tuple, "FfiKernel"] = {}


@dataclass(frozen=True)
class FfiKernel:
    plan: Plan
    handler: object        # the ctypes function einfuse_ffi_handler (for jax.ffi.pycapsule)
    key: str               # the library's cache key: names the XLA target
    # Under bounds='check'/'promise' with gathers: the kernels planned for gathers known
    # to be in range, which the handler runs when the index arrays show it.
    verified: Optional[Plan] = None
    table: object = None   # their function pointers, kept alive for the handler


@functools.lru_cache(maxsize=4)
def support_library(header: str, version: str) -> ctypes.CDLL:
    library = c_build.load(support_source(header, version))
    library.einfuse_ffi_set_reporter.argtypes = [ctypes.c_void_p]
    library.einfuse_ffi_set_reporter.restype = None
    return library


def plan_checks_gathers(plan: Plan) -> bool:
    return any(k.checks_bounds for k in plan.program.kernels)


def checked_bounds(call) -> str:
    """The kernel's bounds mode, never 'verified': the C backend skips the per-element
    test when the index values it was given are in range, but an XLA kernel is planned
    before any value exists, so under check/promise it tests every gathered value."""
    slots = unsigned_slots(call)
    bounds = call.options.bounds
    return f"{bounds}:u{','.join(map(str, slots))}" if slots else bounds


def ffi_kernel(call, layouts: Sequence[int], header: str, version: str) -> FfiKernel:
    """The kernel library for this call's statement, dtypes and buffer layouts, with
    its handler bound to the support library (built and loaded on first use)."""
    kernel = kernel_key(call, layouts, checked_bounds(call))    # (schedule.LoopChoice)
    key = (kernel, header, version)
    found = _handlers.get(key)
    if found is not None:
        return found
    support = support_library(header, version)
    plan = kernel.plan()
    source = render_c(plan.program, c_build.vector_math()) + \
        kernel_stub([k.name for k in plan.program.kernels])
    verified, table = None, None
    if plan_checks_gathers(plan):
        verified = kernel.with_bounds("verified").plan()
        checked_free = c_build.load(render_c(verified.program, c_build.vector_math()),
                                    verified.fast_math)
        table = (ctypes.c_void_p * len(verified.program.kernels))(*[
            ctypes.cast(getattr(checked_free, k.name), ctypes.c_void_p).value
            for k in verified.program.kernels])
    library = c_build.load(source, plan.fast_math)
    library.einfuse_ffi_bind.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    library.einfuse_ffi_bind.restype = None
    library.einfuse_ffi_bind(ctypes.cast(support.einfuse_ffi_run, ctypes.c_void_p),
                             ctypes.cast(table, ctypes.c_void_p) if table else None,
                             len(table) if table else 0)
    found = FfiKernel(plan, library.einfuse_ffi_handler,
                      c_build.library_key(source, c_build.flags_for(plan.fast_math)),
                      verified, table)
    with _lock:
        return _handlers.setdefault(key, found)
