"""Products as operations of the C++ autograd node (runtime/torch_node_products.py): a
program whose statements include products on torch's BLAS (the MLP block, a Linear
layer and its activation) runs wholly as the node, forward and backward, with the
Python path's bits (the same at::matmul / at::addmm on views of the same layouts) and
torch's gradients; strided and transposed inputs, float32/64, no_grad, create_graph
(the Python path), in-place changes refused, gradcheck; a product too small for
torch's BLAS keeps the whole call on the Python path, with its reason."""

import numpy as np
import pytest
import torch

import einfuse as ef
from einfuse.schedule.torch_node_plan import NodeProductFacts, product_eligibility
from torch_node_support import python_path as _python_path, uses_node as _uses_node

D, H = 128, 512
MLP = f"""
r[b] := sqrt(sum[d](X[b,d]**2) / {D} + 0.000001)
n[b,d] := X[b,d] / r[b] * G[d]
h[b,f] := sum[d](n[b,d] * W1[d,f])
g[b,f] := 0.5 * h[b,f] * (1 + erf(h[b,f] * 0.7071067811865476))
y[b,e] := X[b,e] + sum[f](g[b,f] * W2[f,e])
"""
LINEAR = """h[b,o] := sum[i](x[b,i] * W[o,i]) + c[o]
y[b,o] := max(h[b,o], 0)"""


def _mlp_env(dtype, batch=64, seed=0):
    rng = np.random.default_rng(seed)
    return {"X": torch.from_numpy(rng.standard_normal((batch, D))).to(dtype),
            "G": torch.from_numpy(1 + 0.1 * rng.standard_normal(D)).to(dtype),
            "W1": torch.from_numpy(rng.standard_normal((D, H)) / D ** 0.5).to(dtype),
            "W2": torch.from_numpy(rng.standard_normal((H, D)) / H ** 0.5).to(dtype)}


def _linear_env(dtype, batch, inputs, outputs, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": torch.from_numpy(rng.standard_normal((batch, inputs))).to(dtype),
            "W": torch.from_numpy(rng.standard_normal((outputs, inputs)) /
                                  inputs ** 0.5).to(dtype),
            "c": torch.from_numpy(rng.standard_normal(outputs)).to(dtype)}


def _step(program, env, seed):
    leaves = {k: v.detach().clone().requires_grad_() if v.is_contiguous() else
              v.detach().requires_grad_() for k, v in env.items()}
    out = program(**leaves)
    out.backward(seed)
    return out.detach(), {k: v.grad.clone() for k, v in leaves.items()}


def _pair(text, output, env, seed):
    """The program warmed until its calls take the node, and its twin on the Python
    path (another Program object: its own prepared calls)."""
    # (texts of their own: ef.compile shares a Program per text, and its prepared calls)
    _pair.count = getattr(_pair, "count", 0) + 1
    ours = ef.compile(text + "\n" * (2 * _pair.count), outputs=(output,))
    python = ef.compile(text + "\n" * (2 * _pair.count + 1), outputs=(output,))
    for _ in range(3):
        _step(python, env, seed)
        _python_path(python)
        _step(ours, env, seed)
    assert _uses_node(ours), _decisions(ours)
    assert not _uses_node(python)
    return ours, python


def _decisions(program):
    return [call.node_decision for owner in program._autograd.values()
            for call in owner.calls.values()]


def _same_bits(ours, python, env, seed):
    for _ in range(2):
        got, got_grads = _step(ours, env, seed)
        want, want_grads = _step(python, env, seed)
        assert torch.equal(got, want)
        for name in env:
            assert torch.equal(got_grads[name], want_grads[name]), name
    return got, got_grads


def _mlp_twin(env, seed):
    leaves = {k: v.detach().clone().requires_grad_() for k, v in env.items()}
    x = leaves["X"]
    n = x / torch.sqrt((x ** 2).sum(1, keepdim=True) / D + 1e-6) * leaves["G"]
    y = x + torch.nn.functional.gelu(n @ leaves["W1"]) @ leaves["W2"]
    y.backward(seed)
    return y.detach(), {k: v.grad for k, v in leaves.items()}


