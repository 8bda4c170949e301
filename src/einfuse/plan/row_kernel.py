"""Which hand-written row kernel (backends/c/rows.py, rows_source.py), if any, runs a C
fusion group (schedule/fusion.py) for one call: a group that is exactly a softmax or a
layernorm over the rows of one matrix, or one whose members are each a value per row
computed from the row statistics of a log-sum-exp (plan/row_statistics.py: the row
maximum, the sum of shifted exponentials; a log-sum-exp, a cross-entropy).  A fact of the group's statements and of the
call's layouts, decided with the group (the schedule records it); the C backend runs
what it is handed.

A group is recognised by its statements, each printed with canonical names (the row
index ``i``, the other index ``j``, the inputs ``X0 X1 ...`` by first use, member k's
output ``Tk``, numbers ``C``) and compared with the templates below; the hoisted form of
a one-statement softmax or layernorm gives the same members as the program.  The call
must read full rows (every index from 0 to the array's extent), of float32 or float64
arrays whose rows are unit-stride, with no padding; the member whose values are the
exponentials (softmax) must not be an output (it is never written whole).  Anything
else runs the generic fused kernel.

``members`` are the group's bound members (schedule/fusion.Member: kernel, call, plan,
buffers, outer, reads, sources)."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Dict, FrozenSet, Optional, Tuple

import numpy as np

from ..lang.printer import format_expr
from ..lang.sugar import counted
from .row_statistics import RowStatistics, row_statistics


class RowPattern(enum.Enum):
    SOFTMAX = "softmax"
    LAYERNORM = "layernorm"
    LOGSUMEXP = "logsumexp"     # row statistics, then each member's value per row


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
NEVER_WRITTEN = {RowPattern.SOFTMAX: frozenset({1}), RowPattern.LAYERNORM: frozenset(),
                 RowPattern.LOGSUMEXP: frozenset()}


@dataclass(frozen=True)
class RowKernel:
    """A recognised group: its pattern, the input keys by canonical number (X0, X1 ...),
    and the group's numeric literals in order of appearance; for LOGSUMEXP, the matrix
    is input 0 and ``statistics`` says what each member computes from its rows."""
    pattern: RowPattern
    inputs: Tuple[str, ...]
    constants: Tuple[float, ...]
    statistics: Optional[RowStatistics] = None


def match(members, thread_rows: FrozenSet[int]) -> Optional[RowKernel]:
    """The row kernel that runs this group for this call, or None."""
    if not members or any(m.column is not None for m in members):
        return None
    found = _template(members, thread_rows) if len(members) <= 4 else None
    if found is not None:
        return found
    statistics = row_statistics(members)
    if statistics is None:
        return None
    group = RowKernel(RowPattern.LOGSUMEXP, (statistics.matrix,) + statistics.inputs, (),
                      statistics)
    return group if _layouts_fit(group, members) else None


def _template(members, thread_rows: FrozenSet[int]) -> Optional[RowKernel]:
    """The softmax or layernorm kernel, where the group is one of them."""
    canonical = _canonical(members)
    if canonical is None:
        return None
    texts, inputs, constants = canonical
    pattern = next((p for p, t in _TEMPLATE_TOKENS.items() if t == texts), None)
    if pattern is None or not NEVER_WRITTEN[pattern] <= thread_rows or \
            not _CONSTANTS_FIT[pattern](constants):
        return None
    group = RowKernel(pattern, inputs, constants)
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
        # a count (``mean``'s divisor) is the number of points of this call's ranges:
        # read as that number, ``sum[j](X[i,j]) / sum[j](where(X[i,j] == X[i,j], 1, 1))``
        # is the mean the template writes as ``sum[j](X[i,j]) / C``
        rhs = counted(spec.rhs, member.call.bounds.range_map)
        text = f"{spec.output}[{', '.join(spec.output_indices)}] := {format_expr(rhs)}"
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


def _layouts_fit(group: RowKernel, members) -> bool:
    """Whether the call reads whole, unit-stride rows of one float32/float64 matrix
    and, for layernorm, whole unit-stride vectors for the scale and shift."""
    working = members[0].call.dtypes.working
    if working not in (np.float32, np.float64) or any(
            m.call.dtypes.working != working or m.call.dtypes.result != working
            for m in members):
        return False
    x = row_input(members, group, 0)
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
            v = row_input(members, group, k)
            if v is None or v.shape != (n,) or v.strides != (working.itemsize,):
                return False
    return True


def row_input(members, group: RowKernel, number: int):
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
