"""The C++ autograd node on programs that read labels (runtime/torch_node.py): a
cross-entropy, mean and per row, int64 labels, runs in the node -- its log-sum-exp row
kernel, its mean as a statement run alone, its backward's label check and the labels
read as values -- with the Python autograd path's values bit for bit and torch's
gradients; a label out of range gets the statement's own error, from the forward as
from a backward whose labels were checked only there."""

import numpy as np
import pytest
import torch

import einfuse as ef
from torch_node_support import python_path as _python_path, uses_node as _uses_node

MEAN = ("m[i] := max[j](X[i,j])\nl[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - "
        "X[i, t[i]]\nL := sum[i](l[i]) / 64")
PER_ROW = ("m[i] := max[j](X[i,j])\nl[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - "
           "X[i, t[i]]")




def _step(program, x, t, seed):
    leaf = x.detach().clone().requires_grad_()
    out = program(X=leaf, t=t)
    out.backward(seed)
    return out.detach(), leaf.grad.clone()


def _inputs(dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal((64, 64))).to(dtype)
    t = torch.from_numpy(rng.integers(0, 64, 64))
    return x, t


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("which", ["mean", "per row"])
def test_cross_entropy_in_the_node_matches_the_python_path_bit_for_bit(node, which, dtype):
    x, t = _inputs(dtype)
    text, output = (MEAN, "L") if which == "mean" else (PER_ROW, "l")
    seed = None if which == "mean" else \
        torch.from_numpy(np.random.default_rng(3).standard_normal(64)).to(dtype)
    ours = ef.compile(text, outputs=(output,))
    python = ef.compile(text + "\n", outputs=(output,))
    for _ in range(4):
        _step(python, x, t, seed)
        _python_path(python)
        _step(ours, x, t, seed)
    assert _uses_node(ours) and not _uses_node(python)
    for round in range(2):
        xr, tr = _inputs(dtype, seed=10 + round)
        got, got_grad = _step(ours, xr, tr, seed)
        want, want_grad = _step(python, xr, tr, seed)
        assert torch.equal(got, want) and torch.equal(got_grad, want_grad)
        # and torch's own formulation
        twin = xr.detach().clone().requires_grad_()
        loss = torch.nn.functional.cross_entropy(
            twin, tr, reduction="mean" if which == "mean" else "none")
        loss.backward(seed)
        tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else {}
        torch.testing.assert_close(got, loss.detach(), **tolerance)
        torch.testing.assert_close(got_grad, twin.grad, **tolerance)


def test_a_label_out_of_range_raises_the_statements_error(node):
    x, t = _inputs(torch.float32)
    program = ef.compile(MEAN + "\n\n\n", outputs=("L",))     # (a program of its own)
    for _ in range(4):
        _step(program, x, t, None)
    assert _uses_node(program)
    for bad_value in (64, -1):
        bad = t.clone()
        bad[5] = bad_value
        with pytest.raises(ef.EinfuseError, match=str(bad_value)):
            program(X=x.detach().clone().requires_grad_(), t=bad).backward()
    # the node is still in use, with the right values
    got, got_grad = _step(program, x, t, None)
    twin = x.detach().clone().requires_grad_()
    torch.nn.functional.cross_entropy(twin, t).backward()
    torch.testing.assert_close(got_grad, twin.grad)
    assert _uses_node(program)


def test_labels_of_another_dtype_take_the_python_path(node):
    # int32 labels are converted per call by the log-sum-exp kernel's Python runner:
    # no node for them, the same values
    x, t = _inputs(torch.float32)
    t32 = t.to(torch.int32)
    program = ef.compile(MEAN + "\n\n", outputs=("L",))     # (a program of its own)
    for _ in range(4):
        got, got_grad = _step(program, x, t32, None)
    assert not _uses_node(program)
    twin = x.detach().clone().requires_grad_()
    torch.nn.functional.cross_entropy(twin, t).backward()
    torch.testing.assert_close(got_grad, twin.grad)


@pytest.mark.parametrize("form", ["node", "python"])
def test_labels_changed_behind_autograd_before_the_backward(node, form):
    # .data bypasses torch's version check: the backward's own label check (in C++ for
    # the node) finds the label and the Python path raises the statement's error
    x, t = _inputs(torch.float32)
    program = ef.compile(MEAN + "\n" * (4 if form == "node" else 5), outputs=("L",))
    for _ in range(4):
        _step(program, x, t, None)
        if form == "python":
            _python_path(program)
    assert _uses_node(program) == (form == "node")
    labels = t.clone()
    loss = program(X=x.detach().clone().requires_grad_(), t=labels)
    labels.data[7] = 70
    with pytest.raises(ef.EinfuseError, match="70"):
        loss.backward()


def test_the_plan_keeps_a_statements_runner_its_kernel_dropped(node):
    # the mean's repeat runner holds the runtime arrays the plan's kernel call points
    # into; a kernel dropping it from its cache must not free them under the node
    import gc
    x, t = _inputs(torch.float64)
    program = ef.compile(MEAN + "\n" * 6, outputs=("L",))
    for _ in range(4):
        want, want_grad = _step(program, x, t, None)
    assert _uses_node(program)
    alone = [step.run.args[0] for owner in program._autograd.values()
             for call in owner.calls.values() for step in call._forward.steps
             if len(getattr(step.run, "args", ())) == 2]     # (a statement run alone)
    assert alone
    for kernel in alone:
        kernel._repeat.clear()
    gc.collect()
    for _ in range(50):       # (fresh small arrays that would reuse freed memory)
        np.full(4, 123456789, dtype=np.int64)
    got, got_grad = _step(program, x, t, None)
    assert torch.equal(got, want) and torch.equal(got_grad, want_grad)
