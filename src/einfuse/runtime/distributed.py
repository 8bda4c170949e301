"""The seam between a compiled object's call and torch DTensor inputs.  A Kernel or
Program called on DTensors runs sharded: planned by sharding/'s planner, einfuse kernels
on each rank's local tensors, torch.distributed's collectives (sharding/dtensor.py).
sharding/ sits above runtime/ and program/, so einfuse.api installs the runner when it
is imported, as it installs runtime/tracing.py's handler: a hook, not an upward import
(docs/architecture.md)."""

from __future__ import annotations

from typing import Callable, List, Mapping

from ..errors import BackendError

_RUNNERS: List[Callable] = []


def install(runner: Callable) -> None:
    """``runner(compiled, values)`` runs a Kernel's or Program's call whose arguments
    (by name) include DTensors; the last one installed is used."""
    _RUNNERS[:] = [runner]


def run_on_dtensors(compiled, values: Mapping[str, object]):
    if not _RUNNERS:      # only without einfuse.api, which every import of einfuse loads
        raise BackendError("DTensor inputs run through einfuse.sharding; import einfuse")
    return _RUNNERS[0](compiled, values)
