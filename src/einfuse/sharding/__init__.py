"""Sharding on a device mesh (programs.md section 4): explain what an assignment of
indices to mesh axes costs, search for the cheapest, and run it on JAX's SPMD
machinery (``jax.shard_map``).  JAX is imported only to run on JAX arrays."""

from .cost import CostModel, PlanCost
from .layout import Move, MoveKind, Pending, Placement
from .mesh import Assignment, MeshShape
from .planner import ShardPlan, StatementPlan

__all__ = ["Assignment", "CostModel", "MeshShape", "Move", "MoveKind", "Pending",
           "PlanCost", "Placement", "ShardPlan", "StatementPlan", "sharded"]


def sharded(compiled, mesh, shard, memory=None):
    """``compiled`` (a Kernel or Program) run on ``mesh`` with ``shard``, each device
    holding at most ``memory`` bytes (memory.py)."""
    from .api import check_options
    from .computation import ShardedComputation
    check_options(mesh, shard)
    return ShardedComputation(compiled, mesh, shard, memory)


def explain_sharded(compiled, args, arrays, shapes, mesh, shard, cost_model=None,
                    extras=False, memory=None):
    """``ef.explain`` with ``mesh=``; ``extras``: gradients= or source= was asked for,
    which the sharded explanation does not show."""
    from ..errors import OptionError, attach_statement
    from .api import explain_sharded as explain
    if extras:
        source = getattr(compiled, "source", None)
        raise attach_statement(OptionError(
            "explain with mesh= shows the plan on the mesh, not gradients= or source=; "
            "ask for those without mesh="), source if isinstance(source, str)
            else compiled.statement)
    return explain(compiled, args, arrays, shapes, mesh, shard, cost_model, memory)
