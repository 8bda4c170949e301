"""The C++ autograd node of a program's call on CPU torch tensors (runtime/torch_node.py):
built where a compiler exists (a failed build fails here, it does not skip), then the
same values as the Python autograd path, bit for bit, and torch's gradients, with some
inputs recorded only, other layouts, create_graph=True, in-place changes, no_grad and
threads."""

import threading

import numpy as np
import pytest
import torch

import einfuse as ef
from einfuse.backends.c import torch_node as c_torch_node
from torch_node_support import python_path as _python_path, uses_node as _uses_node

SOFTMAX = ("M[i] := max[j](X[i,j])\nE[i,j] := exp(X[i,j] - M[i])\n"
           "Z[i] := sum[j](E[i,j])\nP[i,j] := E[i,j] / Z[i]")
LAYERNORM = ("m[i] := sum[j](X[i,j]) / 64\nv[i] := sum[j]((X[i,j] - m[i])**2) / 64\n"
             "Y[i,j] := (X[i,j] - m[i]) / sqrt(v[i] + 1e-05) * g[j] + b[j]")




def _inputs(dtype=torch.float32, rows=64, cols=64, seed=0):
    rng = np.random.default_rng(seed)
    return (torch.from_numpy(rng.standard_normal((rows, cols))).to(dtype),
            torch.from_numpy(rng.standard_normal(cols)).to(dtype),
            torch.from_numpy(rng.standard_normal(cols)).to(dtype),
            torch.from_numpy(rng.standard_normal((rows, cols))).to(dtype))


def _step(program, env, seed, output):
    leaves = {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in env.items()}
    out = program(**leaves)
    out.backward(seed)
    return out.detach(), {k: (None if v.grad is None else v.grad.clone())
                          for k, v in leaves.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("which", ["softmax", "layernorm"])
def test_node_matches_the_python_path_bit_for_bit(node, which, dtype):
    x, g, b, seed = _inputs(dtype)
    text = SOFTMAX if which == "softmax" else LAYERNORM
    env = {"X": x.requires_grad_()} if which == "softmax" else \
        {"X": x.requires_grad_(), "g": g.requires_grad_(), "b": b.requires_grad_()}
    output = "P" if which == "softmax" else "Y"
    ours = ef.compile(text, outputs=(output,))
    python = ef.compile(text + "\n", outputs=(output,))
    for _ in range(2):
        _step(python, env, seed, output)
        _python_path(python)
        _step(ours, env, seed, output)
    assert _uses_node(ours) and not _uses_node(python)
    for _ in range(2):
        got, got_grads = _step(ours, env, seed, output)
        want, want_grads = _step(python, env, seed, output)
        assert torch.equal(got, want)
        for name in env:
            assert torch.equal(got_grads[name], want_grads[name]), name
    # and torch's own formulation
    leaves = {k: v.detach().clone().requires_grad_() for k, v in env.items()}
    if which == "softmax":
        twin = torch.softmax(leaves["X"], 1)
    else:
        twin = torch.nn.functional.layer_norm(leaves["X"], (64,), leaves["g"], leaves["b"],
                                              1e-5)
    twin.backward(seed)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got, twin.detach(), atol=tolerance, rtol=tolerance)
    for name in env:
        torch.testing.assert_close(got_grads[name], leaves[name].grad, atol=10 * tolerance,
                                   rtol=10 * tolerance)


def _warm(program, env, seed):
    for _ in range(2):
        _step(program, env, seed, None)
    assert _uses_node(program)


def test_some_inputs_recorded_only(node):
    x, g, b, seed = _inputs()
    program = ef.compile(LAYERNORM, outputs=("Y",))
    python = ef.compile(LAYERNORM + "\n", outputs=("Y",))
    env = {"X": x, "g": g.requires_grad_(), "b": b}
    # the gain's column sum of dg runs alone in its hoisted form (a per-row temporary,
    # then the sum): the node takes the steps of its prepared run
    for _ in range(3):
        _step(python, env, seed, None)
        _python_path(python)
        _step(program, env, seed, None)
    assert _uses_node(program) and not _uses_node(python)
    got, grads = _step(program, env, seed, "Y")
    want, want_grads = _step(python, env, seed, "Y")
    assert torch.equal(got, want) and torch.equal(grads["g"], want_grads["g"])
    assert grads["X"] is None and grads["b"] is None
    leaf = g.detach().clone().requires_grad_()
    torch.nn.functional.layer_norm(x, (64,), leaf, b, 1e-5).backward(seed)
    torch.testing.assert_close(grads["g"], leaf.grad, atol=1e-4, rtol=1e-4)


