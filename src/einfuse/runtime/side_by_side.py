"""Independent first-call work run in threads side by side (issue 32): making a kernel
on a first call compiles it, and compiles of independent kernels then overlap, so the
call waits for the slowest rather than for their sum.  One thread per core this process
may run on, at most one per item."""

from __future__ import annotations

import concurrent.futures
import os
from typing import Callable, List, Sequence, TypeVar

T = TypeVar("T")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def side_by_side(work: Callable[[T], object], items: Sequence[T]) -> List[object]:
    """``work(item)`` for every item, in threads; each item's result or the exception
    it raised, in the items' order (the caller chooses which error, if any, it raises)."""
    outcomes: List[object] = []
    with concurrent.futures.ThreadPoolExecutor(max(1, min(len(items), usable_cores())),
                                               "einfuse-gradient") as pool:
        for future in [pool.submit(work, item) for item in items]:
            try:
                outcomes.append(future.result())
            except Exception as error:      # (handed back: the caller decides)
                outcomes.append(error)
    return outcomes
