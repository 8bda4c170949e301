"""Running a plan on JAX arrays: one ``jax.shard_map`` over the mesh whose body runs, on
every device, each statement's einfuse kernel on its local blocks (the einfuse JAX
primitive of runtime/jax_adapter.py) and the plan's moves as JAX collectives
(``psum``/``pmax``/``pmin``, ``psum_scatter``, ``all_gather``, ``all_to_all``) or local
slices (``axis_index`` and ``dynamic_slice``).  The whole is jitted, so it runs on its
own and inside ``jax.jit``.

Imported only when a sharded computation is called (it imports JAX)."""

from __future__ import annotations

import functools
from typing import Tuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from ..errors import OptionError
from .layout import Move, MoveKind, Placement
from .mesh import MeshShape, mesh_shape
from .multiprocess import failure, spans_processes
from .planner import ShardPlan, StatementPlan


def build_function(plan: ShardPlan, kernels, user_mesh, mesh_info: MeshShape, scalars,
                   constants):
    """The jitted shard_map that runs ``plan``: inputs are the plan's tensors in order,
    then the JAX scalars named in ``scalars``; Python numbers are ``constants``."""
    mesh = jax_mesh(user_mesh, mesh_info)
    inputs = tuple(name for name, _ in plan.inputs)

    def local(*arrays):
        env = {(name, place): value for (name, place), value in
               zip(plan.inputs, arrays[:len(inputs)])}
        params = dict(zip(scalars, arrays[len(inputs):]), **constants)
        for step in plan.steps:
            if isinstance(step, StatementPlan):
                kernel = kernels[step.number - 1]
                named = {name: env[(name, place)] for name, place in step.reads}
                named.update((p, params[p]) for p in kernel.spec.params)
                env[(step.output, step.output_placement)] = kernel(**named)
            else:
                env[(step.tensor, step.target)] = apply_move(
                    step, env[(step.tensor, step.source)], mesh_info)
        return tuple(env[key] for key in plan.outputs)

    in_specs = tuple(partition_spec(p) for _, p in plan.inputs) + \
        tuple(PartitionSpec() for _ in scalars)
    out_specs = tuple(partition_spec(p) for _, p in plan.outputs)
    # check_vma=False: the einfuse primitive does not track which mesh axes its
    # result varies over; the plan itself says where every value is replicated
    mapped = jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                           check_vma=False)
    return jax.jit(mapped)


def run_eager_checked(function, arrays, unsharded, source):
    """``function(*arrays)``; on an eager call (no tracer among ``arrays``) it waits for
    the result, and where a kernel failed on a device (an index out of range under
    ``bounds="check"``: a JaxRuntimeError naming a position in that device's block)
    runs ``unsharded()``, which raises the EinfuseError naming the global position.
    Global arrays of a multi-process job cannot be rerun whole (multiprocess.py)."""
    if any(isinstance(a, jax.core.Tracer) for a in arrays):
        return function(*arrays)
    try:
        results = function(*arrays)
        jax.block_until_ready(results)
    except jax.errors.JaxRuntimeError as error:
        if spans_processes(arrays):
            raise failure(error, source) from error
        unsharded()           # the einfuse error, as the unsharded call raises it
        raise                 # not an einfuse error: JAX's own
    return results


def run_whole(compiled, plan: ShardPlan, values, user_mesh, mesh_info: MeshShape):
    """``compiled`` run unsharded on ``values`` (inputs with no elements, which a
    shard_map does not compile), each result placed on the mesh as ``plan`` leaves it."""
    mesh = jax_mesh(user_mesh, mesh_info)
    results = compiled(**values)
    results = results if isinstance(results, tuple) else (results,)
    return tuple(jax.lax.with_sharding_constraint(
        result, NamedSharding(mesh, partition_spec(place)))
        for result, (_, place) in zip(results, plan.outputs))


def partition_spec(place: Placement) -> PartitionSpec:
    return PartitionSpec(*(None if not axes else axes[0] if len(axes) == 1 else axes
                           for axes in place.layout))


@functools.lru_cache(maxsize=32)
def _mesh_from_sizes(axes: Tuple[Tuple[str, int], ...]) -> Mesh:
    shape = MeshShape(axes)
    devices = jax.devices()
    if len(devices) < shape.size():
        raise OptionError(
            f"mesh {shape} needs {shape.size()} devices and JAX sees {len(devices)}; pass a "
            "jax.sharding.Mesh, or on a CPU set XLA_FLAGS="
            f"--xla_force_host_platform_device_count={shape.size()} before importing jax")
    import numpy as np
    grid = np.array(devices[:shape.size()], dtype=object).reshape(
        tuple(size for _, size in axes))
    return Mesh(grid, shape.names, axis_types=(AxisType.Auto,) * len(axes))


def jax_mesh(mesh, info: MeshShape) -> Mesh:
    """A ``Mesh`` with Auto axes (shard_map's in_specs then place the inputs), on the
    caller's devices; a dict mesh takes the first devices JAX lists."""
    if isinstance(mesh, Mesh):
        if all(t == AxisType.Auto for t in mesh.axis_types):
            return mesh
        return Mesh(mesh.devices, mesh.axis_names,
                    axis_types=(AxisType.Auto,) * len(mesh.axis_names))
    if not hasattr(mesh, "items"):
        mesh_shape(mesh)     # its error
    return _mesh_from_sizes(info.axes)


def apply_move(move: Move, value, mesh: MeshShape):
    axes = move.mesh_axes
    name = axes[0] if len(axes) == 1 else axes
    if move.kind is MoveKind.ALL_REDUCE:
        reduce = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}[move.op]
        return reduce(value, name)
    if move.kind is MoveKind.REDUCE_SCATTER:
        return lax.psum_scatter(value, name, scatter_dimension=move.axis, tiled=True)
    if move.kind is MoveKind.ALL_GATHER:
        return lax.all_gather(value, name, axis=move.axis, tiled=True)
    if move.kind is MoveKind.ALL_TO_ALL:
        return lax.all_to_all(value, name, split_axis=move.axis, concat_axis=move.other_axis,
                              tiled=True)
    # a local slice: this device's block, the first mesh axis the major one
    position = jnp.int32(0)
    for axis in axes:
        position = position * mesh.size((axis,)) + lax.axis_index(axis)
    block = move.result_shape[move.axis]
    return lax.dynamic_slice_in_dim(value, position * block, block, axis=move.axis)
