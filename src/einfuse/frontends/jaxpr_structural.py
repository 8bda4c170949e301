"""Rules for primitives that move, select, gather or reduce elements: each maps an
output element's subscripts to the operand's (so a chain of them stays one expression),
or materialises a reduction."""

from __future__ import annotations

import math
from typing import Tuple

from ..ir import (INDEX, Apply, Cast, Const, Expr, Index, ReduceOp, Reduction, ScalarType,
                  ScatterAdd, Select)
from .jaxpr_values import Value, as_index, index_add, index_mul, read_value, scalar_type, unsupported

BOOL = ScalarType.BOOL


def _out(eqn, k=0):
    aval = eqn.outvars[k].aval
    return tuple(int(d) for d in aval.shape), scalar_type(aval, eqn)


def _moved(x: Value, shape, level, subs_of, compound=None) -> Value:
    """A value whose element at ``subs`` is ``x``'s at ``subs_of(subs)``."""
    return Value(tuple(shape), x.dtype, lambda subs: x.at(subs_of(tuple(subs))), level,
                 x.compound if compound is None else compound)


def _imin(a: Expr, b: Expr) -> Expr:
    return Apply("min", (a, b), INDEX)


def _imax(a: Expr, b: Expr) -> Expr:
    return Apply("max", (a, b), INDEX)


def _lt(a: Expr, b: Expr) -> Expr:
    return Apply("lt", (a, b), BOOL)


def _and(a: Expr, b: Expr) -> Expr:
    return Apply("and", (a, b), BOOL)


def broadcast_in_dim(conv, eqn, invals, level):
    x = invals[0]
    if len(invals) > 1:
        raise unsupported(eqn, "dynamic shapes")
    shape, _ = _out(eqn)
    dims = eqn.params["broadcast_dimensions"]
    if math.prod(shape) > x.size:
        x = conv.cheap(x)

    def subs_of(subs):
        return tuple(Const(0, INDEX) if x.shape[k] == 1 and shape[d] != 1 else subs[d]
                     for k, d in enumerate(dims))
    return [_moved(x, shape, level, subs_of)]


def reshape(conv, eqn, invals, level):
    x = invals[0]
    if len(invals) > 1:
        raise unsupported(eqn, "dynamic shapes")
    shape, _ = _out(eqn)
    dims = eqn.params.get("dimensions")
    if dims is None:
        return [_moved(x, shape, level, lambda subs: _reshaped(subs, shape, x.shape))]
    # a transposing reshape (grouped convolutions' gradients): transpose by ``dims``,
    # then reshape row-major
    dims = tuple(int(d) for d in dims)
    transposed = tuple(x.shape[d] for d in dims)

    def subs_of(subs):
        out = [None] * len(dims)
        for sub, d in zip(_reshaped(subs, shape, transposed), dims):
            out[d] = sub
        return tuple(out)
    return [_moved(x, shape, level, subs_of)]


def _reshaped(subs, shape, old_shape) -> Tuple[Expr, ...]:
    """The operand subscripts of a row-major reshape from ``old_shape`` to ``shape``:
    axes of size 1 are dropped and added without arithmetic; where the remaining axes
    agree one to one they map directly; else through the linear position."""
    kept = [(s, n) for s, n in zip(subs, shape) if n != 1]
    old_kept = [n for n in old_shape if n != 1]
    if [n for _, n in kept] == old_kept:
        it = iter(s for s, _ in kept)
        return tuple(Const(0, INDEX) if n == 1 else next(it) for n in old_shape)
    linear = Const(0, INDEX)
    stride = 1
    for sub, extent in reversed(list(zip(subs, shape))):
        linear = index_add(linear, index_mul(sub, stride))
        stride *= extent
    out = []
    stride = 1
    for extent in reversed(old_shape):
        part = linear if stride == 1 else Apply("idiv", (linear, Const(stride, INDEX)), INDEX)
        if extent == 1:
            out.append(Const(0, INDEX))
        else:
            out.append(Apply("imod", (part, Const(extent, INDEX)), INDEX))
        stride *= extent
    return tuple(reversed(out))