def _close(got, want, dtype):
    tolerance = 2e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mlp_block_runs_as_the_node_with_the_python_paths_bits(node, dtype):
    env = _mlp_env(dtype)
    seed = torch.from_numpy(np.random.default_rng(7).standard_normal((64, D))).to(dtype)
    ours, python = _pair(MLP, "y", env, seed)
    got, grads = _same_bits(ours, python, env, seed)
    want, want_grads = _mlp_twin(env, seed)
    _close(got, want, dtype)
    for name in env:
        _close(grads[name], want_grads[name], dtype)


def _linear_twin(env, seed):
    leaves = {k: v.detach().clone().requires_grad_() for k, v in env.items()}
    y = torch.relu(torch.nn.functional.linear(leaves["x"], leaves["W"], leaves["c"]))
    y.backward(seed)
    return y.detach(), {k: v.grad for k, v in leaves.items()}


@pytest.mark.parametrize("shape", [(64, 784, 256), (32, 128, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_linear_and_relu_run_as_the_node(node, dtype, shape):
    env = _linear_env(dtype, *shape)
    seed = torch.from_numpy(np.random.default_rng(3).standard_normal(
        (shape[0], shape[2]))).to(dtype)
    ours, python = _pair(LINEAR, "y", env, seed)
    got, grads = _same_bits(ours, python, env, seed)
    want, want_grads = _linear_twin(env, seed)
    _close(got, want, dtype)
    for name in env:
        _close(grads[name], want_grads[name], dtype)


def test_strided_and_transposed_inputs(node):
    # W given as the transpose of a (784, 256) tensor, x a column window of a wider one
    rng = np.random.default_rng(11)
    wide = torch.from_numpy(rng.standard_normal((64, 800))).float()
    weights = torch.from_numpy(rng.standard_normal((784, 256)) / 28).float()
    env = {"x": wide[:, 8:792], "W": weights.t(), "c": torch.zeros(256)}
    assert not env["x"].is_contiguous() and not env["W"].is_contiguous()
    seed = torch.from_numpy(rng.standard_normal((64, 256))).float()
    ours, python = _pair(LINEAR, "y", env, seed)
    got, grads = _same_bits(ours, python, env, seed)
    want, want_grads = _linear_twin(env, seed)
    _close(got, want, torch.float32)
    for name in env:
        _close(grads[name], want_grads[name], torch.float32)


def test_no_grad_and_inputs_recorded_only(node):
    env = _mlp_env(torch.float32)
    seed = torch.ones(64, D)
    ours, python = _pair(MLP, "y", env, seed)
    with torch.no_grad():
        got, want = ours(**env), python(**env)
    assert got.grad_fn is None and torch.equal(got, want)
    # only W2 recorded: the node's plan for all four inputs, one gradient asked
    leaf = env["W2"].detach().clone().requires_grad_()
    twin_leaf = env["W2"].detach().clone().requires_grad_()
    ours(**dict(env, W2=leaf)).backward(seed)
    python(**dict(env, W2=twin_leaf)).backward(seed)
    assert torch.equal(leaf.grad, twin_leaf.grad)


def test_create_graph_takes_the_python_path(node):
    env = _linear_env(torch.float64, 64, 64, 64)
    seed = torch.from_numpy(np.random.default_rng(5).standard_normal((64, 64)))
    ours, _ = _pair(LINEAR.replace("max(h[b,o], 0)", "h[b,o] * h[b,o]"), "y", env, seed)
    leaves = {k: v.detach().clone().requires_grad_() for k, v in env.items()}
    (grad,) = torch.autograd.grad(ours(**leaves), leaves["W"], seed, create_graph=True)
    (second,) = torch.autograd.grad(grad.square().sum(), leaves["x"])
    twins = {k: v.detach().clone().requires_grad_() for k, v in env.items()}
    h = torch.nn.functional.linear(twins["x"], twins["W"], twins["c"])
    (grad_twin,) = torch.autograd.grad(h * h, twins["W"], seed, create_graph=True)
    (second_twin,) = torch.autograd.grad(grad_twin.square().sum(), twins["x"])
    torch.testing.assert_close(grad, grad_twin)
    torch.testing.assert_close(second, second_twin)


def test_in_place_change_refused(node):
    env = _mlp_env(torch.float32)
    seed = torch.ones(64, D)
    ours, _ = _pair(MLP, "y", env, seed)
    leaves = {k: v.detach().clone().requires_grad_() for k, v in env.items()}
    out = ours(**leaves)
    with torch.no_grad():
        leaves["W1"].mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward(seed)


def test_gradcheck(node):
    env = _linear_env(torch.float64, 64, 64, 64)
    text = LINEAR.replace("max(h[b,o], 0)", "h[b,o] * h[b,o]")
    seed = torch.ones(64, 64, dtype=torch.float64)
    ours, _ = _pair(text, "y", env, seed)
    leaves = tuple(env[k].detach().clone().requires_grad_() for k in ("x", "W", "c"))
    assert torch.autograd.gradcheck(lambda x, w, c: ours(x=x, W=w, c=c), leaves,
                                    fast_mode=True)


def test_a_product_on_numpys_blas_keeps_the_python_path(node):
    # 16x32x32 multiply-adds: below torch's BLAS threshold, NumPy's BLAS on the Python
    # path, whose bits the node would not match
    env = _linear_env(torch.float32, 16, 32, 32)
    program = ef.compile(LINEAR + " " * 1000, outputs=("y",))
    seed = torch.ones(16, 32)
    for _ in range(4):
        got, grads = _step(program, env, seed)
    assert not _uses_node(program)
    assert any(d is not None and "NumPy's BLAS" in d.reason for d in _decisions(program))
    want, want_grads = _linear_twin(env, seed)
    _close(got, want, torch.float32)
    for name in env:
        _close(grads[name], want_grads[name], torch.float32)


def test_product_eligibility_rules():
    fine = NodeProductFacts(prepared=True, torch_blas=True, windowed=False, one_call=True,
                            operands_viewed=True, result_dtype=True)
    assert product_eligibility(fine).eligible
    import dataclasses
    for field, value, words in (("prepared", False, "no prepared runner"),
                                ("windowed", True, "windowed"),
                                ("torch_blas", False, "NumPy's BLAS"),
                                ("one_call", False, "more than one"),
                                ("operands_viewed", False, "converted or copied"),
                                ("result_dtype", False, "result dtype")):
        decision = product_eligibility(dataclasses.replace(fine, **{field: value}))
        assert not decision.eligible and words in decision.reason, field


BATCHED = """S[b,i,j] := sum[d](Q[b,i,d] * K[b,j,d])
P[b,i,j] := tanh(S[b,i,j])
O[b,i,e] := sum[j](P[b,i,j] * V[b,j,e])"""


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batched_products(node, dtype):
    # 8 x 64 x 64 x 64 multiply-adds each: torch.matmul on 3-D views (a bmm), forward
    # and every gradient
    rng = np.random.default_rng(13)
    env = {name: torch.from_numpy(rng.standard_normal((8, 64, 64)) / 8).to(dtype)
           for name in ("Q", "K", "V")}
    seed = torch.from_numpy(rng.standard_normal((8, 64, 64))).to(dtype)
    ours, python = _pair(BATCHED, "O", env, seed)
    got, grads = _same_bits(ours, python, env, seed)
    leaves = {k: v.detach().clone().requires_grad_() for k, v in env.items()}
    twin = torch.tanh(leaves["Q"] @ leaves["K"].transpose(1, 2)) @ leaves["V"]
    twin.backward(seed)
    _close(got, twin.detach(), dtype)
    for name in env:
        _close(grads[name], leaves[name].grad, dtype)


def test_mlp_gradcheck(node):
    env = _mlp_env(torch.float64, seed=2)
    seed = torch.ones(64, D, dtype=torch.float64)
    ours, _ = _pair(MLP, "y", env, seed)
    leaves = tuple(env[k].detach().clone().requires_grad_() for k in ("X", "G", "W1", "W2"))
    assert torch.autograd.gradcheck(lambda X, G, W1, W2: ours(X=X, G=G, W1=W1, W2=W2),
                                    leaves, fast_mode=True)