def test_other_layouts_and_seeds(node):
    x, _, _, seed = _inputs(rows=64)
    program = ef.compile(SOFTMAX, outputs=("P",))
    _warm(program, {"X": x.requires_grad_()}, seed)
    # a transposed input (another signature) and a non-contiguous seed
    for given, seed_given in ((x.detach().t(), seed.t()), (x.detach(), seed.t())):
        leaf = given.detach().clone().requires_grad_() if given.is_contiguous() else \
            given.requires_grad_()
        out = program(X=leaf)
        out.backward(seed_given)
        twin_leaf = given.detach().clone().requires_grad_()
        torch.softmax(twin_leaf, 1).backward(seed_given)
        torch.testing.assert_close(out.detach(), torch.softmax(given.detach(), 1))
        torch.testing.assert_close(leaf.grad, twin_leaf.grad, atol=1e-5, rtol=1e-5)


def test_create_graph_and_unused_output_seed(node):
    x, _, _, seed = _inputs(torch.float64)
    program = ef.compile(SOFTMAX, outputs=("P",))
    _warm(program, {"X": x.requires_grad_()}, seed)
    leaf = x.detach().clone().requires_grad_()
    (grad,) = torch.autograd.grad(program(X=leaf), leaf, seed, create_graph=True)
    (second,) = torch.autograd.grad(grad.square().sum(), leaf)
    twin = x.detach().clone().requires_grad_()
    (grad_twin,) = torch.autograd.grad(torch.softmax(twin, 1), twin, seed, create_graph=True)
    (second_twin,) = torch.autograd.grad(grad_twin.square().sum(), twin)
    torch.testing.assert_close(grad, grad_twin)
    torch.testing.assert_close(second, second_twin)
    # a loss that reads the output through a sum: an expanded seed
    leaf = x.detach().clone().requires_grad_()
    (program(X=leaf) * seed).sum().backward()
    twin = x.detach().clone().requires_grad_()
    (torch.softmax(twin, 1) * seed).sum().backward()
    torch.testing.assert_close(leaf.grad, twin.grad)


def test_in_place_change_refused_and_no_grad(node):
    x, _, _, seed = _inputs()
    program = ef.compile(SOFTMAX, outputs=("P",))
    _warm(program, {"X": x.requires_grad_()}, seed)
    leaf = x.detach().clone().requires_grad_()
    out = program(X=leaf)
    with torch.no_grad():
        leaf.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward(seed)
    with torch.no_grad():
        found = program(X=x)
    assert found.grad_fn is None
    torch.testing.assert_close(found, torch.softmax(x.detach(), 1))


def test_threads(node):
    x, _, _, seed = _inputs()
    program = ef.compile(SOFTMAX, outputs=("P",))
    _warm(program, {"X": x.requires_grad_()}, seed)
    want = _step(program, {"X": x}, seed, "P")
    failures = []

    def work():
        for _ in range(20):
            got = _step(program, {"X": x}, seed, "P")
            if not (torch.equal(got[0], want[0]) and torch.equal(got[1]["X"], want[1]["X"])):
                failures.append(got)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_turned_off_keeps_the_python_path(node, monkeypatch):
    monkeypatch.setenv("EINFUSE_TORCH_NODE", "0")
    x, _, _, seed = _inputs(seed=3)
    program = ef.compile(SOFTMAX + "\n\n", outputs=("P",))
    for _ in range(3):
        got, grads = _step(program, {"X": x.requires_grad_()}, seed, "P")
    assert not _uses_node(program)
    twin = x.detach().clone().requires_grad_()
    torch.softmax(twin, 1).backward(seed)
    torch.testing.assert_close(grads["X"], twin.grad)


