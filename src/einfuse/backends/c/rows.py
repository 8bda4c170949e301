"""Row kernels: a fusion group (schedule/fusion.py) that is exactly a softmax or a
layernorm over the rows of one matrix, or values per row from a matrix's log-sum-exp
row statistics (plan/row_statistics.py: a log-sum-exp, a cross-entropy), runs as a
hand-written C kernel (backends/c/rows_source.py; the per-row rest of the latter by
backends/c/row_values.py) instead of the merged loop nests of plan/fuse.py.

The generic fused kernel is what GCC makes of each statement's loops: per-lane
partials kept in arrays on the stack, a sum's lanes combined one after another at the
end of every row, libmvec's ``expf`` called per vector (its arguments and the
accumulators spilled around the call).  The row kernels keep every accumulator in
registers, combine lanes pairwise and use an inline vector exponential, so a softmax
row is read once from memory, its exponentials written once and scaled in cache.

Which group runs which row kernel is decided with the group (plan/row_kernel.py, by
schedule/fusion.py); this module builds and runs the kernel it is handed.

Results are the statements' up to rounding: the exponential is within one unit in
the last place of exp's (it is not libmvec's, so low-order bits may differ from the
statements run one by one), and row sums add lanes in another order.  NaN, inf and
-inf rows behave as the statements do: the maximum propagates NaN, ``exp(x - m)`` is
computed from the same maximum, a row sum that is 0, inf or NaN divides as written."""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple, Type

import numpy as np

from ...errors import BackendError
from ...plan.row_kernel import (NEVER_WRITTEN, RowKernel, RowPattern,  # noqa: F401
                                row_input)
from ...plan.row_statistics import statement_statistics
from . import build as c_build, call as c_call, row_values
from .backend import KERNEL_ARGTYPES, VECTOR_BYTES
from .rows_source import source
from .threads import fixed_thread_count, free_threads


_lock = threading.Lock()
_libraries: Dict[np.dtype, ctypes.CDLL] = {}


def _library(dtype: np.dtype) -> ctypes.CDLL:
    """The row kernels for this element type, compiled once."""
    found = _libraries.get(dtype)
    if found is None:
        found = c_build.load(source(dtype, VECTOR_BYTES))
        for name in ("ef_softmax_call", "ef_layernorm_call"):
            function = getattr(found, name)
            function.argtypes = KERNEL_ARGTYPES
            function.restype = None
        for name in ("ef_exp_values", "ef_exp_values_fast"):
            getattr(found, name).argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64]
            getattr(found, name).restype = None
        with _lock:
            found = _libraries.setdefault(dtype, found)
    return found


def exp_values(x: np.ndarray, fast: bool = False) -> np.ndarray:
    """The row kernels' exponential of each value of a float32 or float64 vector;
    ``fast``: the form a row takes once its extremes put every argument in range
    (rows_source.py's ef_vexp_fast), for arguments in that range only."""
    x = np.ascontiguousarray(x)
    y = np.empty_like(x)
    library = _library(x.dtype)
    (library.ef_exp_values_fast if fast else library.ef_exp_values)(
        x.ctypes.data, y.ctypes.data, x.size)
    return y


@dataclass(frozen=True)
class _Launch:
    """What a call passes besides the arrays: the kernel, its runtime ints (rows, n,
    ldx, ldp) and doubles (layernorm's n1, n2, eps), kept alive with their addresses."""
    function: object
    entry: int
    ints: np.ndarray
    doubles: np.ndarray
    addresses: Tuple[int, int] = (0, 0)

    def __call__(self, arrays: Tuple[np.ndarray, ...], threads: int) -> int:
        """The kernel run on ``arrays``; its error flag (a gathered index out of
        bounds: only the log-sum-exp kernel's values gather)."""
        caller = c_call.caller()
        ints, doubles = self.addresses
        if caller is not None and len(arrays) <= c_call.MAX_BUFFERS:
            return caller(self.entry, arrays, ints, doubles, ints, doubles, threads)
        pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        error = ctypes.c_int32(0)
        self.function(pointers, ints, doubles, ints, doubles, threads, ctypes.byref(error))
        return error.value


_values_sources: Dict[Tuple, str] = {}


def _values_function(statistics, dtype: np.dtype):
    """The log-sum-exp kernel of this group's values (row_values.py): its source
    printed once, the library c_build's (compiled once, kept by source)."""
    key = (statistics, dtype, VECTOR_BYTES)
    text = _values_sources.get(key)
    if text is None:
        text = _values_sources.setdefault(key, row_values.values_source(
            statistics, dtype, VECTOR_BYTES))
    function = getattr(c_build.load(text), row_values.FUNCTION)
    function.argtypes = KERNEL_ARGTYPES
    function.restype = None
    return function


