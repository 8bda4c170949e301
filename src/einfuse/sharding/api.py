"""The seam between the public API (``ef.explain``, ``ef.compile``, ``ef.ein`` with
``mesh=``/``shard=``) and the planner: the statements of a compiled Kernel or Program,
their global shapes, and the plan for an assignment (given, default or searched)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, replace
from typing import Dict, Mapping, Optional, Tuple


from ..analysis.frameworks import has_dtensor
from ..errors import EinfuseError, OptionError, attach_statement
from ..lang.ast import accesses
from .cost import CostModel
from .memory import memory_limit
from .mesh import Assignment, MeshShape, assignment_from, mesh_shape
from .planner import ShardPlan, bind_statements, plan_program
from .search import SearchResult, search

AUTO = "auto"


@dataclass(frozen=True)
class Statements:
    """A Kernel or Program seen as a sequence of statements."""
    kernels: Tuple[object, ...]
    texts: Tuple[str, ...]
    inputs: Tuple[str, ...]
    outputs: Tuple[str, ...]
    source: str
    params: Tuple[str, ...]

    @property
    def indices(self) -> Tuple[str, ...]:
        seen = {}
        for kernel in self.kernels:
            for index in kernel.spec.all_indices:
                seen.setdefault(index)
        return tuple(seen)


def statements_of(compiled) -> Statements:
    from ..program import Program
    if isinstance(compiled, Program):
        kernels = tuple(s.kernel for s in compiled.statements)
        texts = tuple(s.source.text for s in compiled.statements)
        params = tuple(dict.fromkeys(p for k in kernels for p in k.spec.params))
        return Statements(kernels, texts, compiled.inputs, compiled.outputs,
                          compiled.source, params)
    spec = compiled.spec
    return Statements((compiled,), (compiled.statement,), spec.arg_order, (spec.output,),
                      compiled.statement, spec.params)


@dataclass(frozen=True)
class Choice:
    """The plan chosen and the search that ranked the alternatives."""
    plan: ShardPlan
    how: str                     # "given", "default" or "auto"
    search: Optional[SearchResult]       # None where alternatives were not asked for


def check_options(mesh, shard) -> MeshShape:
    if mesh is None:
        raise OptionError("shard= needs mesh= (a jax.sharding.Mesh or a dict of axis sizes)")
    shape = mesh_shape(mesh)
    if isinstance(shard, str) and shard != AUTO:
        raise OptionError(f"shard= takes a dict of index -> mesh axis, 'auto' or None, not "
                          f"{shard!r}")
    return shape


def choose(program: Statements, values: Mapping[str, object], mesh: MeshShape, shard,
           model: CostModel, rank: bool = True, narrow: bool = True) -> Choice:
    """The plan for ``shard`` (a dict, None for the default, or "auto") and, with
    ``rank`` or for "auto", the ranked alternatives, for inputs of these shapes
    (``values``: arrays or placeholders); ``narrow``: dtypes as JAX runs them
    (planner.run_dtype), not for torch."""
    try:
        bound, shapes = bind_statements(program.kernels, program.texts, values, narrow)
    except EinfuseError as error:
        raise attach_statement(error, program.source) from None

    def build(assignment: Assignment) -> ShardPlan:
        return plan_program(bound, shapes, program.outputs, mesh, assignment,
                            program.source)

    try:
        if shard == AUTO:
            found = search(program.indices, mesh, build, model)
            return Choice(found.best.plan, AUTO, found)
        plan = build(assignment_from(shard, program.indices, mesh))
        found = search(program.indices, mesh, build, model) if rank else None
        return Choice(plan, "default" if shard is None else "given", found)
    except EinfuseError as error:
        raise attach_statement(error, program.source) from None


def shape_values(values: Mapping[str, object]) -> dict:
    """Arrays (of any framework, traced ones too) as read-only placeholders of their
    shapes and dtypes; numbers as they are."""
    from ..analysis.frameworks import placeholder
    return {name: value if isinstance(value, numbers.Number) else placeholder(value)
            for name, value in values.items()}


def shard_of_inputs(program: Statements, values, mesh: MeshShape) -> dict:
    """index -> mesh axes, read off the DTensor inputs' ``Shard`` placements: the index
    a statement's first read of the input subscripts at that tensor axis (an index or
    mesh axis already taken is left as it is; the run redistributes that input)."""
    found: Dict[str, Tuple[str, ...]] = {}
    taken = set()
    for kernel in program.kernels:
        for access in accesses(kernel.spec.rhs):
            per_axis: Dict[int, list] = {}
            for m, place in enumerate(getattr(values.get(access.tensor), "placements", ())
                                      if has_dtensor((values.get(access.tensor),), {})
                                      else ()):
                if place.is_shard():
                    per_axis.setdefault(place.dim, []).append(mesh.names[m])
            for axis, axes in per_axis.items():
                index = access.indices[axis].plain_index if axis < len(access.indices) \
                    else None
                if index is None or index in found or taken & set(axes):
                    continue
                found[index] = tuple(axes)
                taken |= set(axes)
    return found


def with_memory(model: CostModel, memory, mesh) -> CostModel:
    """``model`` with the per-device memory of ``memory=`` (which wins), else its own,
    else the mesh's devices' own (memory.py)."""
    if memory is None and model.memory_per_device is not None:
        return model
    return replace(model, memory_per_device=memory_limit(memory, mesh))


__all__ = ["AUTO", "Choice", "Statements", "check_options", "choose", "shard_of_inputs",
           "shape_values", "statements_of", "with_memory"]
