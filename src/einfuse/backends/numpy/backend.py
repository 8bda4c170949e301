"""The NumPy reference executor: exact semantics, bounded memory.

Every index owns one axis of a conceptual grid (output indices first, then
reduced indices).  An expression evaluates to an array that broadcasts against
the grid, holding size-1 axes for indices it does not depend on.  The output is
computed block by block and every reduction walks its own indices in chunks, so
no intermediate exceeds ``memory_limit`` bytes (default 256 MB) however large
the broadcast would be: ``D[i,j] := (w[k,i]-x[k,j])**2`` with K=784 and
N=M=4096 never holds more than one budget-sized slab.
"""

from __future__ import annotations

import itertools
import math
from typing import Dict, List, Mapping, Tuple

import numpy as np

from ...analysis.dtypes import DTypes
from ...analysis.options import Options
from ...analysis.ranges import Bounds, no_position
from ...analysis.spec import Spec
from ...errors import OutOfBoundsError
from ...lang.ast import (Access, Binary, Call, Expr, IndexExpr, IndexValue, Number, Param, Reduce,
                         Unary)
from ...plan.gathers import INT64_MAX, check_gather_arithmetic
from . import positions as positions

# Upper bound on how many grid-sized temporaries one expression keeps alive at once;
# the element budget is the byte budget divided by this and by 8 bytes per element.
_LIVE_TEMPORARIES = 8


def _erf(x):
    try:
        from scipy.special import erf
        return erf(x)
    except ImportError:  # scipy is optional; math.erf is exact but slow
        return np.vectorize(math.erf, otypes=[np.asarray(x).dtype])(x)


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


_UNARY = {
    "exp": np.exp, "log": np.log, "log1p": np.log1p, "expm1": np.expm1, "sqrt": np.sqrt,
    "abs": np.abs, "sin": np.sin, "cos": np.cos, "tanh": np.tanh, "sigmoid": _sigmoid,
    "relu": lambda x: np.maximum(x, 0), "softplus": lambda x: np.logaddexp(0, x),
    "erf": _erf, "floor": np.floor, "ceil": np.ceil, "sign": np.sign, "tan": np.tan,
}


def _power(base, exponent):
    """np.power element by element, which is C's pow; but NumPy takes a shortcut for an
    exponent that is one value for a whole loop (0.5 becomes sqrt: -inf ** 0.5 is nan and
    -0.0 ** 0.5 is -0.0, where pow gives inf and 0.0), so such an exponent is spread out
    first: every backend computes pow."""
    exponent = np.asarray(exponent)
    if exponent.dtype.kind == "f" and np.any(exponent == 0.5):
        exponent = np.array(np.broadcast_to(exponent, np.broadcast_shapes(
            np.shape(base), exponent.shape)))
    return np.power(base, exponent)


_BINARY = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide, "**": _power,
    # Python's // and %; an integer division by zero gives 0, as NumPy (with a warning)
    "//": np.floor_divide, "%": np.mod,
    "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
    "==": np.equal, "!=": np.not_equal,
}
_EMPTY = {"sum": 0.0, "prod": 1.0, "max": -np.inf, "min": np.inf, "logsumexp": -np.inf}


