"""The thread-count facts a kernel's schedule is decided from, before any backend is
asked: the count OpenMP would take, the work below which one thread is best, and the
count fixed by the call itself (``threads=``, or small work).  Where none is fixed, the
C backend samples the free cores call by call (backends/c/threads.py, issue 11)."""

from __future__ import annotations

import os
from typing import Optional

# Below this many loop iterations in total, threads cost more than they save.
PARALLEL_MIN_WORK = 1 << 15


def default_threads() -> int:
    """The thread count OpenMP would choose (OMP_NUM_THREADS, else the CPUs)."""
    try:
        value = int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0])
    except ValueError:
        value = 0
    return value if value > 0 else (os.cpu_count() or 1)


def fixed_thread_count(requested: Optional[int], work: int) -> Optional[int]:
    """The thread count of a kernel of ``work`` loop iterations where no sample decides
    it: ``requested`` where given, 1 for small work; None where the free cores decide,
    call by call."""
    if requested:
        return requested
    return 1 if work < PARALLEL_MIN_WORK else None
