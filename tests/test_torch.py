"""PyTorch: tensors in and out, differentiable through autograd.Function; gradcheck in
float64 for every construct, on every backend."""

import numpy as np
import pytest

import einfuse as ef

torch = pytest.importorskip("torch")


_seed = iter(range(10**6))


def t(*shape, low=None):
    """A float64 leaf tensor; a new seed per call, so that no two inputs tie."""
    gen = torch.Generator().manual_seed(next(_seed))
    value = torch.randn(shape, dtype=torch.float64, generator=gen)
    if low is not None:
        value = value.abs() + low
    return value.requires_grad_()


CASES = [
    ("C[i,j] := A[i,k] * B[k,j]", lambda: {"A": t(3, 4), "B": t(4, 2)}),
    ("D[i,j] := (w[k,i] - x[k,j])**2", lambda: {"w": t(5, 3), "x": t(5, 4)}),
    ("y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o]", lambda: {"x": t(2, 3), "W": t(3, 4),
                                                            "bias": t(4)}),
    ("y[i] := x[i+a] * ker[a]", lambda: {"x": t(9), "ker": t(3)}),
    ("y[i] := x[2*i + a] * ker[a]", lambda: {"x": t(11), "ker": t(3)}),
    ("o[i,j] := img[i+a, j+b] * ker[a,b]", lambda: {"img": t(6, 5), "ker": t(2, 3)}),
    ("o[i] := sum[j](exp(-sum[d]((x[i,d]-y[j,d])**2)) * b[j])",
     lambda: {"x": t(4, 3), "y": t(5, 3), "b": t(5)}),
    ("z[i] := logsumexp[j](X[i,j])", lambda: {"X": t(3, 6)}),
    ("z[i] := log(sum[j](exp(X[i,j] - m[i])))", lambda: {"X": t(3, 4), "m": t(3)}),
    ("z[i] := max[j](X[i,j])", lambda: {"X": t(3, 5)}),
    ("z[i] := prod[j](X[i,j])", lambda: {"X": t(3, 4)}),
    ("n[i] := sqrt(sum[j](X[i,j]**2))", lambda: {"X": t(3, 4)}),
    ("r[i] := tanh(x[i]) * sigmoid(y[i]) + softplus(x[i]) - erf(y[i]) + sin(x[i])*cos(y[i])",
     lambda: {"x": t(5), "y": t(5)}),
    ("r[i] := log(x[i]) + sqrt(x[i]) + log1p(x[i]) + expm1(y[i]) + abs(y[i]) + relu(y[i])",
     lambda: {"x": t(5, low=0.5), "y": t(5, low=0.3)}),
    ("r[i] := min(x[i], y[i]) + max(x[i], 2*y[i]) + pow(x[i], y[i]) + x[i] / y[i]",
     lambda: {"x": t(5, low=0.5), "y": t(5, low=0.5)}),
    ("r[i,j] := where(j <= i, S[i,j], 0) * alpha", lambda: {"S": t(4, 4), "alpha": t()}),
    ("s := alpha * x[i]**2", lambda: {"x": t(6), "alpha": t()}),
]


@pytest.mark.slow_on("triton")   # the interpreter: 17 gradchecks, 25 s
@pytest.mark.parametrize("statement, make", CASES, ids=[c[0] for c in CASES])
def test_gradcheck(statement, make, backend):
    named = make()
    names = list(named)

    def run(*values):
        return ef.ein(statement, backend=backend, **dict(zip(names, values)))
    assert torch.autograd.gradcheck(run, tuple(named.values()), eps=1e-6, atol=1e-5)


def test_gather_gradient_scatters_repeated_indices(backend):
    W = t(6, 3)
    idx = torch.tensor([1, 1, 5, 0, 1])
    E = ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=idx, backend=backend)
    E.sum().backward()
    counts = torch.bincount(idx, minlength=6).to(torch.float64)
    torch.testing.assert_close(W.grad, counts[:, None].expand(6, 3))


def test_result_is_a_tensor_like_the_inputs(backend):
    A = torch.randn(3, 4, dtype=torch.float32)
    B = torch.randn(4, 2, dtype=torch.float32)
    C = ef.ein("C[i,j] := A[i,k] * B[k,j]", A=A, B=B, backend=backend)
    assert isinstance(C, torch.Tensor) and C.dtype == torch.float32 and not C.requires_grad
    torch.testing.assert_close(C, A @ B)
    s = ef.ein("s := A[i,k]", A=A, backend=backend)
    assert isinstance(s, torch.Tensor) and s.shape == ()


