"""The runtime arguments of one call of a lowered statement (plan/lower.Plan): its
runtime ints (range starts, extents, dimensions, strides) and scalar parameters; and
which axis of an array is its unit-stride one (the layouts a plan depends on)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .gathers import check_gather_arithmetic
from .lower import Plan


def unit_axis(array: np.ndarray) -> int:
    """The axis of ``array`` with unit element stride (and more than one element), or -1."""
    for axis in reversed(range(array.ndim)):
        if array.shape[axis] > 1 and array.strides[axis] == array.itemsize:
            return axis
    return -1


def call_arguments(plan: Plan, call, buffers: Sequence[np.ndarray]):
    """The runtime ints and scalar parameters of one call, as int64/float64 arrays."""
    check_gather_arithmetic(call)
    ranges = call.bounds.range_map
    ints = []
    for how in plan.int_args:
        if how[0] == "lo":
            ints.append(ranges[how[1]][0])
        elif how[0] == "n":
            lo, hi = ranges[how[1]]
            ints.append(max(0, hi - lo))
        elif how[0] == "dim":
            ints.append(buffers[how[1]].shape[how[2]])
        else:  # stride, in elements
            array = buffers[how[1]]
            ints.append(array.strides[how[2]] // array.itemsize)
    values = [call.params[name] for name in plan.params]
    doubles = np.array([float(v) for v in values] or [0.0], dtype=np.float64)
    # only integer working dtypes read these, and then every parameter is an int64 (a
    # float parameter makes the working dtype float); 1e30 must not overflow the slot
    integers = np.array([_int64_or_zero(v) for v in values] or [0], dtype=np.int64)
    return np.array(ints or [0], dtype=np.int64), doubles, integers


def _int64_or_zero(value) -> int:
    if np.ndim(value) == 0 and float(value).is_integer() and -2**63 <= int(value) < 2**63:
        return int(value)
    return 0
