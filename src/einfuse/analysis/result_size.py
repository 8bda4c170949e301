"""Refusing a result that cannot fit in memory, before any backend allocates it."""

from __future__ import annotations

import functools
import os
from typing import Optional

from ..errors import AllocationError
from .binding import BoundCall


def _result_bytes(call: BoundCall) -> int:
    count = 1
    for extent in call.output_shape:
        count *= extent
    return count * max(call.dtypes.working.itemsize, call.dtypes.result.itemsize)


@functools.lru_cache(maxsize=1)
def _physical_memory() -> Optional[int]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):   # not POSIX: rely on MemoryError
        return None


def check_result_size(call: BoundCall) -> None:
    """A result larger than the machine's memory is refused before any backend tries."""
    memory = _physical_memory()
    if memory is not None and _result_bytes(call) > memory:
        raise too_large(call, f"is larger than this machine's memory ({_size(memory)})")


def fits_in_memory(call: BoundCall) -> bool:
    """Whether the call's result could fit in this machine's memory (check_result_size
    would accept it): a fused group (schedule/fusion.py) allocates its members' outputs
    itself, and one that cannot fit runs alone, where this check refuses it."""
    memory = _physical_memory()
    return memory is None or _result_bytes(call) <= memory


def too_large(call: BoundCall, why: str) -> AllocationError:
    spec = call.spec
    return AllocationError(
        f"the result {spec.output} has shape {call.output_shape} ({call.dtypes.result}, "
        f"{_size(_result_bytes(call))}), which {why}; check the shapes and ranges=",
        span=spec.statement.output_span)


def _size(nbytes: int) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if nbytes < 1000 or unit == "PB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.2f} {unit}"
        nbytes /= 1000
