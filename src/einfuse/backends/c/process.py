"""Process-wide settings the C backend makes once, as it loads its first kernel:
libgomp's wait policy and glibc's heap trimming (docs/backends.md, "Threads" and
"Memory").  Each is skipped where the user chose one; neither changes results."""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
from typing import Iterator

# libgomp reads its wait policy from the environment once, when it is first loaded.
_POLICY_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# glibc reads these at its first malloc; set, they are the user's choice.
_MALLOC_VARIABLES = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
                     "GLIBC_TUNABLES")
# Setting it to 0 leaves malloc as it was.
MALLOC_OPT_OUT = "EINFUSE_MALLOC_TUNING"

_M_TRIM_THRESHOLD = -1          # mallopt parameters (glibc's malloc.h)
_M_MMAP_THRESHOLD = -3
# Blocks below this come from the heap, as glibc's own adaptive threshold ends up
# doing (its ceiling on 64-bit Linux); larger ones are mapped and unmapped per call.
MMAP_THRESHOLD = 32 << 20
# Free memory at the top of the heap is returned to the system above this much.
TRIM_THRESHOLD = 128 << 20


@contextlib.contextmanager
def process_settings(first: bool) -> Iterator[None]:
    """Around the loading of a kernel library; ``first``: the first one this process
    loads, the only one that changes anything."""
    if not first:
        yield
        return
    _keep_freed_memory()
    with _passive_openmp():
        yield


@contextlib.contextmanager
def _passive_openmp() -> Iterator[None]:
    """Load libgomp (with the first kernel) with a passive wait policy, unless the user
    chose one.  By default libgomp's idle threads spin for a while after each parallel
    loop; on a machine whose cores are busy with another process (or with the spinning
    threads of torch's or BLAS's pools) a spinning thread keeps a core from the thread a
    parallel loop is waiting for, and a 0.1 ms kernel took 1-8 ms.  Sleeping threads
    cost a wake-up (some microseconds) per parallel loop instead; loops below
    PARALLEL_MIN_WORK run on the calling thread and pay nothing.  The environment is
    restored at once: it only has to be there while libgomp initialises."""
    if any(name in os.environ for name in _POLICY_VARIABLES) or _libgomp_loaded():
        yield
        return
    os.environ["OMP_WAIT_POLICY"] = "passive"
    try:
        yield
    finally:
        os.environ.pop("OMP_WAIT_POLICY", None)


def _libgomp_loaded() -> bool:
    """Has this process loaded a libgomp already (torch's copy, loaded by ``import
    torch``, or the system's)?  Then its policy is set, and it is the one the kernels
    bind to: both answer to the name libgomp.so.1."""
    try:
        with open("/proc/self/maps") as handle:
            return any("/libgomp" in line for line in handle)
    except OSError:      # not Linux: no way to tell; leave the policy to the user
        return True


def _keep_freed_memory() -> None:
    """Tell glibc's malloc to keep up to TRIM_THRESHOLD of freed memory at the top of
    the heap instead of returning it to the system at once.  A training step allocates
    and frees the same few buffers every call (outputs, gradients, torch's
    ``ones_like``); with glibc's default, whether they are given back and faulted in
    again (a zeroed page at a time) depended on the heap's layout: the same 1024x256
    softmax forward+backward took 0.22 or 1.35 ms a step (900 page faults a step) from
    one process to the next.  The cost: a process keeps up to 128 MiB it freed.  Not
    done where the user set glibc's own variables, outside glibc, or with
    EINFUSE_MALLOC_TUNING=0."""
    if os.environ.get(MALLOC_OPT_OUT, "").strip() == "0" or \
            any(name in os.environ for name in _MALLOC_VARIABLES) or \
            platform.libc_ver()[0] != "glibc":
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
