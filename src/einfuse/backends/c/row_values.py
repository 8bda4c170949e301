"""The per-row values of the log-sum-exp row kernel (plan/row_statistics.py decides
them): once the C kernel has each row's maximum M and sum of shifted exponentials S
(rows_source.ef_lse_rows), every member of the group is a value per row, computed
here over whole vectors of rows with NumPy -- a handful of operations on ``rows``
elements, against the kernel's ``rows x n``.

The gathers (a label's logit ``X[i, t[i]]``) are taken first, before the kernel runs,
and an index outside its axis makes the run decline (:func:`gathered` gives None): the
statements then run one by one and raise their own error, so nothing is delivered.
Every value is computed in the group's working dtype (numbers as scalars of it), so
that each operation rounds as the statement's does; the functions are NumPy's, which
give the C library's values up to rounding."""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np

from ...plan.row_statistics import (Apply, Const, MemberValue, Read, RowStatistics, Stat,
                                    Subscript)

_FUNCTIONS = {"exp": np.exp, "log": np.log, "log1p": np.log1p, "expm1": np.expm1,
              "sqrt": np.sqrt, "abs": np.abs, "tanh": np.tanh, "neg": np.negative,
              "square": lambda a: a * a}
_BINARY = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide,
           "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
           "==": np.equal, "!=": np.not_equal, "&": np.logical_and, "|": np.logical_or}


def gathered(statistics: RowStatistics, arrays: Dict[str, np.ndarray], rows: int
             ) -> Optional[Dict[Read, np.ndarray]]:
    """Each read of the members' values, row by row (``arrays``: the inputs by key);
    None where a subscript leaves its axis."""
    found: Dict[Read, np.ndarray] = {}
    counter = np.arange(rows)
    for value in statistics.values:
        for read in _reads(value):
            if read not in found:
                taken = _take(read, arrays, counter, found)
                if taken is None:
                    return None
                found[read] = taken
    return found


def _reads(value):
    """The reads of a value's tree, outermost first."""
    if isinstance(value, Read):
        yield value
    elif isinstance(value, Apply):
        for arg in value.args:
            yield from _reads(arg)


def _take(read: Read, arrays, counter: np.ndarray, found) -> Optional[np.ndarray]:
    array = arrays[read.key]
    if array.ndim != len(read.subscripts):
        return None
    if read.subscripts == (Subscript(0, 1),) and array.shape[0] >= len(counter):
        return array[:len(counter)]
    where = []
    for axis, subscript in enumerate(read.subscripts):
        position = subscript.constant + subscript.row * counter
        for index, coefficient in subscript.gathers:
            values = found.get(index)
            if values is None:
                values = _take(index, arrays, counter, found)
                if values is None or values.dtype.kind not in "iub":
                    return None
                found[index] = values
            position = position + coefficient * values.astype(np.int64, copy=False)
        if len(counter) and (position.min() < 0 or position.max() >= array.shape[axis]):
            return None
        where.append(position)
    return array[tuple(where)]


def evaluate(statistics: RowStatistics, reads: Dict[Read, np.ndarray], maxima: np.ndarray,
             sums: np.ndarray, outs: Sequence[np.ndarray]) -> None:
    """Each member's value into its output (``outs``, in the members' order)."""
    working = maxima.dtype
    stats: Dict[str, np.ndarray] = {"max": maxima, "sum": sums}
    with np.errstate(all="ignore"):
        # a log-sum-exp is the maximum itself where that is not finite (the running
        # maximum's value: -inf for a row of -inf, inf, NaN)
        stats["logsumexp"] = np.where(np.isfinite(maxima), maxima + np.log(sums), maxima)

        def value(node):
            if isinstance(node, Const):
                return working.type(node.value)
            if isinstance(node, Stat):
                return stats[node.name]
            if isinstance(node, MemberValue):
                return outs[node.number]
            if isinstance(node, Read):
                taken = reads[node]
                return taken if taken.dtype == working else taken.astype(working)
            args = [value(a) for a in node.args]
            if node.op == "where":
                return np.where(*args)
            if node.op in _BINARY:
                return _BINARY[node.op](*args)
            return _FUNCTIONS[node.op](*args)

        for number, node in enumerate(statistics.values):
            np.copyto(outs[number], value(node), casting="unsafe")
