"""The schedule's rule chains (schedule/rule_chain.py and its tables in
schedule/torch_node_plan.py and schedule/torch_node_split.py): each rule's reason, to
the letter, where only that fact fails; the first failing rule where several fail; and
the evaluator itself."""

import dataclasses

import pytest

from einfuse.schedule.rule_chain import first_failed, needs, refuses
from einfuse.schedule.torch_node_plan import (ELIGIBLE, NodeCallFacts, NodeEligibility,
                                              NodeProductFacts, NodeStep, NodeStepKind,
                                              node_eligibility, product_eligibility,
                                              signature_eligibility)
from einfuse.schedule.torch_node_split import SplitFacts, split_eligibility

CALL = NodeCallFacts(node_built=True, strided_cpu=True, scalar_parameters=False,
                     gradients_direct=True, forward_prepared=True)
CALL_REASONS = [
    ("node_built", False, "the C++ node is not built"),
    ("strided_cpu", False,
     "a tensor is not a plain strided CPU tensor of float32/64 or int32/64"),
    ("scalar_parameters", True, "a scalar parameter's value is read per call"),
    ("gradients_direct", False,
     "a gradient is not an array of its input's own shape and dtype"),
    ("forward_prepared", False, "the forward has no prepared run"),
]

SPLIT = SplitFacts(named=True, fresh=True, declared=True, reads_covered=True,
                   gradients_apart=True)
SPLIT_REASONS = [
    ("named", False, "an output or kept intermediate the node's forward does not name"),
    ("fresh", False, "an output or kept intermediate that is not an array of its own"),
    ("declared", False,
     "an output or kept intermediate of another layout than the operator declares"),
    ("reads_covered", False,
     "the backward reads a forward array the operator does not return"),
    ("gradients_apart", False, "two gradients in one array"),
]

PRODUCT = NodeProductFacts(prepared=True, torch_blas=True, windowed=False, one_call=True,
                           operands_viewed=True, result_dtype=True)
PRODUCT_REASONS = [
    ("prepared", False, "a product with no prepared runner (its full path)"),
    ("windowed", True, "a windowed product"),
    ("torch_blas", False, "a product on NumPy's BLAS (too small for torch's)"),
    ("one_call", False, "a product that is more than one torch BLAS call on its operands"),
    ("operands_viewed", False, "a product whose operands are converted or copied"),
    ("result_dtype", False, "a product converted to its result dtype"),
]

CHAINS = [
    (lambda facts: node_eligibility(facts, (NodeStep(NodeStepKind.FUSED_GROUP),), ()),
     CALL, CALL_REASONS),
    (split_eligibility, SPLIT, SPLIT_REASONS),
    (product_eligibility, PRODUCT, PRODUCT_REASONS),
]


@pytest.mark.parametrize("decide, fine, reasons", CHAINS)
def test_each_rule_alone_gives_its_reason(decide, fine, reasons):
    assert decide(fine) == ELIGIBLE
    # every field of the facts has its rule
    assert {field for field, _, _ in reasons} == \
        {f.name for f in dataclasses.fields(fine)}
    for field, failing, reason in reasons:
        found = decide(dataclasses.replace(fine, **{field: failing}))
        assert found == NodeEligibility(False, reason), field


@pytest.mark.parametrize("decide, fine, reasons", CHAINS)
def test_the_first_failing_rule_decides(decide, fine, reasons):
    for at in range(len(reasons)):
        failing = {field: value for field, value, _ in reasons[at:]}
        assert decide(dataclasses.replace(fine, **failing)).reason == reasons[at][2]


def test_signature_eligibility_is_the_calls_signature_rules():
    assert signature_eligibility(True, False) == ELIGIBLE
    assert signature_eligibility(False, False).reason == CALL_REASONS[1][2]
    assert signature_eligibility(True, True).reason == CALL_REASONS[2][2]
    assert signature_eligibility(False, True).reason == CALL_REASONS[1][2]


def test_the_steps_are_asked_after_the_calls_facts():
    unknown = (NodeStep(NodeStepKind.UNKNOWN_RUN, "y"),)
    found = node_eligibility(CALL, unknown, ())
    assert found.reason == f"the forward has {NodeStepKind.UNKNOWN_RUN.value} (y)"
    assert node_eligibility(dataclasses.replace(CALL, forward_prepared=False), unknown,
                            ()).reason == "the forward has no prepared run"


def test_the_evaluator():
    @dataclasses.dataclass(frozen=True)
    class Facts:
        a: bool
        b: int

    rules = (needs("a", "not a"), refuses("b", "some b"))
    assert first_failed(rules, Facts(True, 0)) is None
    assert first_failed(rules, Facts(False, 3)) == "not a"
    assert first_failed(rules, Facts(True, 3)) == "some b"   # (truth, as an if reads it)
    assert first_failed((), Facts(False, 3)) is None
    with pytest.raises(AttributeError):
        first_failed((needs("c", "no c"),), Facts(True, 0))
