"""einfuse under torch.compile on CPU tensors that need gradients: the operator runs the
eager recorded call's fused forward and backward (program/torch_compiled_fused.py), its
backward derived once per set of wanted inputs and planned once per signature, with no
graph break; values and gradients equal the eager einfuse module's and a pure-torch
twin's."""

import pytest
import torch

import einfuse as ef
from einfuse.runtime.program_autograd import DERIVATIONS
from einfuse.runtime.program_backward import PLANS_MADE

D, H = 16, 24
# (an epsilon of its own per test: the operator's derived backwards are kept per
# program text, and a test that counts derivations needs a text not seen before)
BLOCK = """
r[b] := sqrt(sum[d](X[b,d]**2) / {D} + {eps})
n[b,d] := X[b,d] / r[b] * G[d]
h[b,f] := sum[d](n[b,d] * W1[d,f])
g[b,f] := 0.5 * h[b,f] * (1 + erf(h[b,f] * 0.7071067811865476))
y[b,e] := X[b,e] + sum[f](g[b,f] * W2[f,e])
"""


class Block(torch.nn.Module):
    """RMSNorm, Linear, GELU, Linear and a residual; as an einfuse program or in torch."""

    def __init__(self, program, dtype, eps):
        super().__init__()
        self.program, self.eps = program, eps
        self.G = torch.nn.Parameter(torch.rand(D, dtype=dtype) + 0.5)
        self.W1 = torch.nn.Parameter(torch.randn(D, H, dtype=dtype) / D ** 0.5)
        self.W2 = torch.nn.Parameter(torch.randn(H, D, dtype=dtype) / H ** 0.5)

    def forward(self, x):
        if self.program is not None:
            return self.program(X=x, G=self.G, W1=self.W1, W2=self.W2)
        r = torch.sqrt((x * x).mean(1, keepdim=True) + self.eps)
        return x + torch.nn.functional.gelu((x / r * self.G) @ self.W1) @ self.W2


class MLP(torch.nn.Module):
    def __init__(self, program, dtype=torch.float64, eps=1e-6):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(program, dtype, eps),
                                           Block(program, dtype, eps)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x.square().mean()


def _step(model, x):
    for p in model.parameters():
        p.grad = None
    loss = model(x)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _twins(dtype=torch.float64, eps=1e-6):
    torch.manual_seed(0)
    program = ef.compile(BLOCK.format(D=D, eps=repr(eps)), outputs=("y",))
    ours, twin = MLP(program, dtype, eps), MLP(None, dtype, eps)
    twin.load_state_dict(ours.state_dict())
    return ours, twin


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_compiled_mlp_equals_eager_einfuse_and_the_torch_twin(dtype):
    ours, twin = _twins(dtype)
    x = torch.randn(8, D, dtype=dtype)
    torch._dynamo.reset()
    run = torch.compile(ours, fullgraph=True, backend="aot_eager")
    tolerance = {} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-5}
    for _ in range(3):
        got, got_grads = _step(run, x)
        eager, eager_grads = _step(ours, x)
        want, want_grads = _step(twin, x)
        torch.testing.assert_close(got, eager, **tolerance)
        torch.testing.assert_close(got, want, **tolerance)
        for a, b, c in zip(got_grads, eager_grads, want_grads):
            torch.testing.assert_close(a, b, **tolerance)
            torch.testing.assert_close(a, c, **tolerance)


def test_the_mlp_compiles_without_a_graph_break():
    ours, _ = _twins()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(ours)(torch.randn(8, D, dtype=torch.float64))
    assert explained.graph_break_count == 0
    assert explained.graph_count == 1


def test_the_backward_is_derived_and_planned_once_across_steps():
    ours, twin = _twins(eps=3e-6)
    x = torch.randn(8, D, dtype=torch.float64)
    torch._dynamo.reset()
    run = torch.compile(ours, fullgraph=True, backend="aot_eager")
    derived, planned = DERIVATIONS.value, PLANS_MADE.value
    _step(run, x)
    # the program, two sets of wanted inputs: (G, W1, W2) in the first block, whose X
    # needs no gradient, and (X, G, W1, W2) in the second; one shape
    assert DERIVATIONS.value - derived == 2
    assert PLANS_MADE.value - planned == 2
    derived, planned = DERIVATIONS.value, PLANS_MADE.value
    for _ in range(4):
        got, grads = _step(run, x)
    assert DERIVATIONS.value == derived
    assert PLANS_MADE.value == planned
    want, want_grads = _step(twin, x)
    torch.testing.assert_close(got, want)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b)