class NumpyExecutor:
    def __init__(self, spec: Spec, bounds: Bounds, arrays: Mapping[str, np.ndarray],
                 params: Mapping[str, object], dtypes: DTypes, options: Options):
        self.spec = spec
        self.ranges = bounds.range_map
        self.arrays = arrays
        self.params = params
        self.working = dtypes.working
        self.options = options
        self.axis = {name: pos for pos, name in enumerate(spec.all_indices)}
        self.ndim = len(spec.all_indices)
        self.budget = max(1, options.memory_limit // (8 * _LIVE_TEMPORARIES))
        self.values: Dict[str, np.ndarray] = {}  # filled by run(): describe() reads no data
        self.output_offsets = {name: self.ranges[name][0] for name in spec.output_indices}

    @classmethod
    def for_call(cls, call) -> "NumpyExecutor":
        """The executor for a bound call (analysis.binding.BoundCall)."""
        executor = cls(call.spec, call.bounds, call.arrays, call.params, call.dtypes,
                       call.options)
        executor.bound = call   # run() applies the per-call gather checks
        return executor

    def cast(self, array: np.ndarray) -> np.ndarray:
        return array.astype(self.working, copy=False)

    # -- driver ------------------------------------------------------------------------
    def run(self) -> np.ndarray:
        if getattr(self, "bound", None) is not None:
            # the limits of the kernels' exact gather arithmetic apply here too, so that
            # every backend accepts and refuses the same calls
            check_gather_arithmetic(self.bound)
        self.values = {name: self.cast(arr) for name, arr in self.arrays.items()
                       if self.spec.tensor(name).as_value}
        out_indices = self.spec.output_indices
        shape = tuple(max(0, self.ranges[n][1] - self.ranges[n][0]) for n in out_indices)
        result = np.empty(shape, dtype=np.int64 if self.spec.result_is_position
                          else self.working)
        if result.size == 0:
            return result
        blocks = self.split(out_indices, self.budget)
        for block in itertools.product(*blocks):
            ctx = dict(zip(out_indices, block))
            value = self.eval(self.spec.rhs, ctx)
            target = tuple(slice(lo - self.ranges[n][0], hi - self.ranges[n][0])
                           for n, (lo, hi) in ctx.items())
            value = np.broadcast_to(value, self.shape_of(ctx, out_indices))
            result[target] = value.reshape(result[target].shape)
        return result

    def split(self, names, budget: int, outer: int = 1) -> List[List[Tuple[int, int]]]:
        """Chunk each index's range so that outer * prod(chunk sizes) <= budget,
        giving the innermost (last) index the largest chunks."""
        allowed = max(1, budget // max(1, outer))
        chunks: List[int] = []
        for name in reversed(names):
            lo, hi = self.ranges[name]
            size = min(max(1, hi - lo), allowed)
            chunks.append(size)
            allowed = max(1, allowed // size)
        chunks.reverse()
        result = []
        for name, size in zip(names, chunks):
            lo, hi = self.ranges[name]
            result.append([(start, min(start + size, hi)) for start in range(lo, hi, size)])
        return result

    def shape_of(self, ctx: Dict[str, Tuple[int, int]], names) -> Tuple[int, ...]:
        shape = [1] * self.ndim
        for name in names:
            lo, hi = ctx[name]
            shape[self.axis[name]] = hi - lo
        return tuple(shape)

    def index_array(self, name: str, ctx) -> np.ndarray:
        lo, hi = ctx[name]
        shape = [1] * self.ndim
        shape[self.axis[name]] = hi - lo
        return np.arange(lo, hi, dtype=np.int64).reshape(shape)

    def describe(self) -> str:
        names = self.spec.output_indices
        blocks = self.split(names, self.budget)
        count = int(np.prod([len(b) for b in blocks], dtype=np.int64)) if names else 1
        limit = self.options.memory_limit / 2**20
        return (f"NumPy reference executor, vectorised over the index grid in {count} output "
                f"block(s); reductions walk their indices in chunks so that no intermediate "
                f"exceeds memory_limit={limit:g} MiB")

    # -- expressions -------------------------------------------------------------------
    def eval(self, expr: Expr, ctx):
        if isinstance(expr, Number):
            return expr.value
        if isinstance(expr, Param):
            value = self.params[expr.name]
            return int(value) if isinstance(value, bool) else value
        if isinstance(expr, IndexValue):
            return self.index_array(expr.name, ctx).astype(self.working)
        if isinstance(expr, Access):
            return self.access(expr, ctx, self.values[expr.tensor], gather=False)
        if isinstance(expr, Unary):
            return np.negative(self.eval(expr.operand, ctx))
        if isinstance(expr, Binary):
            return self.binary(expr, ctx)
        if isinstance(expr, Call):
            return self.call(expr, ctx)
        if isinstance(expr, Reduce):
            return self.reduce(expr, ctx)
        raise TypeError(type(expr).__name__)

    def binary(self, expr: Binary, ctx):
        left, right = self.eval(expr.left, ctx), self.eval(expr.right, ctx)
        if expr.op in ("&", "|"):
            both = np.logical_and if expr.op == "&" else np.logical_or
            return self.cast(np.asarray(both(np.not_equal(left, 0), np.not_equal(right, 0))))
        if expr.op in ("//", "%"):
            # in the working dtype, as every backend computes them (7 // 0 is inf in a
            # float statement, not NumPy's integer 0 for two Python ints)
            left, right = (np.asarray(v, dtype=self.working) for v in (left, right))
        with np.errstate(all="ignore"):
            result = _BINARY[expr.op](left, right)
        if expr.op in ("<", "<=", ">", ">=", "==", "!="):
            return self.cast(np.asarray(result))
        return result

    def call(self, expr: Call, ctx):
        args = [self.eval(arg, ctx) for arg in expr.args]
        with np.errstate(all="ignore"):
            if expr.func == "where":
                cond, a, b = args
                return np.where(np.not_equal(cond, 0), a, b)
            if len(args) == 2:
                func = {"min": np.minimum, "max": np.maximum, "pow": _power,
                        "atan2": np.arctan2}[expr.func]
                return func(*args)
            return _UNARY[expr.func](np.asarray(args[0], dtype=self.working)
                                     if np.ndim(args[0]) == 0 else args[0])

    def reduce(self, expr: Reduce, ctx):
        names = expr.indices
        if any(self.ranges[n][1] <= self.ranges[n][0] for n in names):
            return self.empty_reduction(expr)
        if expr.op in positions.PICK:
            return self.position_reduce(expr, ctx)
        outer = int(np.prod([hi - lo for lo, hi in ctx.values()], dtype=np.int64))
        axes = tuple(self.axis[n] for n in names)
        total = None
        running_max = None
        for block in itertools.product(*self.split(names, self.budget, outer)):
            inner = dict(ctx)
            inner.update(zip(names, block))
            value = np.asarray(self.eval(expr.body, inner), dtype=None)
            value = self.broadcast_axes(value, inner, names)
            with np.errstate(all="ignore"):
                if expr.op == "logsumexp":
                    total, running_max = self.logsumexp_step(value, axes, total, running_max)
                    continue
                part = {"sum": _sum, "prod": np.prod, "max": np.max, "min": np.min}[
                    expr.op](value, axis=axes, keepdims=True)
                if total is None:
                    total = part
                elif expr.op == "sum":
                    total = total + part
                elif expr.op == "prod":
                    total = total * part
                else:
                    pick = np.maximum if expr.op == "max" else np.minimum
                    total = pick(total, part)
        if expr.op == "logsumexp":
            with np.errstate(all="ignore"):
                return running_max + np.log(total)
        return total

    def broadcast_axes(self, value: np.ndarray, ctx, names) -> np.ndarray:
        """Give ``value`` the full chunk length on each reduced axis (a body that does
        not use a reduced index is counted once per value of it)."""
        if value.ndim < self.ndim:
            value = value.reshape((1,) * (self.ndim - value.ndim) + value.shape)
        shape = list(value.shape)
        for name in names:
            lo, hi = ctx[name]
            shape[self.axis[name]] = hi - lo
        return np.broadcast_to(value, shape)

    @staticmethod
    def logsumexp_step(value, axes, total, shift):
        """One chunk of a running-max logsumexp; the result is shift + log(total)."""
        part_max = np.max(value, axis=axes, keepdims=True)
        new_max = part_max if shift is None else np.maximum(shift, part_max)
        # Where the maximum is infinite (all -inf so far, or +inf) x - max would be
        # nan; shifting by 0 there gives exactly -inf or +inf through log.
        new_shift = np.where(np.isfinite(new_max), new_max, 0)
        part = _sum(np.exp(value - new_shift), axis=axes, keepdims=True)
        if total is not None:
            # an earlier shift never exceeds the new one where both are finite; the
            # clamp keeps exp from overflowing where the earlier total was 0
            part = part + total * np.exp(np.minimum(shift - new_shift, 0))
        return part, new_shift

    def position_reduce(self, expr: Reduce, ctx):
        names = expr.indices
        outer = int(np.prod([hi - lo for lo, hi in ctx.values()], dtype=np.int64))
        axes = tuple(self.axis[n] for n in names)
        extents = [self.ranges[n][1] - self.ranges[n][0] for n in names]
        running = None
        for block in itertools.product(*self.split(names, self.budget, outer)):
            inner = dict(ctx)
            inner.update(zip(names, block))
            value = self.broadcast_axes(np.asarray(self.eval(expr.body, inner)), inner, names)
            offsets = [lo - self.ranges[n][0] for n, (lo, _) in zip(names, block)]
            running = positions.merge(expr.op, running, positions.block_extremum(
                expr.op, value, axes, offsets, extents))
        return running[1]

    def empty_reduction(self, expr: Reduce):
        op = expr.op
        if op in positions.PICK:     # binding refuses this first (check_positions_defined)
            empty = [n for n in expr.indices if self.ranges[n][1] <= self.ranges[n][0]]
            raise no_position(expr, empty[0])
        if self.working.kind in "iu" and op in ("max", "min"):
            info = np.iinfo(self.working)
            return info.min if op == "max" else info.max
        return _EMPTY[op]

    # -- accesses ------------------------------------------------------------------------
    def access(self, expr: Access, ctx, array: np.ndarray, gather: bool):
        if not expr.indices:
            return array[()]
        offsets = self.output_offsets if expr.tensor == self.spec.output else None
        names = [sub.plain_index for sub in expr.indices]
        if offsets is not None or (all(names) and len(set(names)) == len(names) and all(
                0 <= ctx[n][0] and ctx[n][1] <= size for n, size in zip(names, array.shape))):
            return self.plain_view(expr, ctx, array, offsets)
        positions = []
        filled = padded = None  # masks of reads that give fill= (gathers) or pad=
        for axis, sub in enumerate(expr.indices):
            size = array.shape[axis]
            pos = self.subscript(sub, ctx)
            if sub.gathers:
                pos, bad = self.apply_bounds(expr, axis, sub, pos, size, ctx)
                if bad is not None:
                    filled = bad if filled is None else filled | bad
            elif self.options.pad is not None and not gather:
                bad = (pos < 0) | (pos >= size)
                padded = bad if padded is None else padded | bad
                pos = np.clip(pos, 0, max(size - 1, 0))
            positions.append(pos)
        if array.size == 0:
            # every read is out of range (fill or pad): nothing to index
            value = np.zeros(np.broadcast_shapes(*[np.shape(p) for p in positions]),
                             dtype=array.dtype)
        else:
            value = array[tuple(positions)]
        # A gather's fill= takes precedence over pad= where both apply.
        for mask, replacement in ((padded, self.options.pad), (filled, self.options.fill)):
            if mask is not None:
                value = np.where(mask, np.asarray(replacement, dtype=self.working), value)
        return self.full_rank(value, positions)

    def full_rank(self, value, positions):
        if np.ndim(value) == self.ndim or np.ndim(value) == 0:
            return value
        return np.reshape(value, (1,) * (self.ndim - np.ndim(value)) + np.shape(value))

    def plain_view(self, expr: Access, ctx, array: np.ndarray, offsets=None) -> np.ndarray:
        """A strided view for an access by distinct plain indices: no copy.  The output
        read in an update (``A[i] = A[i] + 1``) is at position index - range start."""
        names = [sub.plain_index for sub in expr.indices]
        shift = offsets or {}
        view = array[tuple(slice(ctx[n][0] - shift.get(n, 0), ctx[n][1] - shift.get(n, 0))
                           for n in names)]
        order = sorted(range(len(names)), key=lambda a: self.axis[names[a]])
        view = view.transpose(order)
        shape = [1] * self.ndim
        for a in order:
            shape[self.axis[names[a]]] = view.shape[order.index(a)]
        return view.reshape(shape)

    def subscript(self, sub: IndexExpr, ctx):
        # fits: checked per call; NumPy's // and % on int64 floor as Python's do
        pos = np.int64(0) + sub.index_value(lambda name: self.index_array(name, ctx))
        if not sub.gathers:
            return pos
        # A gathered position is exact: int64 when no partial sum can leave int64 for the
        # values read (the usual case), Python ints otherwise (uint64 values beyond int64,
        # x[idx[i] + 1] with idx[i] near INT64_MAX ...); bounds= then sees the true value.
        terms = [(coeff, self.gathered(access, ctx)) for access, coeff in sub.gathers]
        largest = _magnitude(pos) + sum(abs(coeff) * _magnitude(g) for coeff, g in terms)
        exact = np.int64 if largest <= INT64_MAX else object
        pos = np.asarray(pos).astype(exact)
        for coeff, values in terms:
            pos = pos + coeff * values.astype(exact)
        return pos

    def gathered(self, access: Access, ctx) -> np.ndarray:
        """The values an index array gives, as integers of their own dtype (a nested
        gather's rejected read gives fill=, truncated: its range is checked per call)."""
        values = np.asarray(self.access(access, ctx, self.arrays[access.tensor], gather=True))
        return values if values.dtype.kind in "iu" else np.trunc(values).astype(np.int64)

    def apply_bounds(self, expr: Access, axis: int, sub: IndexExpr, pos, size: int, ctx):
        """Positions made safe under bounds=, and the mask of reads that give fill=."""
        mode = self.options.bounds
        bad = (pos < 0) | (pos >= size)
        if mode in ("check", "promise"):
            # The reference never reads out of bounds, so a broken promise raises too.
            if np.any(bad):
                raise self.out_of_bounds(expr, axis, sub, pos, bad, size, ctx)
            return np.asarray(pos).astype(np.int64), None
        if size == 0:
            return np.zeros(np.shape(pos), dtype=np.int64), np.ones(np.shape(pos), dtype=bool)
        if mode == "clip":
            pos = np.minimum(np.maximum(pos, 0), size - 1)
        elif mode == "wrap":
            pos = np.mod(pos, size)
        else:  # fill: these reads give fill=
            pos = np.where(bad, 0, pos)
        return np.asarray(pos).astype(np.int64), (bad if mode == "fill" else None)

    def out_of_bounds(self, expr: Access, axis: int, sub: IndexExpr, pos, bad, size: int,
                      ctx) -> OutOfBoundsError:
        """The error for the first offending read, naming the element of each index array
        that gave it (``idx[3] = 7``)."""
        first = np.unravel_index(np.argmax(bad), np.shape(bad)) if np.ndim(bad) else ()
        value = int(np.asarray(pos)[first] if np.ndim(pos) else pos)
        point = {}   # the offending read's index values (an index pos ignores: its first)
        for name, (lo, _) in ctx.items():
            axis_of = self.axis[name]
            spread = np.ndim(bad) > axis_of and np.shape(bad)[axis_of] > 1
            point[name] = lo + int(first[axis_of]) if spread else lo
        gathered = [self.element(access, point) for access, _ in sub.gathers]
        where = f"axis {axis} of {expr.tensor}, length {size}"
        mode = self.options.bounds
        allow = "use bounds='clip', 'wrap' or 'fill' to allow it" + \
            ("; bounds='promise' was given but the promise does not hold"
             if mode == "promise" else "")
        if len(sub.gathers) == 1 and sub.gathers[0][1] == 1 and not sub.terms and \
                not sub.constant:
            message = f"{gathered[0][0]} = {value} is outside its valid range " \
                      f"0..{size - 1} ({where}); {allow}"
        else:
            used = set(_index_names(sub))
            at = ", ".join(f"{n}={point[n]}" for n in point if n in used)
            read = ", ".join(f"{text} = {v}" for text, v in gathered)
            message = f"{expr} reads position {value}" + (f" at {at}" if at else "") + \
                f" ({read}), outside its valid range 0..{size - 1} ({where}); {allow}"
        return OutOfBoundsError(message, source=self.spec.source, span=sub.span or expr.span)

    def element(self, access: Access, point):
        """``(text, value)`` of the index array element a gather reads at ``point``, such
        as ``("idx[3]", 7)``; nested gathers are in range (they were checked first)."""
        position = []
        for sub in access.indices:
            at = sub.index_value(point.__getitem__)
            at += sum(c * self.element(inner, point)[1] for inner, c in sub.gathers)
            position.append(at)
        value = self.arrays[access.tensor][tuple(position)]
        return f"{access.tensor}[{', '.join(map(str, position))}]", int(value)


def _sum(value: np.ndarray, axis, keepdims: bool = True) -> np.ndarray:
    """np.sum over ``axis``, pairwise whatever the layout.  NumPy sums pairwise only along
    the axis its inner loop runs over and adds one slice after another along any other
    (a column sum of 10**6 float32 rows is 2e-3 off); with the summed axes moved last,
    made one contiguous axis, they are that inner loop."""
    value = np.asarray(value)
    if value.dtype.kind != "f":
        return np.sum(value, axis=axis, keepdims=keepdims)
    axes = tuple(sorted(a % value.ndim for a in axis))
    kept = [a for a in range(value.ndim) if a not in axes]
    moved = np.ascontiguousarray(np.transpose(value, kept + list(axes)))
    total = np.sum(moved.reshape(moved.shape[:len(kept)] + (-1,)), axis=-1)
    return total.reshape([1 if a in axes else value.shape[a] for a in range(value.ndim)]) \
        if keepdims else total


def _magnitude(values) -> int:
    """The largest magnitude among integer ``values`` (a scalar or an array), exactly."""
    values = np.asarray(values)
    if values.size == 0:
        return 0
    return max(abs(int(values.min())), abs(int(values.max())))


def _index_names(sub: IndexExpr):
    """The indices a subscript depends on, through its gathers too."""
    yield from sub.index_names
    for access, _ in sub.gathers:
        for inner in access.indices:
            yield from _index_names(inner)
