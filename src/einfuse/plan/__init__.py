"""Planning: a Spec and its dtypes to the loop-nest IR (see :mod:`einfuse.plan.lower`)."""

from .lower import Plan, buffer_slots, call_arguments, plan_for, unit_axis

__all__ = ["Plan", "buffer_slots", "call_arguments", "plan_for", "unit_axis"]
