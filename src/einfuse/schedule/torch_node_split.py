"""Whether a call's C++ node plan (schedule/torch_node_plan.py decided it runs as the
node) also runs under torch.compile, where its forward and backward are two custom
operators (program/torch_compiled_fused.py) and what passes between them is what the
forward operator returns: the outputs, then the intermediates the Python path keeps,
each a contiguous tensor of the shape and dtype its fake kernel declared.  The node's
halves run apart only where those tensors are exactly the slots its backward reads.
Decides; runs nothing."""

from __future__ import annotations

from dataclasses import dataclass

from .rule_chain import needs
from .torch_node_plan import NodeEligibility, eligibility


@dataclass(frozen=True)
class SplitFacts:
    """What runtime/torch_node.split_plan found of one translated call."""
    named: bool           # every output and kept intermediate is an array the forward names
    fresh: bool           # ... each made by the forward, no two in one slot
    declared: bool        # ... each of the layout the operator declares (contiguous,
                          # its shape and dtype)
    reads_covered: bool   # every forward array the backward reads is passed or returned
    gradients_apart: bool  # no two gradients in one slot


_SPLIT_RULES = (
    needs("named", "an output or kept intermediate the node's forward does not name"),
    needs("fresh", "an output or kept intermediate that is not an array of its own"),
    needs("declared", "an output or kept intermediate of another layout than the "
                      "operator declares"),
    needs("reads_covered", "the backward reads a forward array the operator does not "
                           "return"),
    needs("gradients_apart", "two gradients in one array"),
)


def split_eligibility(facts: SplitFacts) -> NodeEligibility:
    """Eligible, or the first rule the call fails."""
    return eligibility(_SPLIT_RULES, facts)
