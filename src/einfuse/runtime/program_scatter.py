"""A program backward's scatter-add piece prepared for repeated calls on NumPy arrays
(runtime/program_backward.py): ``dX[i, t[i]] += -dl[i]``, the gradient of a gather.

The general path (``gradient_reference.run_reference``) resolves each statement's
options, binds its values statement, builds the index grids and evaluates every
subscript anew on each call: about 120-280 µs of Python for cross-entropy's 256 labels
(256x256 float32), most of a backward whose kernels take tens of µs.  A backward runs
for one signature of its arrays (names, shapes, dtypes), so all of that but the values
and the gathered subscripts is found once here; a call is then the values statement's
compiled kernel (its own fast path, on the backend the backward's gathers run on), the
gathered subscripts read from their index arrays, a range check and one compiled loop
adding the values in ``np.add.at``'s order (``backends/c/scatter.scatter_flat``: the
same bits).

Prepared only where every array the piece reads is a NumPy array, every statement is a
scatter into the piece's key, at least one subscript gathers (an affine scatter has its
own strided path) and the subscripts without gathers stay inside the target (the
general path drops the points of a padded affine read).  A scatter whose first
subscript alone gathers, over whole rows (an embedding's ``dW[idx[b], d]``), is
prepared as the general path adds it: the positions read over the leading indices
only, then ``scatter_rows``.  A call whose arrays have
other shapes or dtypes, whose values are not of the target's float dtype, or whose
gathered positions fall outside the target, returns False: the general path runs it
(and raises the out-of-bounds error where ``bounds='check'``)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional, Tuple

import numpy as np

from ..autodiff.attribution import gradient_errors
from ..errors import EinfuseError, OutOfBoundsError
from ..lang.ast import IndexExpr
from ..lang.printer import format_expr
from ..lang.fresh_names import FreshNames
from ..backends.c.scatter import flat_route, rows_route, scatter_flat, scatter_rows
from ..plan.library_patterns import scatters_rows
from .gradient_reference import resolve_options, statements_to_run, text_kernel

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass(frozen=True)
class _Step:
    """One scatter statement: its values kernel and inputs, the target's shape, and
    per target axis either fixed positions (no gather) or a subscript to evaluate."""
    kernel: object
    inputs: Tuple[str, ...]
    shape: Tuple[int, ...]
    axes: Tuple[object, ...]          # np.ndarray (fixed) or IndexExpr (gathers)
    grid: Dict[str, np.ndarray]
    bounds: str


def prepared_scatter(statements, key: str, env: Mapping[str, object],
                     backend: str) -> Optional[Callable[[Dict[str, object]], bool]]:
    """A run of the scatter piece (``statements`` adding into ``key``) for arrays laid
    out as ``env``'s, or None where the general path must run every call."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            grads = statements_to_run(list(statements), env)
            steps = tuple(_step(g, env, backend) for g in grads)
    except EinfuseError:        # the general path raises it, attributed
        return None
    if len(grads) == 1 and grads[0].kind == "scatter" and grads[0].target == key:
        rows = _rows_run(grads[0], env, backend)
        if rows is not None:
            return rows
    if not steps or any(s is None for s in steps) or \
            any(g.kind != "scatter" or g.target != key for g in grads):
        return None
    reads = sorted({n for g in grads for n in g.inputs} |
                   {a.tensor for s in steps for sub in s.axes
                    if isinstance(sub, IndexExpr) for a in _gathered(sub)})
    if any(type(env.get(n)) is not np.ndarray for n in reads):
        return None
    layouts = tuple((n, env[n].shape, env[n].dtype) for n in reads)
    shape = steps[0].shape
    if any(s.shape != shape for s in steps):
        return None

    # the flat add's route (schedule/scatter_kernels.py) per values dtype and size:
    # the target is fresh zeros of the first values' dtype, the sizes the signature's
    routes = {}

    def run(env: Dict[str, object]) -> bool:
        if not _laid_out(env, layouts):
            return False
        target = None
        for step in steps:
            values = step.kernel(arrays={n: env[n] for n in step.inputs})
            if type(values) is not np.ndarray or values.dtype not in _FLOATS or \
                    target is not None and values.dtype != target.dtype:
                return False
            positions = _positions(step, env, values.shape)
            if positions is None:
                return False
            if target is None:
                target = np.zeros(shape, values.dtype)
            layout = (values.dtype, values.size)
            route = routes.get(layout)
            if route is None:
                route = routes[layout] = flat_route(target, values)
            if not scatter_flat(target, positions, values, route=route):
                return False
        env[key] = target
        return True
    return run


