"""Running gradient statements with the NumPy reference: option resolution and the
scatter-add, so that every derived gradient is testable without a GPU backend."""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from typing import Dict, Iterable, List, Mapping

import numpy as np

from ..errors import OutOfBoundsError, RangeError, ShapeError
from ..lang.ast import IndexExpr, Param, accesses
from ..lang.parser import parse
from ..analysis.frameworks import JAX, NUMPY, TORCH, framework_of, placeholder
from .kernel_maker import compile_statement
from ..autodiff.derive import AxisOf, ExtentOf, GradientStatement, NoGradientError, RangeOf
from ..autodiff.attribution import gradient_errors
from ..autodiff.rebase import output_indices, output_starts, rebased
from .strided_scatter import add_to_view, target_view
from ..plan.library_patterns import scatters_rows
from ..schedule.library import ScatterCall, scatter_library
from ..schedule.schedule import Library
from .window_scatter import WindowScatterRoute, add_by_offsets, scatter_decision

_PASSED = ("ranges", "pad", "bounds", "fill")


# Forward ranges remembered per gradient statement and argument signature.
_RANGES_KEPT = 16


def _forward_ranges(g: GradientStatement, arrays: Mapping[str, object]):
    """Every index range of the forward statement for these arrays (the forward is bound,
    not run).  Ranges depend on shapes (and options) alone: they are remembered per
    signature of the arrays, so a training loop binds the forward once per shape."""
    signature = tuple((name, tuple(np.shape(arrays[name])), getattr(arrays[name], "dtype", None))
                      for name in _range_names(g) if name in arrays)
    cache = g.__dict__.setdefault("_ranges", {})
    found = cache.get(signature)
    if found is None:
        found = _bind_forward_ranges(g, arrays)
        if len(cache) >= _RANGES_KEPT:
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                cache.pop(next(iter(cache)))     # another thread may evict it too
        cache[signature] = found
    return found


def _range_names(g: GradientStatement) -> tuple:
    """The names whose shapes the forward ranges of ``g`` depend on (sorted), found once
    per statement: a program's backward passes every array of the program, and a
    signature over all of them made each statement's lookup as long as the program."""
    found = g.__dict__.get("_range_names")
    if found is None:
        statement = parse(g.forward)
        names = {a.tensor for a in accesses(statement.rhs)} | {
            n.name for n in statement.rhs.walk() if isinstance(n, Param)} | {
            statement.output, g.output_grad}
        parent = g.parent
        if parent is not None:
            names |= set(_range_names(parent))
            names |= {source.tensor for source in parent.options.get("ranges", {}).values()
                      if isinstance(source, (AxisOf, ExtentOf))}
            names |= {tensor for _, tensor, _ in parent.range_checks}
        found = g.__dict__["_range_names"] = tuple(sorted(names))
    return found


def _bind_forward_ranges(g: GradientStatement, arrays: Mapping[str, object]):
    if g.parent is not None:
        options = resolve_options(g.parent, arrays)
    else:
        options = {k: v for k, v in g.forward_options.items() if k in _PASSED}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernel = compile_statement(g.forward, backend="numpy", **options)
    spec = kernel.spec
    # ranges depend on shapes alone: bind placeholders (the arrays may be on a GPU, or
    # traced under jax.jit)
    args = {n: placeholder(arrays[n]) for n in spec.arg_order}
    if spec.assign != ":=":   # '=' / '+=': the output's shape is dOUT's
        args[spec.output] = np.zeros(np.shape(arrays.get(spec.output,
                                                         arrays[g.output_grad])))
    return kernel.bind(**args).bounds.range_map


def _check_starts(g: GradientStatement, forward) -> None:
    """``g``'s statement reads dOUT at index values: only right where the forward's
    output indices start at 0 (statements_to_run rebases the others, autodiff/rebase.py)."""
    starts = output_starts(g, forward)
    if starts != dict(g.starts):
        index = next(i for i in set(starts) | {i for i, _ in g.starts}
                     if starts.get(i, 0) != dict(g.starts).get(i, 0))
        raise NoGradientError(f"output index {index} of {g.forward!r} starts at "
                              f"{starts.get(index, 0)} for these arrays, not where this "
                              "gradient statement was derived for: run the statements "
                              "statements_to_run(...) gives for these arrays")


