"""Front ends that turn other notations into einfuse statements and programs."""

from .einops import EinopsPlan, plan_einops
from .einsum import EinsumPlan, plan_einsum

__all__ = ["EinopsPlan", "EinsumPlan", "einsum", "plan_einops", "plan_einsum", "rearrange",
           "reduce", "repeat"]
