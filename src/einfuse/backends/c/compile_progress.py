"""A progress line while a first call compiles for long.

A program's first call (its forward and backward kernels, an ``ef.jit`` function and its
gradient) can compile for seconds; silent, that looks like a hang.  Compiles that follow
each other closely (less than ``GAP_S`` of anything else between them) are taken as one
first call's; once such a run of compiles has lasted ``PROGRESS_AFTER_S`` seconds (wall
time since its first compile began) einfuse says so on the ``einfuse`` logger, with how
many kernels are built so far and where they are cached, and again every
``PROGRESS_EVERY_S`` seconds after that.  The line is written when a compile starts or
ends, from the thread that compiles: no timer thread runs in the user's process.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

PROGRESS_AFTER_S = 2.0
PROGRESS_EVERY_S = 10.0
GAP_S = 1.0

_lock = threading.Lock()


@dataclass
class _Run:
    """One run of compiles (one first call's, as far as timing can tell)."""
    started: float
    active: int = 0          # compiles in progress (programs may build several at once)
    built: int = 0
    last_end: Optional[float] = None
    next_line: float = 0.0   # elapsed seconds at which the next line is due


_run: Optional[_Run] = None
# (tests replace it to check the lines without a logging configuration)
say: Callable[[str], None] = lambda line: logging.getLogger("einfuse").warning("%s", line)


def _line(run: _Run, now: float, directory: str) -> Optional[str]:
    elapsed = now - run.started
    if elapsed < run.next_line:
        return None
    while run.next_line <= elapsed:
        run.next_line += PROGRESS_EVERY_S
    kernels = "kernel" if run.built == 1 else "kernels"
    return (f"einfuse: a first call is compiling its kernels: {run.built} {kernels} built "
            f"in {elapsed:.1f} s so far, {run.active} compiling (each is cached in "
            f"{directory}: later calls and processes skip this)")


def compile_started(directory: str, now: Optional[float] = None) -> None:
    global _run
    now = time.perf_counter() if now is None else now
    with _lock:
        run = _run
        if run is None or (run.active == 0 and run.last_end is not None
                           and now - run.last_end > GAP_S):
            run = _run = _Run(started=now, next_line=PROGRESS_AFTER_S)
        run.active += 1
        line = _line(run, now, directory)
    if line:
        say(line)


def compile_ended(directory: str, now: Optional[float] = None) -> None:
    now = time.perf_counter() if now is None else now
    with _lock:
        run = _run
        if run is None:
            return
        run.active = max(0, run.active - 1)
        run.built += 1
        run.last_end = now
        line = _line(run, now, directory)
    if line:
        say(line)


def reset() -> None:
    """Forget the current run (tests)."""
    global _run
    with _lock:
        _run = None
