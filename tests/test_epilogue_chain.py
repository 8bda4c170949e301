"""A repeated torch call of a BLAS-then-epilogue statement that autograd does not
record runs the epilogue form's kernels chained by their prepared runners
(runtime/epilogue_chain.py): the product on torch's BLAS, then the epilogue pass.
Values against the oracle and torch on every repeat, with grad mode switched between
calls of one signature, strided inputs, float32/64, non-finite values; a recorded
call still gets its gradients."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from oracle import brute_force

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")

C_OI = "sum[i](x[b,i]*W[o,i])"
CASES = [
    (f"y[b,o] := max({C_OI} + bias[o], 0)",
     lambda x, W, bias: torch.relu(torch.addmm(bias, x, W.T))),
    (f"y[b,o] := 0.5*({C_OI} + bias[o])*(1 + erf(({C_OI} + bias[o])*0.7071067811865476))",
     lambda x, W, bias: torch.nn.functional.gelu(x @ W.T + bias)),
    (f"y[b,o] := tanh({C_OI}) * bias[o]",
     lambda x, W, bias: torch.tanh(x @ W.T) * bias),
]


def _tensors(dtype, batch=24, inner=80, outer=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(batch, inner, generator=g, dtype=dtype),
            "W": torch.randn(outer, inner, generator=g, dtype=dtype) / inner ** 0.5,
            "bias": torch.randn(outer, generator=g, dtype=dtype)}


def _oracle(statement, arrays):
    named = {k: v.detach().numpy().astype(np.float64) for k, v in arrays.items()}
    b, i = named["x"].shape
    o = named["W"].shape[0]
    return brute_force(statement, {"b": (0, b), "i": (0, i), "o": (0, o)}, named)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("statement,twin", CASES)
def test_repeats_match_the_oracle_and_torch(statement, twin, dtype):
    kernel = ef.compile(statement, backend="c")
    arrays = _tensors(dtype, batch=6, inner=10, outer=5)
    expected = _oracle(statement, arrays)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for _ in range(4):          # the first call, then the prepared repeats
        result = kernel(**arrays)
        assert isinstance(result, torch.Tensor) and result.dtype == dtype
        np.testing.assert_allclose(result.numpy(), expected, rtol=tol, atol=tol)
        torch.testing.assert_close(result, twin(**arrays), rtol=tol, atol=tol)


def test_repeats_run_the_product_on_torch_blas(monkeypatch):
    statement, twin = CASES[0]
    kernel = ef.compile(statement, backend="c")
    arrays = _tensors(torch.float32, batch=64, inner=256, outer=128)   # m*n*k >= 2**18
    kernel(**arrays)
    kernel(**arrays)
    calls = []
    original = torch.addmm

    def counting(addend, left, right, **kwargs):
        calls.append(tuple(left.shape))
        return original(addend, left, right, **kwargs)
    monkeypatch.setattr(torch, "addmm", counting)
    fresh = {k: v.clone() for k, v in _tensors(torch.float32, batch=65, inner=256,
                                                 outer=128).items()}
    for _ in range(3):
        result = kernel(**fresh)
    torch.testing.assert_close(result, twin(**fresh), rtol=1e-5, atol=1e-5)
    assert calls.count((65, 256)) >= 2, "a torch caller's repeats did not reach torch's BLAS"


def test_grad_mode_switched_between_calls_of_one_signature():
    statement, twin = CASES[1]
    kernel = ef.compile(statement, backend="c")
    arrays = _tensors(torch.float64, batch=5, inner=7, outer=3)
    leaves = {k: v.clone().requires_grad_(True) for k, v in arrays.items()}
    for round_ in range(3):
        with torch.no_grad():
            plain = kernel(**leaves)
        assert not plain.requires_grad
        torch.testing.assert_close(plain, twin(**arrays))
        recorded = kernel(**leaves)
        assert recorded.requires_grad
        grads = torch.autograd.grad(recorded.sum(), list(leaves.values()))
        reference = {k: v.clone().requires_grad_(True) for k, v in arrays.items()}
        expected = torch.autograd.grad(twin(**reference).sum(), list(reference.values()))
        for got, want in zip(grads, expected):
            torch.testing.assert_close(got, want)


def test_strided_inputs_and_non_finite_values():
    statement, twin = CASES[0]
    kernel = ef.compile(statement, backend="c")
    base = _tensors(torch.float32, batch=9, inner=12, outer=6)
    x = torch.randn(12, 9).T           # a transposed view
    W = torch.randn(6, 24)[:, ::2]     # every other column
    bias = base["bias"].clone()
    bias[2] = float("nan")
    x[3, 4] = float("inf")
    arrays = {"x": x, "W": W, "bias": bias}
    expected = _oracle(statement, arrays)
    for _ in range(3):
        result = kernel(**arrays)
        np.testing.assert_allclose(result.numpy(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result, twin(**arrays), rtol=1e-5, atol=1e-5,
                               equal_nan=True)


def test_results_are_fresh_tensors():
    statement, _ = CASES[2]
    kernel = ef.compile(statement, backend="c")
    arrays = _tensors(torch.float32, batch=4, inner=6, outer=3)
    first = kernel(**arrays)
    kept = first.clone()
    second = kernel(**arrays)
    second.add_(1.0)          # a caller writing into one result leaves the other alone
    torch.testing.assert_close(first, kept)


def _node_runs(monkeypatch):
    """Counts the chain's calls the C++ node ran (runtime/torch_node.run not None)."""
    from einfuse.runtime import torch_node
    ran, original = [], torch_node.run

    def counting(found, tensors):
        result = original(found, tensors)
        ran.append(result is not None)
        return result
    monkeypatch.setattr(torch_node, "run", counting)
    return ran


