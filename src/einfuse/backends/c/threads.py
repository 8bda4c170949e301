"""How many threads a C kernel runs on (issue 11: threads that never stall).

* ``threads=`` given: that many.
* Below PARALLEL_MIN_WORK loop iterations: the calling thread alone (threads cost more
  than they save).
* Otherwise every core this process may use -- unless other tasks are running on them
  right now.  A parallel loop is split evenly (static schedule), so one thread whose core
  is busy with another process holds up the whole kernel until the scheduler runs it:
  on this 2-core machine beside two busy processes a 2048x1024 row sum took 6.6 ms on 2
  threads against 1.8 ms on 1 (torch: 28-38 ms against 6-10 ms).  So the kernel takes
  the cores left: the count of running tasks in ``/proc/loadavg`` (sampled at most every
  10 ms; it includes the calling thread) less one, taken from the cores.  The sample is
  only trusted where that count covers the same cores as this process (its CPU affinity
  is the whole machine, as outside a CPU-limited container); elsewhere, and where the
  file is missing, OpenMP's default stands.
* The count has this process's own running threads taken out: idle OpenMP workers spin
  for some milliseconds after each parallel loop (torch's libgomp spins; XLA's and BLAS's
  pools too), and counted as "other tasks" they made every repeated kernel of a process
  that had imported torch first run on one thread (a 4096x1024 softmax 1.19 ms instead of
  0.65 ms).  They are read from ``/proc/self/task/*/stat`` only when the machine-wide
  count says some task besides the caller runs (30-150 us, once per sample).

OpenMP's own answer to this (``OMP_DYNAMIC``) reads the 15-minute load average, which a
long-running einfuse computation raises itself, and then throttles its own kernels."""

from __future__ import annotations

import os
import threading
import time
from typing import Optional

from ...analysis.thread_policy import (PARALLEL_MIN_WORK, default_threads,  # noqa: F401
                                       fixed_thread_count)

# How long one reading of the running tasks stands.
SAMPLE_SECONDS = 0.01

_lock = threading.Lock()
_sample = [-1.0, 0]        # (time.monotonic() of the reading, the thread count it gave)


def thread_count(requested: Optional[int], work: int) -> int:
    """Threads for a kernel of ``work`` loop iterations: the fixed count, else
    :func:`free_threads` (0 means OpenMP's default)."""
    return threads_for(fixed_thread_count(requested, work))


def threads_for(fixed: Optional[int]) -> int:
    """The threads of this call of a kernel whose schedule fixed ``fixed`` threads
    (schedule/schedule.Schedule.threads), or None: the cores left, sampled now."""
    return free_threads() if fixed is None else fixed


def free_threads() -> int:
    """0 (OpenMP's default) when no other task is running, else the cores left (at
    least 1)."""
    if default_threads() <= 1:
        return 0        # (one thread either way: no /proc reads, 50 us a pack at worst)
    now = time.monotonic()
    if now - _sample[0] < SAMPLE_SECONDS:
        return _sample[1]
    count = _from_running_tasks(_running_tasks())
    with _lock:
        _sample[0], _sample[1] = now, count
    return count


def _running_tasks() -> Optional[int]:
    try:
        with open("/proc/loadavg", "rb") as handle:
            return int(handle.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None


def _from_running_tasks(running: Optional[int]) -> int:
    if running is None or not _whole_machine():
        return 0
    cores = default_threads()
    others = running - 1        # the calling thread is running
    if others > 0:
        others = running - _own_running_threads()
    if others <= 0:
        return 0
    return max(1, min(cores, os.cpu_count() or 1) - others) if cores > 1 else 1


def _whole_machine() -> bool:
    try:
        return len(os.sched_getaffinity(0)) == (os.cpu_count() or 0)
    except (AttributeError, OSError):
        return False


def _own_running_threads() -> int:
    """How many of this process's threads are running or runnable now (at least 1: the
    caller).  A thread that ends while it is read is skipped."""
    running = 0
    try:
        names = os.listdir("/proc/self/task")
    except OSError:
        return 1
    for name in names:
        try:
            handle = os.open("/proc/self/task/" + name + "/stat", os.O_RDONLY)
        except OSError:
            continue
        try:
            data = os.read(handle, 512)
        except OSError:
            continue
        finally:
            os.close(handle)
        # "pid (comm) S ...": the state follows the last parenthesis (comm may hold any).
        end = data.rfind(b")")
        if end >= 0 and data[end + 2:end + 3] == b"R":
            running += 1
    return max(running, 1)