def _check_output_grad(g: GradientStatement, forward, arrays) -> None:
    """dOUT must have the forward output's shape: a padded read would take a shorter
    one for zeros past its end."""
    if g.output_grad not in arrays or g.parent is not None:
        return
    indices = output_indices(g.forward)
    expected = tuple(forward[i][1] - forward[i][0] for i in indices)
    found = tuple(np.shape(arrays[g.output_grad]))
    if found != expected:
        raise ShapeError(f"{g.output_grad}, the gradient of the output, has shape {found}, "
                         f"but this statement's output has shape {expected} for these "
                         f"arrays", source=g.forward,
                         span=parse(g.forward).output_span)


def covers(g: GradientStatement, arrays: Mapping[str, object]) -> bool:
    if not g.range_checks:
        return True
    forward = _forward_ranges(g, arrays)
    _check_starts(g, forward)
    return all(forward[index][0] <= 0 and forward[index][1] >= np.shape(arrays[t])[axis]
               for index, t, axis in g.range_checks)


def resolve_options(g: GradientStatement, arrays: Mapping[str, object]) -> Dict[str, object]:
    forward = _forward_ranges(g, arrays)
    _check_starts(g, forward)
    _check_output_grad(g, forward, arrays)
    ranges = {}
    for index, source in g.options["ranges"].items():
        if isinstance(source, AxisOf):
            ranges[index] = range(0, np.shape(arrays[source.tensor])[source.axis])
        elif isinstance(source, ExtentOf):
            n = np.shape(arrays[source.tensor])[source.axis]
            ranges[index] = range(n, n + 1)
        else:
            ranges[index] = range(*forward[source.index])
    for index, tensor, axis in g.range_checks:
        lo, hi = forward[index]
        n = np.shape(arrays[tensor])[axis]
        if lo > 0 or hi < n:
            raise RangeError(f"index {index} runs over {lo}..{hi - 1} in {g.forward!r}, not "
                             f"over all of {tensor}'s axis {axis} (0..{n - 1}); run this "
                             f"gradient's fallback (scatter) statements instead")
    _check_positions_exact(g, ranges, arrays)
    result = {"ranges": ranges}
    for key in ("pad", "bounds", "fill"):
        if g.options.get(key) is not None:
            result[key] = g.options[key]
    return result


# The largest integer below which every integer is exact in float32 (float16 and
# bfloat16 compute in float32 too).
_FLOAT32_EXACT = 2**24


def _check_positions_exact(g: GradientStatement, ranges, arrays) -> None:
    """Positions compared as numbers must be exact in the working dtype: a float32
    max/min gradient over more than 2**24 positions along one index could not tell
    neighbouring positions apart."""
    long = [index for index in g.positions
            if max(abs(ranges[index].start), abs(ranges[index].stop)) > _FLOAT32_EXACT]
    if not long:
        return
    floats = [np.dtype(placeholder(arrays[n]).dtype) for n in g.inputs
              if not isinstance(arrays[n], (int, float)) and
              np.dtype(placeholder(arrays[n]).dtype).kind == "f"]
    if floats and max(d.itemsize for d in floats) < 8:
        index = long[0]
        source = g.options["ranges"].get(index)
        shown = source.index if isinstance(source, RangeOf) else index
        raise NoGradientError(
            f"the gradient of {g.forward!r} locates the first maximum/minimum along "
            f"{shown} ({ranges[index].stop - ranges[index].start} positions) and float32 "
            f"cannot tell positions beyond {_FLOAT32_EXACT} apart; compute in float64 "
            "(float64 inputs or dtype='float64')")


def statements_to_run(grads: Iterable[GradientStatement],
                      arrays: Mapping[str, object]) -> List[GradientStatement]:
    """The statements that compute these gradients for arrays of these shapes: a gather
    whose frame indices do not cover wrt's axes runs its fallback statements instead,
    and the statements of a forward whose output ranges do not start at 0 for these
    arrays are derived again for those starts (autodiff/rebase.py)."""
    chosen: List[GradientStatement] = []
    for g in grads:
        starts = output_starts(g, _forward_ranges(g, arrays))
        if starts != dict(g.starts):
            with gradient_errors(g):
                again = rebased(g, starts)
            chosen.extend(statements_to_run(again, arrays))
        else:
            chosen.extend(g.fallback if g.fallback and not covers(g, arrays) else [g])
    return chosen


