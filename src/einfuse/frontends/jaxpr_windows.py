"""Rules for JAX's window primitives: ``reduce_window_{sum,max,min}`` (pooling),
``conv_general_dilated`` (convolutions, any layout, strides, padding, both dilations,
feature and batch groups) and ``select_and_scatter_add`` (the gradient of max/min
pooling).

Each output element is a reduction over the window: the operand position of window
offset ``k`` for output position ``o`` is ``p = o*stride + k*window_dilation - pad_low``
in the padded and base-dilated operand, which holds an operand element where ``p`` is a
multiple of the base dilation and ``p / base_dilation`` is in range, and the reduction's
identity (padding, dilation holes) elsewhere."""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..ir import INDEX, Apply, Cast, Const, Expr, Index, ReduceOp, Reduction, ScalarType, Select
from .jaxpr_values import index_add, index_mul, scalar_type, unsupported

BOOL = ScalarType.BOOL


def _out(eqn, k=0):
    aval = eqn.outvars[k].aval
    return tuple(int(d) for d in aval.shape), scalar_type(aval, eqn)


def _and(a: Optional[Expr], b: Optional[Expr]) -> Optional[Expr]:
    if a is None:
        return b
    if b is None:
        return a
    return Apply("and", (a, b), BOOL)


def _operand_index(out: Expr, offset: Expr, stride: int, dilation: int, low: int,
                   base: int, extent: int) -> Tuple[Expr, Expr]:
    """(the condition that window ``offset`` of output ``out`` reads an element; that
    element's index, clamped so that a read never leaves the array where it is not
    selected)."""
    position = index_add(index_mul(out, stride), index_mul(offset, dilation),
                         Const(-low, INDEX))
    valid = Apply("ge", (position, Const(0, INDEX)), BOOL)
    valid = _and(valid, Apply("lt", (position, Const((extent - 1) * base + 1, INDEX)), BOOL))
    if base != 1:
        valid = _and(valid, Apply("eq", (Apply("imod", (position, Const(base, INDEX)), INDEX),
                                         Const(0, INDEX)), BOOL))
        position = Apply("idiv", (position, Const(base, INDEX)), INDEX)
    clamped = Apply("min", (Apply("max", (position, Const(0, INDEX)), INDEX),
                            Const(extent - 1, INDEX)), INDEX)
    return valid, clamped


def _identity(op: ReduceOp, dtype: ScalarType, eqn) -> Const:
    if op is ReduceOp.SUM:
        return Const(0, dtype)
    if dtype.is_float:
        return Const(float("-inf") if op is ReduceOp.MAX else float("inf"), dtype)
    if dtype is BOOL:
        raise unsupported(eqn, "on bool")
    info = np.iinfo(dtype.numpy)
    return Const(int(info.min if op is ReduceOp.MAX else info.max), dtype)


def _window_reads(x, out_subs: Sequence[Expr], offsets: Sequence[Expr], params
                  ) -> Tuple[Optional[Expr], Tuple[Expr, ...]]:
    """The condition (None: always) and subscripts of ``x``'s element at window
    ``offsets`` of output ``out_subs``."""
    valid, subs = None, []
    for d, extent in enumerate(x.shape):
        stride, dilation = params.strides[d], params.window_dilation[d]
        low, base = params.padding[d][0], params.base_dilation[d]
        last = (params.out_shape[d] - 1) * stride + (params.window[d] - 1) * dilation - low
        if base == 1 and low <= 0 and last <= extent - 1:   # never outside the operand
            subs.append(index_add(index_mul(out_subs[d], stride),
                                  index_mul(offsets[d], dilation), Const(-low, INDEX)))
            continue
        ok, sub = _operand_index(out_subs[d], offsets[d], stride, dilation, low, base, extent)
        valid = _and(valid, ok)
        subs.append(sub)
    return valid, tuple(subs)


class _WindowParams:
    """A window primitive's parameters, one entry per operand axis."""

    def __init__(self, window, strides, padding, base_dilation, window_dilation, out_shape):
        self.window = tuple(int(n) for n in window)
        self.strides = tuple(int(n) for n in strides)
        self.padding = tuple((int(lo), int(hi)) for lo, hi in padding)
        self.base_dilation = tuple(int(n) for n in base_dilation)
        self.window_dilation = tuple(int(n) for n in window_dilation)
        self.out_shape = tuple(int(n) for n in out_shape)


