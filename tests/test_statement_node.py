"""A recorded Linear+ReLU *statement* on CPU torch tensors runs as the C++ autograd node
its two-statement program runs as (issue 32): the statement's epilogue form (BLAS,
then the elementwise pass: Route.BLAS_THEN_EPILOGUE) is that program, prepared by the
same machinery (runtime/program_autograd.PreparedCall), so the node's decision
(schedule/torch_node_plan.node_eligibility) is the program's, the values and gradients
are the program's to the bit, and torch's addmm + relu to rounding.  A signature whose
recorded calls reach no backward has its node planned at a forward
(schedule/torch_node_plan.plan_before_backward), for the statement and the program
alike."""

import itertools

import numpy as np
import pytest
import torch

import einfuse as ef
from einfuse.runtime.program_backward import PLANS_MADE
from einfuse.schedule.torch_node_plan import FORWARDS_BEFORE_PLAN
from torch_node_support import python_path, uses_node

STATEMENT = "y[b,o] := max(sum[i](x[b,i] * W[o,i]) + c[o], 0)"
PROGRAM = "h[b,o] := sum[i](x[b,i] * W[o,i]) + c[o]\ny[b,o] := max(h[b,o], 0)"
# (a statement's epilogue form is cached by its text, a program by its text: each test
# its own texts, so that turning one form's node off touches no other test)
_fresh = itertools.count(1)


def _statement():
    return ef.compile(STATEMENT + " " * next(_fresh), backend="c")


def _program():
    return ef.compile(PROGRAM + "\n" * next(_fresh), outputs=("y",), backend="c")


def _form(kernel):
    form = kernel.epilogue_form
    assert form is not None
    return form


def _decisions(holder):
    return [call.node_decision for owner in holder._autograd.values()
            for call in owner.calls.values()]


def _inputs(dtype, batch=32, inner=128, outer=128, seed=0):
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal((batch, inner))).to(dtype)
    W = torch.from_numpy(rng.standard_normal((outer, inner)) / inner ** 0.5).to(dtype)
    c = torch.from_numpy(rng.standard_normal(outer)).to(dtype)
    dy = torch.from_numpy(rng.standard_normal((batch, outer))).to(dtype)
    return {"x": x, "W": W, "c": c}, dy


def _step(fn, env, grads, seed):
    """One recorded call and its backward on fresh leaves of ``env`` (those named in
    ``grads`` require a gradient): the output and each leaf's gradient."""
    leaves = {k: v.detach().clone().requires_grad_(k in grads) for k, v in env.items()}
    out = fn(**leaves)
    out.backward(seed)
    return out.detach(), {k: leaves[k].grad for k in grads}


def _torch_step(env, grads, seed):
    return _step(lambda x, W, c: torch.relu(torch.addmm(c, x, W.t())), env, grads, seed)


def _tolerance(dtype):
    return dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else \
        dict(rtol=1e-12, atol=1e-12)


