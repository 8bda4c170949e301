"""Under torch.compile, a program's operators run the C++ node's prepared plans
(program/torch_compiled_fused.py, runtime/torch_node.split_plan): the forward operator
runs the node's forward and returns what its backward reads, the backward operator
runs the node's backward on those; the values and gradients are bit for bit eager
einfuse's (the same kernels), with no graph break."""

import pytest
import torch

import einfuse as ef
from einfuse.program import torch_compiled_fused as fused
from einfuse.runtime import torch_node

B, D, H = 32, 64, 128     # (B*D*H: products on torch's BLAS, which the node runs)
BLOCK = f"""
r[b] := sqrt(sum[d](X[b,d]**2) / {D} + 0.000001)
n[b,d] := X[b,d] / r[b] * G[d]
h[b,f] := sum[d](n[b,d] * W1[d,f])
g[b,f] := 0.5 * h[b,f] * (1 + erf(h[b,f] * 0.7071067811865476))
y[b,e] := X[b,e] + sum[f](g[b,f] * W2[f,e])
"""
SOFTMAX = """m[i] := max[j](X[i,j])
e[i,j] := exp(X[i,j] - m[i])
P[i,j] := e[i,j] / sum[k](e[i,k])"""
LAYERNORM = """mu[i] := sum[j](X[i,j]) / 24
v[i] := sum[j]((X[i,j] - mu[i])**2) / 24
y[i,j] := (X[i,j] - mu[i]) / sqrt(v[i] + 0.00001) * g[j] + b[j]"""


class Block(torch.nn.Module):
    def __init__(self, program, dtype):
        super().__init__()
        self.program = program
        self.G = torch.nn.Parameter(torch.rand(D, dtype=dtype) + 0.5)
        self.W1 = torch.nn.Parameter(torch.randn(D, H, dtype=dtype) / D ** 0.5)
        self.W2 = torch.nn.Parameter(torch.randn(H, D, dtype=dtype) / H ** 0.5)

    def forward(self, x):
        return self.program(X=x, G=self.G, W1=self.W1, W2=self.W2)


class MLP(torch.nn.Module):
    def __init__(self, program, dtype):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(program, dtype), Block(program, dtype)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x.square().mean()


def _twins(dtype):
    torch.manual_seed(0)
    program = ef.compile(BLOCK, outputs=("y",))
    eager = MLP(program, dtype)
    compiled_model = MLP(program, dtype)
    compiled_model.load_state_dict(eager.state_dict())
    return eager, compiled_model


def _train(model, x, steps):
    """(losses, parameters after each step) of plain SGD."""
    losses, params = [], []
    for _ in range(steps):
        for p in model.parameters():
            p.grad = None
        loss = model(x)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        losses.append(loss.detach().clone())
        params.append([p.detach().clone() for p in model.parameters()])
    return losses, params


@pytest.fixture
def node_runs(monkeypatch):
    """How many forward and backward operator calls the node ran (not declined)."""
    counts = {"forward": 0, "backward": 0}

    def counted(name, function):
        def wrapper(*args):
            found = function(*args)
            counts[name] += found is not None
            return found
        return wrapper
    monkeypatch.setattr(torch_node, "split_forward",
                        counted("forward", torch_node.split_forward))
    monkeypatch.setattr(torch_node, "split_backward",
                        counted("backward", torch_node.split_backward))
    return counts


def _eligible_splits() -> int:
    return sum(1 for d in fused.node_decisions() if d is not None and d.eligible)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_compiled_training_loop_is_eager_einfuse_bit_for_bit(node, node_runs, dtype):
    eager, compiled_model = _twins(dtype)
    x = torch.randn(B, D, dtype=dtype)
    torch._dynamo.reset()
    before = _eligible_splits()
    run = torch.compile(compiled_model, fullgraph=True, backend="aot_eager")
    got_losses, got_params = _train(run, x, 5)
    want_losses, want_params = _train(eager, x, 5)
    # the node ran both operators: one signature per block (X needs no gradient in
    # the first, does in the second)
    assert _eligible_splits() - before == 2
    # (the node's plan is made in the first backward, split in the second; the forward
    # takes it from the third step)
    assert node_runs == {"forward": 2 * 3, "backward": 2 * 4}
    for got, want in zip(got_losses, want_losses):
        assert torch.equal(got, want)
    for got_step, want_step in zip(got_params, want_params):
        for got, want in zip(got_step, want_step):
            assert torch.equal(got, want)


