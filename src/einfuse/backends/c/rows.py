"""Row kernels: a fusion group (schedule/fusion.py) that is exactly a softmax or a
layernorm over the rows of one matrix runs as a hand-written C kernel
(backends/c/rows_source.py) instead of the merged loop nests of plan/fuse.py.

The generic fused kernel is what GCC makes of each statement's loops: per-lane
partials kept in arrays on the stack, a sum's lanes combined one after another at the
end of every row, libmvec's ``expf`` called per vector (its arguments and the
accumulators spilled around the call).  The row kernels keep every accumulator in
registers, combine lanes pairwise and use an inline vector exponential, so a softmax
row is read once from memory, its exponentials written once and scaled in cache.

A group is recognised by its statements, each printed with canonical names (the row
index ``i``, the other index ``j``, the inputs ``X0 X1 ...`` by first use, member k's
output ``Tk``, numbers ``C``) and compared with the templates below; the hoisted form of
a one-statement softmax or layernorm gives the same members as the program.  The call
must read full rows (every index from 0 to the array's extent), of float32 or float64
arrays whose rows are unit-stride, with no padding; the member whose values are the
exponentials (softmax) must not be an output (it is never written whole).  Anything
else runs the generic fused kernel.

Results are the statements' up to rounding: the exponential is within one unit in
the last place of exp's (it is not libmvec's, so low-order bits may differ from the
statements run one by one), and row sums add lanes in another order.  NaN, inf and
-inf rows behave as the statements do: the maximum propagates NaN, ``exp(x - m)`` is
computed from the same maximum, a row sum that is 0, inf or NaN divides as written."""

from __future__ import annotations

import ctypes
import enum
import re
import threading
from dataclasses import dataclass
from typing import Dict, FrozenSet, Optional, Sequence, Tuple

import numpy as np

from ...errors import BackendError
from ...lang.printer import format_expr
from . import build as c_build, call as c_call
from .backend import _ARGTYPES, _VECTOR_BYTES
from .rows_source import source
from .threads import free_threads


class RowPattern(enum.Enum):
    SOFTMAX = "softmax"
    LAYERNORM = "layernorm"


# member k's statement, canonically named, for each pattern
_TEMPLATES: Dict[RowPattern, Tuple[str, ...]] = {
    RowPattern.SOFTMAX: ("T0[i] := max[j](X0[i, j])",
                         "T1[i, j] := exp(X0[i, j] - T0[i])",
                         "T2[i] := sum[j](T1[i, j])",
                         "T3[i, j] := T1[i, j] / T2[i]"),
    RowPattern.LAYERNORM: ("T0[i] := sum[j](X0[i, j]) / C",
                           "T1[i] := sum[j]((X0[i, j] - T0[i])**C) / C",
                           "T2[i, j] := (X0[i, j] - T0[i]) / sqrt(T1[i] + C) * X1[j] + X2[j]"),
}
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\S")
_NUMBER = re.compile(r"\d")
_TEMPLATE_TOKENS = {pattern: tuple(tuple(_TOKEN.findall(t)) for t in texts)
                    for pattern, texts in _TEMPLATES.items()}
# the numbers of a template (each written C there) that the kernel takes: softmax has
# none; layernorm's are the mean's divisor, the square, the variance's divisor and eps
_CONSTANTS_FIT = {RowPattern.SOFTMAX: lambda c: c == (),
                  RowPattern.LAYERNORM: lambda c: len(c) == 4 and c[1] == 2.0}
# the members whose values are written only where delivered (may stay unwritten)
_NEVER_WRITTEN = {RowPattern.SOFTMAX: frozenset({1}), RowPattern.LAYERNORM: frozenset()}


@dataclass(frozen=True)
class RowGroup:
    """A recognised group: its pattern, the input keys by canonical number (X0, X1 ...),
    and the group's numeric literals in order of appearance."""
    pattern: RowPattern
    inputs: Tuple[str, ...]
    constants: Tuple[float, ...]


