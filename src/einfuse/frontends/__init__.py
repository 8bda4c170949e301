"""Front ends that turn other notations into einfuse statements and programs."""

from .einsum import EinsumPlan, einsum, plan_einsum

__all__ = ["EinsumPlan", "einsum", "plan_einsum"]
