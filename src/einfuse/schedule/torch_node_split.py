"""Whether a call's C++ node plan (schedule/torch_node_plan.py decided it runs as the
node) also runs under torch.compile, where its forward and backward are two custom
operators (program/torch_compiled_fused.py) and what passes between them is what the
forward operator returns: the outputs, then the intermediates the Python path keeps,
each a contiguous tensor of the shape and dtype its fake kernel declared.  The node's
halves run apart only where those tensors are exactly the slots its backward reads.
Decides; runs nothing."""

from __future__ import annotations

from dataclasses import dataclass

from .torch_node_plan import ELIGIBLE, NodeEligibility


@dataclass(frozen=True)
class SplitFacts:
    """What runtime/torch_node.split_plan found of one translated call."""
    named: bool           # every output and kept intermediate is an array the forward names
    fresh: bool           # ... each made by the forward, no two in one slot
    declared: bool        # ... each of the layout the operator declares (contiguous,
                          # its shape and dtype)
    reads_covered: bool   # every forward array the backward reads is passed or returned
    gradients_apart: bool  # no two gradients in one slot


def split_eligibility(facts: SplitFacts) -> NodeEligibility:
    """Eligible, or the first rule the call fails."""
    if not facts.named:
        return NodeEligibility.declined("an output or kept intermediate the node's "
                                        "forward does not name")
    if not facts.fresh:
        return NodeEligibility.declined("an output or kept intermediate that is not "
                                        "an array of its own")
    if not facts.declared:
        return NodeEligibility.declined("an output or kept intermediate of another "
                                        "layout than the operator declares")
    if not facts.reads_covered:
        return NodeEligibility.declined("the backward reads a forward array the "
                                        "operator does not return")
    if not facts.gradients_apart:
        return NodeEligibility.declined("two gradients in one array")
    return ELIGIBLE
