"""Arrays read only to be compared, and the working dtypes their comparisons are exact in.

NumPy evaluates ``np.where(y[:, None] == np.arange(n), x, 0)`` and ``x * (y[:, None] ==
np.arange(n))`` in float32 for float32 ``x`` and int64 ``y``: ``y`` meets only the
comparison, whose result is bool, so its dtype never reaches the arithmetic.  The
notation's "NumPy promotion of the inputs" is read the same way (docs/notation.md
section 10): an array whose every value read is an operand of a comparison whose two
operands are *leaves* -- an array read, an index, a number or a parameter -- does not
promote the statement.  (A comparison with an arithmetic operand, ``y[i] + 1 == j``, still
promotes its arrays: the dtype NumPy gives that operand would need the sub-expression's
own promotion, which the kernels do not compute.)

Every backend compares two values after converting both to the working dtype (the C
and Triton kernels, the NumPy reference, the row kernels).  NumPy compares them in
their common type C = ``np.result_type(left, right)`` (an int64 label against an index
as integers, a float32 logit against an int64 label in float64).  :func:`agrees` says
when the first gives the second's answer for every value the operands can take:

* the working dtype is C itself; or
* both operands are exact in the working dtype and in C (an int16 label, an index
  whose range fits the mantissa, a number that rounds to itself): both then compare
  the true values; or
* one operand is exact in both with magnitude below 2**p of each float type (p = 24
  for float32, 53 for float64) and the other holds integers (any width): rounding an
  integer to a float is monotonic and keeps a value past 2**p past it, so a label of
  2**24 + 1 rounded to 2**24 in float32 still differs from every index below 2**24
  (an index of 2**24 itself is not "below", and the statement then computes in
  float64, where it is).

Where no candidate working dtype agrees, analysis/dtypes.py keeps the rule this one
refines (the array promotes, as it did before).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import FrozenSet, Mapping, Optional, Tuple

import numpy as np

from ..lang.ast import COMPARISON_OPS, Access, Binary, Expr, IndexValue, Number, Param
from .spec import Spec

_LEAVES = (Access, IndexValue, Number, Param)
# the bits of an integer a float type holds exactly (its significand, with the implicit 1)
_MANTISSA = {2: 11, 4: 24, 8: 53}


def _leaf_comparison(node) -> bool:
    return isinstance(node, Binary) and node.op in COMPARISON_OPS and \
        isinstance(node.left, _LEAVES) and isinstance(node.right, _LEAVES)


@functools.lru_cache(maxsize=1024)
def compared_only(spec: Spec) -> FrozenSet[str]:
    """The arrays whose every value read is an operand of a leaf comparison (their
    dtypes do not promote the statement); an array also read as an index (a gather)
    may be one, as the subscript does not promote either."""
    compared, elsewhere = set(), set()

    def visit(node: Expr, under_comparison: bool) -> None:
        if isinstance(node, Access):
            # (its subscripts' gathers are index reads, which never promote: not walked)
            (compared if under_comparison else elsewhere).add(node.tensor)
            return
        leaf = _leaf_comparison(node)
        for child in node.children():
            visit(child, leaf)

    visit(spec.rhs, False)
    values = {t.name for t in spec.tensors if t.as_value}
    return frozenset((compared - elsewhere) & values)


@functools.lru_cache(maxsize=1024)
def comparisons_of(spec: Spec, names: FrozenSet[str]) -> Tuple[Binary, ...]:
    """The leaf comparisons that read one of ``names`` (each once)."""
    found = []
    for node in spec.rhs.walk():
        if _leaf_comparison(node) and node not in found and any(
                isinstance(side, Access) and side.tensor in names
                for side in (node.left, node.right)):
            found.append(node)
    return tuple(found)


@dataclass(frozen=True)
class _Operand:
    """What one side of a comparison can hold: its dtype as NumPy would see it (a
    Python number is 'weak'), whether its values are integers, and the largest
    magnitude it can take where that is known (an index's range, an integer dtype's, a
    number's own value).  ``kind``: "array" (an array read, a NumPy scalar: its dtype),
    "index", "number" (a literal: its value) or "scalar" (a Python int or float
    parameter, whose value is a kernel argument and decides nothing here: only its
    type counts, as the fast path's call signature holds no parameter's value)."""
    kind: str
    numpy_type: object
    integers: bool
    magnitude: Optional[float]       # None: not known
    value: object = None             # a literal's own value


def _dtype_magnitude(dtype: np.dtype) -> Optional[float]:
    if dtype.kind == "b":
        return 1
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return max(-int(info.min), int(info.max))
    return None


def _operand(side, value_dtypes, params, ranges) -> _Operand:
    if isinstance(side, IndexValue):
        lo, hi = (ranges or {}).get(side.name, (None, None))
        magnitude = None if lo is None else 0 if hi <= lo else max(abs(lo), abs(hi - 1))
        return _Operand("index", np.dtype(np.int64), True, magnitude)
    if isinstance(side, Number):
        value = int(side.value) if isinstance(side.value, bool) else side.value
        integers = isinstance(value, int) or (math.isfinite(value) and value == int(value))
        return _Operand("number", value, integers,
                        abs(value) if math.isfinite(value) else None, value)
    if isinstance(side, Param):
        value = params[side.name]
        if isinstance(value, (bool, int, float)):
            weak = 0.0 if isinstance(value, float) else 0     # (its type, weak)
            return _Operand("scalar", weak, not isinstance(value, float), None)
        dtype = np.asarray(value).dtype
    else:
        dtype = np.dtype(value_dtypes[side.tensor])
    return _Operand("array", dtype, dtype.kind in "biu", _dtype_magnitude(dtype))


def _exact_in(operand: _Operand, target: np.dtype) -> bool:
    """Whether every value ``operand`` can take converts to ``target`` unchanged."""
    if operand.kind == "number":
        value = operand.value
        if isinstance(value, float) and not math.isfinite(value):
            return target.kind == "f"          # (NaN compares false, inf as itself)
        if target.kind == "f":
            try:
                return float(target.type(value)) == value
            except OverflowError:              # (an int past the float's range)
                return False
        # NumPy compares a Python int with an integer array exactly, in range or not
        return isinstance(value, int)
    if operand.kind == "scalar":
        # a Python int compares exactly with integers; a float is a float64
        return target.kind in "iu" if operand.integers else target == np.float64
    if operand.kind == "index":
        if operand.magnitude is None:
            return target == np.int64
        if target.kind == "f":
            return operand.magnitude <= 2 ** _MANTISSA[target.itemsize]
        info = np.iinfo(target)
        return operand.magnitude <= info.max and (target.kind == "i" or
                                                  operand.magnitude == 0)
    dtype = operand.numpy_type
    if dtype.kind == "b":
        return True
    if dtype.kind == "f":
        return target.kind == "f" and dtype.itemsize <= target.itemsize
    if target.kind == "f":                    # an integer dtype in a float one
        bits = dtype.itemsize * 8 - (dtype.kind == "i")
        return bits <= _MANTISSA[target.itemsize]
    return target.kind in "iu" and np.can_cast(dtype, target, "safe")


def _below_mantissa(operand: _Operand, target: np.dtype) -> bool:
    """Whether ``operand``'s magnitude is strictly below 2**p of float ``target`` (an
    integer dtype: no bound needed, it holds the integers exactly)."""
    if target.kind != "f":
        return True
    return operand.magnitude is not None and \
        operand.magnitude < 2 ** _MANTISSA[target.itemsize]


def agrees(comparison: Binary, working: np.dtype, value_dtypes: Mapping[str, np.dtype],
           params: Mapping[str, object], ranges) -> bool:
    """Whether ``comparison``, both operands converted to ``working``, gives NumPy's
    answer (its operands compared in their common type) for every value they can take;
    ``ranges``: each index's (low, high) range, or None where they are not known."""
    working = np.dtype(working)
    left, right = (_operand(side, value_dtypes, params, ranges)
                   for side in (comparison.left, comparison.right))
    try:
        common = np.dtype(np.result_type(left.numpy_type, right.numpy_type))
    except (TypeError, ValueError, OverflowError):
        return False
    if common == working:
        return True
    if _exact_in(left, working) and _exact_in(left, common) and \
            _exact_in(right, working) and _exact_in(right, common):
        return True
    if working.kind != "f" or common.kind not in "fiu":
        return False
    for small, other in ((left, right), (right, left)):
        if other.integers and other.kind != "number" and _exact_in(small, working) and \
                _exact_in(small, common) and _below_mantissa(small, working) and \
                _below_mantissa(small, common):
            return True
    return False
