"""Statements on JAX values run by the C backend's fusion groups: each group that the
schedule forms for a NumPy caller's arrays of the same shapes and dtypes
(schedule/fusion.py) is one XLA custom call running that group's fused kernel
(backends/c/fused_xla.py, through the ef.jit handler), every other statement its own
einfuse primitive (runtime/jax_adapter.py) as before.  A program's backward under
``jax.grad`` (runtime/jax_program.py) runs this way: a layernorm's backward is the
kernels of a NumPy caller's backward, with their bits; so does its forward under a
transformation, where a softmax's or layernorm's group runs its merged loop nests (the
hand-written row kernel of a NumPy caller takes no XLA buffers).

Where the groups are not used -- another backend, no C compiler or no ``jax.ffi``,
arrays on a GPU, values batched by ``vmap`` (a statement batches as a statement with
one more index; a group's custom call would run once per batch element) -- and for a
group its custom call cannot take (fused_xla's reasons), the statements run one by one
as their own primitives, exactly as without this module.

The custom call itself is still batched correctly where a transformation applied after
tracing batches it (``vmap`` of a jitted gradient): once per batch element
(``vmap_method="sequential"``)."""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from typing import Dict, Optional, Sequence, Set

import jax
import jax.numpy as jnp
import numpy as np

from ..backends.c import build as c_build
from ..errors import BackendError
from ..backends.c.fused_xla import Declined, XlaGroup, trampoline, xla_group
from ..backends.c.jit_ffi import library_location, register, registered_token
from ..schedule.fusion import bound_group, last_read_positions, worth_fusing
from . import jax_gpu
from .jit_ffi import handler_library
from .run_groups import run_statements

TARGET = "einfuse_group"     # the ef.jit handler, under a target name of its own

_lock = threading.Lock()
_held: Dict[int, tuple] = {}    # token -> (identity, the group whose constants it reads)
# how many group custom calls were emitted (tests count them against the statements)
emitted = [0]


def run_kernels(kernels: Sequence, env: Dict[str, object], keep: Optional[Set[str]]) -> None:
    """run_statements(kernels, env, "jax", keep) with the groups described above."""
    stand = _stand_ins(kernels, env)
    if stand is None or not worth_fusing(kernels, stand, "numpy"):
        run_statements(kernels, env, "jax", keep=keep)
        return
    last_reads = last_read_positions(kernels)
    position = 0
    while position < len(kernels):
        ran = 0
        if len(kernels) - position >= 2:
            ran = _try_group(kernels, position, env, stand, keep, last_reads)
        if ran:
            position += ran
            continue
        kernel = kernels[position]
        run_statements([kernel], env, "jax")
        stand[kernel.spec.output] = _stand_in(env[kernel.spec.output])
        position += 1


def _stand_ins(kernels, env) -> Optional[Dict[str, object]]:
    """NumPy stand-ins (zeros of each JAX value's shape and dtype; numbers as they are)
    for binding the groups, or None where the groups are not used."""
    if any(k.options.backend not in ("auto", "c") for k in kernels):
        return None
    values = list(env.values())
    if any(_batched(v) for v in values):
        return None
    if jax_gpu.jax_triton_installed() and jax_gpu.on_gpu(
            [v for v in values if isinstance(v, (jax.Array, jax.core.Tracer))]):
        return None
    if jax.default_backend() != "cpu" or not hasattr(getattr(jax, "ffi", None), "ffi_call"):
        return None
    if c_build.find_compiler() is None:
        return None
    return {name: _stand_in(value) for name, value in env.items()}


def _batched(value) -> bool:
    """Whether ``value`` is batched by ``vmap`` (its tracer: JAX keeps the class in
    jax._src only)."""
    return isinstance(value, jax.core.Tracer) and type(value).__name__ == "BatchTracer"


def _stand_in(value):
    # (an eager backward's constants may come as NumPy subclasses of JAX's own)
    if isinstance(value, (jax.Array, jax.core.Tracer, np.ndarray)):
        return np.zeros(np.shape(value), np.dtype(value.dtype))
    return value


def _try_group(kernels, start: int, env, stand, keep, last_reads) -> int:
    """Run the group starting at ``start`` as one custom call; the statements it ran
    (0: none)."""
    group = bound_group(kernels, start, stand, keep, last_reads)
    if group is None:
        return 0
    if group.row_kernel is not None:
        # a softmax's or layernorm's hand-written row kernel takes no XLA buffers: the
        # group's merged loop nests, one custom call still (the values are the
        # statements' up to rounding, as the row kernel's are)
        group = dataclasses.replace(group, row_kernel=None)
    try:
        found = xla_group(group, stand)
    except BackendError:    # (the merged nests cannot hold the group's column sums)
        return 0
    if isinstance(found, Declined):
        return 0
    token = _registered(found)
    if token is None:
        return 0
    operands = [jnp.asarray(env[o.key]).astype(o.dtype).reshape(o.shape)
                for o in found.operands]
    shapes = [jax.ShapeDtypeStruct(shape, dtype) for dtype, shape in found.results]
    results = jax.ffi.ffi_call(TARGET, shapes, vmap_method="sequential")(
        *operands, token=np.int64(token))
    emitted[0] += 1
    keys = group.outputs
    for out in found.delivered:
        if out.member not in group.inside:
            env[keys[out.member]] = results[out.index]
            stand[keys[out.member]] = np.zeros(out.shape, out.dtype)
    for column in found.columns:
        total = _column_total(column, results[column.sums], results[column.errors])
        env[keys[column.member]] = total
        stand[keys[column.member]] = np.zeros(column.shape, column.working)
    return group.statements


def _column_total(column, sums, errors):
    """backends/c/fused.column_total in XLA's additions (each one rounded as NumPy's):
    each slice's sum, its compensation added back where finite, added in slice order."""
    sums, errors = sums[:, :column.size], errors[:, :column.size]
    if sums.dtype != np.dtype(column.working):      # wide sums: added up, rounded once
        total = sums[0]
        for row in range(1, sums.shape[0]):
            total = total + sums[row]
        return total.astype(column.working).reshape(column.shape)
    totals = jnp.where(jnp.isfinite(sums), sums + errors, sums)
    total = totals[0]
    for row in range(1, totals.shape[0]):
        total = total + totals[row]
    return total.reshape(column.shape)


def _registered(found: XlaGroup) -> Optional[int]:
    """The handler's token for this group's kernel and constants (registered once), or
    None where the handler cannot be had."""
    try:
        library = handler_library(TARGET)
    except (c_build.CompileError, ValueError, OSError):
        return None
    entry = trampoline()
    identity = (library_location(found.function), found.layout,
                tuple(hashlib.sha256(c.tobytes()).hexdigest() for c in found.constants))
    # (the constants the record points at live as long as the group _held keeps)
    return registered_token(
        identity, found, _held, _lock,
        lambda token, kept: register(
            library, token, entry, kept.layout, kept.constant_addresses(),
            "einfuse: a fused group's kernel raised its error flag", ("group",) + identity))


__all__ = ["TARGET", "emitted", "run_kernels"]