def run_reference(grads: Iterable[GradientStatement], arrays: Mapping[str, object], *,
                  backend: str = "numpy") -> Dict[str, object]:
    """Evaluate gradient statements: ``arrays`` holds the forward's inputs and dOUT.
    Returns {target: gradient}; gathers run with ``ef.ein``, scatters add with
    ``np.add.at``.  When dOUT is a torch tensor, everything stays torch tensors on its
    device (a GPU backward never visits the host): scatters add with ``index_put_``."""
    out: Dict[str, object] = {}
    grads = list(grads)
    ops = _ops_for(arrays[grads[0].output_grad]) if grads else NumpyOps()
    for g in statements_to_run(grads, arrays):
        with gradient_errors(g):
            _run_one(ops, g, arrays, out, backend)
    return out


def _run_one(ops, g: GradientStatement, arrays, out, backend: str) -> None:
    """Add what gradient statement ``g`` computes into ``out[g.target]``."""
    options = resolve_options(g, arrays)
    args = {n: arrays[n] for n in g.inputs}
    # arrays= keys the kernel's fast path: a training loop's backward is then a
    # lookup and a kernel call per gradient statement
    values = ops.asarray(_gradient_kernel(g.text, backend, _options_key(options))(
        arrays=args))
    if g.kind == "gather":
        # ein returns a fresh array: it can be the gradient itself, no copy
        out[g.target] = out[g.target] + values if g.target in out else values
        return
    if g.target not in out:
        # accumulate in the gradient's own float dtype, as frameworks do
        out[g.target] = ops.zeros(np.shape(arrays[g.wrt]), values)
    out[g.target] = numpy_scatter_add(ops, out[g.target], g, values, options, arrays)


def gradient_kernel(g: GradientStatement, arrays: Mapping[str, object], backend: str):
    """The compiled kernel running gather statement ``g`` for arrays like these."""
    return _gradient_kernel(g.text, backend, _options_key(resolve_options(g, arrays)))


def text_kernel(text: str, options: Mapping[str, object], backend: str):
    """The compiled kernel of a rewritten gather statement ``text`` under options that
    ``resolve_options`` gave for the statement it was rewritten from."""
    return _gradient_kernel(text, backend, _options_key(options))


def _options_key(options: Mapping[str, object]):
    """resolve_options' result as a hashable key (ranges as (start, stop) pairs)."""
    return tuple((key, tuple((n, (r.start, r.stop)) for n, r in sorted(value.items()))
                  if key == "ranges" else value) for key, value in sorted(options.items()))


def _gradient_kernel(text: str, backend: str, key):
    """The compiled kernel of one gradient statement under resolved options, made once
    (its compile-time warnings are the derivation's business, not the caller's)."""
    # 0.0 == -0.0 in the key, yet fill=-0.0 gives other values (1 / fill): keyed apart
    signs = tuple(math.copysign(1.0, v) for _, v in key if isinstance(v, float))
    return _compiled_gradient_kernel(text, backend, key, signs)


@functools.lru_cache(maxsize=1024)
def _compiled_gradient_kernel(text: str, backend: str, key, signs):
    options = {k: ({n: range(*bounds) for n, bounds in v} if k == "ranges" else v)
               for k, v in key}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile_statement(text, backend=backend, **options)


def _ops_for(output_grad):
    """Array operations in dOUT's framework: a torch or JAX backward stays in it."""
    framework = framework_of(output_grad)
    if framework == TORCH:
        return _TorchOps(output_grad)
    if framework == JAX:
        return _JaxOps()
    return NumpyOps()


class NumpyOps:
    """The array operations a scatter needs, on NumPy arrays."""

    @staticmethod
    def any(flags) -> bool:
        return bool(flags.any())

    @staticmethod
    def asarray(value):
        return np.asarray(value)

    @staticmethod
    def zeros(shape, like):
        dtype = like.dtype if like.dtype.kind == "f" else np.dtype(np.float64)
        return np.zeros(shape, dtype=dtype)

    @staticmethod
    def arange(lo, hi, shape):
        return np.arange(lo, hi).reshape(shape)

    @staticmethod
    def broadcast(values, shape):
        return np.broadcast_to(values, shape)

    @staticmethod
    def take(table, where):
        return table[np.broadcast_arrays(*where)] if where else table[()]

    @staticmethod
    def add_at(target, positions, values, keep):
        where, kept = tuple(p[keep] for p in positions), values[keep]
        from ..backends.c.scatter import scatter_flat     # compiled where it applies
        if not scatter_flat(target, where, kept):
            np.add.at(target, where, kept)
        return target


