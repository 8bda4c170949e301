"""Decisions that are a chain of rules over a frozen value of facts: each rule one fact
that must hold (or must not), with the reason the decision gives where it does not; the
first rule that fails decides.  One evaluator, so that a chain is its table -- the
order of the rules is the order of the reasons a caller may see -- and not a column
of ``if`` statements written again for every decision (schedule/torch_node_plan.py,
schedule/torch_node_split.py).  Decides; runs nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class Rule:
    """``fact``: a field of the facts; the rule holds where its truth is ``wanted``
    (False: a fact whose presence declines, a scalar parameter's say)."""
    fact: str
    reason: str
    wanted: bool = True


def needs(fact: str, reason: str) -> Rule:
    """A rule that fails where ``fact`` is false."""
    return Rule(fact, reason, True)


def refuses(fact: str, reason: str) -> Rule:
    """A rule that fails where ``fact`` is true."""
    return Rule(fact, reason, False)


def first_failed(rules: Sequence[Rule], facts) -> Optional[str]:
    """The reason of the first rule in ``rules`` that ``facts`` fail, or None."""
    for rule in rules:
        if bool(getattr(facts, rule.fact)) != rule.wanted:
            return rule.reason
    return None
