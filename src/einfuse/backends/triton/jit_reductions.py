"""The reductions of the Triton jit renderer (backends/triton/jit_render.py) that pick
points rather than fold values: ``argmax``/``argmin`` over a statement's reduced axes,
and scatter-adds into a register tensor.

* argmax/argmin: the first position (row-major over the reduced indices, as the IR
  counts it) of the extreme value; where a NaN is present, the first NaN (NumPy's and
  JAX's rule).  The extreme and "is there a NaN" are reduced with the reduced axes
  kept, then the smallest position that holds the answer is the result.
* scatter-add ``buffer[target] += value where valid`` over a nest: every point and every
  element of the buffer meet in one tile (nest axes, then buffer axes), the element a
  point targets takes its value, and the sum over the nest's axes is added to the
  buffer -- each element gets the sum of exactly the values aimed at it (in another
  order than a sequential loop: floating sums may differ in the last bits).  Into a
  buffer in memory it is one ``tl.atomic_add`` (float32/64, int32/64).  A scatter whose
  last write wins (``replace``) takes, per element, the value of the last point aimed
  at it (into a register tensor; in memory it is declined)."""

from __future__ import annotations

from ...ir import ReduceOp, ScalarType, ScatterAdd
from .jit_lanes import output_mask
from .jit_ops import TL_TYPE, Declined, int_literal, where_text


def _keep(axes, line_value: str, reducer: str) -> str:
    """``reducer`` over each of ``axes`` with the axes kept (size 1)."""
    for axis in axes:
        line_value = f"{reducer}({line_value}, {axis}, keep_dims=True)"
    return line_value


def arg_reduction(renderer, reduction, value: str, nest, reduced) -> None:
    """``value`` := argmax/argmin of ``reduction.body`` over the nest positions
    ``reduced`` (the position counted row-major over the reduction's indices, in the
    order the reduction lists them)."""
    body_type = reduction.body.dtype
    names = [n for n, _ in reduction.indices]
    axes = sorted(reduced)
    emit, fresh = renderer.emit, renderer.fresh
    emit(f"{value} = tl.broadcast_to({renderer.expr(reduction.body, nest)}, {nest.shape})")
    if body_type is ScalarType.BOOL:
        emit(f"{value} = {value}.to(tl.int8)")
    padding = [f"(n_{n} < {nest.axes[n][1]})" for n in names
               if nest.axes[n][1] != nest.axes[n][2]]
    valid = fresh("a")
    emit(f"{valid} = tl.broadcast_to({' & '.join(padding) if padding else 'tl.full((), 1, tl.int1)'}"
         f", {nest.shape})")
    position, stride = [], 1
    for n in reversed(names):
        position.append(f"n_{n}" if stride == 1 else f"n_{n} * {stride}")
        stride *= nest.axes[n][1]
    where = fresh("a")
    emit(f"{where} = tl.broadcast_to({' + '.join(reversed(position)) or '0'}, {nest.shape})")
    high = reduction.op is ReduceOp.ARGMAX
    extreme, reducer = ("tl.max" if high else "tl.min"), ("tl.max" if high else "tl.min")
    hit = fresh("a")
    if body_type.is_float:
        nan = fresh("a")
        emit(f"{nan} = ({value} != {value}) & {valid}")
        any_nan = _keep(axes, f"{nan}.to(tl.int8)", "tl.max")
        clean = fresh("a")
        fill = 'float("-inf")' if high else 'float("inf")'
        emit(f"{clean} = tl.where({valid} & ({value} == {value}), {value}, {fill})")
        best = _keep(axes, clean, extreme)
        emit(f"{hit} = tl.where({any_nan} != 0, {nan}, {valid} & ({clean} == {best}))")
    else:
        import numpy as np
        info = np.iinfo(np.int8 if body_type is ScalarType.BOOL else body_type.numpy)
        clean = fresh("a")
        emit(f"{clean} = tl.where({valid}, {value}, "
             f"{int_literal(info.min if high else info.max)})")
        emit(f"{hit} = {valid} & ({clean} == {_keep(axes, clean, reducer)})")
    emit(f"{value} = tl.where({hit}, {where}, {stride})")
    for axis in reversed(axes):
        emit(f"{value} = tl.min({value}, {axis})")


def scatter_add(renderer, step: ScatterAdd) -> None:
    """``step`` into its register tensor (see the module's docstring)."""
    if step.buffer in renderer.memory:
        memory_scatter_add(renderer, step)
        return
    buffer = renderer.program.buffer(step.buffer)
    if buffer.dtype is ScalarType.BOOL or step.buffer in renderer.inputs:
        raise Declined(f"a scatter-add{where_text(step.origin)} into {step.buffer}")
    shape = renderer.padded_shape(step.buffer)
    if len(step.target) != len(shape):
        raise Declined(f"a scatter-add{where_text(step.origin)} with {len(step.target)} "
                       "target subscripts")
    renderer.emit(f"# {step.origin[:150]!s}".replace("\n", " "))
    nest = renderer.open_nest(step.indices)
    q, m = nest.rank, len(shape)
    full = tuple(nest.shape) + tuple(shape)
    renderer.tile(full)

    def spread(node) -> str:
        text = renderer.expr(node, nest)
        if q == 0 or renderer.is_scalar(node, nest) or not m:
            return f"({text})"
        return f"({text})[{', '.join([':'] * q + ['None'] * m)}]"
    conditions = [f"({spread(step.valid)} != 0)"]
    for k, target in enumerate(step.target):
        lane = f"tl.arange(0, {shape[k]}).to(tl.int64)"
        if len(full) > 1:
            lane += "[" + ", ".join(":" if a == q + k else "None" for a in range(len(full))) + "]"
        conditions.append(f"({lane} == {spread(target)})")
    for name, (position, extent, size) in nest.axes.items():
        if extent != size:
            lane = f"n_{name}" if not m else f"n_{name}[{', '.join([':'] * q + ['None'] * m)}]"
            conditions.append(f"({lane} < {extent})")
    added = renderer.fresh("c")
    dtype = TL_TYPE[buffer.dtype]
    if step.replace:
        _last_write(renderer, step, nest, full, " & ".join(conditions), spread)
        return
    renderer.emit(f"{added} = tl.where({' & '.join(conditions)}, "
                  f"({spread(step.value)}).to({dtype}), 0)")
    renderer.emit(f"{added} = tl.broadcast_to({added}, {full})" if full else
                  f"{added} = {added}")
    for _ in range(q):
        renderer.emit(f"{added} = tl.sum({added}, 0)")
    target = renderer.register(step.buffer)
    renderer.emit(f"{target} = ({target} + {added}).to({dtype})")