def transpose(conv, eqn, invals, level):
    (x,) = invals
    perm = eqn.params["permutation"]
    shape, _ = _out(eqn)

    def subs_of(subs):
        out = [None] * len(perm)
        for j, k in enumerate(perm):
            out[k] = subs[j]
        return tuple(out)
    return [_moved(x, shape, level, subs_of)]


def squeeze(conv, eqn, invals, level):
    (x,) = invals
    shape, _ = _out(eqn)
    dims = {d % len(x.shape) for d in eqn.params["dimensions"]}

    def subs_of(subs):
        it = iter(subs)
        return tuple(Const(0, INDEX) if k in dims else next(it) for k in range(len(x.shape)))
    return [_moved(x, shape, level, subs_of)]


def expand_dims(conv, eqn, invals, level):
    (x,) = invals
    shape, _ = _out(eqn)
    dims = set(eqn.params["dimensions"])
    return [_moved(x, shape, level,
                   lambda subs: tuple(s for k, s in enumerate(subs) if k not in dims))]


def rev(conv, eqn, invals, level):
    (x,) = invals
    dims = set(eqn.params["dimensions"])
    return [_moved(x, x.shape, level, lambda subs: tuple(
        index_add(Const(x.shape[k] - 1, INDEX), index_mul(s, -1)) if k in dims else s
        for k, s in enumerate(subs)))]


def slice_rule(conv, eqn, invals, level):
    (x,) = invals
    shape, _ = _out(eqn)
    starts = eqn.params["start_indices"]
    strides = eqn.params["strides"] or (1,) * len(starts)
    return [_moved(x, shape, level, lambda subs: tuple(
        index_add(index_mul(s, st), Const(b, INDEX))
        for s, b, st in zip(subs, starts, strides)))]


def _clamped_starts(conv, starts, sizes, dims):
    """Dynamic start values clamped to ``0 .. dim - size`` as XLA does."""
    out = []
    for start, size, dim in zip(starts, sizes, dims):
        start = conv.cheap(start)
        node = as_index(start.at(()))
        out.append(_imin(_imax(node, Const(0, INDEX)), Const(dim - size, INDEX)))
    return out


def dynamic_slice(conv, eqn, invals, level):
    x, *starts = invals
    sizes = eqn.params["slice_sizes"]
    if len(starts) != len(x.shape):
        raise unsupported(eqn, "dynamic shapes")
    shape, _ = _out(eqn)
    x = conv.cheap(x) if x.compound else x
    clamped = _clamped_starts(conv, starts, sizes, x.shape)
    return [_moved(x, shape, level, lambda subs: tuple(
        index_add(c, s) for c, s in zip(clamped, subs)))]


def dynamic_update_slice(conv, eqn, invals, level):
    x, update, *starts = invals
    shape, dtype = _out(eqn)
    clamped = _clamped_starts(conv, starts, update.shape, x.shape)

    def at(subs):
        inside = None
        for sub, start, size in zip(subs, clamped, update.shape):
            offset = index_add(sub, index_mul(start, -1))
            ok = _and(Apply("ge", (offset, Const(0, INDEX)), BOOL),
                      _lt(offset, Const(size, INDEX)))
            inside = ok if inside is None else _and(inside, ok)
        inner = tuple(index_add(s, index_mul(c, -1)) for s, c in zip(subs, clamped))
        if inside is None:
            return update.at(())
        return Select(inside, (x.at(subs), update.at(inner)), dtype)
    return [Value(shape, dtype, at, level, True)]


def concatenate(conv, eqn, invals, level):
    dim = eqn.params["dimension"]
    shape, dtype = _out(eqn)
    offsets = []
    total = 0
    for v in invals:
        offsets.append(total)
        total += v.shape[dim]

    def at(subs):
        def piece(k):
            moved = list(subs)
            moved[dim] = index_add(subs[dim], Const(-offsets[k], INDEX))
            return invals[k].at(tuple(moved))
        result = piece(len(invals) - 1)
        for k in range(len(invals) - 2, -1, -1):
            result = Select(_lt(subs[dim], Const(offsets[k + 1], INDEX)),
                            (result, piece(k)), dtype)
        return result
    return [Value(shape, dtype, at, level, True)]


