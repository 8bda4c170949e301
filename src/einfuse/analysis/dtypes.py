"""Result and working dtypes, by NumPy's promotion rules.

* value tensors and scalar parameters promote as in NumPy 2 (Python scalars are
  'weak': ``float32 * 2.0`` stays float32);
* bool tensors promote as in NumPy (bool with float32 is float32, with int8 int8);
  bools alone, used in arithmetic, count as int64;
* integer inputs meeting a float-producing operation (``/``, ``exp``, a float
  literal ...) give float64, as NumPy's ufuncs do;
* float16/bfloat16 are computed in float32 and stored in their own dtype;
* a right side that only moves bool values -- a read, ``max``/``min`` (reductions and
  functions), ``where``'s branches -- of bool tensors alone gives bool, as NumPy's
  transpose, ``max`` and ``where`` keep bool (computed in uint8: an empty max is
  False, an empty min True);
* a right side that is a comparison or ``&``/``|`` gives bool, one that is an
  ``argmax``/``argmin`` int64 positions (the working dtype is still the values': an
  argmax inside arithmetic gives its position in the working dtype);
* a statement with a ``sum`` or ``prod`` (written or implicit) that would compute in
  an integer dtype narrower than 64 bits computes and returns in a 64-bit one, as
  ``a.sum()`` accumulates: int64 for signed inputs (and bools); for unsigned ones
  uint64 on NumPy (and JAX), int64 on torch, as ``torch.sum`` does;
* ``dtype=`` overrides the result; a float ``dtype=`` is also the working dtype;
* ``=``/``+=`` store the result into the caller's array by NumPy's ``same_kind``
  rule unless ``dtype=`` is given.
"""

from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..errors import EinfuseTypeError
from ..lang.ast import Access, Binary, Call, Number, Param, Reduce, reductions
from .compared import agrees, comparisons_of, compared_only
from .options import Options
from .spec import Spec

# sign, abs, relu, min, max, where, pow and the operators + - * // % ** keep an integer
# dtype integer, as NumPy's ufuncs do
FLOAT_FUNCTIONS = frozenset({"exp", "log", "log1p", "expm1", "sqrt", "sin", "cos", "tanh",
                             "sigmoid", "softplus", "erf", "floor", "ceil", "tan", "atan2"})


@dataclass(frozen=True)
class DTypes:
    working: np.dtype   # what the arithmetic runs in
    result: np.dtype    # what is returned / stored


def _float_producing(spec: Spec, params: Mapping[str, object]) -> bool:
    for node in spec.rhs.walk():
        if isinstance(node, Binary) and node.op == "/":
            return True
        if isinstance(node, Call) and node.func in FLOAT_FUNCTIONS:
            return True
        if isinstance(node, Reduce) and node.op == "logsumexp":
            return True
        if isinstance(node, Number) and isinstance(node.value, float):
            return True
        if isinstance(node, Param) and isinstance(params.get(node.name), float):
            return True
    return False


@functools.lru_cache(maxsize=1024)
def accumulates(spec: Spec) -> bool:
    """Whether the statement sums or multiplies over an index (``sum``, ``prod``, or an
    implicit sum): the reductions whose value grows with the range, which NumPy and
    torch accumulate in a 64-bit integer for narrower integer inputs."""
    return any(node.op in ("sum", "prod") for node in reductions(spec.rhs))


def widened(dtype: np.dtype, framework: str) -> np.dtype:
    """The dtype a sum of ``dtype`` values accumulates in: NumPy's ``add.reduce`` rule
    (signed and bool to int64, unsigned to uint64), torch's ``sum`` rule (every integer
    to int64) for ``framework`` "torch"; other dtypes are their own."""
    if dtype.kind == "b" or (dtype.kind in "iu" and dtype.itemsize < 8):
        unsigned = dtype.kind == "u" and framework != "torch"
        return np.dtype(np.uint64 if unsigned else np.int64)
    return dtype


def _moves_bools(expr) -> bool:
    """Whether ``expr`` only selects among the values it reads (no arithmetic, no
    number of its own): a read, max/min, where's branches (its condition may be
    anything)."""
    if isinstance(expr, Access):
        return True
    if isinstance(expr, Reduce):
        return expr.op in ("max", "min") and _moves_bools(expr.body)
    if isinstance(expr, Call):
        if expr.func in ("max", "min"):
            return all(_moves_bools(a) for a in expr.args)
        if expr.func == "where":
            return _moves_bools(expr.args[1]) and _moves_bools(expr.args[2])
    return False


def check_value_dtype(name: str, dtype: np.dtype, source: str, span) -> None:
    if dtype.kind not in "biuf":
        raise EinfuseTypeError(f"{name} has dtype {dtype}; einfuse takes bool, integer and "
                               "float arrays", source=source, span=span)
    if dtype.kind == "f" and dtype.itemsize > 8:
        # (no compiled backend has a long double; the reference alone would take it)
        raise EinfuseTypeError(f"{name} has dtype {dtype}; einfuse computes in float16, "
                               "float32 and float64 (bfloat16 on torch): pass it as float64",
                               source=source, span=span)


