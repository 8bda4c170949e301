"""A recorded Triton program call's repeated backward (runtime/program_triton_autograd.py):
planned once per layout of its seeds, with which results need converting decided on
that plan's first run; a seed of another layout plans anew and gets its own right
gradient; inference tensors among the inputs are still held (save_tensors' path)."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.triton import backend as triton_backend, launch
from einfuse.runtime.program_backward import PLANS_MADE

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not triton_backend.available(),
                                reason="Triton is not installed")
DEVICE = torch.device("cpu" if triton_backend.interpreted() else "cuda")
SOFTMAX = ("m[i] := max[j](X[i,j])\ne[i,j] := exp(X[i,j] - m[i])\n"
           "P[i,j] := e[i,j] / sum[k](e[i,k])")


def _softmax_grad(x, seed):
    reference = x.detach().clone().requires_grad_(True)
    torch.softmax(reference, 1).backward(seed)
    return reference.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_repeated_backward_is_planned_once_and_matches_torch(dtype):
    program = ef.compile(SOFTMAX, backend="triton")
    x = torch.randn(6, 10, dtype=dtype, device=DEVICE, requires_grad=True)
    seeds = [torch.randn(6, 10, dtype=dtype, device=DEVICE) for _ in range(4)]
    program(X=x).backward(seeds[0])
    made = PLANS_MADE.value
    for seed in seeds[1:]:
        x.grad = None
        with launch.observed() as seen:
            program(X=x).backward(seed)
        assert [r.kernel for r in seen] == ["einfuse_rows", "einfuse_rows"]
        torch.testing.assert_close(x.grad, _softmax_grad(x, seed))
    assert PLANS_MADE.value == made


def test_a_seed_of_another_layout_gets_its_own_plan_and_gradient():
    program = ef.compile(SOFTMAX, backend="triton")
    x = torch.randn(5, 7, dtype=torch.float64, device=DEVICE, requires_grad=True)
    contiguous = torch.randn(5, 7, dtype=torch.float64, device=DEVICE)
    transposed = torch.randn(7, 5, dtype=torch.float64, device=DEVICE).t()
    for seed in (contiguous, transposed, contiguous, transposed):
        x.grad = None
        program(X=x).backward(seed)
        torch.testing.assert_close(x.grad, _softmax_grad(x, seed))


def test_an_inference_tensor_input_is_held_for_the_backward():
    program = ef.compile("y[i,j] := X[i,j] * W[i,j]\nz[i] := sum[j](y[i,j] * y[i,j])",
                         backend="triton")
    with torch.inference_mode():
        x = torch.randn(4, 6, dtype=torch.float64, device=DEVICE)
    w = torch.randn(4, 6, dtype=torch.float64, device=DEVICE, requires_grad=True)
    seed = torch.randn(4, dtype=torch.float64, device=DEVICE)
    for _ in range(3):
        w.grad = None
        program(X=x, W=w).backward(seed)
        expected = 2 * (x * w.detach()) * x * seed[:, None]
        np.testing.assert_allclose(w.grad.cpu().numpy(), expected.cpu().numpy(),
                                   rtol=1e-12)