def _reduce_window(op: ReduceOp):
    def rule(conv, eqn, invals, level):
        (x,) = invals
        shape, dtype = _out(eqn)
        p = eqn.params
        params = _WindowParams(p["window_dimensions"], p["window_strides"], p["padding"],
                               p["base_dilation"], p["window_dilation"], shape)
        if math.prod(params.window) > 1:
            x = conv.cheap(x)
        identity = _identity(op, dtype, eqn)

        def reduction_of(out_subs):
            names = [conv.fresh("w") for _ in params.window]
            valid, subs = _window_reads(x, out_subs, [Index(n) for n in names], params)
            body = x.at(subs)
            if valid is not None:
                body = Select(valid, (identity, body), dtype)
            return Reduction(op, tuple(zip(names, params.window)), body)
        return [conv.reduce_into(shape, dtype, level, reduction_of)]
    return rule


def conv_general_dilated(conv, eqn, invals, level):
    lhs, rhs = invals
    p = eqn.params
    shape, dtype = _out(eqn)
    lhs_spec, rhs_spec, out_spec = p["dimension_numbers"]
    features, batches = int(p["feature_group_count"]), int(p["batch_group_count"])
    spatial = len(lhs_spec) - 2
    lhs, rhs = conv.cheap(lhs), conv.cheap(rhs)
    in_per_group = rhs.shape[rhs_spec[1]]                 # input features a group reads
    out_features = rhs.shape[rhs_spec[0]]
    out_spatial = tuple(shape[out_spec[2 + d]] for d in range(spatial))
    window = tuple(rhs.shape[rhs_spec[2 + d]] for d in range(spatial))
    params = _WindowParams(window, p["window_strides"], p["padding"], p["lhs_dilation"],
                           p["rhs_dilation"], out_spatial)
    spatial_lhs = _SpatialView(lhs, lhs_spec)
    zero = Const(0, dtype)

    def reduction_of(out_subs):
        n, o = out_subs[out_spec[0]], out_subs[out_spec[1]]
        outs = [out_subs[out_spec[2 + d]] for d in range(spatial)]
        feature = conv.fresh("c")
        offsets = [conv.fresh("w") for _ in range(spatial)]
        channel: Expr = Index(feature)
        if features > 1:      # output feature o reads the input features of its group
            group = Apply("idiv", (o, Const(out_features // features, INDEX)), INDEX)
            channel = index_add(index_mul(group, in_per_group), channel)
        batch = n
        if batches > 1:       # output feature o reads the batch elements of its group
            group = Apply("idiv", (o, Const(out_features // batches, INDEX)), INDEX)
            batch = index_add(index_mul(group, shape[out_spec[0]]), n)
        valid, subs = _window_reads(spatial_lhs, outs, [Index(w) for w in offsets], params)
        left = lhs.at(spatial_lhs.full(batch, channel, subs))
        rsubs: List[Expr] = [Const(0, INDEX)] * len(rhs.shape)
        rsubs[rhs_spec[0]], rsubs[rhs_spec[1]] = o, Index(feature)
        for d in range(spatial):
            rsubs[rhs_spec[2 + d]] = Index(offsets[d])
        right = rhs.at(tuple(rsubs))
        left = left if left.dtype is dtype else Cast(left, dtype)
        right = right if right.dtype is dtype else Cast(right, dtype)
        body: Expr = Apply("and" if dtype is BOOL else "mul", (left, right), dtype)
        if valid is not None:
            body = Select(valid, (zero, body), dtype)
        indices = ((feature, in_per_group),) + tuple(zip(offsets, window))
        return Reduction(ReduceOp.OR if dtype is BOOL else ReduceOp.SUM, indices, body)
    return [conv.reduce_into(shape, dtype, level, reduction_of)]


class _SpatialView:
    """An operand seen through its spatial axes (for the window arithmetic), which
    places batch, feature and spatial subscripts back in the operand's own order."""

    def __init__(self, value, spec):
        self.spec = spec
        self.shape = tuple(value.shape[spec[2 + d]] for d in range(len(spec) - 2))

    def full(self, batch: Expr, feature: Expr, spatial: Sequence[Expr]) -> Tuple[Expr, ...]:
        subs: List[Expr] = [Const(0, INDEX)] * (len(self.shape) + 2)
        subs[self.spec[0]], subs[self.spec[1]] = batch, feature
        for d, sub in enumerate(spatial):
            subs[self.spec[2 + d]] = sub
        return tuple(subs)


def select_and_scatter_add(conv, eqn, invals, level):
    """The gradient of max (``ge``) or min (``le``) pooling: each window's cotangent goes
    to the window's first extreme element.  Computed as a gather: the arg-extremum of
    every window first (one buffer), then each operand element sums the cotangents of
    the windows that contain it and chose it."""
    source, operand = invals
    p = eqn.params
    select = getattr(p["select_prim"], "name", str(p["select_prim"]))
    if select not in ("ge", "le", "gt", "lt"):
        raise unsupported(eqn, f"with select_prim={select}")
    op = ReduceOp.ARGMAX if select in ("ge", "gt") else ReduceOp.ARGMIN
    if select in ("gt", "lt"):
        raise unsupported(eqn, f"with select_prim={select} (the last extreme element)")
    shape, dtype = _out(eqn)
    rank = len(operand.shape)
    params = _WindowParams(p["window_dimensions"], p["window_strides"], p["padding"],
                           (1,) * rank, (1,) * rank, source.shape)
    operand = conv.cheap(operand)
    extreme = ReduceOp.MAX if op is ReduceOp.ARGMAX else ReduceOp.MIN
    identity = _identity(extreme, operand.dtype, eqn)

    def choice_of(out_subs):
        names = [conv.fresh("w") for _ in params.window]
        valid, subs = _window_reads(operand, out_subs, [Index(n) for n in names], params)
        body = operand.at(subs)
        if valid is not None:
            body = Select(valid, (identity, body), operand.dtype)
        return Reduction(op, tuple(zip(names, params.window)), body)
    chosen = conv.reduce_into(source.shape, ScalarType.INT64, level, choice_of)
    source = conv.cheap(source)
    zero = Const(0, dtype)

    def gathered(subs):
        # windows w holding operand position q at offset k: w = (q + low - k) / stride
        offsets = [conv.fresh("k") for _ in params.window]
        valid, windows, flat = None, [], None
        for d, q in enumerate(subs):
            stride, low = params.strides[d], params.padding[d][0]
            size, count = params.window[d], source.shape[d]
            at = index_add(q, Const(low, INDEX), index_mul(Index(offsets[d]), -1))
            ok = _and(Apply("ge", (at, Const(0, INDEX)), BOOL),
                      Apply("lt", (at, Const(count * stride, INDEX)), BOOL))
            if stride != 1:
                ok = _and(ok, Apply("eq", (Apply("imod", (at, Const(stride, INDEX)), INDEX),
                                           Const(0, INDEX)), BOOL))
                at = Apply("idiv", (at, Const(stride, INDEX)), INDEX)
            if size == 1 and stride == 1 and low == 0 and count == operand.shape[d]:
                ok = None
            windows.append(Apply("min", (Apply("max", (at, Const(0, INDEX)), INDEX),
                                         Const(count - 1, INDEX)), INDEX))
            valid = _and(valid, ok)
            flat = Index(offsets[d]) if flat is None else \
                index_add(index_mul(flat, size), Index(offsets[d]))
        picked = Apply("eq", (chosen.at(tuple(windows)), Cast(flat, ScalarType.INT64)), BOOL)
        valid = _and(valid, picked)
        body = Select(valid, (zero, source.at(tuple(windows))), dtype)
        return Reduction(ReduceOp.SUM, tuple(zip(offsets, params.window)), body)
    return [conv.reduce_into(shape, dtype, level, gathered)]


RULES = {
    "reduce_window_sum": _reduce_window(ReduceOp.SUM),
    "reduce_window_max": _reduce_window(ReduceOp.MAX),
    "reduce_window_min": _reduce_window(ReduceOp.MIN),
    "conv_general_dilated": conv_general_dilated,
    "select_and_scatter_add": select_and_scatter_add,
}
