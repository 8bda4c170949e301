"""Running a fusion group (schedule/fusion.py) as one C kernel: each member's plan is
the one the C backend would use for it alone; plan/fuse.py merges their loop nests;
the merged kernel is compiled once per combination of plans and called with every
member's arrays, runtime ints and parameters."""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Dict, FrozenSet, Tuple

import numpy as np

from .. import ir
from ..plan import call_arguments, unit_axis
from ..plan.fuse import fuse_kernels, slots_after_fusion
from ..plan.lower import divides
from . import c_build
from .c_backend import (_ARGTYPES, PARALLEL_MIN_WORK, _blas_contraction, _buffers,
                        _pack_for_lanes, _plan)
from .c_render import render_c

_fused: Dict[Tuple, Tuple] = {}
_lock = threading.Lock()


def available() -> bool:
    return c_build.find_compiler() is not None


def prepare(kernel, call):
    """(plan, buffers, outer index) of a statement that can be a member of a group, or
    None: it must run on the C backend as one kernel that is a single parallel loop."""
    if call.options.backend not in ("auto", "c") or _blas_contraction(call) is not None \
            or call.spec.has_position_reductions:
        return None
    out = np.empty(call.output_shape, dtype=call.dtypes.working)
    if out.size == 0:
        return None
    buffers = _buffers(call) + [out]
    plan = _plan(call, [unit_axis(b) for b in buffers])
    if _pack_for_lanes(call, plan, list(buffers)) or len(plan.program.kernels) != 1:
        return None
    body = plan.program.kernels[0].body
    if len(body) != 1 or not isinstance(body[0], ir.Loop) or body[0].kind != "parallel":
        return None
    number = int(body[0].var[1:])
    return plan, buffers, call.spec.all_indices[number]


def run(members, thread_rows: FrozenSet[int] = frozenset()) -> bool:
    """Run the group; False when its kernel flagged an out-of-bounds gather (nothing
    is delivered then: the statements run one by one and raise their own errors).
    The outputs of the members in ``thread_rows`` (nothing after the group reads them)
    may live as one row per thread: they are not delivered in their buffers."""
    kernels = tuple(m.plan.program.kernels[0] for m in members)
    reads = tuple(m.reads for m in members)
    thread_rows = fitting_rows(members, thread_rows)
    local = frozenset((k, len(kernels[k].buffers) - 1) for k in thread_rows)
    key = tuple(id(m.plan) for m in members) + (tuple(tuple(sorted(r.items()))
                                                       for r in reads), local)
    found = _fused.get(key)
    if found is None:
        working = members[0].call.dtypes.working.name
        program = fuse_kernels(kernels, reads, working, local)
        # reciprocal math where every member allows it or has no division it could change
        library = c_build.load(render_c(program, c_build.vector_math()),
                               all(m.plan.fast_math or not divides(m.call.spec.rhs)
                                   for m in members))
        function = getattr(library, program.kernels[0].name)
        function.argtypes = _ARGTYPES
        function.restype = None
        # the plans stay referenced, so their ids in the key cannot be reused
        found = (function, slots_after_fusion(kernels, reads), tuple(m.plan for m in members))
        with _lock:
            found = _fused.setdefault(key, found)
    function, passed, _ = found
    options = members[0].call.options
    work = sum(member.call.bounds.points for member in members)
    threads = options.threads or (1 if work < PARALLEL_MIN_WORK else
                                  0 if not thread_rows else default_threads())
    buffers = [list(m.buffers) for m in members]
    rows = []
    for k in sorted(thread_rows):
        view, length = _thread_rows(members[k], threads)
        buffers[k][-1] = view
        rows.append(length)
        for j, member in enumerate(members):
            for slot, (producer, _) in member.reads.items():
                if producer == k:
                    buffers[j][slot] = view
    ints, doubles, integers = [], [], []
    for member, kernel, arrays in zip(members, kernels, buffers):
        i, d, n = call_arguments(member.plan, member.call, arrays)
        ints.append(i[:len(kernel.ints)])
        doubles.append(d[:kernel.n_params])
        integers.append(n[:kernel.n_params])
    ints_array = np.concatenate(ints + [np.array(rows + [0], dtype=np.int64)])
    doubles_array = np.concatenate(doubles + [np.zeros(1)])
    integers_array = np.concatenate(integers + [np.zeros(1, np.int64)])
    arrays = [buffers[k][slot] for k, slot in passed]
    pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    fills = np.array([options.pad if options.pad is not None else 0.0, options.fill],
                     dtype=np.float64)
    error = ctypes.c_int32(0)
    function(pointers, ints_array.ctypes.data, doubles_array.ctypes.data,
             integers_array.ctypes.data, fills.ctypes.data, threads, ctypes.byref(error))
    return not error.value


def default_threads() -> int:
    """The thread count OpenMP would choose (OMP_NUM_THREADS, else the CPUs): per-thread
    rows need it known before the call."""
    try:
        value = int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0])
    except ValueError:
        value = 0
    return value if value > 0 else (os.cpu_count() or 1)


def fitting_rows(members, candidates: FrozenSet[int]) -> FrozenSet[int]:
    """The candidates (members whose outputs nothing after the group reads) whose
    outputs live as per-thread rows."""
    return frozenset(k for k in candidates if _rows_fit_plan(members[k]))


def row_bytes(member) -> int:
    """The bytes of one thread's row of the member's output."""
    return _thread_rows(member, 1)[1] * member.call.dtypes.working.itemsize


def _rows_fit_plan(member) -> bool:
    """Whether the member's output can live as per-thread rows under the plans as
    lowered: the plans address its unit-stride axis without a stride, so the rows'
    view must keep that axis (and it must not be the row axis, whose stride is 0)."""
    shape = tuple(member.call.output_shape)
    axis = member.kernel.spec.output_indices.index(member.outer)
    full = unit_axis(member.buffers[-1])
    view, _ = _thread_rows(member, 1)
    return full != axis and unit_axis(view) == full and len(shape) >= 2


def _thread_rows(member, threads: int):
    """(view, row length): a scratch array of one row per thread, seen with the
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
    length = step // itemsize
    scratch = np.empty((max(threads, 1), length), dtype=member.call.dtypes.working)
    view = np.lib.stride_tricks.as_strided(scratch, shape=shape, strides=tuple(strides))
    return view, length
