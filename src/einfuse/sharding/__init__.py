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
