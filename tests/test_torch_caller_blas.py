"""A program on torch tensors runs its statements on NumPy views of them (the prepared
forward and backward, runtime/program_autograd.py; the operator under torch.compile):
their large products are a torch caller's, so they run on torch's BLAS as a statement
on the tensors does (analysis/frameworks.torch_views; backends/c/blas.py says why),
while a NumPy caller of the same program and shapes keeps NumPy's BLAS: the caller is
part of the signature every prepared runner is keyed by."""

import numpy as np
import pytest

import einfuse as ef
from torch_node_support import python_path
from einfuse.backends.c import build as c_build

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")

PROGRAM = """h[b,f] := sum[d](X[b,d] * W1[d,f])
g[b,f] := tanh(h[b,f])
y[b,e] := sum[f](g[b,f] * W2[f,e])"""
# equal programs spelled otherwise: operands swapped and other names, one statement
SPELLINGS = [PROGRAM,
             """h[p,q] := sum[r](W1[r,q] * X[p,r])
g[p,q] := tanh(h[p,q])
y[p,s] := sum[q](W2[q,s] * g[p,q])""",
             "y[b,e] := sum[f](tanh(sum[d](X[b,d] * W1[d,f])) * W2[f,e])"]
B, D, F, E = 64, 128, 64, 64      # every product >= 2**18 multiply-adds


def _arrays(dtype, seed=0):
    rng = np.random.default_rng(seed)
    return {"X": rng.standard_normal((B, D)).astype(dtype),
            "W1": (rng.standard_normal((D, F)) / D ** 0.5).astype(dtype),
            "W2": (rng.standard_normal((F, E)) / F ** 0.5).astype(dtype)}


def _twin(X, W1, W2):
    return torch.tanh(X @ W1) @ W2


class _MatmulCount:
    """Counts torch.matmul calls (torch's BLAS route of backends/c/torch_blas.py)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        original = torch.matmul

        def counting(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)
        monkeypatch.setattr(torch, "matmul", counting)


@pytest.mark.parametrize("dtype, text", [(np.float32, PROGRAM), (np.float64, PROGRAM),
                                         (np.float32, SPELLINGS[1]),
                                         (np.float64, SPELLINGS[2])])
def test_a_recorded_programs_products_run_on_torch_blas(monkeypatch, dtype, text):
    # (the Python path's products, counted at torch.matmul: where the C++ node takes
    # the program they are its at::matmul / at::addmm operations, which no Python
    # counter sees: tests/test_torch_node_products.py checks their bits against these)
    monkeypatch.setenv("EINFUSE_TORCH_NODE", "0")
    program = ef.compile(text, outputs=("y",), backend="c")
    arrays = _arrays(dtype)
    seed = torch.from_numpy(np.random.default_rng(1).standard_normal((B, E)).astype(dtype))
    leaves = {k: torch.from_numpy(v).requires_grad_(True) for k, v in arrays.items()}
    twins = {k: torch.from_numpy(v).requires_grad_(True) for k, v in arrays.items()}
    (_twin(**twins) * seed).sum().backward()
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for round_ in range(4):
        if round_ == 2:
            count = _MatmulCount(monkeypatch)
        for leaf in leaves.values():
            leaf.grad = None
        if "_autograd" in vars(program):    # (a Program another test made of this text)
            python_path(program)
        y = program(**leaves)
        (y * seed).sum().backward()
        torch.testing.assert_close(y.detach(), _twin(**twins).detach(), rtol=tol, atol=tol)
        for name, leaf in leaves.items():
            torch.testing.assert_close(leaf.grad, twins[name].grad, rtol=tol, atol=tol)
    # two repeats of two forward products and (at least) three backward ones
    assert count.calls >= 2 * 5, f"only {count.calls} products reached torch's BLAS"


def test_an_unrecorded_programs_products_run_on_torch_blas(monkeypatch):
    """(Sizes past what the brute-force oracle can loop over: NumPy in float64.)"""
    program = ef.compile(PROGRAM, outputs=("y",), backend="c")
    arrays = _arrays(np.float32)
    tensors = {k: torch.from_numpy(v) for k, v in arrays.items()}
    wide = {k: v.astype(np.float64) for k, v in arrays.items()}
    expected = np.tanh(wide["X"] @ wide["W1"]) @ wide["W2"]
    for round_ in range(4):
        if round_ == 2:
            count = _MatmulCount(monkeypatch)
        with torch.no_grad():
            y = program(**tensors)
        np.testing.assert_allclose(y.numpy(), expected, rtol=1e-4, atol=1e-4)
    assert count.calls >= 2 * 2


def test_a_numpy_caller_of_the_same_shapes_keeps_numpys_blas(monkeypatch):
    """After a torch caller prepared its runners, a NumPy caller of the same program,
    dtypes and shapes gets runners of its own (NumPy's BLAS: no torch call at all)."""
    program = ef.compile(PROGRAM, outputs=("y",), backend="c")
    arrays = _arrays(np.float64, seed=3)
    tensors = {k: torch.from_numpy(v.copy()) for k, v in arrays.items()}
    with torch.no_grad():
        for _ in range(3):
            program(**tensors)
    count = _MatmulCount(monkeypatch)
    expected = _twin(**{k: torch.from_numpy(v) for k, v in arrays.items()}).numpy()
    for _ in range(3):
        y = program(**arrays)
        assert type(y) is np.ndarray
        np.testing.assert_allclose(y, expected, rtol=1e-10, atol=1e-10)
    assert count.calls == 0, "a NumPy caller's products went to torch's BLAS"
