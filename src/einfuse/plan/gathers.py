"""Gather bounds as compiled kernels see them: shared by the C and Triton backends.

A gathered subscript ``affine + sum(c_k * g_k)`` is judged on its exact integer value,
never on an int64 that wrapped around (``x[idx[i] + 1]`` with ``idx[i]`` = INT64_MAX
reads position 2**63 and is clipped to the last element, not wrapped to a negative
one).  Kernels compute it in one of two exact forms (see the renderers' helpers):

* ``one``: a single gather with coefficient +-1 (``x[idx[i] + k]``, ``x[k - idx[i]]``):
  the index value is compared with the valid range before the affine part is added,
  in integer arithmetic that cannot overflow, signed or unsigned;
* ``wide``: anything else: the int64 sum that wraps (exact modulo 2**64) plus a float64
  estimate of the true value, which tells how many times 2**64 the wrapped sum is off.
  That estimate is good enough (within 2**61) when :func:`check_gather_arithmetic`
  passes; it raises an EinfuseOverflowError otherwise (coefficients near 2**46 and
  beyond on 64-bit index arrays), on every backend alike.

uint64 index arrays reach kernels as int64 bit patterns; their slots are listed in the
kernel's bounds mode (``"clip:u1,3"``), so that kernels read them as unsigned.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from ..analysis.ranges import subscript_span
from ..errors import EinfuseOverflowError
from ..lang.ast import IndexExpr, accesses
from .slots import buffer_slots

INT64_MAX = 2**63 - 1
# The wide form's float64 estimate must stay within 2**61 of the true value: its error
# is at most (terms + 4) * 2**-53 * (sum of the terms' magnitudes).
_WIDE_LIMIT = 2**113
# Wrapping a wide value that is 2**64 or more from the int64 sum multiplies by 2**64
# modulo the axis length 16 bits at a time, which needs an axis below 2**47.
_WRAP_AXIS_LIMIT = 2**47


def one_gather(sub) -> bool:
    """Whether a gathered subscript has the ``one`` form: one gather, coefficient +-1
    (IR and AST subscripts alike)."""
    return len(sub.gathers) == 1 and sub.gathers[0][1] in (1, -1)


def gather_helper(sub, unsigned: bool) -> str:
    """The renderers' helper for a gathered IR subscript (``ef_<helper>``): ``sat`` or
    ``wrap`` by policy, then for the ``one`` form the index array's signedness and the
    coefficient's sign (``sat_sp``, ``wrap_um`` ...), else ``w`` (the ``wide`` form).
    ``unsigned``: whether the single gather reads a uint64 index array."""
    policy = "wrap" if sub.policy == "wrap" else "sat"
    if not one_gather(sub):
        return f"{policy}_w"
    return f"{policy}_{'u' if unsigned else 's'}{'p' if sub.gathers[0][1] == 1 else 'm'}"


def bounds_mode(call, unsigned_checks: bool = False) -> str:
    """bounds= as the kernel sees it: under 'check'/'promise', gathers whose index arrays
    are all in range (found by one vectorised min/max per index array, O(its size)) need
    no per-element test in the kernel, which then vectorises ('verified').  Otherwise
    the mode, followed by the buffer slots of uint64 index arrays (``"wrap:u2"``) for
    clip/wrap/fill, and for check/promise too with ``unsigned_checks`` (a kernel that
    tests each value itself; a Triton kernel never does: its caller checks first)."""
    check_gather_arithmetic(call)   # here too: a launch cached by its caller skips the rest
    bounds = call.options.bounds
    if bounds in ("check", "promise"):
        if gathers_in_range(call):
            return "verified"
        if not unsigned_checks:
            return bounds
    slots = unsigned_slots(call)
    return f"{bounds}:u{','.join(map(str, slots))}" if slots else bounds


def parse_mode(mode: str):
    """(bounds mode, slots of uint64 index arrays) from :func:`bounds_mode`'s string."""
    bounds, _, unsigned = mode.partition(":u")
    return bounds, tuple(int(s) for s in unsigned.split(",") if s)


def unsigned_slots(call):
    dtypes = call.arrays.dtypes
    if not any(dtypes[info.name] == np.uint64 for info in call.spec.tensors
               if info.as_index):
        return ()
    return tuple(n for n, (tensor, kind) in enumerate(buffer_slots(call.spec))
                 if kind == "index" and np.dtype(dtypes[tensor]) == np.uint64)


def check_gather_arithmetic(call) -> None:
    """Raise EinfuseOverflowError where a gathered subscript could be too large for the
    exact forms the kernels compute (see the module's notes), or where a nested gather
    under bounds='fill' would read a fill= value that is no int64 as a position.  It
    depends only on the statement, the ranges, the index arrays' dtypes, the axis
    lengths and the options, so every backend raises for the same calls."""
    spec, options = call.spec, call.options
    wide, nested = _gather_forms(spec)
    if nested and options.bounds == "fill" and \
            not (math.isfinite(options.fill) and abs(options.fill) < 2**63):
        raise EinfuseOverflowError(
            f"fill={options.fill} is read as a position by a nested gather (an index "
            "array read out of range gives fill=), and positions are int64; pass a whole "
            "number fill=", span=spec.statement.output_span)
    if not wide:
        return
    dtypes = tuple(sorted((t.name, np.dtype(call.arrays.dtypes[t.name]).str)
                          for t in spec.tensors if t.as_index))
    _check(spec, tuple(sorted(call.bounds.range_map.items())), dtypes,
           tuple(sorted(call.arrays.shapes.items())), options.bounds, options.fill)


