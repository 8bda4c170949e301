"""How the runtime's lower modules make a statement's Kernel without importing
runtime/kernel.py: running a Kernel reaches them (autograd computes gradients, which
compile and run gradient statements; the hoisted form and the JAX adapters build
kernels of their own), so they cannot import the class that calls them.  kernel.py
installs the class here when it is imported (``import einfuse`` does, before any
call).  A hook, not an import: the knot it ties (Kernel.__call__'s dispatch) is
named in docs/architecture.md as the place the schedule's route will replace."""

from __future__ import annotations

import functools
import warnings
from typing import List, Optional

from ..analysis.options import Options, make_options
from ..analysis.spec import first_span, spec_of
from ..errors import EinfuseError, OptionError, attach_statement, warn

_CLASSES: List[type] = []


def install(kernel_class: type) -> None:
    """The Kernel class (runtime/kernel.py) that ``new_kernel`` makes."""
    _CLASSES[:] = [kernel_class]


def new_kernel(statement: str, options: Options):
    """A new Kernel of ``statement`` under checked ``options``."""
    return _CLASSES[0](statement, options)


@functools.lru_cache(maxsize=256)
def shared_kernel(statement: str, options: Options) -> "Kernel":
    """One Kernel per (statement, options), so that ``ein`` in a loop finds its prepared
    calls (the fast path) instead of building a kernel per call.  Kernels hold no
    per-call state; their warnings are emitted by ``compile`` on every request."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return new_kernel(statement, options)


def compile_statement(statement: str, ranges=None, pad=None, bounds="check", fill=0.0,
                      dtype=None, backend="auto", threads: Optional[int] = None,
                      memory_limit: Optional[int] = None) -> "Kernel":
    """One statement compiled with ``compile``'s options (checked here), its warnings
    emitted on every request; the Kernel is shared (shared_kernel)."""
    try:
        options = make_options(ranges, pad, bounds, fill, dtype, backend, threads,
                               memory_limit)
    except OptionError as error:
        raise attach_statement(option_collision(error, statement), statement) from None
    return statement_kernel(statement, options)


def statement_kernel(statement: str, options: Options) -> "Kernel":
    """The shared Kernel of ``statement`` under checked ``options``, its warnings emitted
    (as a new Kernel would)."""
    kernel = shared_kernel(statement, options)
    for message, span in kernel.spec.warnings:
        warn(message, source=statement, span=span)
    return kernel


def option_collision(error: OptionError, statement: str) -> OptionError:
    """``error``, saying so when the bad option value was meant for a tensor, scalar or
    output of the statement that has the option's name."""
    option = getattr(error, "option", None)
    try:
        spec = spec_of(statement)
    except EinfuseError:
        return error   # the option's own message; the statement's error comes later
    if option not in set(spec.arg_order) | {spec.output}:
        return error
    what = "output" if option == spec.output else \
        "scalar parameter" if option in spec.params else "tensor"
    return OptionError(f"{error.message}; {option}= is the option, and the statement's "
                       f"{what} {option} has the same name: pass the {what} as "
                       f"arrays={{'{option}': ...}}", span=first_span(spec, option))
