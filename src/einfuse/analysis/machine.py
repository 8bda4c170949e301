"""The CPU the C kernels are built for: its instruction set, vector width and register
count, read once per process.

By default kernels are built with ``-march=native`` for the CPU this process runs on.
``EINFUSE_CPU`` picks another target the host can still execute, so that one machine
can build and test the code paths of another (issue 29: an AVX2-only AMD Zen 3 gave
results an AVX-512 machine never showed):

* ``native`` (default): this CPU, its facts read from ``/proc/cpuinfo``;
* ``avx2``: x86-64-v3 (AVX2 + FMA, 16 vector registers of 32 bytes), tuned for Zen 3;
* ``avx512``: x86-64-v4 (AVX-512, 32 vector registers of 64 bytes).

Besides the instruction set a Machine states what register and loop blocking is chosen
from (plan/blocking.py): the FMA units and their latency (independent accumulator chains
needed = latency x units) and the data cache sizes.  A native machine's caches are read
from sysfs; an emulated target states those of the CPU it stands for (Zen 3 for avx2).

The target is part of every compiled kernel's cache key (its flags are), so kernels
built for one target are never loaded for another.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from typing import Dict, FrozenSet, Tuple

from ..errors import BackendError

TARGET_VARIABLE = "EINFUSE_CPU"
# GCC tunes most AVX-512 cores (rocketlake, icelake, x86-64-v4) to prefer 32-byte
# vectors: the blocking's 64-byte lanes then became twice the registers and spilled
# (native dist K=784 1024 x 1024: 57 GFLOP/s, 150 with 64-byte vectors; issue 31).  The
# vector width the blocks are sized for is the width the compiler is told to use.
WIDE_VECTORS = ("-mprefer-vector-width=512",)


@dataclass(frozen=True)
class Machine:
    """What a kernel may assume of the CPU it runs on."""
    target: str                     # "native", "avx2" or "avx512"
    march: Tuple[str, ...]          # the compiler flags selecting the instruction set
    vector_bytes: int               # the widest vector register the code may use
    vector_registers: int           # how many of them (the register file a block fills)
    fma: bool
    # FMA (or multiply-add) pipes and their latency in cycles: x86 cores since Haswell and
    # Zen 1 issue two per cycle at 4-5 cycles; not readable from /proc/cpuinfo, so a table
    fma_units: int = 2
    fma_latency: int = 4
    l1d_bytes: int = 32 * 1024          # per core
    l2_bytes: int = 512 * 1024          # per core

    @property
    def accumulators(self) -> int:
        """Independent accumulator chains that keep every FMA unit busy."""
        return self.fma_units * self.fma_latency

    def describe(self) -> str:
        return (f"{self.target} ({' '.join(self.march)}): {self.vector_registers} vector "
                f"registers of {self.vector_bytes} bytes{', FMA' if self.fma else ''} "
                f"({self.fma_units} units, latency {self.fma_latency}); L1d "
                f"{self.l1d_bytes // 1024} KiB, L2 {self.l2_bytes // 1024} KiB")


def _cpu_flags() -> FrozenSet[str]:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[-1].split())
    except OSError:
        pass
    return frozenset()


@functools.lru_cache(maxsize=1)
def cpu_vendor() -> str:
    """This CPU's vendor as /proc/cpuinfo names it ("GenuineIntel", "AuthenticAMD"), ""
    where unreadable.  Not part of a Machine: it picks between libraries (whose BLAS),
    not what a kernel may assume, so it stays out of the kernels' cache keys."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[-1].strip()
    except OSError:
        pass
    return ""


_CACHE_DIR = "/sys/devices/system/cpu/cpu0/cache"


def _size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1:], 1)
    return int(text.rstrip("KMG") or 0) * scale


def _cache_sizes() -> Dict[Tuple[int, str], int]:
    """(level, type) -> bytes of this CPU's caches (sysfs), {} where unreadable."""
    found: Dict[Tuple[int, str], int] = {}
    try:
        entries = sorted(os.listdir(_CACHE_DIR))
    except OSError:
        return found
    for entry in entries:
        if not entry.startswith("index"):
            continue
        try:
            with open(os.path.join(_CACHE_DIR, entry, "level")) as level, \
                    open(os.path.join(_CACHE_DIR, entry, "type")) as kind, \
                    open(os.path.join(_CACHE_DIR, entry, "size")) as size:
                found[(int(level.read()), kind.read().strip())] = _size(size.read())
        except (OSError, ValueError):
            continue
    return found


def _native(flags: FrozenSet[str]) -> Machine:
    if "avx512f" in flags:
        width, registers = 64, 32
    elif "avx" in flags:
        width, registers = 32, 16
    else:
        width, registers = 16, 16 if platform.machine() in ("x86_64", "AMD64") else 32
    caches = _cache_sizes()
    l1 = caches.get((1, "Data")) or 32 * 1024
    l2 = caches.get((2, "Unified")) or 512 * 1024
    fma = "fma" in flags
    march = ("-march=native",) + (WIDE_VECTORS if width == 64 else ())
    return Machine("native", march, width, registers, fma,
                   fma_units=2, fma_latency=4 if fma else 3, l1d_bytes=l1, l2_bytes=l2)


# target -> (flags, vector bytes, registers, the host CPU flags it needs, L1d, L2): avx2
# stands for Zen 3 (32 KiB L1d, 512 KiB L2), avx512 for a Skylake-SP class core
_TARGETS = {
    "avx2": (("-march=x86-64-v3", "-mtune=znver3"), 32, 16,
             frozenset({"avx2", "fma", "bmi2"}), 32 * 1024, 512 * 1024),
    "avx512": (("-march=x86-64-v4",) + WIDE_VECTORS, 64, 32,
               frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"}), 32 * 1024,
               1024 * 1024),
}


@functools.lru_cache(maxsize=None)
def _machine_for(target: str) -> Machine:
    flags = _cpu_flags()
    if target in ("", "native"):
        return _native(flags)
    if target not in _TARGETS:
        raise BackendError(f"{TARGET_VARIABLE}={target!r} is not a CPU target einfuse "
                           f"knows; use one of native, {', '.join(sorted(_TARGETS))}")
    march, width, registers, needs, l1, l2 = _TARGETS[target]
    missing = sorted(needs - flags)
    if missing:
        raise BackendError(f"{TARGET_VARIABLE}={target}: this CPU cannot run such code "
                           f"(it lacks {', '.join(missing)}); unset {TARGET_VARIABLE} or use "
                           "native")
    return Machine(target, march, width, registers, True, l1d_bytes=l1, l2_bytes=l2)


@functools.lru_cache(maxsize=1)
def machine() -> Machine:
    """The target of this process's C kernels (``EINFUSE_CPU``, default native), read
    once: kernels already built and the block sizes chosen for them must agree."""
    return _machine_for(os.environ.get(TARGET_VARIABLE, "native").strip().lower())
