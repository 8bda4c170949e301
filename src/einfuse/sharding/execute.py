"""Running a plan on JAX arrays: one ``jax.shard_map`` over the mesh whose body runs, on
every device, each statement's einfuse kernel on its local blocks (the einfuse JAX
primitive of runtime/jax_adapter.py) and the plan's moves as JAX collectives
(``psum``/``pmax``/``pmin``, ``psum_scatter``, ``all_gather``, ``all_to_all``) or local
slices (``axis_index`` and ``dynamic_slice``).  The whole is jitted, so it runs on its
own and inside ``jax.jit``.

Imported only when a sharded computation is called (it imports JAX)."""

from __future__ import annotations

import functools
import numbers
from typing import Dict, Tuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, Mesh, PartitionSpec

from ..errors import EinfuseError, EinfuseTypeError, OptionError, attach_statement
from ..runtime.frameworks import JAX, framework_of
from .api import check_options, choose, shape_values, statements_of
from .cost import CostModel
from .layout import Move, MoveKind, Placement
from .mesh import MeshShape, mesh_shape
from .planner import ShardPlan, StatementPlan


class ShardedComputation:
    """A statement or program compiled for a device mesh: call it with JAX arrays (by
    keyword, or positionally in the order of ``inputs``); the result is the unsharded
    result, laid out on the mesh as the plan leaves it (``plan(...)`` shows it)."""

    def __init__(self, compiled, mesh, shard):
        self.compiled = compiled
        self.program = statements_of(compiled)
        self.mesh_info: MeshShape = check_options(mesh, shard)
        self.mesh = mesh
        self.shard = shard
        self._plans: Dict[Tuple, ShardPlan] = {}
        self._functions: Dict[Tuple, object] = {}

    @property
    def inputs(self) -> Tuple[str, ...]:
        return self.program.inputs

    def __repr__(self) -> str:
        return (f"<einfuse sharded on {self.mesh_info} | shard={self.shard!r} | takes "
                f"{', '.join(self.inputs)} | returns {', '.join(self.program.outputs)}>")

    def plan(self, /, *args, **arrays) -> ShardPlan:
        """The plan for these arrays (or any objects with their shapes and dtypes)."""
        values = self._named(args, arrays)
        return self._plan_for(shape_values(values))

    def __call__(self, /, *args, arrays=None, **kwargs):
        if arrays is not None:
            kwargs = {**kwargs, **arrays}
        values = self._named(args, kwargs)
        for name, value in values.items():
            if not isinstance(value, numbers.Number) and framework_of(value) != JAX:
                raise attach_statement(EinfuseTypeError(
                    f"mesh= runs on JAX arrays (jax.shard_map), but {name} is a "
                    f"{type(value).__module__}.{type(value).__name__}; pass "
                    f"jnp.asarray({name}), or call without mesh="), self.program.source)
        plan = self._plan_for(shape_values(values))
        tensors = tuple(name for name, _ in plan.inputs)
        scalars = tuple(name for name in self.program.params
                        if not isinstance(values[name], numbers.Number))
        numbers_key = tuple((n, values[n]) for n in self.program.params if n not in scalars)
        key = (plan, scalars, numbers_key)
        function = self._functions.get(key)
        if function is None:
            function = self._functions[key] = self._build(plan, scalars, dict(numbers_key))
        results = function(*(values[n] for n in tensors + scalars))
        return results[0] if len(results) == 1 else tuple(results)

    def _named(self, args, kwargs) -> dict:
        from ..program import Program
        try:
            if isinstance(self.compiled, Program):
                return self.compiled._named(args, kwargs, None)
            from ..runtime.binding import bind_names
            return bind_names(self.compiled.spec, args, kwargs)
        except EinfuseError as error:
            raise attach_statement(error, self.program.source) from None

    def _plan_for(self, values) -> ShardPlan:
        key = tuple((n, getattr(v, "shape", None), str(getattr(v, "dtype", type(v))))
                    for n, v in sorted(values.items()))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = choose(self.program, values, self.mesh_info,
                                             self.shard, CostModel()).plan
        return plan

    def _build(self, plan: ShardPlan, scalars, constants):
        mesh = jax_mesh(self.mesh, self.mesh_info)
        kernels = self.program.kernels
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
                        step, env[(step.tensor, step.source)], self.mesh_info)
            return tuple(env[key] for key in plan.outputs)

        in_specs = tuple(partition_spec(p) for _, p in plan.inputs) + \
            tuple(PartitionSpec() for _ in scalars)
        out_specs = tuple(partition_spec(p) for _, p in plan.outputs)
        # check_vma=False: the einfuse primitive does not track which mesh axes its
        # result varies over; the plan itself says where every value is replicated
        mapped = jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                               check_vma=False)
        return jax.jit(mapped)


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