class _TorchOps:
    """The same on torch tensors, on the device of dOUT."""

    def __init__(self, like):
        import torch
        self.torch, self.device = torch, like.device

    @staticmethod
    def any(flags) -> bool:
        return bool(flags.any())

    def asarray(self, value):
        return value if framework_of(value) == TORCH else \
            self.torch.as_tensor(np.asarray(value), device=self.device)

    def zeros(self, shape, like):
        dtype = like.dtype if like.dtype.is_floating_point else self.torch.float64
        return self.torch.zeros(shape, dtype=dtype, device=self.device)

    def arange(self, lo, hi, shape):
        return self.torch.arange(lo, hi, device=self.device).reshape(shape)

    def broadcast(self, values, shape):
        return self.torch.as_tensor(values, device=self.device).expand(shape)

    def take(self, table, where):
        if not where:
            return table[()]
        where = [self.torch.as_tensor(w, device=self.device).long() for w in where]
        return table[self.torch.broadcast_tensors(*where)]

    def add_at(self, target, positions, values, keep):
        # index_put_ with accumulate: repeated positions add up (atomics on a GPU)
        where, added = tuple(p[keep].long() for p in positions), values[keep].to(target.dtype)
        if target.requires_grad:
            # (create_graph=True: the target may be a recorded node's saved output, a
            # gather's part; adding in place would fail its version check)
            return target.index_put(where, added, accumulate=True)
        target.index_put_(where, added, accumulate=True)
        return target


class _JaxOps:
    """The same on JAX arrays, traceable under jax.jit: no boolean masks (their shapes
    would depend on data); a position not kept is moved past the end and dropped."""

    def __init__(self):
        import jax.numpy as jnp
        self.jnp = jnp

    @staticmethod
    def any(flags) -> bool:
        """Concrete values are checked; traced ones cannot be (the device path takes
        only statements whose gathers clip, wrap or fill, see runtime.jax_gpu)."""
        try:
            return bool(flags.any())
        except Exception:   # a tracer: jax.errors.ConcretizationTypeError
            return False

    def asarray(self, value):
        return self.jnp.asarray(value)

    def zeros(self, shape, like):
        floating = self.jnp.issubdtype(like.dtype, self.jnp.floating)
        return self.jnp.zeros(shape, like.dtype if floating else self.jnp.float32)

    def arange(self, lo, hi, shape):
        return self.jnp.arange(lo, hi).reshape(shape)

    def broadcast(self, values, shape):
        return self.jnp.broadcast_to(values, shape)

    def take(self, table, where):
        return table[tuple(self.jnp.broadcast_arrays(*where))] if where else table[()]

    def add_at(self, target, positions, values, keep):
        moved = tuple(self.jnp.where(keep, p, n) for p, n in zip(positions, target.shape))
        return target.at[moved].add(values.astype(target.dtype), mode="drop")


def numpy_scatter_add(ops, target, g: GradientStatement, values, options, arrays):
    """``target`` plus ``values`` at ``g``'s scatter positions, by the kernel the
    library's rule for the arrays' framework chooses (schedule/library.scatter_library):
    one strided view, the colliding windows (col2im), whole rows, or element by
    element."""
    indices = g.spec.output_indices
    framework = _framework_of_ops(ops)
    library, view, window = scatter_entry(target, g, values, options, framework)
    if library is Library.STRIDED_ADD:
        add_to_view(target, view, values)
        return target
    if library is Library.WINDOW_ADD:     # (col2im: one C walk, or view adds per offset)
        add_by_offsets(target, g, values, {n: options["ranges"][n] for n in indices},
                       window)
        return target
    grid = {}
    for pos, name in enumerate(indices):
        rng = options["ranges"][name]
        shape = [1] * len(indices)
        shape[pos] = len(rng)
        grid[name] = ops.arange(rng.start, rng.stop, shape)
    bounds = options.get("bounds", "check")
    keep = ops.broadcast(True, tuple(values.shape))
    positions = []
    for axis, sub in enumerate(g.scatter):
        n = target.shape[axis]
        where = ops.broadcast(_evaluate(ops, sub, grid, arrays), tuple(values.shape))
        outside = (where < 0) | (where >= n)
        if sub.gathers and bounds == "clip":
            where = where.clip(0, n - 1)
        elif sub.gathers and bounds == "wrap":
            where = where % n   # both libraries' % is non-negative for n > 0
        elif sub.gathers and bounds in ("check", "promise") and ops.any(outside):
            bad = int(where[outside].reshape(-1)[0])
            raise OutOfBoundsError(f"{g.description}: index value {bad} is outside "
                                   f"0..{n - 1} (axis {axis} of {g.wrt})")
        else:   # fill, or a padded affine read: the value read did not come from wrt
            keep = keep & ~outside
        positions.append(where)
    if library is Library.SCATTER_ROWS:
        if framework == JAX:
            return _jax_add_rows(target, g, values, positions, keep)
        _add_rows(target, g, values, positions, keep)
        return target
    return ops.add_at(target, positions, values, keep)


