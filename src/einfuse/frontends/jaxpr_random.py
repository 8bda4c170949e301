"""Rules for ``jax.random`` with threefry keys (the default): a key array is held as its
uint32 data (one more axis of 2), and ``random_bits``/``random_split``/``random_fold_in``
are converted by tracing JAX's own threefry implementation on that data and inlining the
jaxpr (shifts, xors and adds on uint32), so random numbers drawn in a loop stay in the
kernel and equal JAX's bit for bit."""

from __future__ import annotations

import math

from ..ir import INDEX, Apply, Cast, Const, ScalarType
from .jaxpr_values import Value, scalar_type, unsupported

UINT32 = ScalarType.UINT32


def _threefry():
    try:
        from jax._src.random import threefry2x32 as module
        return module
    except ImportError:   # an older layout
        from jax._src import prng as module
        return module


def _key_data(eqn, key: Value) -> Value:
    if key.dtype is not UINT32 or not key.shape or key.shape[-1] != 2:
        raise unsupported(eqn, "a key that is not a threefry key")
    return key


def _inline(conv, eqn, fn, invals, batch_shape):
    """Convert ``fn`` (of uint32 key data, one key) traced by JAX, vmapped over the key
    array's leading axes, with ``invals`` bound to its arguments."""
    import jax
    for _ in batch_shape:
        fn = jax.vmap(fn)
    structs = [jax.ShapeDtypeStruct(v.shape, v.dtype.numpy) for v in invals]
    closed = jax.make_jaxpr(fn)(*structs)
    from .jaxpr_control import closed_consts
    return conv.run_jaxpr(closed.jaxpr, closed_consts(conv, closed), invals)


def random_wrap(conv, eqn, invals, level):
    if str(eqn.params.get("impl", "fry")).find("fry") < 0 and \
            "threefry" not in str(eqn.params.get("impl")):
        raise unsupported(eqn, f"the PRNG implementation {eqn.params.get('impl')}")
    return [_key_data(eqn, invals[0])]


def random_unwrap(conv, eqn, invals, level):
    return [invals[0]]


def random_bits(conv, eqn, invals, level):
    key = _key_data(eqn, invals[0])
    width, shape = eqn.params["bit_width"], tuple(eqn.params["shape"])
    module = _threefry()
    return _inline(conv, eqn, lambda k: module.threefry_random_bits(k, width, shape),
                   [key], key.shape[:-1])


def random_split(conv, eqn, invals, level):
    key = _key_data(eqn, invals[0])
    shape = tuple(eqn.params["shape"])
    module = _threefry()
    return _inline(conv, eqn, lambda k: module.threefry_split(k, shape), [key],
                   key.shape[:-1])


def random_fold_in(conv, eqn, invals, level):
    key = _key_data(eqn, invals[0])
    module = _threefry()
    return _inline(conv, eqn, lambda k, d: module.threefry_fold_in(k, d), list(invals),
                   key.shape[:-1])


def threefry2x32(conv, eqn, invals, level):
    module = _threefry()
    import jax
    structs = [jax.ShapeDtypeStruct(v.shape, v.dtype.numpy) for v in invals]
    closed = jax.make_jaxpr(lambda *x: list(module._threefry2x32_lowering(
        *x, use_rolled_loops=False)))(*structs)
    from .jaxpr_control import closed_consts
    return conv.run_jaxpr(closed.jaxpr, closed_consts(conv, closed), list(invals))


def iota_2x32_shape(conv, eqn, invals, level):
    """The row-major position of each element as a 64-bit count, in two uint32 words."""
    shape = tuple(int(d) for d in eqn.params["shape"])

    def position(subs):
        total = Const(0, INDEX)
        stride = 1
        for sub, extent in reversed(list(zip(subs, shape))):
            term = sub if stride == 1 else Apply("mul", (sub, Const(stride, INDEX)), INDEX)
            total = term if isinstance(total, Const) and total.value == 0 else \
                Apply("add", (total, term), INDEX)
            stride *= extent
        return total
    if math.prod(shape) >= 2 ** 63:
        raise unsupported(eqn, "more than 2**63 counts")
    high = Value(shape, UINT32, lambda subs: Cast(Apply(
        "shift_right_logical", (position(subs), Const(32, INDEX)), INDEX), UINT32), level, True)
    low = Value(shape, UINT32, lambda subs: Cast(position(subs), UINT32), level, True)
    return [high, low]


def bitcast_convert_type(conv, eqn, invals, level):
    (x,) = invals
    dtype = scalar_type(eqn.outvars[0].aval, eqn)
    if dtype.bits != x.dtype.bits or dtype is ScalarType.BOOL or x.dtype is ScalarType.BOOL:
        raise unsupported(eqn, "a bitcast between types of different widths")
    return [Value(x.shape, dtype, lambda subs: Apply("bitcast", (x.at(subs),), dtype), level,
                  True)]


RULES = {
    "random_wrap": random_wrap, "random_unwrap": random_unwrap, "random_bits": random_bits,
    "random_split": random_split, "random_fold_in": random_fold_in,
    "threefry2x32": threefry2x32, "iota_2x32_shape": iota_2x32_shape,
    "bitcast_convert_type": bitcast_convert_type,
}