def _rows_run(g, env, backend: str) -> Optional[Callable[[Dict[str, object]], bool]]:
    """The embedding backward's shape, ``dW[idx[b], d] += v[b, d]`` (whole rows at
    gathered positions, plan/library_patterns.scatters_rows), prepared: a call is the
    values kernel, the positions read from the index arrays over the values' leading
    indices alone (the general path builds them over every value), one range check and
    ``scatter_rows`` on zeros, as the general path's ``_add_rows`` adds them (the same
    bits).  None where it does not apply (bounds other than 'check'/'promise', trailing
    ranges not from 0, arrays other than NumPy's)."""
    with gradient_errors(g), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options = resolve_options(g, env)
    ranges = options["ranges"]
    indices = tuple(g.spec.output_indices)
    target_shape = tuple(np.shape(env[g.wrt]))
    values_shape = tuple(len(ranges[name]) for name in indices)
    rest = len(g.scatter) - 1
    if options.get("bounds", "check") not in ("check", "promise") or \
            not scatters_rows(g, target_shape, values_shape) or \
            any(ranges[sub.plain_index].start != 0 for sub in g.scatter[1:]):
        return None
    lead = indices[:len(indices) - rest]
    grid = {}
    for pos, name in enumerate(lead):
        shape = [1] * len(lead)
        shape[pos] = len(ranges[name])
        grid[name] = np.arange(ranges[name].start, ranges[name].stop,
                               dtype=np.int64).reshape(shape)
    reads = sorted(set(g.inputs) | {a.tensor for a in _gathered(g.scatter[0])})
    if any(type(env.get(n)) is not np.ndarray for n in reads):
        return None
    layouts = tuple((n, env[n].shape, env[n].dtype) for n in reads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernel = text_kernel(g.text, options, backend)
    inputs, first, key = tuple(g.inputs), g.scatter[0], g.target
    lead_shape = values_shape[:len(lead)]
    count = int(np.prod(lead_shape, dtype=np.int64))
    # the row add's route (schedule/scatter_kernels.py), decided once per values dtype:
    # the target is fresh zeros of the values' dtype, the sizes are the signature's
    routes = {}

    def run(env: Dict[str, object]) -> bool:
        if not _laid_out(env, layouts):
            return False
        values = kernel(arrays={n: env[n] for n in inputs})
        if type(values) is not np.ndarray or values.dtype not in _FLOATS:
            return False
        where = np.broadcast_to(_evaluate(first, grid, env), lead_shape).reshape(-1)
        if where.size and (where.min() < 0 or where.max() >= target_shape[0]):
            return False         # the general path raises the statement's own error
        target = np.zeros(target_shape, values.dtype)
        if values.size:
            rows, flat = values.reshape(count, -1), target.reshape(target_shape[0], -1)
            route = routes.get(values.dtype)
            if route is None:
                route = routes[values.dtype] = rows_route(flat, rows)
            scatter_rows(flat, rows, np.ascontiguousarray(where), route=route)
        env[key] = target
        return True
    return run


def _step(g, env, backend: str) -> Optional[_Step]:
    with gradient_errors(g):
        options = resolve_options(g, env)
    bounds = options.get("bounds", "check")
    if not any(sub.gathers for sub in g.scatter) or \
            bounds not in ("check", "promise", "clip", "wrap"):
        return None
    if g.scatter[0].gathers and not any(sub.gathers for sub in g.scatter[1:]):
        return None     # whole rows, maybe: the general path's column-parallel row add
    indices = g.spec.output_indices
    grid = {}
    for pos, name in enumerate(indices):
        rng = options["ranges"][name]
        shape = [1] * len(indices)
        shape[pos] = len(rng)
        grid[name] = np.arange(rng.start, rng.stop, dtype=np.int64).reshape(shape)
    values_shape = tuple(len(options["ranges"][name]) for name in indices)
    target_shape = tuple(np.shape(env[g.wrt]))
    if len(target_shape) != len(g.scatter):
        return None
    axes = []
    for axis, sub in enumerate(g.scatter):
        if sub.gathers:
            axes.append(sub)
            continue
        fixed = np.broadcast_to(np.asarray(sub.index_value(grid.__getitem__), np.int64),
                                values_shape)
        if fixed.size and (fixed.min() < 0 or fixed.max() >= target_shape[axis]):
            return None       # a padded affine read: the general path drops those points
        axes.append(fixed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernel = text_kernel(g.text, options, backend)
    return _Step(kernel, tuple(g.inputs), target_shape, tuple(axes), grid, bounds)


def _gathered(sub: IndexExpr):
    """The index-array accesses of a subscript, nested ones included."""
    for access, _ in sub.gathers:
        yield access
        for inner in access.indices:
            yield from _gathered(inner)


def _positions(step: _Step, env, shape) -> Optional[Tuple[np.ndarray, ...]]:
    """Each target axis's positions for the values (``shape``), or None where a
    gathered one is outside the target under 'check'/'promise'."""
    found = []
    for axis, sub in enumerate(step.axes):
        if not isinstance(sub, IndexExpr):
            found.append(sub)
            continue
        where = np.broadcast_to(_evaluate(sub, step.grid, env), shape)
        n = step.shape[axis]
        if step.bounds == "clip":
            where = where.clip(0, n - 1)
        elif step.bounds == "wrap":
            where = where % n
        elif where.size and (where.min() < 0 or where.max() >= n):
            return None
        found.append(where)
    return tuple(found)


def _evaluate(sub: IndexExpr, grid, env) -> np.ndarray:
    """A subscript's integer values over the grid (gathers read from ``env``)."""
    value = sub.index_value(grid.__getitem__)
    for access, coeff in sub.gathers:
        where = tuple(_evaluate(s, grid, env) for s in access.indices)
        value = value + coeff * np.asarray(env[access.tensor])[where].astype(np.int64)
    return np.asarray(value, np.int64)


@dataclass(frozen=True)
class WhereForm:
    """A scatter statement rewritten as the gather it equals: ``dX[i, t[i]] += v[i]``
    adds exactly one value at each ``(i, t[i])``, so ``dX[i, j] := where(j == t[i],
    v[i], 0)`` holds the same numbers, and as a plain statement over the target's rows
    it joins the backward's row kernel (cross-entropy's ``softmax - onehot`` becomes one
    pass).  ``checks``: (index array, size of the target axis it addresses, that axis)
    per gathered axis, whose values must lie inside the axis for the rewrite to hold
    (the scatter raises on such labels; the gather would drop them)."""
    text: str
    options: Dict[str, object]
    checks: Tuple[Tuple[str, int, int], ...]
    kernel: object                   # the text compiled under the options


def where_form(g, shapes: Mapping[str, object], taken, backend: str
               ) -> Optional[WhereForm]:
    """``g`` (a scatter statement) as a :class:`WhereForm`, or None where the two are not
    the same for arrays like ``shapes``: each target axis is either one of the values'
    indices, each index on one axis and over the whole axis (so no two values meet),
    or one index array read at the values' indices over its whole extent (``t[i]``);
    bounds 'check' or 'promise' (where a label outside raises: a fill never applies),
    no padding."""
    if g.kind != "scatter" or g.options.get("pad") not in (None, 0):
        return None
    with gradient_errors(g), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            options = resolve_options(g, shapes)
        except EinfuseError:
            return None
    if options.get("bounds", "check") not in ("check", "promise"):
        return None
    ranges = options["ranges"]
    target = tuple(np.shape(shapes[g.wrt]))
    indices = tuple(g.spec.output_indices)
    if len(target) != len(g.scatter) or len(set(indices)) != len(indices):
        return None
    fresh_names = FreshNames(set(taken) | set(indices) | set(ranges))
    subscripts, conditions, checks, plain = [], [], [], []
    for axis, sub in enumerate(g.scatter):
        name = sub.plain_index
        if name is not None:
            if name not in indices or name in plain or \
                    ranges[name] != range(0, target[axis]):
                return None
            plain.append(name)
            subscripts.append(name)
            continue
        array = _label_array(sub, indices, ranges, shapes)
        if array is None:
            return None
        fresh = fresh_names.numbered("s")
        ranges = dict(ranges, **{fresh: range(0, target[axis])})
        subscripts.append(fresh)
        conditions.append(f"({fresh} == {sub.gathers[0][0]})")
        checks.append((array, target[axis], axis))
    if sorted(plain) != sorted(indices) or not conditions:
        return None
    # the scattered values' dtype, given as dtype= (which is then the working dtype
    # too); the labels, read only to be compared, would not promote it anyway
    # (analysis/compared.py), and they compare exactly in it below 2**24 (float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            values_kernel = text_kernel(g.text, options, backend)
            call = values_kernel.bind(arrays={n: shapes[n]
                                              for n in values_kernel.spec.arg_order})
        except (EinfuseError, KeyError):   # the scatter path says what is wrong, if anything
            return None
    dtype = np.dtype(call.dtypes.result)
    if dtype not in _FLOATS or max(size for _, size, _ in checks) > \
            2 ** (np.finfo(dtype).nmant + 1):
        return None
    values = format_expr(g.statement.rhs)
    text = f"{g.target}[{', '.join(subscripts)}] := " \
           f"where({' & '.join(conditions)}, {values}, 0)"
    options = dict(options, ranges=ranges, dtype=dtype.name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            kernel = text_kernel(text, options, backend)
        except EinfuseError:        # (not expected: then the scatter runs as derived)
            return None
    return WhereForm(text, options, tuple(checks), kernel)


def _label_array(sub: IndexExpr, indices, ranges, shapes) -> Optional[str]:
    """The index array of a subscript that is exactly ``t[i, ...]``, read at plain
    indices of the values over all of its extent (so that its values are the labels
    checked), or None."""
    if sub.terms or sub.constant or sub.quasi or len(sub.gathers) != 1 or \
            sub.gathers[0][1] != 1:
        return None
    access = sub.gathers[0][0]
    array = shapes.get(access.tensor)
    names = tuple(s.plain_index for s in access.indices)
    if array is None or np.dtype(getattr(array, "dtype", np.float64)).kind not in "iu" or \
            None in names or len(names) != np.ndim(array) or \
            any(n not in indices or ranges[n] != range(0, size)
                for n, size in zip(names, np.shape(array))):
        return None
    return access.tensor


def check_labels(g, checks: Tuple[Tuple[str, int, int], ...], env) -> None:
    """Raise the scatter ``g``'s own out-of-bounds error where an index array of
    ``checks`` (a :class:`WhereForm`'s) holds a value outside its axis."""
    for name, size, axis in checks:
        labels = env[name]
        if not hasattr(labels, "numel"):    # (a torch tensor is checked on its device:
            labels = np.asarray(labels)     # one read of the answer)
        outside = (labels < 0) | (labels >= size)
        if bool(outside.any()):
            bad = int(labels[outside].reshape(-1)[0])
            with gradient_errors(g):
                raise OutOfBoundsError(f"{g.description}: index value {bad} is outside "
                                       f"0..{size - 1} (axis {axis} of {g.wrt})")


def _laid_out(env: Dict[str, object], layouts) -> bool:
    """Whether every array ``layouts`` names ((name, shape, dtype), as a prepared run
    saw them first) is a NumPy array of that shape and dtype again."""
    for name, shape, dtype in layouts:
        value = env[name]
        if type(value) is not np.ndarray or value.shape != shape or value.dtype != dtype:
            return False
    return True