def match(members, thread_rows: FrozenSet[int]) -> Optional[RowGroup]:
    """The row kernel that runs this group for this call, or None."""
    if not members or len(members) > 4 or any(m.column is not None for m in members):
        return None
    canonical = _canonical(members)
    if canonical is None:
        return None
    texts, inputs, constants = canonical
    pattern = next((p for p, t in _TEMPLATE_TOKENS.items() if t == texts), None)
    if pattern is None or not _NEVER_WRITTEN[pattern] <= thread_rows or \
            not _CONSTANTS_FIT[pattern](constants):
        return None
    group = RowGroup(pattern, inputs, constants)
    return group if _layouts_fit(group, members) else None


def _canonical(members):
    """(texts, input keys, numbers) of the members' statements with canonical names, or
    None where a member has parameters, index arrays or more than two indices."""
    inputs: Dict[str, str] = {}
    texts, constants = [], []
    for number, member in enumerate(members):
        spec = member.kernel.spec
        if spec.params or spec.assign != ":=" or member.call.options.pad is not None:
            return None
        others = [n for n in spec.all_indices if n != member.outer]
        if len(set(others)) > 1:
            return None
        indices = {member.outer: "i"}
        indices.update((n, "j") for n in others)
        tensors = {spec.output: f"T{number}"}
        for slot, (tensor, role) in enumerate(member.plan.slots[:-1]):
            if role != "value":
                return None
            if slot in member.reads:
                name = f"T{member.reads[slot][0]}"
            else:
                key = member.sources[slot] if slot < len(member.sources) else None
                if key is None:
                    return None
                name = inputs.setdefault(key, f"X{len(inputs)}")
            if tensors.setdefault(tensor, name) != name:
                return None
        text = f"{spec.output}[{', '.join(spec.output_indices)}] := {format_expr(spec.rhs)}"
        tokens = _TOKEN.findall(text)
        out = []
        for position, token in enumerate(tokens):
            following = tokens[position + 1] if position + 1 < len(tokens) else ""
            if token in tensors and following == "[":
                out.append(tensors[token])
            elif token in indices and following not in ("[", "("):
                out.append(indices[token])
            elif _NUMBER.match(token):
                constants.append(float(token))
                out.append("C")
            else:
                out.append(token)
        texts.append(tuple(out))
    return tuple(texts), tuple(inputs), tuple(constants)


def _layouts_fit(group: RowGroup, members) -> bool:
    """Whether the call reads whole, unit-stride rows of one float32/float64 matrix
    and, for layernorm, whole unit-stride vectors for the scale and shift."""
    working = members[0].call.dtypes.working
    if working not in (np.float32, np.float64) or any(
            m.call.dtypes.working != working or m.call.dtypes.result != working
            for m in members):
        return False
    x = _input(members, group, 0)
    if x is None or x.ndim != 2 or x.strides[1] != working.itemsize or \
            x.strides[0] % working.itemsize:
        return False
    rows, n = x.shape
    for member in members:
        out = member.buffers[-1]
        if out.shape not in ((rows,), (rows, n)) or not out.flags.c_contiguous:
            return False
        ranges = member.call.bounds.range_map
        if ranges[member.outer] != (0, rows) or \
                any(r != (0, n) for name, r in ranges.items() if name != member.outer):
            return False
    if group.pattern is RowPattern.LAYERNORM:
        for k in (1, 2):
            v = _input(members, group, k)
            if v is None or v.shape != (n,) or v.strides != (working.itemsize,):
                return False
    return True


def _input(members, group: RowGroup, number: int):
    """The array bound for input X<number> (the same array in every member that reads
    it), or None."""
    key = group.inputs[number] if number < len(group.inputs) else None
    found = None
    for member in members:
        for slot, source_key in enumerate(member.sources):
            if source_key == key and slot not in member.reads:
                array = member.buffers[slot]
                if found is not None and _layout(array) != _layout(found):
                    return None
                found = array
    return found