@pytest.mark.parametrize("shape", [(32, 128, 128), (64, 784, 256)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_unrecorded_repeats_run_as_the_node_with_the_chains_bits(node, monkeypatch, case,
                                                                 dtype, shape):
    # (the chain in Python is the reference: a kernel of its own with the node off)
    statement, twin = CASES[case]
    ours = ef.compile(statement + " " * 3, backend="c")
    python = ef.compile(statement + " " * 4, backend="c")
    batch, inner, outer = shape
    arrays = _tensors(dtype, batch=batch, inner=inner, outer=outer, seed=case)
    ran = _node_runs(monkeypatch)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for round_ in range(6):
        fresh = {k: v.clone() for k, v in arrays.items()}
        with torch.no_grad():
            got = ours(**fresh)
        monkeypatch.setenv("EINFUSE_TORCH_NODE", "0")
        want = python(**fresh)
        monkeypatch.delenv("EINFUSE_TORCH_NODE")
        assert torch.equal(got, want), round_
        assert not got.requires_grad and got.is_contiguous()
        torch.testing.assert_close(got, twin(**arrays), rtol=tol, atol=tol)
    assert sum(ran) >= 2, "the node never ran the unrecorded chain"


def test_the_node_chain_with_strided_inputs_and_non_finite_values(node, monkeypatch):
    statement, twin = CASES[0]
    ours = ef.compile(statement + " " * 5, backend="c")
    python = ef.compile(statement + " " * 6, backend="c")
    x = torch.randn(256, 64).T           # a transposed view
    W = torch.randn(128, 512)[:, ::2]    # every other column
    bias = torch.randn(128)
    bias[2] = float("nan")
    x[3, 4] = float("inf")
    arrays = {"x": x, "W": W, "bias": bias}
    ran = _node_runs(monkeypatch)
    for _ in range(5):
        got = ours(**arrays)
        monkeypatch.setenv("EINFUSE_TORCH_NODE", "0")
        want = python(**arrays)
        monkeypatch.delenv("EINFUSE_TORCH_NODE")
        # (bit for bit but where NaN, which never equals itself)
        assert torch.equal(got.isnan(), want.isnan()) and got.isnan().any()
        assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))
    assert sum(ran) >= 2
    torch.testing.assert_close(got, twin(**arrays), rtol=1e-5, atol=1e-5, equal_nan=True)
    # a result the caller writes into leaves the next one alone
    first = ours(**arrays)
    kept = first.clone()
    ours(**arrays).add_(1.0)
    torch.testing.assert_close(first, kept, equal_nan=True)


def test_inference_mode_and_a_float_parameter(node, monkeypatch):
    # under inference_mode (the node declines inference tensors: the chain in Python),
    # and with a float parameter (its value read per call: the chain in Python)
    statement, twin = CASES[0]
    ours = ef.compile(statement + " " * 7, backend="c")
    arrays = _tensors(torch.float32, batch=32, inner=128, outer=128, seed=4)
    with torch.inference_mode():
        made = _tensors(torch.float32, batch=32, inner=128, outer=128, seed=4)
        for given in (arrays, made, arrays, made, made, arrays):
            got = ours(**given)
            torch.testing.assert_close(got, twin(**given), rtol=1e-5, atol=1e-5)
    ran = _node_runs(monkeypatch)
    scaled = ef.compile(f"y[b,o] := max({C_OI} + bias[o], 0) * s", backend="c")
    for _ in range(5):
        with torch.no_grad():
            got = scaled(**arrays, s=0.5)
        torch.testing.assert_close(got, 0.5 * twin(**arrays), rtol=1e-5, atol=1e-5)
    assert not any(ran)