def _statistics_launch(group: RowKernel, inputs) -> _Launch:
    """The log-sum-exp kernel's launch for inputs of these layouts (the matrix first,
    then the other inputs as the kernel takes them)."""
    function = _values_function(group.statistics, inputs[0].dtype)
    ints, doubles = row_values.ints_of(group.statistics, inputs), np.zeros(1)
    return _Launch(function, ctypes.cast(function, ctypes.c_void_p).value, ints, doubles,
                   (ints.ctypes.data, doubles.ctypes.data))


def _launch(group: RowKernel, x: np.ndarray) -> _Launch:
    library = _library(x.dtype)
    if group.pattern is RowPattern.SOFTMAX:
        function, doubles = library.ef_softmax_call, np.zeros(1)
    elif group.pattern is RowPattern.LAYERNORM:
        n1, _, n2, eps = group.constants
        function, doubles = library.ef_layernorm_call, np.array([n1, n2, eps])
    else:
        raise BackendError(f"no row kernel for {group.pattern}")
    rows, n = x.shape
    ints = np.array([rows, n, x.strides[0] // x.itemsize, n], dtype=np.int64)
    return _Launch(function, ctypes.cast(function, ctypes.c_void_p).value, ints, doubles,
                   (ints.ctypes.data, doubles.ctypes.data))


def _arrays(group: RowKernel, inputs: Sequence[np.ndarray], outs) -> Tuple[np.ndarray, ...]:
    """The kernel's buffers in its order: the inputs, then the members' outputs (the
    softmax's exponentials, never written, left out)."""
    if group.pattern is RowPattern.SOFTMAX:
        return (inputs[0], outs[0], outs[2], outs[3])
    return tuple(inputs) + tuple(outs)


def _call(group: RowKernel, launch: _Launch, arrays, threads: int) -> int:
    return launch(arrays, threads)


def _statistics_run(group: RowKernel, launch: _Launch, inputs, outs, threads: int) -> bool:
    """The log-sum-exp kernel: each row's maximum and sum of shifted exponentials, then
    the members' values from them (``inputs``: the matrix, then the other inputs as
    row_values.kernel_inputs gives them); False where a gathered index left its axis
    (what was written is not to be delivered)."""
    return not _call(group, launch, (inputs[0],) + tuple(outs) + tuple(inputs[1:]), threads)


def _statistics_inputs(group: RowKernel, arrays):
    """The matrix and the other inputs (``arrays``, in group.inputs' order) as the
    log-sum-exp kernel takes them."""
    return [arrays[0]] + row_values.kernel_inputs(
        group.statistics, dict(zip(group.inputs[1:], arrays[1:])), arrays[0].dtype)


def run(group: RowKernel, members, threads: int) -> Optional[dict]:
    """Run the group on the members' own buffers (their outputs are filled, except
    the never-written ones, as c_fused.run's callers expect): {} (no column sums), or
    None where a gathered index is out of bounds (nothing is delivered then: the
    statements run one by one and raise their own error)."""
    inputs = [row_input(members, group, k) for k in range(len(group.inputs))]
    outs = [m.buffers[-1] for m in members]
    if group.pattern is RowPattern.LOGSUMEXP:
        inputs = _statistics_inputs(group, inputs)
        done = _statistics_run(group, _statistics_launch(group, inputs), inputs, outs,
                               threads)
        return {} if done else None
    _call(group, _launch(group, inputs[0]), _arrays(group, inputs, outs), threads)
    return {}


def laid_out(array, layout, working) -> Optional[np.ndarray]:
    """``array`` as a prepared run takes it: itself where its (shape, dtype, strides) are
    ``layout``, else converted to the working dtype where that gives the layout; None
    where nothing does (the run then takes the full path)."""
    if type(array) is np.ndarray and (array.shape, array.dtype, array.strides) == layout:
        return array
    array = np.asarray(array).astype(working, copy=False)
    return array if (array.shape, array.dtype, array.strides) == layout else None


def prepared_runner(group: RowKernel, members, adaptive: bool, threads: int):
    """The group's run for repeated calls with the same layouts (as
    c_fused.prepared_runner's: False and nothing run where an input's layout differs
    from this call's)."""
    layouts = []
    for number in range(len(group.inputs)):
        array = row_input(members, group, number)
        layouts.append((group.inputs[number], (array.shape, array.dtype, array.strides)))
    working = members[0].call.dtypes.working
    never = NEVER_WRITTEN[group.pattern]
    shapes = tuple((k, tuple(m.buffers[-1].shape)) for k, m in enumerate(members)
                   if k not in never)
    bound = [row_input(members, group, k) for k in range(len(group.inputs))]
    statistics = group.pattern is RowPattern.LOGSUMEXP
    launch = _statistics_launch(group, _statistics_inputs(group, bound)) if statistics \
        else _launch(group, bound[0])

    def runner(env, keys) -> bool:
        inputs = []
        for key, layout in layouts:
            # (in its bound dtype: the working one, or an index array's integers)
            array = laid_out(env[key], layout, layout[1])
            if array is None:
                return False
            inputs.append(array)
        outs = [None] * len(members)
        for k, shape in shapes:
            outs[k] = np.empty(shape, working)
        count = (free_threads() or threads) if adaptive else threads
        if statistics:      # (the same layouts as the bound arrays': launch's ints)
            inputs = _statistics_inputs(group, inputs)
            if not _statistics_run(group, launch, inputs, outs, count):
                return False     # an index out of bounds: the full path names it
        else:
            _call(group, launch, _arrays(group, inputs, outs), count)
        for k, _ in shapes:
            if keys[k] is not None:
                env[keys[k]] = outs[k]
        return True
    runner.keep = launch
    # the same kernel call as runtime/torch_node.py runs it from C++ (the log-sum-exp
    # kernel's where its inputs need no conversion per call: int64 index arrays, values
    # in the working dtype; the matrix, the outputs, then the other inputs)
    by_key = dict(layouts)
    if statistics:
        order = (group.inputs[0],) + tuple(group.statistics.inputs)
        targets = [np.dtype(working)] + [
            np.dtype(np.int64) if key in group.statistics.index_keys else np.dtype(working)
            for key in group.statistics.inputs]
        plain = all(key in by_key and by_key[key][1] == target and
                    all(s % target.itemsize == 0 for s in by_key[key][2])
                    for key, target in zip(order, targets))
    runner.describe = None if (statistics and not plain) or (
        group.pattern is not RowPattern.SOFTMAX and never) else lambda: {
        "entry": launch.entry, "addresses": launch.addresses * 2, "adaptive": 1 if adaptive
        else 0, "threads": threads, "working": np.dtype(working),
        "inputs": tuple((key, by_key[key]) for key in order) if statistics else
        tuple(layouts), "shapes": shapes, "softmax": group.pattern is RowPattern.SOFTMAX,
        "statistics": statistics}
    return runner


def statement_runner(call, flagged: Type[Exception]):
    """``run(named)`` for a statement run alone that the schedule gave the log-sum-exp
    row kernel (schedule/library.py: Library.ROW_STATISTICS, from
    plan/row_statistics.statement_statistics: ``logsumexp[j](X[i,j])``, a cross-entropy
    as one statement), raising ``flagged`` where a gathered index leaves its axis (the
    full path then names it); None where this call needs more than the kernel takes
    (other extents than whole rows, a dtype it has no kernel for): the generic
    prepared kernel then.  A scalar statement summing such values over the rows (a
    mean cross-entropy) gets its sum from the kernel too."""
    statistics = statement_statistics(call.spec, call.options)
    working = np.dtype(call.dtypes.working)
    if statistics is None or working not in (np.float32, np.float64) or \
            call.dtypes.result != working or c_build.find_compiler() is None:
        return None
    shape = tuple(call.arrays.shapes[statistics.matrix])
    if len(shape) != 2 or 0 in shape:
        return None
    rows, n = shape
    ranges, outer = call.bounds.range_map, statistics.row
    if ranges[outer] != (0, rows) or \
            any(r != (0, n) for name, r in ranges.items() if name != outer):
        return None
    group = RowKernel(RowPattern.LOGSUMEXP, (statistics.matrix,) + statistics.inputs, (),
                      statistics)
    fixed = fixed_thread_count(call.options.threads, call.bounds.points)
    launches: Dict[Tuple, _Launch] = {}
    item = working.itemsize
    shape_out = (rows,) if statistics.total is None else ()     # (a sum over the rows)

    def run(named):
        x = np.asarray(named[statistics.matrix]).astype(working, copy=False)
        if x.strides[1] != item or x.strides[0] < 0 or x.strides[0] % item:
            x = np.ascontiguousarray(x)      # (rows the kernel cannot step through)
        inputs = _statistics_inputs(group, [x] + [named[key] for key in statistics.inputs])
        layout = tuple((a.shape, a.strides) for a in inputs)
        launch = launches.get(layout)
        if launch is None:
            launch = launches.setdefault(layout, _statistics_launch(group, inputs))
        out = np.empty(shape_out, working)
        if not _statistics_run(group, launch, inputs, [out], fixed or free_threads()):
            raise flagged("an index value out of bounds")
        return out
    return run
