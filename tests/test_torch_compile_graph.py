"""What AOTAutograd records around einfuse's operators (program/torch_compiled.py): the
intermediates the forward operator keeps for the backward get no gradient of their
own (no zero tensor made per kept value and call), and the compiled gradients pass
gradcheck in float64 and equal eager einfuse's."""

import torch

import einfuse as ef

D, H = 4, 6
BLOCK = """
r[b] := sqrt(sum[d](X[b,d]**2) / 4 + 0.001)
n[b,d] := X[b,d] / r[b] * G[d]
h[b,f] := sum[d](n[b,d] * W1[d,f])
g[b,f] := 0.5 * h[b,f] * (1 + erf(h[b,f] * 0.7071067811865476))
y[b,e] := X[b,e] + sum[f](g[b,f] * W2[f,e])
"""


def _recording_backend(graphs):
    """An AOTAutograd backend that runs the graphs as they are and keeps them."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs.append((kind, gm))
            return make_boxed_func(gm)
        return compiler
    return aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))


def _operator_calls(graphs, kind, name):
    target = getattr(torch.ops.einfuse, name).default
    return [node for found, gm in graphs if found == kind
            for node in gm.graph.nodes if node.target is target]


def _parameters(dtype=torch.float64):
    torch.manual_seed(0)
    return (torch.randn(3, D, dtype=dtype, requires_grad=True),
            (torch.rand(D, dtype=dtype) + 0.5).requires_grad_(),
            (torch.randn(D, H, dtype=dtype) / 2).requires_grad_(),
            (torch.randn(H, D, dtype=dtype) / 2).requires_grad_())


def test_the_kept_intermediates_get_no_gradient_in_the_compiled_backward():
    program = ef.compile(BLOCK, outputs=("y",))
    graphs = []
    torch._dynamo.reset()

    def loss(X, G, W1, W2):
        return program(X=X, G=G, W1=W1, W2=W2).square().sum()
    run = torch.compile(loss, fullgraph=True, backend=_recording_backend(graphs))
    arguments = _parameters()
    for _ in range(2):
        for t in arguments:
            t.grad = None
        run(*arguments).backward()
        got = [t.grad.clone() for t in arguments]
        for t in arguments:
            t.grad = None
        loss(*arguments).backward()
        for mine, eager in zip(got, arguments):
            torch.testing.assert_close(mine, eager.grad, rtol=1e-12, atol=1e-12)
    (forward,) = _operator_calls(graphs, "forward", "run")
    (backward,) = _operator_calls(graphs, "backward", "run_fused_backward")
    # the forward returns y, then what the backward reads (r, h: RMSNorm's scale and the
    # pre-activation); only y has a gradient, the kept values' slots are None
    returned = len(forward.meta["val"])
    seeds = backward.args[6]
    assert returned > 1 and len(seeds) == returned
    assert seeds[0] is not None and all(seed is None for seed in seeds[1:])


def test_a_compiled_block_passes_gradcheck_in_float64():
    program = ef.compile(BLOCK, outputs=("y",))
    torch._dynamo.reset()
    run = torch.compile(lambda X, G, W1, W2: program(X=X, G=G, W1=W1, W2=W2),
                        fullgraph=True)
    assert torch.autograd.gradcheck(run, _parameters(), eps=1e-6, atol=1e-7)