def _layout(array: np.ndarray):
    """What makes two bound arrays the same data: address, shape, strides, dtype."""
    return (array.__array_interface__["data"][0], array.shape, array.strides, array.dtype)


_lock = threading.Lock()
_libraries: Dict[np.dtype, ctypes.CDLL] = {}


def _library(dtype: np.dtype) -> ctypes.CDLL:
    """The row kernels for this element type, compiled once."""
    found = _libraries.get(dtype)
    if found is None:
        found = c_build.load(source(dtype, _VECTOR_BYTES))
        for name in ("ef_softmax_call", "ef_layernorm_call"):
            function = getattr(found, name)
            function.argtypes = _ARGTYPES
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

    def __call__(self, arrays: Tuple[np.ndarray, ...], threads: int) -> None:
        caller = c_call.caller()
        ints, doubles = self.addresses
        if caller is not None and len(arrays) <= c_call.MAX_BUFFERS:
            caller(self.entry, arrays, ints, doubles, ints, doubles, threads)
            return
        pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        self.function(pointers, ints, doubles, ints, doubles, threads,
                      ctypes.byref(ctypes.c_int32(0)))


def _launch(group: RowGroup, x: np.ndarray) -> _Launch:
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


def _arrays(group: RowGroup, inputs: Sequence[np.ndarray], outs) -> Tuple[np.ndarray, ...]:
    """The kernel's buffers in its order: the inputs, then the members' outputs (the
    softmax's exponentials, never written, left out)."""
    if group.pattern is RowPattern.SOFTMAX:
        return (inputs[0], outs[0], outs[2], outs[3])
    return tuple(inputs) + tuple(outs)


def _call(group: RowGroup, launch: _Launch, arrays, threads: int) -> None:
    launch(arrays, threads)


def run(group: RowGroup, members, threads: int) -> None:
    """Run the group on the members' own buffers (their outputs are filled, except
    the never-written ones, as c_fused.run's callers expect)."""
    inputs = [_input(members, group, k) for k in range(len(group.inputs))]
    arrays = _arrays(group, inputs, [m.buffers[-1] for m in members])
    _call(group, _launch(group, inputs[0]), arrays, threads)


def laid_out(array, layout, working) -> Optional[np.ndarray]:
    """``array`` as a prepared run takes it: itself where its (shape, dtype, strides) are
    ``layout``, else converted to the working dtype where that gives the layout; None
    where nothing does (the run then takes the full path)."""
    if type(array) is np.ndarray and (array.shape, array.dtype, array.strides) == layout:
        return array
    array = np.asarray(array).astype(working, copy=False)
    return array if (array.shape, array.dtype, array.strides) == layout else None


def prepared_runner(group: RowGroup, members, adaptive: bool, threads: int):
    """The group's run for repeated calls with the same layouts (as
    c_fused.prepared_runner's: False and nothing run where an input's layout differs
    from this call's)."""
    layouts = []
    for number in range(len(group.inputs)):
        array = _input(members, group, number)
        layouts.append((group.inputs[number], (array.shape, array.dtype, array.strides)))
    working = members[0].call.dtypes.working
    never = _NEVER_WRITTEN[group.pattern]
    shapes = tuple((k, tuple(m.buffers[-1].shape)) for k, m in enumerate(members)
                   if k not in never)
    launch = _launch(group, _input(members, group, 0))

    def runner(env, keys) -> bool:
        inputs = []
        for key, layout in layouts:
            array = laid_out(env[key], layout, working)
            if array is None:
                return False
            inputs.append(array)
        outs = [None] * len(members)
        for k, shape in shapes:
            outs[k] = np.empty(shape, working)
        _call(group, launch, _arrays(group, inputs, outs),
              (free_threads() or threads) if adaptive else threads)
        for k, _ in shapes:
            if keys[k] is not None:
                env[keys[k]] = outs[k]
        return True
    runner.keep = launch
    return runner