def test_a_statement_is_derived_once_and_its_gradients_match_torch():
    kernel = ef.compile("y[i] := logsumexp[j](X[i,j] * w[j] * 1.5)")

    def model(x, w):
        return (kernel(X=x, w=w) * torch.arange(1.0, 5.0, dtype=x.dtype)).sum()

    def reference(x, w):
        return (torch.logsumexp(x * w * 1.5, 1) * torch.arange(1.0, 5.0, dtype=x.dtype)).sum()

    torch._dynamo.reset()
    run = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, dtype=torch.float64, requires_grad=True)
    derived = DERIVATIONS.value
    run(x, w).backward()
    assert DERIVATIONS.value == derived + 1      # the statement's one backward
    derived = DERIVATIONS.value
    for _ in range(3):
        x.grad = w.grad = None
        value = run(x, w)
        value.backward()
        got = (value.detach(), x.grad.clone(), w.grad.clone())
    assert DERIVATIONS.value == derived
    x.grad = w.grad = None
    want = reference(x, w)
    want.backward()
    torch.testing.assert_close(got, (want.detach(), x.grad, w.grad))


def test_only_the_inputs_that_need_a_gradient_get_one():
    program = ef.compile("""
        m[i]   := max[j](X[i,j])
        e[i,j] := exp(X[i,j] - m[i])
        P[i,j] := e[i,j] / sum[k](e[i,k]) * s[j]
    """)

    def model(x, s):
        return (program(X=x, s=s) ** 2).sum()

    def reference(x, s):
        return ((torch.softmax(x, 1) * s) ** 2).sum()

    torch._dynamo.reset()
    run = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    s = torch.randn(7, dtype=torch.float64)
    for _ in range(2):
        x.grad = None
        value = run(x, s)
        value.backward()
    got = x.grad.clone()
    x.grad = None
    reference(x, s).backward()
    torch.testing.assert_close(got, x.grad)
    assert s.grad is None


def test_a_gradient_through_argmax_alone_is_refused_as_eagerly():
    program = ef.compile("""
        a[i] := argmax[j](X[i,j])
        y[i] := logsumexp[j](X[i,j])
    """, outputs=("a", "y"))

    def model(x):
        positions, y = program(X=x)
        return positions, y.sum()

    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ef.EinfuseError) as eager:
        model(x)
    torch._dynamo.reset()
    with pytest.raises(Exception) as traced:
        torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    assert "reaches the result only through argmax" in str(eager.value)
    assert "reaches the result only through argmax" in str(traced.value)
    # without a gradient wanted, both outputs come back
    positions, value = torch.compile(model, fullgraph=True, backend="aot_eager")(
        x.detach())
    assert torch.equal(positions, x.detach().argmax(1))
    torch.testing.assert_close(value, torch.logsumexp(x.detach(), 1).sum())


def test_under_no_grad_the_compiled_call_keeps_nothing_for_a_backward():
    ours, twin = _twins()
    x = torch.randn(8, D, dtype=torch.float64)

    def evaluate(model, x):
        with torch.no_grad():
            return model(x)

    torch._dynamo.reset()
    run = torch.compile(evaluate, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(run(ours, x), evaluate(twin, x))


@pytest.mark.slow
def test_the_mlp_under_inductor_equals_the_torch_twin():
    ours, twin = _twins(torch.float32)
    x = torch.randn(8, D)
    torch._dynamo.reset()
    run = torch.compile(ours, fullgraph=True)
    for _ in range(2):
        got, grads = _step(run, x)
    want, want_grads = _step(twin, x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_eager_repeated_calls_that_record_nothing_then_one_that_records():
    # (the prepared forward of a call that records nothing must not be taken for a
    # recorded call's: grad mode and requires_grad decide, call by call)
    program = ef.compile("""
        m[i]   := max[j](X[i,j])
        e[i,j] := exp(X[i,j] - m[i])
        P[i,j] := e[i,j] / sum[k](e[i,k])
    """)
    x = torch.randn(6, 5, dtype=torch.float64)
    want = torch.softmax(x, 1)
    for _ in range(3):              # nothing needs a gradient
        got = program(X=x)
        assert got.grad_fn is None
        torch.testing.assert_close(got, want)
    leaf = x.clone().requires_grad_(True)
    weights = torch.randn(6, 5, dtype=torch.float64)
    for _ in range(2):              # recorded, then the same signature under no_grad
        got = program(X=leaf)
        assert got.grad_fn is not None
        leaf.grad = None
        (got * weights).sum().backward()
        torch.testing.assert_close(got.detach(), want)
        with torch.no_grad():
            quiet = program(X=leaf)
        assert quiet.grad_fn is None
        torch.testing.assert_close(quiet, want)
    expected = x.clone().requires_grad_(True)
    (torch.softmax(expected, 1) * weights).sum().backward()
    torch.testing.assert_close(leaf.grad, expected.grad)


def test_cross_entropy_with_an_index_input_and_a_0d_output():
    program = ef.compile("""
        m[i] := max[j](X[i,j])
        l[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - X[i, t[i]]
        L := sum[i](l[i]) / 8
    """)

    def model(x, t):
        return program(X=x, t=t) * 2.0

    torch._dynamo.reset()
    run = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(8, 5, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 5, (8,))
    for _ in range(3):
        x.grad = None
        value = run(x, t)
        value.backward()
    got = x.grad.clone()
    x.grad = None
    want = torch.nn.functional.cross_entropy(x, t) * 2.0
    want.backward()
    torch.testing.assert_close(value.detach(), want.detach())
    torch.testing.assert_close(got, x.grad)