def pad(conv, eqn, invals, level):
    x, fill = invals
    shape, dtype = _out(eqn)
    config = eqn.params["padding_config"]

    def at(subs):
        valid = None
        inner = []
        for sub, (low, _high, interior), extent in zip(subs, config, x.shape):
            position = index_add(sub, Const(-low, INDEX))
            step = interior + 1
            ok = _and(Apply("ge", (position, Const(0, INDEX)), BOOL),
                      _lt(position, Const((extent - 1) * step + 1, INDEX)))
            if step != 1:
                ok = _and(ok, Apply("eq", (Apply("imod", (position, Const(step, INDEX)), INDEX),
                                           Const(0, INDEX)), BOOL))
                position = Apply("idiv", (position, Const(step, INDEX)), INDEX)
            # clamp so that the read stays in the array even where it is not selected
            inner.append(_imin(_imax(position, Const(0, INDEX)), Const(extent - 1, INDEX)))
            valid = ok if valid is None else _and(valid, ok)
        if valid is None:
            return x.at(())
        return Select(valid, (fill.at(()), x.at(tuple(inner))), dtype)
    if any(n == 0 for n in x.shape):   # nothing to place: every element is the fill
        return [Value(shape, dtype, lambda subs: fill.at(()), level, fill.compound)]
    return [Value(shape, dtype, at, level, True)]


def iota(conv, eqn, invals, level):
    shape, dtype = _out(eqn)
    dim = eqn.params["dimension"]
    return [Value(shape, dtype, lambda subs: Cast(subs[dim], dtype), level, True)]


def empty(conv, eqn, invals, level):
    """``lax.empty`` / ``empty2``: an array whose contents are unspecified.  JAX's
    gradients of ``cond`` and ``scan`` make one for residuals a branch never writes;
    XLA's CPU lowering fills it with zeros, and so does this (a constant)."""
    shape, dtype = _out(eqn)
    zero = False if dtype is BOOL else 0.0 if dtype.is_float else 0
    return [Value(shape, dtype, lambda subs: Const(zero, dtype), level, False)]


def platform_index(conv, eqn, invals, level):
    """``lax.platform_dependent``'s branch number (``jnp.diag`` uses one): einfuse's kernels
    run on the CPU, so the CPU's branch, else the default one (``None`` in ``platforms``),
    as a constant; the ``cond`` that follows then picks that branch."""
    shape, dtype = _out(eqn)
    platforms = eqn.params["platforms"]
    chosen = next((k for k, names in enumerate(platforms)
                   if names is not None and "cpu" in names), None)
    if chosen is None:
        chosen = next((k for k, names in enumerate(platforms) if names is None), None)
    if chosen is None:
        raise unsupported(eqn, f"no branch for the CPU among {platforms}")
    return [Value(shape, dtype, lambda subs: Const(chosen, dtype), level, False)]


def tile(conv, eqn, invals, level):
    (x,) = invals
    shape, _ = _out(eqn)
    if math.prod(shape) > x.size:
        x = conv.cheap(x)
    return [_moved(x, shape, level, lambda subs: tuple(
        s if n == extent else Apply("imod", (s, Const(n, INDEX)), INDEX)
        for s, n, extent in zip(subs, x.shape, shape)))]


def split(conv, eqn, invals, level):
    (x,) = invals
    axis = eqn.params["axis"]
    outs = []
    start = 0
    for k, size in enumerate(eqn.params["sizes"]):
        shape, _ = _out(eqn, k)

        def subs_of(subs, start=start):
            moved = list(subs)
            moved[axis] = index_add(subs[axis], Const(start, INDEX))
            return tuple(moved)
        outs.append(_moved(x, shape, level, subs_of))
        start += int(size)
    return outs


def unstack(conv, eqn, invals, level):
    """``lax`` unstack (iterating over an array, ``k1, k2 = key``: jax 0.11's threefry
    split): one result per position along ``axis``, that axis removed."""
    (x,) = invals
    axis = int(eqn.params["axis"])
    outs = []
    for k in range(len(eqn.outvars)):
        shape, _ = _out(eqn, k)

        def subs_of(subs, k=k):
            return tuple(subs[:axis]) + (Const(k, INDEX),) + tuple(subs[axis:])
        outs.append(_moved(x, shape, level, subs_of))
    return outs


