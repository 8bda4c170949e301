"""Review of the prepared autograd call (program/autograd.py), the fused groups' prepared
runner (backends/c_fused_prepared.py) and programs under JAX transformations
(runtime/jax_program.py): the bugs found, each as the test that failed."""

import numpy as np
import pytest

import einfuse as ef

torch = pytest.importorskip("torch")


# -- PyTorch: one autograd node per program ------------------------------------------------

@pytest.mark.parametrize("source, formula", [
    ("T[i,j] := X[i,j]*2\ny[i] := sum[j](T[i,j])", lambda X, W: (X * 2).sum(1)),
    ("T[i,j] := X[i,j]*W[j]\nU[i,j] := T[i,j] + 1\ny[i] := sum[j](U[i,j])",
     lambda X, W: (X * W + 1).sum(1)),
    ("T[i,k] := X[i,k]*2\nS[i] := sum[k](T[i,k])\ny[i,j] := S[i] * W[j]",
     lambda X, W: (2 * X).sum(1)[:, None] * W),
])
def test_an_intermediate_the_backward_needs_the_shape_of_may_live_inside_a_fused_group(
        source, formula):
    """Past the fusing size the forward keeps only outputs and saved names, so ``T``
    (a per-thread row) never reached the environment, and the placeholder the backward
    needed for its shape raised a raw KeyError: 'T' on the first call."""
    program = ef.compile(source)
    for _ in range(2):      # the first call and the prepared one
        X = torch.randn(80, 64, dtype=torch.float64, requires_grad=True)
        W = torch.randn(64, dtype=torch.float64, requires_grad=True)
        inputs = dict(X=X, W=W) if "W" in source else dict(X=X)
        out = program(**inputs)
        seed = torch.randn_like(out)
        got = torch.autograd.grad(out, list(inputs.values()), seed)
        want = torch.autograd.grad(formula(X, W), list(inputs.values()), seed)
        torch.testing.assert_close(out, formula(X, W))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
