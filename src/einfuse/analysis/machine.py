"""The CPU the C kernels are built for: its instruction set, vector width and register
count, read once per process.

By default kernels are built with ``-march=native`` for the CPU this process runs on.
``EINFUSE_CPU`` picks another target the host can still execute, so that one machine
can build and test the code paths of another (issue 29: an AVX2-only AMD Zen 3 gave
results an AVX-512 machine never showed):

* ``native`` (default): this CPU, its facts read from ``/proc/cpuinfo``;
* ``avx2``: x86-64-v3 (AVX2 + FMA, 16 vector registers of 32 bytes), tuned for Zen 3;
* ``avx512``: x86-64-v4 (AVX-512, 32 vector registers of 64 bytes).

The target is part of every compiled kernel's cache key (its flags are), so kernels
built for one target are never loaded for another.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from typing import FrozenSet, Tuple

from ..errors import BackendError

TARGET_VARIABLE = "EINFUSE_CPU"


@dataclass(frozen=True)
class Machine:
    """What a kernel may assume of the CPU it runs on."""
    target: str                     # "native", "avx2" or "avx512"
    march: Tuple[str, ...]          # the compiler flags selecting the instruction set
    vector_bytes: int               # the widest vector register the code may use
    vector_registers: int           # how many of them (the register file a block fills)
    fma: bool

    def describe(self) -> str:
        return (f"{self.target} ({' '.join(self.march)}): {self.vector_registers} vector "
                f"registers of {self.vector_bytes} bytes{', FMA' if self.fma else ''}")


def _cpu_flags() -> FrozenSet[str]:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[-1].split())
    except OSError:
        pass
    return frozenset()


def _native(flags: FrozenSet[str]) -> Machine:
    if "avx512f" in flags:
        width, registers = 64, 32
    elif "avx" in flags:
        width, registers = 32, 16
    else:
        width, registers = 16, 16 if platform.machine() in ("x86_64", "AMD64") else 32
    return Machine("native", ("-march=native",), width, registers, "fma" in flags)


# target -> (flags, vector bytes, registers, the host CPU flags it needs)
_TARGETS = {
    "avx2": (("-march=x86-64-v3", "-mtune=znver3"), 32, 16,
             frozenset({"avx2", "fma", "bmi2"})),
    "avx512": (("-march=x86-64-v4",), 64, 32,
               frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"})),
}


@functools.lru_cache(maxsize=None)
def _machine_for(target: str) -> Machine:
    flags = _cpu_flags()
    if target in ("", "native"):
        return _native(flags)
    if target not in _TARGETS:
        raise BackendError(f"{TARGET_VARIABLE}={target!r} is not a CPU target einfuse "
                           f"knows; use one of native, {', '.join(sorted(_TARGETS))}")
    march, width, registers, needs = _TARGETS[target]
    missing = sorted(needs - flags)
    if missing:
        raise BackendError(f"{TARGET_VARIABLE}={target}: this CPU cannot run such code "
                           f"(it lacks {', '.join(missing)}); unset {TARGET_VARIABLE} or use "
                           "native")
    return Machine(target, march, width, registers, True)


@functools.lru_cache(maxsize=1)
def machine() -> Machine:
    """The target of this process's C kernels (``EINFUSE_CPU``, default native), read
    once: kernels already built and the block sizes chosen for them must agree."""
    return _machine_for(os.environ.get(TARGET_VARIABLE, "native").strip().lower())