def scatter_entry(target, g: GradientStatement, values, options, framework: str):
    """(the registry's scatter entry for this call, the target's strided view where
    the positions form one, the col2im route where they are not one view): the facts of
    schedule/library.ScatterCall gathered from the arrays' signature (no values)."""
    ranges = {n: options["ranges"][n] for n in g.spec.output_indices}
    view = window = None
    if framework != JAX:      # (JAX's arrays are immutable: no view, no window add)
        view = target_view(target, g, values, ranges)
        if view is None:
            window = scatter_decision(target, g, values, ranges)
    rows = scatters_rows(g, target.shape, values.shape)
    library = scatter_library(ScatterCall(
        view is not None, rows,
        rows and all(options["ranges"][sub.plain_index].start == 0
                     for sub in g.scatter[1:]),
        window is not None and window.route is not WindowScatterRoute.NOT_THIS_FORM),
        framework)
    return library, view, window


def _framework_of_ops(ops) -> str:
    """The framework whose arrays ``ops`` computes on (the library rules' backend)."""
    return JAX if isinstance(ops, _JaxOps) else TORCH if isinstance(ops, _TorchOps) \
        else NUMPY


def _jax_add_rows(target, g: GradientStatement, values, positions, keep):
    """``_add_rows`` on JAX arrays: one index per row (whole rows added, a scatter
    with window dimensions), not one index tuple per element, which XLA and the
    ``ef.jit`` converter both run element by element."""
    import jax.numpy as jnp
    if values.size == 0:    # nothing to add (an empty index array, or rows of width 0)
        return target
    rest = len(g.scatter) - 1
    lead = values.shape[:len(values.shape) - rest]
    count = int(np.prod(lead, dtype=np.int64))
    rows = values.reshape(count, -1).astype(target.dtype)
    where = positions[0][(Ellipsis,) + (0,) * rest].reshape(-1)
    ok = keep[(Ellipsis,) + (0,) * rest].reshape(-1)
    where = jnp.where(ok, where, target.shape[0])      # past the end: dropped
    flat = target.reshape(target.shape[0], -1)
    return flat.at[where].add(rows, mode="drop").reshape(target.shape)


def _add_rows(target: np.ndarray, g: GradientStatement, values: np.ndarray, positions,
              keep) -> None:
    """The embedding-backward shape, ``dW[idx[b], d] += v[b, d]`` (plan/library_patterns
    .scatters_rows): the first axis of the target is scattered, its other axes are the
    values' last axes taken whole.  Rows are added whole
    (:func:`einfuse.backends.c.scatter.scatter_rows`: deterministic, and far faster
    than ``np.add.at`` element by element)."""
    rest = len(g.scatter) - 1
    if values.size == 0:    # nothing to add (an empty index array, or rows of width 0)
        return
    lead = values.shape[:len(values.shape) - rest]
    rows = values.reshape(int(np.prod(lead, dtype=np.int64)), -1)
    where = positions[0][(Ellipsis,) + (0,) * rest].reshape(-1)
    ok = keep[(Ellipsis,) + (0,) * rest].reshape(-1)
    if not ok.all():
        rows, where = rows[ok], where[ok]
    from ..backends.c.scatter import scatter_rows
    scatter_rows(target.reshape(target.shape[0], -1), rows, where)


def _evaluate(ops, sub: IndexExpr, grid, arrays):
    # // and % floor as Python's on NumPy, torch and JAX integers alike
    value = sub.index_value(grid.__getitem__)
    for access, coeff in sub.gathers:
        where = tuple(_evaluate(ops, s, grid, arrays) for s in access.indices)
        value = value + coeff * ops.take(ops.asarray(arrays[access.tensor]), where)
    return value
