"""Planning: a Spec and its dtypes to the loop-nest IR (see :mod:`einfuse.plan.lower`)."""

from .arguments import call_arguments, unit_axis
from .lower import Plan, plan_for
from .slots import buffer_slots

__all__ = ["Plan", "buffer_slots", "call_arguments", "plan_for", "unit_axis"]
