"""Which outputs of a C fusion group live as one row per thread (never written to
memory whole), and the per-thread scratch they live in: a layout fact of the group's
members and of the plans as lowered (plan/fuse.py addresses a row's unit-stride axis
without a stride), read by the schedule when it decides the group (schedule/fusion.py)
and by the C backend that runs it (backends/c/fused.py).

``member``: a bound member of the group (schedule/fusion.Member: kernel, call, outer,
buffers)."""

from __future__ import annotations

from typing import FrozenSet

import numpy as np

from .arguments import unit_axis


def fitting_rows(members, candidates: FrozenSet[int]) -> FrozenSet[int]:
    """The candidates (members whose outputs nothing after the group reads) whose
    outputs live as per-thread rows."""
    return frozenset(k for k in candidates if rows_fit_plan(members[k]))


def row_bytes(member) -> int:
    """The bytes of one thread's row of the member's output."""
    shape = tuple(member.call.output_shape)
    axis = member.kernel.spec.output_indices.index(member.outer)
    elements = int(np.prod([n for a, n in enumerate(shape) if a != axis], dtype=np.int64))
    return elements * member.call.dtypes.working.itemsize


def rows_fit_plan(member) -> bool:
    """Whether the member's output can live as per-thread rows under the plans as
    lowered: the plans address its unit-stride axis without a stride, so the rows'
    view must keep that axis (and it must not be the row axis, whose stride is 0)."""
    shape = tuple(member.call.output_shape)
    axis = member.kernel.spec.output_indices.index(member.outer)
    full = unit_axis(member.buffers[-1])
    view, _ = thread_rows_view(member, 1)
    return full != axis and unit_axis(view) == full and len(shape) >= 2


def padded(member) -> int:
    """The padded row length (elements) of the member's per-thread rows."""
    itemsize = member.call.dtypes.working.itemsize
    return padded_length(row_bytes(member) // itemsize, itemsize)


def thread_rows_view(member, threads: int):
    """(view, padded row length): a scratch array of one row per thread, seen with the
    member's output shape and stride 0 along the shared (row) axis, so that each
    thread's row pointer (ir.Buffer.per_thread) plus the usual addressing lands in its
    own row."""
    shape = tuple(member.call.output_shape)
    axis = member.kernel.spec.output_indices.index(member.outer)
    itemsize = member.call.dtypes.working.itemsize
    strides, step = [0] * len(shape), itemsize
    for a in reversed(range(len(shape))):
        if a != axis:
            strides[a] = step
            step *= shape[a]
    scratch = thread_scratch(max(threads, 1), step // itemsize, member.call.dtypes.working)
    view = np.lib.stride_tricks.as_strided(scratch, shape=shape, strides=tuple(strides))
    return view, scratch.shape[1]


# Each thread's row starts on its own pair of cache lines (the line and the neighbour
# the hardware prefetches with it).  Rows of 2 KiB laid end to end from a 16-byte
# aligned allocation shared a line between one thread's last elements and the next
# thread's first; with layernorm's four column accumulators written every row, the
# 8192x256 backward took 3.5 ms on two threads against 1.1 ms on one.
ROW_ALIGN = 128


def thread_scratch(threads: int, length: int, dtype, zeroed: bool = False) -> np.ndarray:
    """A (threads, padded length) array whose rows each start on a ROW_ALIGN-byte
    boundary; the padded length (a multiple of ROW_ALIGN bytes) is the row stride the
    kernel takes."""
    dtype = np.dtype(dtype)
    per_line = max(1, ROW_ALIGN // dtype.itemsize)
    padded = padded_length(length, dtype.itemsize)
    raw = (np.zeros if zeroed else np.empty)(threads * padded + per_line, dtype)
    start = (-raw.ctypes.data % ROW_ALIGN) // dtype.itemsize
    return raw[start:start + threads * padded].reshape(threads, padded)


def padded_length(length: int, itemsize: int) -> int:
    """``length`` elements rounded up to whole ROW_ALIGN-byte lines (a row of float32
    padded so is a whole number of lines of float64 too)."""
    per_line = max(1, ROW_ALIGN // itemsize)
    return -(-max(length, 1) // per_line) * per_line