def _last_write(renderer, step: ScatterAdd, nest, full, condition: str, spread) -> None:
    """``buffer[target] = value`` where the last point (row-major over the nest, as a
    sequential loop writes) aimed at an element wins: the largest position aimed at each
    element, then the value of the point at it; elements no point aims at keep theirs."""
    q = nest.rank
    emit, fresh = renderer.emit, renderer.fresh
    dtype = TL_TYPE[renderer.program.buffer(step.buffer).dtype]
    terms, stride = [], 1
    for name in reversed(list(nest.axes)):
        terms.append(f"n_{name}" if stride == 1 else f"n_{name} * {stride}")
        stride *= nest.axes[name][1]
    hit, position, last, chosen = fresh("c"), fresh("c"), fresh("c"), fresh("c")
    emit(f"{hit} = tl.broadcast_to({condition}, {full})" if full else f"{hit} = {condition}")
    spread_position = " + ".join(reversed(terms)) or "0"
    if q and len(full) > q:
        spread_position = f"({spread_position})[{', '.join([':'] * q + ['None'] * (len(full) - q))}]"
    emit(f"{position} = tl.broadcast_to({spread_position}, {full})" if full else
         f"{position} = 0")
    emit(f"{last} = tl.where({hit}, {position}, -1)")
    for _ in range(q):
        emit(f"{last} = tl.max({last}, 0)")
    # the largest position again over the nest's axes (nothing to spread: no nest, or a
    # scalar target)
    again = f"{last}[{', '.join(['None'] * q + [':'] * (len(full) - q))}]" \
        if q and len(full) > q else last
    emit(f"{chosen} = tl.where({hit} & ({position} == {again}), "
         f"({spread(step.value)}).to({dtype}), 0)")
    for _ in range(q):
        emit(f"{chosen} = tl.sum({chosen}, 0)")
    target = renderer.register(step.buffer)
    emit(f"{target} = tl.where({last} >= 0, ({chosen}).to({dtype}), {target})")


ATOMIC_TYPES = (ScalarType.FLOAT32, ScalarType.FLOAT64, ScalarType.INT32, ScalarType.INT64)


def memory_scatter_add(renderer, step: ScatterAdd) -> None:
    """``step`` into a buffer in memory: one ``tl.atomic_add`` of the nest's values at
    their targets (points aimed at one element add up whatever the order; a target out
    of range adds nothing), between barriers as every store to memory is."""
    buffer = renderer.program.buffer(step.buffer)
    if step.replace:
        raise Declined(f"a scatter{where_text(step.origin)} whose last write wins, into a "
                       "buffer in memory, has no Triton rendering yet")
    if buffer.dtype not in ATOMIC_TYPES:
        raise Declined(f"a scatter-add{where_text(step.origin)} into {buffer.dtype.value} "
                       "memory (no atomic add of that type)")
    shape = renderer.shape_of(step.buffer)
    if len(step.target) != len(shape):
        raise Declined(f"a scatter-add{where_text(step.origin)} with {len(step.target)} "
                       "target subscripts")
    renderer.emit(f"# {step.origin[:150]!s}".replace("\n", " "))
    nest = renderer.open_nest(step.indices)
    tile = tuple(nest.shape) or (1,)
    zero = f"tl.zeros({tile}, tl.int64)"
    # every condition a tile (the interpreter takes no mask made of a scalar)
    valid = f"(({zero} + ({renderer.expr(step.valid, nest)}).to(tl.int64)) != 0)"
    offsets, conditions, stride = [], [valid], 1
    for axis in range(len(shape) - 1, -1, -1):
        target, extent = step.target[axis], shape[axis]
        position = renderer.fresh("o")
        renderer.emit(f"{position} = {zero} + {renderer.expr(target, nest)}")
        conditions.append(f"({position} >= 0) & ({position} < {extent})")
        if axis == 0 and output_mask(renderer, step.buffer, position) is not None:
            conditions.append(output_mask(renderer, step.buffer, position))
        offsets.append(position if stride == 1 else f"{position} * {stride}")
        stride *= extent
    for name, (_, extent, size) in nest.axes.items():
        if extent != size:
            conditions.append(f"({zero} + n_{name} < {extent})")
    dtype = TL_TYPE[buffer.dtype]
    value = renderer.fresh("c")
    renderer.emit(f"{value} = tl.broadcast_to(({renderer.expr(step.value, nest)}).to({dtype}), "
                  f"{tile})")
    renderer.emit("tl.debug_barrier()")
    renderer.emit(f"tl.atomic_add({renderer.pointer(step.buffer)} + "
                  f"{' + '.join(reversed(offsets)) or zero}, {value}, "
                  f"mask={' & '.join(conditions)})")
    renderer.emit("tl.debug_barrier()")


__all__ = ["ATOMIC_TYPES", "arg_reduction", "memory_scatter_add", "scatter_add"]
