"""What AOTAutograd records around einfuse's operators (program/torch_compiled.py): the
intermediates the forward operator keeps for the backward get no gradient of their
own (no zero tensor made per kept value and call), the compiled gradients pass
gradcheck in float64 and equal eager einfuse's, and an operator's key names its
program whatever was traced before it (inductor's caches are shared by processes)."""

import os
import subprocess
import sys

import pytest
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


_KEY_OF = """
import torch, einfuse as ef
from torch._dynamo.backends.common import aot_autograd
found = []
def keep(gm, example_inputs):
    found.extend(n.args[0] for n in gm.graph.nodes
                 if n.target is torch.ops.einfuse.run.default)
    return gm
backend = aot_autograd(fw_compiler=keep, bw_compiler=lambda gm, example_inputs: gm)
x = torch.randn(3, 4, requires_grad=True)
for text in {texts!r}:
    program = ef.compile(text)
    torch.compile(lambda x: program(X=x), backend=backend)(x)
print(found[-1])
"""


@pytest.mark.parametrize("first", ["z[i,j] := X[i,j] * 2", "z[i,j] := X[i,j] + 1"])
def test_an_operators_key_names_its_program_not_the_order_of_traces(first):
    """The key is a constant of the graph that inductor's caches (shared by processes)
    key the compiled graph by: one program traced after another in a fresh process
    gets the key it gets alone, and two programs get two keys."""
    def key_after(*texts):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        out = subprocess.run([sys.executable, "-c", _KEY_OF.format(texts=texts)],
                             env=env, capture_output=True, text=True, check=True)
        return out.stdout.split()[-1]
    wanted = "y[i,j] := exp(X[i,j])"
    alone, after = key_after(wanted), key_after(first, wanted)
    assert alone == after and alone.startswith("einfuse-")
    assert key_after(first) != alone
