"""The hand-written library kernels, one rule per (pattern, backend) -- as JAX registers
one lowering rule per primitive per platform.  A rule says whether a call of a
statement takes that kernel; :func:`library_for` is what schedule/choose.py asks.

Registered: online-softmax attention (rewrite/online_softmax.py) on the C, NumPy and
Triton backends, run by runtime/attention.py (the kernels: backends/c/attention.py,
the NumPy key-block loop, backends/triton/attention.py).  The kernels of gradients
(scatter, gather rows, strided add) are still chosen where they run
(docs/architecture.md names that gap)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from ..analysis.frameworks import NUMPY, TORCH
from ..analysis.spec import spec_of
from ..rewrite.online_softmax import Attention, recognise
from .schedule import Library


@functools.lru_cache(maxsize=256)
def statement_attention(statement: str) -> Optional[Attention]:
    """The attention one statement computes, or None (cached by its text: every call
    of a kernel asks)."""
    spec = spec_of(statement)
    if spec.assign != ":=":
        return None
    # (the spec's right side has its implicit reductions explicit)
    return recognise([dataclasses.replace(spec.statement, rhs=spec.rhs)], (spec.output,))


@dataclass(frozen=True)
class LibraryRule:
    """``applies(statement, framework)``: whether a call of the statement from that
    framework takes the kernel (the kernel itself may still decline a call whose data
    it cannot take: the schedule's fallback runs then)."""
    library: Library
    backend: str
    applies: Callable[[str, str], bool]


_RULES: Dict[Tuple[Library, str], LibraryRule] = {}


def register(library: Library, backend: str, applies: Callable[[str, str], bool]) -> None:
    _RULES[(library, backend)] = LibraryRule(library, backend, applies)


def rules() -> Tuple[LibraryRule, ...]:
    return tuple(_RULES.values())


def library_for(statement: str, framework: str, backend: str) -> Optional[Library]:
    """The library kernel a call of ``statement`` from ``framework`` on ``backend`` (a
    resolved backend name) takes, or None."""
    for (library, name), rule in _RULES.items():
        if name == backend and rule.applies(statement, framework):
            return library
    return None


def _attention_applies(statement: str, framework: str) -> bool:
    # NumPy arrays and torch tensors: runtime/attention.run_fused_attention takes them
    return framework in (NUMPY, TORCH) and statement_attention(statement) is not None


for _backend in ("c", "numpy", "triton"):
    register(Library.ATTENTION, _backend, _attention_applies)