def stack(conv, eqn, invals, level):
    """``jnp.stack``: the operands side by side along a new ``axis``."""
    axis = eqn.params["axis"]
    shape, dtype = _out(eqn)

    def at(subs):
        rest = tuple(s for k, s in enumerate(subs) if k != axis)
        result = invals[-1].at(rest)
        for k in range(len(invals) - 2, -1, -1):
            result = Select(Apply("eq", (subs[axis], Const(k, INDEX)), BOOL),
                            (result, invals[k].at(rest)), dtype)
        return result
    return [Value(shape, dtype, at, level, True)]


def _cumulative(op: ReduceOp):
    def rule(conv, eqn, invals, level):
        """``out[.., i, ..] = op over k <= i`` (``k >= i`` reversed) as a masked
        reduction over the whole axis: O(n^2) along the axis, exact in order."""
        (x,) = invals
        x = conv.cheap(x)
        shape, dtype = _out(eqn)
        axis = eqn.params["axis"]
        reverse = eqn.params.get("reverse", False)
        identity = {ReduceOp.SUM: 0, ReduceOp.PROD: 1}.get(op)
        if identity is None:
            import numpy as np
            if dtype.is_float:
                identity = float("-inf") if op is ReduceOp.MAX else float("inf")
            elif dtype is BOOL:
                identity = op is ReduceOp.MIN
            else:
                info = np.iinfo(dtype.numpy)
                identity = int(info.min if op is ReduceOp.MAX else info.max)
        neutral = Const(identity, dtype)

        def reduction_of(out_subs):
            name = conv.fresh("r")
            k = Index(name)
            subs = list(out_subs)
            subs[axis] = k
            inside = Apply("ge" if reverse else "le", (k, out_subs[axis]), BOOL)
            body = Select(inside, (neutral, x.at(tuple(subs))), dtype)
            return Reduction(op, ((name, x.shape[axis]),), body)
        return [conv.reduce_into(shape, dtype, level, reduction_of)]
    return rule


# -- reductions -----------------------------------------------------------------------------
def _reduction(op: ReduceOp):
    def rule(conv, eqn, invals, level):
        (x,) = invals
        shape, dtype = _out(eqn)
        axes = tuple(a % max(1, len(x.shape)) for a in eqn.params["axes"])
        if op in (ReduceOp.ARGMAX, ReduceOp.ARGMIN) and not x.dtype.is_float and \
                x.dtype is not BOOL and not x.dtype.is_signed_int and \
                not x.dtype.is_unsigned_int:
            raise unsupported(eqn, f"on {x.dtype.value}")

        def reduction_of(out_subs):
            names = {a: conv.fresh("r") for a in axes}
            it = iter(out_subs)
            subs = tuple(Index(names[k]) if k in names else next(it)
                         for k in range(len(x.shape)))
            return Reduction(op, tuple((names[a], x.shape[a]) for a in axes), x.at(subs))
        return [conv.reduce_into(shape, dtype, level, reduction_of)]
    return rule


