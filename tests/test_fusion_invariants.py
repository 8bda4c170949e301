"""A value an inner loop of a fused kernel reads at every step (a row's sum written just
before, a per-row input) is read once per row (plan/fuse_invariants.py): the results
are the same to the bit as the kernel that reads it at every step, right against
brute-force loops and on repeated calls, and the
softmax backward that motivated it (one row pass: dX = P * dP - P * sum(P * dP))
equals torch's."""

import numpy as np
import pytest

import einfuse as ef
from einfuse import ir
from einfuse.backends.c import build as c_build, fused as c_fused
from einfuse.plan import fuse
from fresh_runs import fresh_runs
from oracle import brute_force

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="fusion runs C kernels")

# s[i] is written by the first statement and read at every j by the second; W[i] is an
# input read at every j
ROW_DOT = """s[i] := sum[j](X[i,j] * Y[i,j])
Z[i,j] := X[i,j] * Y[i,j] - X[i,j] * s[i] + W[i]"""


def _locals_in(body) -> int:
    """How many values the kernels' loops read into locals first (ir.Let of a load)."""
    found = 0
    for stmt in body:
        if isinstance(stmt, ir.Let) and isinstance(stmt.value, ir.Load):
            found += 1
        for field in ("body", "small", "large", "then", "otherwise"):
            found += _locals_in(getattr(stmt, field, ()) or ())
    return found


@pytest.fixture
def hoisted(monkeypatch):
    """The number of loads read once per row in each fused kernel built (fresh ones)."""
    seen = []
    real = fuse.read_invariants_once

    def spy(body, buffers, working):
        result = real(body, buffers, working)
        seen.append(_locals_in(result) - _locals_in(body))
        return result
    monkeypatch.setattr(fuse, "read_invariants_once", spy)
    fresh_runs(monkeypatch)
    return seen


def _without_pass(monkeypatch, run):
    with monkeypatch.context() as patch:
        patch.setattr(fuse, "read_invariants_once", lambda body, buffers, working: body)
        fresh_runs(patch)
        return run()


def _arrays(rows, cols, dtype):
    rng = np.random.default_rng(rows * 1000 + cols)
    return {"X": rng.standard_normal((rows, cols)).astype(dtype),
            "Y": rng.standard_normal((rows, cols)).astype(dtype),
            "W": rng.standard_normal(rows).astype(dtype)}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("rows, cols", [(300, 256), (257, 37), (1, 5000), (2000, 3)])
def test_row_values_read_once_give_the_same_bits(monkeypatch, hoisted, rows, cols, dtype):
    arrays = _arrays(rows, cols, dtype)
    program = ef.compile(ROW_DOT)
    found = program(**arrays)
    assert sum(hoisted) >= 2           # s[i] and W[i] were read once per row
    expected = _without_pass(monkeypatch, lambda: ef.compile(ROW_DOT)(**arrays))
    np.testing.assert_array_equal(found, expected)
    if rows * cols <= 6000:             # (the brute-force loops are slow)
        ranges = {"i": (0, rows), "j": (0, cols)}
        s = brute_force("s[i] := sum[j](X[i,j] * Y[i,j])", ranges, arrays)
        z = brute_force("Z[i,j] := X[i,j] * Y[i,j] - X[i,j] * s[i] + W[i]", ranges,
                        {**arrays, "s": s.astype(dtype)})
        tolerance = 1e-5 if dtype == "float32" else 1e-12
        np.testing.assert_allclose(found, z, rtol=tolerance, atol=tolerance)


def test_repeated_calls_keep_their_bits(hoisted):
    program = ef.compile(ROW_DOT)
    arrays = _arrays(400, 256, "float32")
    first = program(**arrays).copy()
    for _ in range(3):
        np.testing.assert_array_equal(program(**arrays), first)
    other = _arrays(400, 256, "float32")
    again = program(**other)
    expected = other["X"] * other["Y"] - other["X"] * (other["X"] * other["Y"]).sum(
        1, keepdims=True) + other["W"][:, None]
    np.testing.assert_allclose(again, expected, rtol=1e-4, atol=1e-4)


def test_softmax_backward_reads_its_row_sum_once_and_equals_torch(monkeypatch, hoisted):
    torch = pytest.importorskip("torch")
    source = """M[i] := max[j](X[i,j])
E[i,j] := exp(X[i,j] - M[i])
P[i,j] := E[i,j] / sum[k](E[i,k])"""
    generator = torch.Generator().manual_seed(3)
    X = torch.randn(256, 256, generator=generator, requires_grad=True)
    G = torch.randn(256, 256, generator=generator)

    def gradient():
        program = ef.compile(source)
        grads = [torch.autograd.grad((program(X=X) * G).sum(), X)[0] for _ in range(3)]
        for later in grads[1:]:          # a repeated call: the same bits
            assert torch.equal(later, grads[0])
        return grads[0]
    found = gradient()
    assert any(hoisted)
    expected = torch.autograd.grad((torch.softmax(X, 1) * G).sum(), X)[0]
    torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(found, _without_pass(monkeypatch, gradient))