@functools.lru_cache(maxsize=256)
def _gather_forms(spec):
    """(whether a gathered subscript has the wide form, whether a gather is nested)."""
    subs = [sub for access in accesses(spec.rhs) for sub in access.indices if sub.gathers]
    return (any(not one_gather(sub) for sub in subs),
            any(inner.gathers for sub in subs for gathered, _ in sub.gathers
                for inner in gathered.indices))


@functools.lru_cache(maxsize=1024)
def _check(spec, ranges, dtypes, shapes, bounds: str, fill: float) -> None:
    ranges, dtypes, shapes = dict(ranges), dict(dtypes), dict(shapes)
    for access in accesses(spec.rhs):
        for axis, sub in enumerate(access.indices):
            if not sub.gathers or one_gather(sub):
                continue
            low, high = subscript_span(IndexExpr(sub.terms, (), sub.constant), ranges)
            total, count = max(abs(low), abs(high)), 1
            for gathered, coeff in sub.gathers:
                total += abs(coeff) * _magnitude(gathered, dtypes, bounds == "fill", fill)
                count += 1
            if total * (count + 4) > _WIDE_LIMIT or (
                    bounds == "wrap" and total > INT64_MAX and
                    shapes[access.tensor][axis] >= _WRAP_AXIS_LIMIT):
                raise EinfuseOverflowError(
                    f"{access}: subscript {sub} may reach magnitude {total} for these index "
                    "array dtypes, too large for exact index arithmetic (gathered "
                    "subscripts are exact up to about 2**110); use smaller coefficients",
                    span=sub.span or access.span)


def _magnitude(gathered, dtypes, fills: bool, fill: float) -> int:
    """The largest magnitude a gathered index value can have: its array's dtype range,
    or fill= where a rejected read of it gives fill= (a nested gather)."""
    info = np.iinfo(np.dtype(dtypes[gathered.tensor]))
    largest = max(abs(int(info.min)), int(info.max))
    if fills and any(sub.gathers for sub in gathered.indices):
        largest = max(largest, abs(int(fill)))
    return largest


@dataclass(frozen=True)
class GatherSpan:
    """One gathered subscript of an access: ``low``..``high`` is its affine part's span
    over the call's ranges, ``gathers`` its (index array, coefficient) terms, ``extent``
    the length of the axis it reads.  All of it depends on shapes only."""
    low: int
    high: int
    gathers: Tuple[Tuple[str, int], ...]
    extent: int


def gather_spans(call) -> Tuple[GatherSpan, ...]:
    """The gathered subscripts of ``call``'s statement, for :func:`spans_in_range`."""
    ranges = call.bounds.range_map
    spans = []
    for access in accesses(call.spec.rhs):
        for axis, sub in enumerate(access.indices):
            if sub.gathers:
                low, high = subscript_span(IndexExpr(sub.terms, (), sub.constant), ranges)
                spans.append(GatherSpan(low, high, tuple((g.tensor, c) for g, c in sub.gathers),
                                        call.arrays.shapes[access.tensor][axis]))
    return tuple(spans)


def spans_in_range(spans: Tuple[GatherSpan, ...],
                   extremes: Callable[[str], Optional[Tuple[int, int]]]) -> bool:
    """True when every span stays inside its axis for any value the index arrays hold,
    ``extremes(name)`` giving an index array's (min, max), or None when it is empty (an
    access through it reads nothing).  Each array's extremes are asked for once."""
    found: Dict[str, Optional[Tuple[int, int]]] = {}
    for span in spans:
        low, high = span.low, span.high
        reads = True
        for name, coeff in span.gathers:
            if name not in found:
                found[name] = extremes(name)
            if found[name] is None:
                reads = False
                break
            g_low, g_high = (coeff * v for v in found[name])
            low, high = low + min(g_low, g_high), high + max(g_low, g_high)
        if reads and (low < 0 or high >= span.extent):
            return False
    return True


def gathers_in_range(call) -> bool:
    """True when every gathered subscript stays inside its axis for any value the index
    arrays hold (a conservative bound: whole index arrays, whole index ranges)."""
    return spans_in_range(gather_spans(call), lambda name: _extremes(call, name))


def array_extremes(values: np.ndarray) -> Optional[Tuple[int, int]]:
    """(min, max) of an integer ndarray, or None when it is empty."""
    return (int(values.min()), int(values.max())) if values.size else None


def _extremes(call, name: str):
    """(min, max) of an index array, or None when it is empty; a torch tensor is reduced
    where it lives (a CUDA tensor is not copied to the host)."""
    source = (call.sources or {}).get(name)
    if type(source).__module__.startswith("torch"):
        if source.numel() == 0:
            return None
        import torch
        if source.dtype == torch.uint64:
            return _uint64_extremes(source.view(torch.int64))
        low, high = source.aminmax()
        if source.is_cuda:   # one transfer to the host (and one wait), not one per value
            low, high = torch.stack((low, high)).tolist()
        return int(low), int(high)
    return array_extremes(call.arrays[name])


def _uint64_extremes(bits):
    """(min, max) of a torch uint64 tensor given as its int64 view (torch has no uint64
    min/max): values of 2**63 and above are the negative bit patterns."""
    high_half = bits < 0
    low_values, high_values = bits[~high_half], bits[high_half]
    low = int(low_values.min()) if low_values.numel() else int(high_values.min()) + 2**64
    high = int(high_values.max()) + 2**64 if high_values.numel() else int(low_values.max())
    return low, high
