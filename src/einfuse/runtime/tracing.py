"""The seam between a compiled object's call and torch.compile.  While torch.compile
traces, ``Kernel.__call__`` and ``Program.__call__`` hand the call to the adapter in
program/torch_compiled.py, which sits above both floors (it compiles text through the
front door and derives program gradients).  einfuse.api installs the handler when it is
imported, before any trace can begin; the handler imports the adapter (and torch) only
then, so ``import einfuse`` imports no torch.  A hook, not an import: the runtime floor
never imports what is built on it (docs/architecture.md)."""

from __future__ import annotations

from typing import Callable, List

_HANDLERS: List[Callable] = []


def install(handler: Callable) -> None:
    """``handler(compiled, args, kwargs, arrays)`` runs a traced call of a Kernel or
    Program; the last one installed is used."""
    _HANDLERS[:] = [handler]


def traced_call(compiled, args, kwargs, arrays):
    """A Kernel's or Program's call while torch.compile traces it."""
    return _HANDLERS[0](compiled, args, kwargs, arrays)
