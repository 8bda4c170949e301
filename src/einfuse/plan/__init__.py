"""Planning: a Spec and its dtypes to the loop-nest IR (see :mod:`einfuse.plan.lower`)."""

from .lower import Plan, call_arguments, plan_for, unit_axis
from .slots import buffer_slots

__all__ = ["Plan", "buffer_slots", "call_arguments", "plan_for", "unit_axis"]
