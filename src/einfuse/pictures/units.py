"""Numbers as the pictures print them: the same units as ``explain``'s text."""

from __future__ import annotations

from typing import Optional, Sequence


def nbytes(n: Optional[int]) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def count(n: Optional[int]) -> str:
    if n is None:
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:,}"


def rate(value: float, unit: str) -> str:
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def seconds(value: Optional[float]) -> str:
    if value is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def shape(extents: Sequence[int]) -> str:
    return "x".join(str(e) for e in extents) or "()"
