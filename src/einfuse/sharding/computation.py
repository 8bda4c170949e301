"""A statement or program compiled for a device mesh (``ef.compile(..., mesh=,
shard=)``): it checks the call, plans for the arrays' shapes (cached per shapes and
dtypes) and hands the plan to execute.py, which imports JAX, only for JAX arrays."""

from __future__ import annotations

import numbers
from typing import Dict, Tuple

from ..errors import EinfuseError, EinfuseTypeError, attach_statement
from ..analysis.frameworks import JAX, framework_of
from .api import check_options, choose, shape_values, statements_of, with_memory
from .cost import CostModel
from .dtensor import DTensorRun, any_dtensor, is_device_mesh
from .memory import check_fits
from .mesh import MeshShape
from .planner import ShardPlan


CACHED_FUNCTIONS = 32      # compiled functions kept per sharded computation (LRU)


class ShardedComputation:
    """A statement or program compiled for a device mesh: call it with JAX arrays (by
    keyword, or positionally in the order of ``inputs``); the result is the unsharded
    result, laid out on the mesh as the plan leaves it (``plan(...)`` shows it)."""

    def __init__(self, compiled, mesh, shard, memory=None):
        self.compiled = compiled
        self.program = statements_of(compiled)
        self.mesh_info: MeshShape = check_options(mesh, shard)
        self.mesh = mesh
        self.shard = shard
        self.memory = memory
        self.model = with_memory(CostModel(), memory, mesh)
        if shard is not None and not isinstance(shard, str):   # its errors now, not later
            from .mesh import assignment_from
            try:
                assignment_from(shard, self.program.indices, self.mesh_info)
            except EinfuseError as error:
                raise attach_statement(error, self.program.source) from None
        self._plans: Dict[Tuple, ShardPlan] = {}
        self._functions: Dict[Tuple, object] = {}
        self._dtensor_run = None        # for DTensor inputs (dtensor.py)

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
        if is_device_mesh(self.mesh) or any_dtensor(values.values()):
            if self._dtensor_run is None:
                self._dtensor_run = DTensorRun(self.compiled, self.mesh, self.shard,
                                               self.memory)
            return self._dtensor_run(values)
        for name, value in values.items():
            if not isinstance(value, numbers.Number) and framework_of(value) != JAX:
                raise attach_statement(EinfuseTypeError(
                    f"mesh= runs on JAX arrays (jax.shard_map) and torch DTensors, but "
                    f"{name} is a {type(value).__module__}.{type(value).__name__}; pass "
                    f"jnp.asarray({name}), or call without mesh="), self.program.source)
        plan = self._plan_for(shape_values(values))
        tensors = tuple(name for name, _ in plan.inputs)
        scalars = tuple(name for name in self.program.params
                        if not isinstance(values[name], numbers.Number))
        numbers_key = tuple((n, values[n]) for n in self.program.params if n not in scalars)
        if any(getattr(values[n], "size", 1) == 0 for n in tensors):
            # XLA (jax 0.10) fails to compile a shard_map whose operands all have no
            # elements; such a result is computed whole and placed as the plan says
            from .execute import run_whole
            results = run_whole(self.compiled, plan, values, self.mesh, self.mesh_info)
            return results[0] if len(results) == 1 else tuple(results)
        key = (plan, scalars, numbers_key)
        function = self._functions.pop(key, None)
        if function is None:
            from .execute import build_function
            function = build_function(plan, self.program.kernels, self.mesh,
                                      self.mesh_info, scalars, dict(numbers_key))
        self._functions[key] = function       # the most recently used last
        while len(self._functions) > CACHED_FUNCTIONS:
            # Python numbers are compiled in: a loop over many values must not keep a
            # compiled function for each
            self._functions.pop(next(iter(self._functions)))
        from .execute import run_eager_checked
        results = run_eager_checked(function, tuple(values[n] for n in tensors + scalars),
                                    lambda: self.compiled(**values),
                                    self.program.source)
        return results[0] if len(results) == 1 else tuple(results)

    def _named(self, args, kwargs) -> dict:
        from ..program import Program
        try:
            if isinstance(self.compiled, Program):
                return self.compiled._named(args, kwargs, None)
            from ..analysis.binding import bind_names
            return bind_names(self.compiled.spec, args, kwargs)
        except EinfuseError as error:
            raise attach_statement(error, self.program.source) from None

    def _plan_for(self, values) -> ShardPlan:
        key = tuple((n, getattr(v, "shape", None), str(getattr(v, "dtype", type(v))))
                    for n, v in sorted(values.items()))
        plan = self._plans.get(key)
        if plan is None:
            plan = choose(self.program, values, self.mesh_info, self.shard, self.model,
                          rank=False).plan
            try:
                check_fits(plan, self.model.memory_per_device)
            except EinfuseError as error:
                raise attach_statement(error, self.program.source) from None
            self._plans[key] = plan
        return plan
