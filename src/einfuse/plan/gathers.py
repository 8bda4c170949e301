"""Gather bounds as compiled kernels see them: shared by the C and Triton backends."""

from __future__ import annotations

from ..analysis.ranges import subscript_span
from ..lang.ast import IndexExpr, accesses


def bounds_mode(call) -> str:
    """bounds= as the kernel sees it: under 'check'/'promise', gathers whose index arrays
    are all in range (found by one vectorised min/max per index array, O(its size)) need
    no per-element test in the kernel, which then vectorises ('verified')."""
    bounds = call.options.bounds
    if bounds in ("check", "promise") and gathers_in_range(call):
        return "verified"
    return bounds


def gathers_in_range(call) -> bool:
    """True when every gathered subscript stays inside its axis for any value the index
    arrays hold (a conservative bound: whole index arrays, whole index ranges)."""
    ranges = call.bounds.range_map
    extremes = {}
    for access in accesses(call.spec.rhs):
        for axis, sub in enumerate(access.indices):
            if not sub.gathers:
                continue
            low, high = subscript_span(IndexExpr(sub.terms, (), sub.constant), ranges)
            reads = True
            for gathered, coeff in sub.gathers:
                name = gathered.tensor
                if name not in extremes:
                    extremes[name] = _extremes(call, name)
                if extremes[name] is None:
                    reads = False   # an empty index array: this access reads nothing
                    break
                g_low, g_high = (coeff * v for v in extremes[name])
                low, high = low + min(g_low, g_high), high + max(g_low, g_high)
            if reads and (low < 0 or high >= call.arrays.shapes[access.tensor][axis]):
                return False
    return True


def _extremes(call, name: str):
    """(min, max) of an index array, or None when it is empty; a torch tensor is reduced
    where it lives (a CUDA tensor is not copied to the host)."""
    source = (call.sources or {}).get(name)
    if type(source).__module__.startswith("torch"):
        if source.numel() == 0:
            return None
        low, high = source.aminmax()
        return int(low), int(high)
    values = call.arrays[name]
    return (int(values.min()), int(values.max())) if values.size else None