def dot_general(conv, eqn, invals, level):
    lhs, rhs = invals
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    shape, dtype = _out(eqn)
    lfree = [d for d in range(len(lhs.shape)) if d not in lc and d not in lb]
    rfree = [d for d in range(len(rhs.shape)) if d not in rc and d not in rb]
    if math.prod(rhs.shape[d] for d in rfree) > 1:
        lhs = conv.cheap(lhs)
    if math.prod(lhs.shape[d] for d in lfree) > 1:
        rhs = conv.cheap(rhs)

    def operands(out_subs, contract):
        nb = len(lb)
        lsubs = [None] * len(lhs.shape)
        rsubs = [None] * len(rhs.shape)
        for k, (a, b) in enumerate(zip(lb, rb)):
            lsubs[a] = rsubs[b] = out_subs[k]
        for k, d in enumerate(lfree):
            lsubs[d] = out_subs[nb + k]
        for k, d in enumerate(rfree):
            rsubs[d] = out_subs[nb + len(lfree) + k]
        for k, (a, b) in enumerate(zip(lc, rc)):
            lsubs[a] = rsubs[b] = contract[k]
        left, right = lhs.at(tuple(lsubs)), rhs.at(tuple(rsubs))
        if left.dtype is not dtype:
            left = Cast(left, dtype)
        if right.dtype is not dtype:
            right = Cast(right, dtype)
        return Apply("and" if dtype is BOOL else "mul", (left, right), dtype)

    if not lc:   # an outer (or batched elementwise) product: nothing to sum
        return [Value(shape, dtype, lambda subs: operands(subs, ()), level, True)]

    def reduction_of(out_subs):
        names = [conv.fresh("r") for _ in lc]
        body = operands(out_subs, tuple(Index(n) for n in names))
        return Reduction(ReduceOp.OR if dtype is BOOL else ReduceOp.SUM,
                         tuple((n, lhs.shape[a]) for n, a in zip(names, lc)), body)
    return [conv.reduce_into(shape, dtype, level, reduction_of)]


# -- gather and scatter-add -------------------------------------------------------------------
def _mode(eqn) -> str:
    mode = eqn.params.get("mode")
    name = getattr(mode, "name", str(mode))
    if "CLIP" in name or "PROMISE" in name:
        return "clip"          # XLA clamps gather starts; a promise is clamped too
    if "FILL" in name:
        return "fill"
    raise unsupported(eqn, f"mode {name}")


def _fill_value(dtype: ScalarType, given):
    if given is not None:
        return given
    if dtype.is_float:
        return float("nan")
    if dtype is BOOL:
        return True
    import numpy as np
    info = np.iinfo(dtype.numpy)
    return int(info.min) if dtype.is_signed_int else int(info.max)


def gather(conv, eqn, invals, level):
    operand, indices = invals
    operand = conv.cheap(operand)
    indices = conv.cheap(indices)
    dn = eqn.params["dimension_numbers"]
    sizes = eqn.params["slice_sizes"]
    shape, dtype = _out(eqn)
    mode = _mode(eqn)
    offset_dims = tuple(dn.offset_dims)
    collapsed = set(dn.collapsed_slice_dims)
    start_map = tuple(dn.start_index_map)
    op_batch = tuple(getattr(dn, "operand_batching_dims", ()))
    idx_batch = tuple(getattr(dn, "start_indices_batching_dims", ()))
    window_dims = [d for d in range(len(operand.shape)) if d not in collapsed and
                   d not in op_batch]
    fill = Const(_fill_value(dtype, eqn.params.get("fill_value")), dtype)

    def at(subs):
        batch_subs = [s for k, s in enumerate(subs) if k not in offset_dims]
        offsets = [subs[k] for k in offset_dims]

        def index_entry(j):   # start_indices[batch..., j]
            return as_index(indices.at(tuple(batch_subs) + (Const(j, INDEX),)))
        full = [Const(0, INDEX)] * len(operand.shape)
        valid = None
        for j, d in enumerate(start_map):
            start = index_entry(j)
            limit = operand.shape[d] - sizes[d]
            if mode == "clip":
                full[d] = _imin(_imax(start, Const(0, INDEX)), Const(limit, INDEX))
            else:
                ok = _and(Apply("ge", (start, Const(0, INDEX)), BOOL),
                          Apply("le", (start, Const(limit, INDEX)), BOOL))
                valid = ok if valid is None else _and(valid, ok)
                full[d] = _imin(_imax(start, Const(0, INDEX)), Const(max(limit, 0), INDEX))
        for d, b in zip(op_batch, idx_batch):
            full[d] = batch_subs[b]
        for d, off in zip(window_dims, offsets):
            full[d] = index_add(full[d], off)
        value = operand.at(tuple(full))
        if valid is None:
            return value
        return Select(valid, (fill, value), dtype)
    if len(indices.shape) - 1 != len(shape) - len(offset_dims):
        raise unsupported(eqn, "an index_vector_dim other than the last")
    return [Value(shape, dtype, at, level, True)]