def check_index_dtype(name: str, dtype: np.dtype, source: str, span) -> None:
    if dtype.kind not in "iu":
        raise EinfuseTypeError(f"{name} is used as an index array (a gather) but has dtype "
                               f"{dtype}; index arrays must have an integer dtype "
                               "(signed or unsigned, any width)",
                               source=source, span=span)


def resolve_dtypes(spec: Spec, value_dtypes: Mapping[str, np.dtype],
                   params: Mapping[str, object], options: Options,
                   framework: str = "numpy", ranges=None) -> DTypes:
    """The working and result dtypes of a call (``framework``: the callers' arrays',
    a name of analysis.frameworks; it decides how an unsigned sum widens; ``ranges``:
    each index's (low, high), which decides whether a comparison is exact in a dtype).

    An array read only to be compared (analysis/compared.py) does not promote, as in
    NumPy: ``where(j == y[i], x[i,j], 0)`` with int64 ``y`` and float32 ``x`` is float32.
    The working dtype is then the first of the result's own and float64 in which every
    such comparison gives NumPy's answer; where neither does (or ``dtype=`` is given,
    which sets the working dtype itself), the arrays promote as before."""
    values = tuple(t.name for t in spec.tensors if t.as_value)
    before = _resolve(spec, value_dtypes, params, options, framework, values)
    quiet = compared_only(spec)
    if not quiet or options.dtype is not None:
        return before
    found = _resolve(spec, value_dtypes, params, options, framework,
                     tuple(n for n in values if n not in quiet))
    if found == before:
        return before
    comparisons = comparisons_of(spec, quiet)
    candidates = [found.working]
    if found.working.kind == "f" and found.working != np.float64:
        candidates.append(np.dtype(np.float64))
    for working in candidates:
        if all(agrees(c, working, value_dtypes, params, ranges) for c in comparisons):
            return DTypes(working=working, result=found.result)
    return before


def _resolve(spec: Spec, value_dtypes: Mapping[str, np.dtype],
             params: Mapping[str, object], options: Options, framework: str,
             promoting) -> DTypes:
    """The dtypes with the arrays ``promoting`` (names) promoting the statement."""
    operands = []
    for name in promoting:   # (bool as NumPy promotes it: it never widens another dtype)
        operands.append(np.dtype(value_dtypes[name]))
    for name in spec.params:
        value = params[name]
        if isinstance(value, bool):
            operands.append(1)
        elif isinstance(value, (int, float)):
            operands.append(value)  # weak, as in NumPy 2
        else:
            dtype = np.asarray(value).dtype
            operands.append(np.dtype(np.int64) if dtype.kind == "b" else dtype)
    promoted = np.result_type(*operands) if operands else np.dtype(np.int64)
    if promoted.kind == "b":    # bools alone, in arithmetic: counted as int64
        promoted = np.dtype(np.int64)
    if promoted.kind in "biu" and (not operands or all(isinstance(o, numbers.Number)
                                                        for o in operands)):
        promoted = np.dtype(np.int64) if promoted.kind != "f" else promoted
    if promoted.kind in "biu" and _float_producing(spec, params):
        promoted = np.dtype(np.float64)
    if all(isinstance(o, numbers.Number) for o in operands) and any(
            isinstance(o, float) for o in operands):
        promoted = np.dtype(np.float64)
    if promoted.kind in "iu" and accumulates(spec):   # (bools alone are int64 already)
        promoted = widened(promoted, framework)
    stored = promoted
    working = np.dtype(np.float32) if promoted.itemsize < 4 and promoted.kind == "f" \
        else promoted
    if options.dtype is not None:
        stored = np.dtype(options.dtype)
        if stored.kind == "f":
            working = np.dtype(np.float32) if stored.itemsize < 4 else stored
    elif spec.result_is_bool:
        stored = np.dtype(bool)
    elif not spec.params and promoting and all(
            np.dtype(value_dtypes[name]).kind == "b" for name in promoting) and \
            _moves_bools(spec.rhs):
        # computed in uint8, whose max/min identities (0, 255) are bool's (False,
        # True): an empty max is False, an empty min True, as any() and all() are
        working, stored = np.dtype(np.uint8), np.dtype(bool)
    elif spec.result_is_position:
        stored = np.dtype(np.int64)
    return DTypes(working=np.dtype(working), result=np.dtype(stored))


def check_output_cast(output: str, result: np.dtype, target: np.dtype, options: Options,
                      span) -> None:
    """'='/'+=' store the result by NumPy's 'same_kind' rule, what ``np.copyto`` and
    ``out += ...`` allow: float64 into float32 or int64 into int32 is a narrowing the
    caller chose with the array, but float into an integer array (or a number into a
    bool one) would silently truncate every element.  ``dtype=`` is the caller asking
    for that cast, so it is then allowed."""
    result, target = np.dtype(result), np.dtype(target)
    if options.dtype is not None or np.can_cast(result, target, "same_kind"):
        return
    raise EinfuseTypeError(f"the result has dtype {result} but the output {output} has "
                           f"dtype {target}, and {result} does not cast to {target} by "
                           "NumPy's 'same_kind' rule (it would change values silently); pass "
                           f"an output of dtype {result}, or dtype={target.name!r} to cast "
                           "explicitly", span=span)
