"""torch autograd helpers of the program-gradient tests (import after
``pytest.importorskip("torch")``)."""

import torch


def grads(fn, inputs, seed):
    """(fn's output, its gradients for the inputs that require them) on fresh leaves."""
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out = fn(*leaves)
    wanted = [t for t in leaves if t.requires_grad]
    return out.detach(), torch.autograd.grad(out, wanted, seed)


def close(got, want, dtype, equal_nan=False):
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(got, want, **tol, equal_nan=equal_nan)