def scatter(conv, eqn, invals, level):
    """``x.at[i].set(v)``: as scatter-add, each update replacing the element (with
    repeated indices the last in row-major order wins; XLA leaves that order open)."""
    return scatter_add(conv, eqn, invals, level, replace=True)


def scatter_add(conv, eqn, invals, level, replace: bool = False):
    operand, indices, updates = invals
    dn = eqn.params["dimension_numbers"]
    shape, dtype = _out(eqn)
    # XLA's scatter skips an update whose window leaves the operand; only an explicit
    # clip mode clamps (a promise of in-bounds indices gets XLA's behaviour)
    mode = "clip" if "CLIP" in getattr(eqn.params.get("mode"), "name", "") else "drop"
    if eqn.params.get("update_consts"):
        raise unsupported(eqn, "a combiner with constants")
    window = tuple(dn.update_window_dims)
    inserted = set(dn.inserted_window_dims)
    to_operand = tuple(dn.scatter_dims_to_operand_dims)
    op_batch = tuple(getattr(dn, "operand_batching_dims", ()))
    idx_batch = tuple(getattr(dn, "scatter_indices_batching_dims", ()))
    indices = conv.cheap(indices)
    result = conv.new_buffer(shape, dtype)
    conv.write(result.name, (), operand, level)
    names = conv.index_names(updates.shape)
    subs = tuple(Index(n) for n, _ in names)
    scatter_subs = [s for k, s in enumerate(subs) if k not in window]
    window_subs = [subs[k] for k in window]
    window_operand_dims = [d for d in range(len(shape)) if d not in inserted and
                           d not in op_batch]
    window_sizes = [updates.shape[k] for k in window]
    full = [Const(0, INDEX)] * len(shape)
    valid = Const(True, BOOL)
    for j, d in enumerate(to_operand):
        start = as_index(indices.at(tuple(scatter_subs) + (Const(j, INDEX),)))
        size = window_sizes[window_operand_dims.index(d)] if d in window_operand_dims else 1
        limit = shape[d] - size
        if mode == "clip":
            start = _imin(_imax(start, Const(0, INDEX)), Const(limit, INDEX))
        else:   # XLA skips an update whose window leaves the operand
            valid = _and(valid, _and(Apply("ge", (start, Const(0, INDEX)), BOOL),
                                     Apply("le", (start, Const(limit, INDEX)), BOOL)))
        full[d] = start
    for d, b in zip(op_batch, idx_batch):
        full[d] = scatter_subs[b]
    for d, w in zip(window_operand_dims, window_subs):
        full[d] = index_add(full[d], w)
    conv.emit(level, ScatterAdd(result.name, names, tuple(full), valid, updates.at(subs),
                                origin=conv.origin(), replace=replace))
    return [read_value(result, level)]


RULES = {
    "broadcast_in_dim": broadcast_in_dim, "reshape": reshape, "transpose": transpose,
    "squeeze": squeeze, "expand_dims": expand_dims, "rev": rev, "slice": slice_rule,
    "dynamic_slice": dynamic_slice, "dynamic_update_slice": dynamic_update_slice,
    "concatenate": concatenate, "pad": pad, "iota": iota, "platform_index": platform_index,
    "empty": empty, "empty2": empty,
    "reduce_sum": _reduction(ReduceOp.SUM), "reduce_prod": _reduction(ReduceOp.PROD),
    "reduce_max": _reduction(ReduceOp.MAX), "reduce_min": _reduction(ReduceOp.MIN),
    "reduce_and": _reduction(ReduceOp.AND), "reduce_or": _reduction(ReduceOp.OR),
    "argmax": _reduction(ReduceOp.ARGMAX), "argmin": _reduction(ReduceOp.ARGMIN),
    "tile": tile, "split": split, "stack": stack, "unstack": unstack, "cumsum": _cumulative(ReduceOp.SUM),
    "cumprod": _cumulative(ReduceOp.PROD), "cummax": _cumulative(ReduceOp.MAX),
    "cummin": _cumulative(ReduceOp.MIN),
    "dot_general": dot_general, "gather": gather, "scatter-add": scatter_add,
    "scatter_add": scatter_add, "scatter": scatter,
}