def test_only_needed_gradients_are_derived(monkeypatch):
    from einfuse.runtime import gradients
    asked = []
    original = gradients.gradient_statements

    def spy(statement, wrt, key):
        asked.append(wrt)
        return original(statement, wrt, key)
    monkeypatch.setattr(gradients, "gradient_statements", spy)
    A, B = t(3, 4), t(4, 2).detach()
    ef.ein("C[i,j] := A[i,k] * B[k,j]", A=A, B=B).sum().backward()
    # (the forward asks too: whether a gradient reads its result, autodiff/reuse.py)
    assert set(asked) == {"A"} and B.grad is None


def test_assign_into_a_tensor():
    A, B = torch.randn(3, 4), torch.randn(4, 2)
    out = torch.zeros(3, 2)
    returned = ef.ein("C[i,j] += A[i,k] * B[k,j]", A=A, B=B, C=out)
    assert returned is out
    torch.testing.assert_close(out, A @ B)


def test_mixing_frameworks_is_an_error():
    with pytest.raises(ef.EinfuseError, match="different frameworks"):
        ef.ein("C[i] := A[i] * B[i]", A=torch.ones(3), B=np.ones(3))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_tensors_compute_in_float32(dtype, backend):
    A = torch.randn(6, 5).to(dtype).requires_grad_()
    B = torch.randn(5, 4).to(dtype)
    C = ef.ein("C[i,j] := (A[i,k] - B[k,j])**2", A=A, B=B, backend=backend)
    assert C.dtype == dtype
    want = ((A.float()[:, :, None] - B.float()[None]) ** 2).sum(1)
    torch.testing.assert_close(C.float(), want, rtol=1e-2, atol=1e-2)
    C.sum().backward()
    assert A.grad.dtype == dtype and A.grad.shape == A.shape


def test_unsupported_torch_dtypes_are_reported_not_crashed():
    x = torch.zeros(3, dtype=torch.float8_e4m3fn)
    with pytest.raises(ef.EinfuseError, match="float8_e4m3fn"):
        ef.ein("y[i] := x[i]", x=x)


@pytest.mark.parametrize("repeat", [1, 2])     # the second call takes the fast path
def test_an_input_modified_in_place_before_backward_is_refused(repeat):
    # torch refuses this for its own ops; the gradient statements would read the new x
    W = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    for _ in range(repeat):
        x = torch.randn(4, dtype=torch.float64)
        y = ef.ein("y[i] := sum[j](W[i,j] * x[j])", W=W, x=x)
    x.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("make", [lambda x: x.to_sparse(), lambda x: x.to_sparse_csr(),
                                  lambda x: torch.nested.nested_tensor([x[0], x[1, :2]])],
                         ids=["sparse_coo", "sparse_csr", "nested"])
def test_a_tensor_without_strides_is_named_not_crashed(make):
    x = make(torch.randn(3, 3))
    softmax = ("m[i] := max[j](x[i,j])\ne[i,j] := exp(x[i,j] - m[i])\n"
               "P[i,j] := e[i,j] / sum[k](e[i,k])")
    for statement in ("y[i] := sum[j](x[i,j])", softmax):
        for _ in range(2):
            with pytest.raises(ef.EinfuseError, match="x is a"):
                ef.ein(statement, x=x)


def test_sparse_attention_inputs_are_named():
    Q, K, V = (torch.randn(1, 4, 2, dtype=torch.float64) for _ in range(3))
    attention = ("S[b,i,j] := sum[d](Q[b,i,d]*K[b,j,d])\nm[b,i] := max[j](S[b,i,j])\n"
                 "P[b,i,j] := exp(S[b,i,j] - m[b,i])\nO[b,i,e] := sum[j](P[b,i,j] * V[b,j,e]) "
                 "/ sum[j](P[b,i,j])")
    with pytest.raises(ef.EinfuseError, match="Q is a torch tensor with layout sparse"):
        ef.ein(attention, Q=Q.to_sparse(), K=K, V=V)


@pytest.mark.parametrize("transform", ["grad", "vmap"])
def test_torch_func_transforms_are_refused_with_an_einfuse_error(transform):
    k = ef.compile("y := sum[j](x[j] * x[j])")
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    k(x=x), k(x=x.detach())          # signatures a repeated call could take
    run = torch.func.grad(lambda v: k(x=v)) if transform == "grad" else \
        torch.func.vmap(lambda v: k(x=v))
    for _ in range(2):
        with pytest.raises(ef.EinfuseError, match="x is a tensor inside a torch.func"):
            run(x.detach() if transform == "grad" else x.detach().expand(3, 4))
