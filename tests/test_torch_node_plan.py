"""Whether a prepared program call runs as the C++ autograd node: decided by
schedule/torch_node_plan.node_eligibility (a frozen value: eligible, or the reason),
from facts runtime/torch_node.py gathers; the reason a translation's step gives is
recorded the same way."""

import dataclasses

import numpy as np
import pytest
import torch

import einfuse as ef
from einfuse.schedule.torch_node_plan import (ELIGIBLE, NodeCallFacts, NodeEligibility,
                                              NodeStep, NodeStepKind, node_eligibility,
                                              signature_eligibility)
from torch_node_support import uses_node

_FACTS = NodeCallFacts(node_built=True, strided_cpu=True, scalar_parameters=False,
                       gradients_direct=True, forward_prepared=True)
_GROUP = NodeStep(NodeStepKind.FUSED_GROUP)


def test_every_rule_in_order():
    assert node_eligibility(_FACTS, (_GROUP,), (NodeStep(NodeStepKind.LABEL_CHECK),)) \
        == ELIGIBLE
    cases = [({"node_built": False}, "not built"),
             ({"strided_cpu": False}, "strided CPU"),
             ({"scalar_parameters": True}, "scalar parameter"),
             ({"gradients_direct": False}, "gradient"),
             ({"forward_prepared": False}, "no prepared run")]
    for changed, words in cases:
        found = node_eligibility(dataclasses.replace(_FACTS, **changed), (_GROUP,), ())
        assert not found.eligible and words in found.reason, (changed, found)
    # the first failing rule names the reason
    both = dataclasses.replace(_FACTS, node_built=False, scalar_parameters=True)
    assert "not built" in node_eligibility(both, (), ()).reason
    for kind in (NodeStepKind.OTHER_FRAMEWORK, NodeStepKind.UNPREPARED,
                 NodeStepKind.UNKNOWN_RUN):
        found = node_eligibility(_FACTS, (_GROUP,), (NodeStep(kind, "dW"),))
        assert found == NodeEligibility(False, f"the backward has {kind.value} (dW)")
    assert signature_eligibility(True, False) == ELIGIBLE
    assert not signature_eligibility(True, True).eligible
    with pytest.raises(dataclasses.FrozenInstanceError):
        ELIGIBLE.eligible = False


def _decisions(program):
    return [call.node_decision for owner in program._autograd.values()
            for call in owner.calls.values()]


def _train(program, env, steps=4):
    for _ in range(steps):
        leaves = {k: v.detach().clone().requires_grad_(v.requires_grad)
                  if isinstance(v, torch.Tensor) else v for k, v in env.items()}
        out = program(**leaves)
        out.backward(torch.ones_like(out))
    return out


def test_decisions_of_real_calls(node):
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((32, 48)).astype(np.float32))
    softmax = ef.compile("M[i] := max[j](X[i,j])\nE[i,j] := exp(X[i,j] - M[i])\n"
                         "Z[i] := sum[j](E[i,j])\nP[i,j] := E[i,j] / Z[i]", outputs=("P",))
    out = _train(softmax, {"X": x.requires_grad_()})
    # (other tests' calls of the same program text may share its owner: each eligible)
    assert uses_node(softmax) and set(_decisions(softmax)) == {ELIGIBLE}
    torch.testing.assert_close(out.detach(), torch.softmax(x.detach(), 1))
    # a product the node does not run (NumPy's BLAS): declined, the statement named
    w = torch.from_numpy(rng.standard_normal((48, 64)).astype(np.float32))
    linear = ef.compile("h[b,f] := sum[d](X[b,d] * W[d,f])\ny[b,f] := tanh(h[b,f])",
                        outputs=("y",))
    out = _train(linear, {"X": x.detach().requires_grad_(), "W": w.requires_grad_()})
    (decision,) = set(_decisions(linear))
    assert not uses_node(linear) and not decision.eligible and "h" in decision.reason
    torch.testing.assert_close(out.detach(), torch.tanh(x.detach() @ w.detach()))
    # a scalar parameter: decided from the signature when the call is prepared
    scaled = ef.compile("E[i,j] := exp(X[i,j] * s)\nP[i,j] := E[i,j] / sum[k](E[i,k])",
                        outputs=("P",))
    _train(scaled, {"X": x.detach().requires_grad_(), "s": 0.5})
    (decision,) = set(_decisions(scaled))
    assert decision is not None and "scalar parameter" in decision.reason