def test_the_training_step_has_no_graph_break(node):
    _, compiled_model = _twins(torch.float32)
    x = torch.randn(B, D)
    _train(torch.compile(compiled_model, fullgraph=True, backend="aot_eager"), x, 3)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(compiled_model)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def _layer_case(source, make, dtype):
    program = ef.compile(source)
    torch.manual_seed(1)
    tensors = make(dtype)

    def model(**given):
        out = program(**given)
        return (out * torch.linspace(-1, 2, out.shape[-1], dtype=out.dtype)).sum(), out

    return model, tensors


def _softmax_inputs(dtype):
    return {"X": torch.randn(12, 24, dtype=dtype, requires_grad=True)}


def _layernorm_inputs(dtype):
    return {"X": torch.randn(12, 24, dtype=dtype, requires_grad=True),
            "g": (torch.rand(24, dtype=dtype) + 0.5).requires_grad_(),
            "b": torch.randn(24, dtype=dtype, requires_grad=True)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("source, make", [(SOFTMAX, _softmax_inputs),
                                          (LAYERNORM, _layernorm_inputs)],
                         ids=["softmax", "layernorm"])
def test_a_compiled_layer_is_eager_einfuse_bit_for_bit(node, node_runs, dtype, source,
                                                      make):
    model, tensors = _layer_case(source, make, dtype)
    torch._dynamo.reset()
    before = _eligible_splits()
    run = torch.compile(model, fullgraph=True, backend="aot_eager")
    for step in range(5):
        given = {name: (t.detach() * (1 + step / 8)).requires_grad_(t.requires_grad)
                 for name, t in tensors.items()}
        again = {name: t.detach().clone().requires_grad_(t.requires_grad)
                 for name, t in given.items()}
        loss, out = run(**given)
        loss.backward()
        want_loss, want_out = model(**again)
        want_loss.backward()
        assert torch.equal(out, want_out) and torch.equal(loss, want_loss)
        for name in given:
            assert torch.equal(given[name].grad, again[name].grad), name
    assert _eligible_splits() - before == 1
    assert node_runs == {"forward": 3, "backward": 4}


def test_an_output_the_loss_does_not_read_seeds_zeros(node):
    program = ef.compile("""m[i] := max[j](X[i,j])
        e[i,j] := exp(X[i,j] - m[i])
        s[i] := sum[j](e[i,j])
        P[i,j] := e[i,j] / s[i]""", outputs=("P", "s"))

    def model(x):
        p, s = program(X=x)
        return (p * p).sum()

    torch._dynamo.reset()
    run = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(6, 10, dtype=torch.float64, requires_grad=True)
    reference = x.detach().clone().requires_grad_()
    for _ in range(4):
        x.grad = reference.grad = None
        run(x).backward()
        model(reference).backward()
        assert torch.equal(x.grad, reference.grad)
    torch.testing.assert_close(x.grad, torch.autograd.grad(
        (torch.softmax(reference, 1) ** 2).sum(), reference)[0])


def test_a_label_out_of_range_after_the_node_took_the_call_raises_einfuses_error(
        node, node_runs):
    n = 64       # (float32: the node's log-sum-exp row kernel on int64 labels)
    program = ef.compile(f"""m[i] := max[j](X[i,j])
        l[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - X[i, t[i]]
        L := sum[i](l[i]) / {n}""")

    def model(x, t):
        return program(X=x, t=t)

    torch._dynamo.reset()
    run = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.manual_seed(2)
    x = torch.randn(n, n, requires_grad=True)
    reference = x.detach().clone().requires_grad_()
    labels = torch.randint(0, n, (n,))
    for _ in range(4):
        x.grad = reference.grad = None
        got = run(x, labels)
        got.backward()
        want = model(reference, labels)
        want.backward()
        assert torch.equal(got, want) and torch.equal(x.grad, reference.grad)
    assert node_runs["forward"] >= 1 and node_runs["backward"] >= 1
    bad = labels.clone()
    bad[3] = n + 5
    with pytest.raises(Exception) as raised:
        run(x, bad)
    assert "t[3] = 69 is outside its valid range" in str(raised.value)


def test_the_split_rules_decline_in_order():
    from einfuse.schedule.torch_node_split import SplitFacts, split_eligibility
    every = dict(named=True, fresh=True, declared=True, reads_covered=True,
                 gradients_apart=True)
    assert split_eligibility(SplitFacts(**every)).eligible
    reasons = set()
    for rule in every:
        decision = split_eligibility(SplitFacts(**dict(every, **{rule: False})))
        assert not decision.eligible and decision.reason
        reasons.add(decision.reason)
    assert len(reasons) == len(every)