def test_forward_mode_tangents_take_the_python_path(node):
    x, _, _, seed = _inputs()
    program = ef.compile(SOFTMAX, outputs=("P",))
    _warm(program, {"X": x.requires_grad_()}, seed)
    import torch.autograd.forward_ad as fwad

    def tangent_of_program():
        with fwad.dual_level():
            out = program(X=fwad.make_dual(x.detach().clone().requires_grad_(), seed))
            return fwad.unpack_dual(out).tangent

    try:        # the node never drops a tangent: the Python path's answer, or its error
        tangent = tangent_of_program()
    except Exception as error:     # (the Python node has no forward-mode formula)
        assert "jvp" in str(error) or "forward" in str(error).lower()
    else:
        assert tangent is not None
        with fwad.dual_level():
            want = fwad.unpack_dual(torch.softmax(fwad.make_dual(x.detach(), seed), 1)).tangent
        torch.testing.assert_close(tangent, want)


def test_a_program_it_cannot_translate_keeps_the_python_path(node):
    # an embedding's weights: their gradient is a scatter, which the node does not run,
    # so the whole call stays on the Python path, with torch's gradients and the error
    # naming a label out of range (cross-entropy's labels: tests/test_torch_node_labels.py)
    program = ef.compile("E[i,k] := W[t[i], k]\nY[i] := sum[k](E[i,k] * X[i,k])",
                         outputs=("Y",))
    rng = np.random.default_rng(1)
    w, x = (torch.from_numpy(rng.standard_normal(shape)) for shape in ((64, 64), (32, 64)))
    t = torch.from_numpy(rng.integers(0, 64, 32))
    for _ in range(4):
        leaf = w.detach().clone().requires_grad_()
        program(W=leaf, X=x, t=t).sum().backward()
    assert not _uses_node(program)
    twin = w.detach().clone().requires_grad_()
    (twin[t] * x).sum().backward()
    torch.testing.assert_close(leaf.grad, twin.grad)
    bad = t.clone()
    bad[5] = 64
    with pytest.raises(ef.EinfuseError, match="64"):
        program(W=w.detach().clone().requires_grad_(), X=x, t=bad).sum().backward()


def test_two_outputs_one_unused_by_the_loss(node):
    x, g, b, seed = _inputs(torch.float64)
    program = ef.compile(LAYERNORM, outputs=("m", "Y"))
    python = ef.compile(LAYERNORM + "\n", outputs=("m", "Y"))
    env = {"X": x, "g": g, "b": b}

    def step(p, use_mean):
        leaves = {k: v.detach().clone().requires_grad_() for k, v in env.items()}
        m, y = p(**leaves)
        loss = (y * seed).sum() + (m.sum() * 3 if use_mean else 0)
        loss.backward()
        return m.detach(), y.detach(), {k: v.grad for k, v in leaves.items()}
    for _ in range(2):
        step(program, True)
        step(python, True)
        _python_path(python)
    assert _uses_node(program)
    for use_mean in (True, False):
        got, want = step(program, use_mean), step(python, use_mean)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        for name in env:
            assert torch.equal(got[2][name], want[2][name]), (name, use_mean)


def test_a_short_run_never_starts_the_build(node, monkeypatch):
    # (where the node is not loaded yet: the build starts from a signature's third
    # backward on, so that a script or test with a backward or two never pays for it)
    started = []
    monkeypatch.setattr(c_torch_node, "_state", {"module": None, "reason": "not built yet",
                                                 "thread": None})
    monkeypatch.setattr(c_torch_node, "_build_and_load", lambda: started.append(1))
    x, _, _, seed = _inputs(seed=5)
    program = ef.compile(SOFTMAX + "\n\n\n", outputs=("P",))
    for count in range(1, 5):
        _step(program, {"X": x.requires_grad_()}, seed, "P")
        thread = c_torch_node._state["thread"]
        if thread is not None:
            thread.join()
        assert bool(started) == (count >= 3), count
    assert not _uses_node(program)
