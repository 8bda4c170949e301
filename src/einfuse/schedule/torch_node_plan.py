"""Whether a prepared program call on CPU torch tensors runs as the C++ autograd node
(backends/c/torch_node_source.cpp), decided from facts of the call and of its prepared
steps (runtime/torch_node.py gathers them; it then translates an eligible call into
the node's plan, where a step may still decline the layouts it is given: that reason
is recorded the same way).  Decides; runs nothing.

The node runs kernels the Python path has prepared, by their function pointers, on
arrays whose layouts the signature fixes; so a call is eligible only where each step
is one of those kernels (or a backward's label check, which it makes itself, or a
product on torch's BLAS, which it calls as the Python path does: product_eligibility) and
nothing is decided per call: no scalar parameter (its value fills the kernel's doubles
per call), every gradient an array the backward makes of the input's own shape and
dtype, every tensor a plain strided CPU one of a dtype a plan holds."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from .rule_chain import Rule, first_failed, needs, refuses


class NodeStepKind(enum.Enum):
    """What one step of a prepared forward or backward is, as the node sees it."""
    FUSED_GROUP = "a prepared fused group"
    ROW_KERNEL = "a prepared row kernel"
    STATEMENT = "a statement run alone by its repeat runner"
    LABEL_CHECK = "a backward's range check of its labels"
    OTHER_FRAMEWORK = "a statement on another framework's arrays"
    UNPREPARED = "a step with no prepared kernel calls"
    UNKNOWN_RUN = "a run of another kind than a prepared run"


_RUNNABLE = frozenset({NodeStepKind.FUSED_GROUP, NodeStepKind.ROW_KERNEL,
                       NodeStepKind.STATEMENT, NodeStepKind.LABEL_CHECK})


@dataclass(frozen=True)
class NodeStep:
    """One step: its kind and what it computes (a statement's output, or empty)."""
    kind: NodeStepKind
    computes: str = ""


@dataclass(frozen=True)
class NodeCallFacts:
    """What the call's signature fixes, before its steps are looked at."""
    node_built: bool            # the extension is built and loaded
    strided_cpu: bool           # every passed tensor is a plain strided CPU one a plan holds
    scalar_parameters: bool     # a scalar parameter is passed (its value per call)
    gradients_direct: bool      # every gradient goes to torch as the backward makes it
    forward_prepared: bool      # the forward's prepared run is known


@dataclass(frozen=True)
class NodeEligibility:
    """Whether the call runs as the node; ``reason``: why not (None where it does)."""
    eligible: bool
    reason: Optional[str] = None

    @staticmethod
    def declined(reason: str) -> "NodeEligibility":
        return NodeEligibility(False, reason)


ELIGIBLE = NodeEligibility(True)


def eligibility(rules: Sequence[Rule], facts) -> NodeEligibility:
    """Eligible, or declined with the first of ``rules`` that ``facts`` fail."""
    reason = first_failed(rules, facts)
    return ELIGIBLE if reason is None else NodeEligibility.declined(reason)


# (fields of NodeCallFacts, and of the signature's own facts below)
_SIGNATURE_RULES = (
    needs("strided_cpu",
          "a tensor is not a plain strided CPU tensor of float32/64 or int32/64"),
    refuses("scalar_parameters", "a scalar parameter's value is read per call"),
)

_CALL_RULES = (
    (needs("node_built", "the C++ node is not built"),) + _SIGNATURE_RULES +
    (needs("gradients_direct",
           "a gradient is not an array of its input's own shape and dtype"),
     needs("forward_prepared", "the forward has no prepared run")))


@dataclass(frozen=True)
class _SignatureFacts:
    strided_cpu: bool
    scalar_parameters: bool


def signature_eligibility(strided_cpu: bool, scalar_parameters: bool) -> NodeEligibility:
    """What the call's signature alone decides (asked when the prepared call is made:
    a call it declines never keeps its forward's arrays for a translation)."""
    return eligibility(_SIGNATURE_RULES, _SignatureFacts(strided_cpu, scalar_parameters))


# Recorded forwards of one signature, with no backward yet, after which its node's
# plan is made anyway (plan_before_backward)
FORWARDS_BEFORE_PLAN = 3


def plan_before_backward(forwards: int, backwards: int, node_loaded: bool) -> bool:
    """Whether a recorded call's node plan is made at its forward, from a backward
    planned (and run once, on zero seeds) then, rather than at its first backward:
    where ``forwards`` recorded forwards of the signature (at least
    FORWARDS_BEFORE_PLAN) have had no backward (a loop that records and never
    differentiates, an evaluation without no_grad), and the node is loaded already (no
    build is started for it).  A signature that reaches a backward is planned there,
    with nothing computed twice."""
    return node_loaded and backwards == 0 and forwards >= FORWARDS_BEFORE_PLAN


def node_eligibility(facts: NodeCallFacts, forward: Tuple[NodeStep, ...],
                     backward: Tuple[NodeStep, ...]) -> NodeEligibility:
    """Eligible, or the first rule the call fails, in the order they are checked: the
    call's facts (_CALL_RULES, the signature's among them), then every step."""
    found = eligibility(_CALL_RULES, facts)
    if not found.eligible:
        return found
    for direction, steps in (("forward", forward), ("backward", backward)):
        for step in steps:
            if step.kind not in _RUNNABLE:
                what = f" ({step.computes})" if step.computes else ""
                return NodeEligibility.declined(f"the {direction} has {step.kind.value}{what}")
    return ELIGIBLE


@dataclass(frozen=True)
class NodeProductFacts:
    """What the Python path's prepared runner of a statement BLAS computes does for one
    signature (runtime/torch_node_products.py records it on stand-in arrays): the node
    runs the same torch BLAS call on the same views, so the same bits, or declines."""
    prepared: bool              # the statement's repeats run a prepared runner
    torch_blas: bool            # its product is torch's (large enough, a float dtype)
    windowed: bool              # a windowed contraction (a convolution's)
    one_call: bool              # one torch.matmul or torch.addmm, its result returned as is
    operands_viewed: bool       # every operand a view of an argument (no copy, no conversion)
    result_dtype: bool          # the product's dtype is the statement's result dtype


_PRODUCT_RULES = (
    needs("prepared", "a product with no prepared runner (its full path)"),
    refuses("windowed", "a windowed product"),
    needs("torch_blas", "a product on NumPy's BLAS (too small for torch's)"),
    needs("one_call", "a product that is more than one torch BLAS call on its operands"),
    needs("operands_viewed", "a product whose operands are converted or copied"),
    needs("result_dtype", "a product converted to its result dtype"),
)


def product_eligibility(facts: NodeProductFacts) -> NodeEligibility:
    """Whether a product statement runs as a node operation (``at::matmul`` or
    ``at::addmm`` on the recorded views), or the first rule it fails."""
    return eligibility(_PRODUCT_RULES, facts)
