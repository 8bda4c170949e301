"""Running a fusion group (schedule/fusion.py) as one C kernel: each member's plan is
the one the C backend would use for it alone; plan/fuse.py merges their loop nests;
the merged kernel is compiled once per combination of plans and called with every
member's arrays, runtime ints and parameters."""

from __future__ import annotations

import ctypes
import threading
from typing import Dict, Tuple

import numpy as np

from .. import ir
from ..plan import call_arguments, unit_axis
from ..plan.fuse import fuse_kernels, slots_after_fusion
from . import c_build
from .capabilities import not_compiled
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
            or not_compiled(call.spec):
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


def run(members) -> bool:
    """Run the group; False when its kernel flagged an out-of-bounds gather (nothing
    is delivered then: the statements run one by one and raise their own errors)."""
    kernels = tuple(m.plan.program.kernels[0] for m in members)
    reads = tuple(m.reads for m in members)
    key = tuple(id(m.plan) for m in members) + (tuple(tuple(sorted(r.items()))
                                                       for r in reads),)
    found = _fused.get(key)
    if found is None:
        working = members[0].call.dtypes.working.name
        program = fuse_kernels(kernels, reads, working)
        library = c_build.load(render_c(program, c_build.vector_math()),
                               all(m.plan.fast_math for m in members))
        function = getattr(library, program.kernels[0].name)
        function.argtypes = _ARGTYPES
        function.restype = None
        # the plans stay referenced, so their ids in the key cannot be reused
        found = (function, slots_after_fusion(kernels, reads), tuple(m.plan for m in members))
        with _lock:
            found = _fused.setdefault(key, found)
    function, passed, _ = found
    ints, doubles, integers = [], [], []
    for member, kernel in zip(members, kernels):
        i, d, n = call_arguments(member.plan, member.call, member.buffers)
        ints.append(i[:len(kernel.ints)])
        doubles.append(d[:kernel.n_params])
        integers.append(n[:kernel.n_params])
    ints_array = np.concatenate(ints + [np.zeros(1, np.int64)])
    doubles_array = np.concatenate(doubles + [np.zeros(1)])
    integers_array = np.concatenate(integers + [np.zeros(1, np.int64)])
    arrays = [members[k].buffers[slot] for k, slot in passed]
    pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    options = members[0].call.options
    fills = np.array([options.pad if options.pad is not None else 0.0, options.fill],
                     dtype=np.float64)
    work = sum(member.call.bounds.points for member in members)
    threads = options.threads or (1 if work < PARALLEL_MIN_WORK else 0)
    error = ctypes.c_int32(0)
    function(pointers, ints_array.ctypes.data, doubles_array.ctypes.data,
             integers_array.ctypes.data, fills.ctypes.data, threads, ctypes.byref(error))
    return not error.value