def _warm(fn, env, grads, seed, calls=3):
    for _ in range(calls):
        _step(fn, env, grads, seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_statement_takes_the_programs_node(node, dtype):
    env, seed = _inputs(dtype)
    grads = ("x", "W", "c")
    statement, program = _statement(), _program()
    _warm(statement, env, grads, seed)
    _warm(program, env, grads, seed)
    assert uses_node(_form(statement)) and uses_node(program)
    assert _decisions(_form(statement)) == _decisions(program)
    got, got_grads = _step(statement, env, grads, seed)
    want, want_grads = _step(program, env, grads, seed)
    # one computation: the program's bits
    assert torch.equal(got, want)
    for name in grads:
        assert torch.equal(got_grads[name], want_grads[name]), name
    twin, twin_grads = _torch_step(env, grads, seed)
    torch.testing.assert_close(got, twin, **_tolerance(dtype))
    for name in grads:
        torch.testing.assert_close(got_grads[name], twin_grads[name], **_tolerance(dtype))


def test_the_node_equals_the_python_path(node):
    env, seed = _inputs(torch.float64, seed=1)
    grads = ("x", "W", "c")
    ours, python = _statement(), _statement()
    _warm(python, env, grads, seed, calls=1)
    python_path(_form(python))
    _warm(ours, env, grads, seed)
    assert uses_node(_form(ours)) and not uses_node(_form(python))
    for _ in range(2):
        got, got_grads = _step(ours, env, grads, seed)
        want, want_grads = _step(python, env, grads, seed)
        assert torch.equal(got, want)
        for name in grads:
            assert torch.equal(got_grads[name], want_grads[name]), name


def test_an_input_that_needs_no_gradient(node):
    env, seed = _inputs(torch.float32, seed=2)
    grads = ("W", "c")          # a layer's input: only the parameters learn
    statement, program = _statement(), _program()
    _warm(statement, env, grads, seed)
    _warm(program, env, grads, seed)
    assert uses_node(_form(statement)) and uses_node(program)
    got, got_grads = _step(statement, env, grads, seed)
    want, want_grads = _step(program, env, grads, seed)
    assert torch.equal(got, want)
    for name in grads:
        assert torch.equal(got_grads[name], want_grads[name]), name
    twin, twin_grads = _torch_step(env, grads, seed)
    torch.testing.assert_close(got, twin, **_tolerance(torch.float32))
    for name in grads:
        torch.testing.assert_close(got_grads[name], twin_grads[name],
                                   **_tolerance(torch.float32))


def test_strided_and_transposed_inputs(node):
    env, seed = _inputs(torch.float64, seed=3)
    grads = ("x", "W", "c")
    # W held transposed (a Linear's weight stored as its transpose), x a column slice
    strided = {"x": torch.cat([env["x"], env["x"]], 1)[:, ::2],
               "W": env["W"].t().contiguous().t(), "c": env["c"]}
    statement, program = _statement(), _program()

    def step(fn):
        leaves = {k: v.detach().clone().requires_grad_() for k, v in env.items()}
        views = {"x": torch.cat([leaves["x"], leaves["x"]], 1)[:, ::2],
                 "W": leaves["W"].t().contiguous().t(), "c": leaves["c"]}
        out = fn(**views)
        out.backward(seed)
        return out.detach(), {k: leaves[k].grad for k in grads}
    assert not strided["x"].is_contiguous() and not strided["W"].is_contiguous()
    for _ in range(3):
        step(statement)
        step(program)
    assert _decisions(_form(statement)) == _decisions(program)
    assert uses_node(_form(statement)) == uses_node(program)
    got, got_grads = step(statement)
    want, want_grads = step(program)
    assert torch.equal(got, want)
    for name in grads:
        assert torch.equal(got_grads[name], want_grads[name]), name
    twin, twin_grads = step(lambda x, W, c: torch.relu(torch.addmm(c, x, W.t())))
    torch.testing.assert_close(got, twin, **_tolerance(torch.float64))
    for name in grads:
        torch.testing.assert_close(got_grads[name], twin_grads[name],
                                   **_tolerance(torch.float64))


def test_no_grad_call_after_recorded_ones(node):
    env, seed = _inputs(torch.float32, seed=4)
    statement = _statement()
    _warm(statement, env, ("x", "W", "c"), seed)
    assert uses_node(_form(statement))
    leaves = {k: v.detach().clone().requires_grad_() for k, v in env.items()}
    recorded = statement(**leaves)
    with torch.no_grad():
        found = statement(**leaves)
    assert found.grad_fn is None and recorded.grad_fn is not None
    assert torch.equal(found, recorded.detach())


def test_create_graph_takes_the_differentiable_backward(node):
    env, seed = _inputs(torch.float64, batch=16, seed=5)
    statement = _statement()
    _warm(statement, env, ("x", "W", "c"), seed)
    assert uses_node(_form(statement))

    def second(fn):
        leaves = {k: v.detach().clone().requires_grad_() for k, v in env.items()}
        dx, = torch.autograd.grad(fn(**leaves), leaves["x"], seed, create_graph=True)
        dW, dc = torch.autograd.grad(dx.square().sum(), (leaves["W"], leaves["c"]),
                                     allow_unused=True)
        return dx.detach(), dW, dc
    got = second(statement)
    want = second(lambda x, W, c: torch.relu(torch.addmm(c, x, W.t())))
    torch.testing.assert_close(got[0], want[0], **_tolerance(torch.float64))
    torch.testing.assert_close(got[1], want[1], **_tolerance(torch.float64))
    # (relu's mask has no gradient: the bias reaches dx through it alone)
    assert got[2] is None or torch.count_nonzero(got[2]) == 0
    assert want[2] is None or torch.count_nonzero(want[2]) == 0


def test_gradcheck_on_the_node(node):
    # 16x128x128: just the work at which the product is torch's BLAS (the node's)
    env, seed = _inputs(torch.float64, batch=16, seed=6)
    statement = _statement()
    _warm(statement, env, ("x", "W", "c"), seed)
    assert uses_node(_form(statement))
    leaves = tuple(env[k].detach().clone().requires_grad_() for k in ("x", "W", "c"))
    assert torch.autograd.gradcheck(lambda x, W, c: statement(x=x, W=W, c=c), leaves,
                                    fast_mode=True)
    assert uses_node(_form(statement))


def _recorded_forwards(fn, env, grads, calls):
    leaves = {k: v.detach().clone().requires_grad_(k in grads) for k, v in env.items()}
    return leaves, [fn(**leaves) for _ in range(calls)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_recorded_forwards_with_no_backward_take_the_node(node, dtype):
    # (schedule/torch_node_plan.plan_before_backward: after FORWARDS_BEFORE_PLAN of them)
    env, seed = _inputs(dtype, seed=7)
    grads = ("x", "W", "c")
    statement, program, python = _statement(), _program(), _statement()
    _recorded_forwards(statement, env, grads, FORWARDS_BEFORE_PLAN - 1)
    _recorded_forwards(program, env, grads, FORWARDS_BEFORE_PLAN - 1)
    assert not uses_node(_form(statement)) and not uses_node(program)
    leaves, outs = _recorded_forwards(statement, env, grads, 2)
    _recorded_forwards(program, env, grads, 1)
    assert uses_node(_form(statement)) and uses_node(program)
    assert _decisions(_form(statement)) == _decisions(program)
    # the Python path's first forward and backward (its node off) is the reference
    _recorded_forwards(python, env, grads, 1)
    python_path(_form(python))
    want, want_grads = _step(python, env, grads, seed)
    # the forward before the plan was made, the node's, and each one's backward
    assert torch.equal(outs[0].detach(), want) and torch.equal(outs[1].detach(), want)
    for out in outs:
        for leaf in leaves.values():
            leaf.grad = None
        out.backward(seed)
        for name in grads:
            assert torch.equal(leaves[name].grad, want_grads[name]), name
    got, got_grads = _step(statement, env, grads, seed)
    assert torch.equal(got, want)
    twin, twin_grads = _torch_step(env, grads, seed)
    torch.testing.assert_close(got, twin, **_tolerance(dtype))
    for name in grads:
        assert torch.equal(got_grads[name], want_grads[name]), name
        torch.testing.assert_close(got_grads[name], twin_grads[name], **_tolerance(dtype))


def test_a_signature_with_a_backward_plans_it_once(node):
    # a training loop's signature is planned at its first backward (no zero-seed run)
    env, seed = _inputs(torch.float32, seed=8)
    statement = _statement()
    planned = PLANS_MADE.value
    for _ in range(FORWARDS_BEFORE_PLAN + 2):
        _step(statement, env, ("W", "c"), seed)
    assert uses_node(_form(statement)) and PLANS_MADE.value - planned == 1


def test_forward_only_plan_with_create_graph_and_no_grad(node):
    env, seed = _inputs(torch.float64, batch=16, seed=9)
    statement = _statement()
    leaves, outs = _recorded_forwards(statement, env, ("x", "W", "c"),
                                      FORWARDS_BEFORE_PLAN + 1)
    assert uses_node(_form(statement))
    with torch.no_grad():
        assert torch.equal(statement(**leaves), outs[-1].detach())
    dx, = torch.autograd.grad(outs[-1], leaves["x"], seed, create_graph=True)
    dW, = torch.autograd.grad(dx.square().sum(), leaves["W"])
    twins = {k: v.detach().clone().requires_grad_() for k, v in env.items()}
    twin = torch.relu(torch.addmm(twins["c"], twins["x"], twins["W"].t()))
    tx, = torch.autograd.grad(twin, twins["x"], seed, create_graph=True)
    tW, = torch.autograd.grad(tx.square().sum(), twins["W"])
    torch.testing.assert_close(dx, tx, **_tolerance(torch.float64))
    torch.testing.assert_close(dW, tW, **_tolerance(torch.float64))


def test_plan_before_backward_rules():
    from einfuse.schedule.torch_node_plan import plan_before_backward
    assert plan_before_backward(FORWARDS_BEFORE_PLAN, 0, True)
    assert not plan_before_backward(FORWARDS_BEFORE_PLAN - 1, 0, True)
    # a signature that reached a backward is planned there; an unloaded node is not
    # built for a forward
    assert not plan_before_backward(FORWARDS_BEFORE_PLAN + 5, 1, True)
    assert not plan_before_backward(FORWARDS_BEFORE_PLAN + 5, 0, False)


def test_a_failing_plan_ahead_never_fails_the_forward(node, monkeypatch):
    # the plan made at a forward is for speed only: whatever its backward raises, the
    # forwards return their values and a later real backward runs the Python path
    from einfuse.runtime import program_autograd

    def refuse(*args, **kwargs):
        raise RuntimeError("a backward that cannot be planned ahead")
    env, seed = _inputs(torch.float64, seed=9)
    grads = ("x", "W", "c")
    statement, python = _statement(), _statement()
    _recorded_forwards(python, env, grads, 1)
    python_path(_form(python))
    want, want_grads = _step(python, env, grads, seed)
    monkeypatch.setattr(program_autograd, "BackwardRun", refuse)
    leaves, outs = _recorded_forwards(statement, env, grads, FORWARDS_BEFORE_PLAN + 1)
    assert not uses_node(_form(statement))
    for out in outs:
        assert torch.equal(out.detach(), want)
    monkeypatch.undo()
    outs[-1].backward(seed)
    for name in grads:
        assert torch.equal(leaves[name].grad, want_grads[name]), name


def test_inference_mode_with_enable_grad_after_the_node_is_planned(node):
    # torch records nothing inside inference_mode even under enable_grad; a node planned
    # by earlier training steps must not save the inference tensors it would make there
    env, seed = _inputs(torch.float64, seed=10)
    statement, program = _statement(), _program()
    for fn in (statement, program):
        for _ in range(FORWARDS_BEFORE_PLAN):
            _step(fn, env, ("x", "W", "c"), seed)
        holder = _form(fn) if fn is statement else fn
        assert uses_node(holder)
        leaves = {k: v.detach().clone().requires_grad_(True) for k, v in env.items()}
        with torch.inference_mode(), torch.enable_grad():
            got = fn(**leaves)
        assert not got.requires_grad
        want = torch.relu(leaves["x"].detach() @ leaves["W"].detach().T + leaves["c"].detach())
        torch.testing.assert_close(got, want, **_tolerance(torch.float64))
