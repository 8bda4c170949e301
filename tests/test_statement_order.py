"""A program's statements run in an order from their dataflow (rewrite/statement_order.py):
a statement written between a producer and its consumer no longer ends the producer's
fusion group, every order of independent statements runs in one order (same values, same
kernels), updates ('+=') keep their place, and positional arguments keep the order of
first use as written."""

import itertools

import numpy as np
import pytest

import einfuse as ef
from einfuse.lang.parser import parse as parse_statement
from einfuse.rewrite.statement_order import dataflow_order

RNG = np.random.default_rng(11)
X = RNG.standard_normal((256, 512)).astype(np.float32)
Z = RNG.standard_normal((256, 64)).astype(np.float32)
A = RNG.standard_normal((64, 128)).astype(np.float32)
W = RNG.standard_normal((128, 32)).astype(np.float32)

PARTS = {
    "m": "m[i] := max[j](x[i,j])",
    "e": "e[i,j] := exp(x[i,j] - m[i])",
    "s": "s[i] := sum[j](e[i,j])",
    "y": "y[i,j] := e[i,j] / s[i]",
    "h": "h[p,o] := sum[k](a[p,k] * w[k,o])",
    "t": "t[i] := sum[c](z[i,c] * z[i,c])",
}
NEEDS = {"e": "m", "s": "e", "y": "s"}


def _orders():
    """Every order of the six statements that defines m, e, s before their readers."""
    for order in itertools.permutations(PARTS):
        if all(order.index(NEEDS[n]) < order.index(n) for n in NEEDS):
            yield order


def _expected():
    e = np.exp(X - X.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True), A @ W, (Z * Z).sum(1)


ORDERS = list(_orders())


@pytest.mark.parametrize("order", ORDERS[::7] + [ORDERS[-1]], ids=lambda o: "".join(o))
def test_every_order_of_independent_statements_runs_alike(order):
    text = "\n".join(PARTS[n] for n in order)
    arrays = dict(x=X, a=A, w=W, z=Z)
    explanation = ef.explain(text, outputs=["y", "h", "t"], **arrays)
    fused = [g for g in explanation.groups if len(g.statements) > 1]
    # the softmax's four statements are one kernel (the row kernel), whatever is
    # written between them
    assert len(fused) == 1 and fused[0].row_kernel == "softmax"
    assert len(explanation.groups) == 3
    y, h, t = ef.ein(text, outputs=["y", "h", "t"], **arrays)
    for got, want in zip((y, h, t), _expected()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_the_run_order_is_one_for_every_written_order():
    canonical = set()
    for order in ORDERS:
        program = ef.compile("\n".join(PARTS[n] for n in order), outputs=["y", "h", "t"])
        canonical.add(tuple(s.output for s in program.statements
                            if s.output in ("m", "e", "s", "y")))
    assert canonical == {("m", "e", "s", "y")}


def test_positional_arguments_keep_the_order_of_first_use_as_written():
    text = "\n".join(PARTS[n] for n in ("m", "h", "e", "s", "y"))
    program = ef.compile(text, outputs=["y", "h"])
    assert program.inputs == ("x", "a", "w")
    assert [s.output for s in program.statements] == ["m", "e", "s", "y", "h"]
    y, h = program(X, A, W)
    want = _expected()
    np.testing.assert_allclose(y, want[0], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(h, want[1], rtol=1e-4)


def test_nothing_moves_across_an_update():
    statements = [parse_statement(t) for t in (
        "m[i] := max[j](x[i,j])",
        "u[i] := sum[j](z[i,j])",
        "acc[i] += u[i]",
        "e[i] := m[i] * 2",
        "v[i] := acc[i] + m[i]",
    )]
    order = dataflow_order(statements)
    assert order.index(2) == 2 and set(order[:2]) == {0, 1} and set(order[3:]) == {3, 4}
    acc = np.zeros(256, np.float32)
    text = "\n".join(("m[i] := max[j](x[i,j])", "u[i] := sum[c](z[i,c])",
                      "acc[i] += u[i]", "e[i] := m[i] * 2", "v[i] := acc[i] + m[i]"))
    e, v = ef.ein(text, x=X, z=Z, acc=acc, outputs=["e", "v"])
    np.testing.assert_allclose(acc, Z.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(v, Z.sum(1) + X.max(1), rtol=1e-5, atol=1e-5)


def test_a_consumer_runs_right_after_its_producer():
    statements = [parse_statement(t) for t in (
        "a[i] := sum[j](x[i,j])",
        "b[i] := sum[j](z[i,j])",
        "c[i] := a[i] * 2",
        "d[i] := b[i] * 3",
    )]
    assert dataflow_order(statements) == (0, 2, 1, 3)


def test_gradients_of_a_reordered_program_are_torch_autograd_s():
    torch = pytest.importorskip("torch")
    text = "\n".join(PARTS[n] for n in ("m", "t", "e", "s", "y"))
    x = torch.tensor(X[:8, :16].astype(np.float64), requires_grad=True)
    z = torch.tensor(Z[:8, :5].astype(np.float64), requires_grad=True)
    y, t = ef.ein(text, x=x, z=z, outputs=["y", "t"])
    (y * torch.arange(16.0, dtype=torch.float64)).sum().backward(retain_graph=True)
    t.sum().backward()
    xr, zr = x.detach().clone().requires_grad_(), z.detach().clone().requires_grad_()
    (torch.softmax(xr, 1) * torch.arange(16.0, dtype=torch.float64)).sum().backward()
    (zr * zr).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(z.grad, zr.grad)
