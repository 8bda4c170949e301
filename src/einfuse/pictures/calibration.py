"""``einfuse calibrate``: this machine's memory bandwidth and FLOP rate, measured once and
cached (with the date and the CPU model) for the rooflines of the pictures.

Bandwidth: every core copies its own part of arrays much larger than the caches at once
(NumPy's copy releases the GIL, so the threads run in parallel, as the OpenMP kernels
do); bytes read plus bytes written over the best time.  FLOP rate: a float32 matrix
product through NumPy's BLAS on every core, 2 n^3 FLOPs (a multiply and an add each
count one, as ``explain`` counts them) over the best time.  Both are what this machine
reaches, not its datasheet."""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional, TextIO

import numpy as np

from ..backends.disk_cache import cache_dir

FILE_NAME = "calibration.json"
VERSION = 1


@dataclass(frozen=True)
class Calibration:
    bytes_per_second: float
    flops_per_second: float
    cpu: str            # the CPU model, as /proc/cpuinfo names it
    cores: int
    date: str           # ISO date of the measurement
    version: int = VERSION

    def describe(self) -> str:
        limits = f"{self.bytes_per_second / 1e9:.1f} GB/s memory bandwidth, " \
                 f"{self.flops_per_second / 1e9:.1f} GFLOP/s (float32)"
        return f"{limits}; {self.cpu}, {self.cores} cores; measured {self.date}"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


FILE_VARIABLE = "EINFUSE_CALIBRATION_FILE"


def cache_path() -> str:
    """``$EINFUSE_CALIBRATION_FILE``, else calibration.json in einfuse's cache directory."""
    return os.environ.get(FILE_VARIABLE) or os.path.join(cache_dir(), FILE_NAME)


def _best(run: Callable[[], None], budget: float, repeats: int) -> float:
    """The fastest of at least ``repeats`` runs (more while ``budget`` seconds last)."""
    best = float("inf")
    start = time.perf_counter()
    done = 0
    while done < repeats or time.perf_counter() - start < budget:
        began = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - began)
        done += 1
        if done >= 50 * repeats:
            break
    return max(best, 1e-9)


def _bandwidth(megabytes: int, threads: int, budget: float) -> float:
    count = max(1, megabytes * 1_000_000 // 8 // threads)
    sources = [np.ones(count) for _ in range(threads)]
    targets = [np.empty(count) for _ in range(threads)]

    def copy_all() -> None:
        workers = [threading.Thread(target=np.copyto, args=(t, s))
                   for s, t in zip(sources, targets)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    copy_all()
    seconds = _best(copy_all, budget, 3)
    return 2 * count * 8 * threads / seconds


def _flop_rate(n: int, budget: float) -> float:
    a = np.ones((n, n), np.float32)
    b = np.ones((n, n), np.float32)
    a @ b
    seconds = _best(lambda: a @ b, budget, 3)
    return 2 * n ** 3 / seconds


def calibrate(quick: bool = False, progress: Optional[TextIO] = None) -> Calibration:
    """Measure this machine (a few seconds; ``quick``: small sizes, a fraction of a second,
    for tests) and cache the result; ``progress`` gets one line saying so."""
    out = sys.stderr if progress is None else progress
    print("einfuse: calibrating this machine for the roofline (memory bandwidth, FLOP "
          f"rate){' quickly' if quick else ', a few seconds, once'}; cached in "
          f"{cache_path()}", file=out, flush=True)
    cores = os.cpu_count() or 1
    bandwidth = _bandwidth(16 if quick else 256, cores, 0.05 if quick else 1.0)
    flops = _flop_rate(256 if quick else 2048, 0.05 if quick else 1.0)
    result = Calibration(bandwidth, flops, cpu_model(), cores,
                         datetime.date.today().isoformat())
    store(result)
    return result


def store(calibration: Calibration) -> None:
    """Cache ``calibration`` for this machine (written whole, then renamed into place)."""
    path = cache_path()
    partial = f"{path}.{os.getpid()}.tmp"
    try:
        with open(partial, "w") as handle:
            json.dump(asdict(calibration), handle)
        os.replace(partial, path)
    except OSError:
        pass          # an unwritable cache: measured again next time


def cached() -> Optional[Calibration]:
    """The cached calibration when it was measured on this CPU model; None otherwise."""
    try:
        with open(cache_path()) as handle:
            data = json.load(handle)
        found = Calibration(**data)
    except (OSError, ValueError, TypeError):
        return None
    if found.version != VERSION or found.cpu != cpu_model() or found.cores != os.cpu_count():
        return None
    if not (found.bytes_per_second > 0 and found.flops_per_second > 0):
        return None
    return found


QUICK_VARIABLE = "EINFUSE_CALIBRATE"


def machine_limits() -> Calibration:
    """The cached calibration, measured now (with a progress line) on first need;
    ``EINFUSE_CALIBRATE=quick`` measures with small sizes (tests, CI)."""
    return cached() or calibrate(quick=os.environ.get(QUICK_VARIABLE) == "quick")
