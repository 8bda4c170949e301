"""einfuse inside torch.compile: statements, compiled kernels and programs trace as the
custom operators einfuse::run / einfuse::run_backward (no graph break with
fullgraph=True), give eager torch's values and gradients, follow changing shapes, and
refuse what they cannot trace with einfuse's message."""

import numpy as np
import pytest
import torch

import einfuse as ef


def compiled(fn, backend="aot_eager"):
    # aot_eager runs AOTAutograd (forward and backward graphs, fake tensors) without
    # inductor's code generation, which only costs time here; one test uses inductor
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=backend)


def grads(fn, *tensors):
    tensors = [t.detach().clone().requires_grad_(True) for t in tensors]
    value = fn(*tensors)
    value.backward()
    return value.detach(), [t.grad for t in tensors]


def test_statement_forward_and_gradient_match_torch_under_inductor():
    def model(w, x):
        return torch.tanh(ef.ein("D[i,j] := (w[k,i] - x[k,j])**2", w=w, x=x)).sum()

    def reference(w, x):
        return torch.tanh(((w[:, :, None] - x[:, None, :]) ** 2).sum(0)).sum()

    w, x = torch.rand(5, 4, dtype=torch.float64), torch.rand(5, 3, dtype=torch.float64)
    value, (dw, dx) = grads(compiled(model, backend="inductor"), w, x)
    want, (ew, ex) = grads(reference, w, x)
    torch.testing.assert_close(value, want)
    torch.testing.assert_close(dw, ew)
    torch.testing.assert_close(dx, ex)


def test_a_compiled_kernel_with_a_scalar_parameter_and_positional_arguments():
    kernel = ef.compile("y[i] := logsumexp[j](X[i,j]) * s")   # takes X, then s

    def model(x):
        return (kernel(x, 2.5) * torch.arange(x.shape[0])).sum()

    def reference(x):
        return (2.5 * torch.logsumexp(x, 1) * torch.arange(x.shape[0])).sum()

    x = torch.randn(6, 7, dtype=torch.float64)
    value, (dx,) = grads(compiled(model), x)
    want, (ex,) = grads(reference, x)
    torch.testing.assert_close(value, want)
    torch.testing.assert_close(dx, ex)


def test_a_program_with_two_outputs_and_its_gradient():
    program = ef.compile("""
        m[i]   := max[j](X[i,j])
        e[i,j] := exp(X[i,j] - m[i])
        P[i,j] := e[i,j] / sum[k](e[i,k])
    """, outputs=("P", "m"))
    weights = torch.randn(5, 4, dtype=torch.float64)

    def model(x):
        p, m = program(X=x)
        return (p * weights).sum() + m.sum()

    def reference(x):
        return (torch.softmax(x, 1) * weights).sum() + x.amax(1).sum()

    x = torch.randn(5, 4, dtype=torch.float64)
    value, (dx,) = grads(compiled(model), x)
    want, (ex,) = grads(reference, x)
    torch.testing.assert_close(value, want)
    torch.testing.assert_close(dx, ex)


def test_changing_shapes_give_the_right_shapes_and_values():
    def conv(x, k):
        return ef.ein("y[i] := x[i+a] * k[a]", x=x, k=k)

    run = compiled(conv)
    for n, m in [(10, 3), (12, 3), (20, 5), (7, 7)]:
        x, k = torch.randn(n, dtype=torch.float64), torch.randn(m, dtype=torch.float64)
        want = torch.nn.functional.conv1d(x[None, None], k[None, None])[0, 0]
        torch.testing.assert_close(run(x, k), want)


def test_integer_results_and_options_reach_the_operator():
    def model(w, idx):
        gathered = ef.ein("E[b,d] := W[idx[b], d]", W=w, idx=idx, bounds="clip")
        return gathered, ef.ein("a[i] := argmax[j](W[i,j])", W=w)

    w = torch.randn(4, 3)
    idx = torch.tensor([3, 0, 9, -2])
    gathered, positions = compiled(model)(w, idx)
    torch.testing.assert_close(gathered, w[idx.clamp(0, 3)])
    assert positions.dtype == torch.int64
    assert torch.equal(positions, w.argmax(1))


def _causes(error):
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def test_a_shape_error_found_while_compiling_carries_einfuse_s_message():
    def model(a, b):
        return ef.ein("C[i,j] := A[i,k] * B[k,j]", A=a, B=b)

    with pytest.raises(Exception) as info:
        compiled(model)(torch.randn(4, 3), torch.randn(2, 5))
    assert "A gives 3 (axis 1) but B gives 2 (axis 0)" in str(info.value)


def test_writing_into_an_argument_is_refused_while_compiling():
    def model(a, c):
        return ef.ein("C[i] = A[i,j]", A=a, C=c)

    with pytest.raises(Exception) as info:
        compiled(model)(torch.ones(2, 2), torch.zeros(2))
    found = [e for e in _causes(info.value) if isinstance(e, ef.EinfuseError)]
    assert found and "torch.compile cannot trace" in str(found[0])


def test_a_numpy_array_beside_tensors_is_refused_without_fullgraph():
    def model(a):
        return ef.ein("y[i] := A[i,j] * B[j]", A=np.ones((2, 2)), B=a)

    torch._dynamo.reset()
    with pytest.raises(ef.EinfuseError, match="tensors and Python numbers; A is a ndarray"):
        torch.compile(model, backend="aot_eager")(torch.ones(2))


def test_a_kernel_swapped_for_one_with_another_pad_is_traced_again():
    # Dynamo guards on the kernel object (its id is the key's source), and the float
    # option that tells the two apart reaches the key whatever Dynamo makes of floats
    kernels = {"k": ef.compile("y[i] := x[i+1]", pad=0.0, ranges={"i": range(3)})}

    def model(x):
        return kernels["k"](x=x) * 1.0

    for dynamic in (False, True):
        torch._dynamo.reset()
        run = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=dynamic)
        x = torch.arange(1.0, 4.0, dtype=torch.float64)
        kernels["k"] = ef.compile("y[i] := x[i+1]", pad=0.0, ranges={"i": range(3)})
        torch.testing.assert_close(run(x), torch.tensor([2.0, 3.0, 0.0], dtype=torch.float64))
        kernels["k"] = ef.compile("y[i] := x[i+1]", pad=-7.5, ranges={"i": range(3)})
        torch.testing.assert_close(run(x), torch.tensor([2.0, 3.0, -7.5], dtype=torch.float64))
        program = ef.compile("t[i] := x[i+1]\ny[i] := t[i] * 2.0", pad=4.0,
                             ranges={"i": range(3)})
        kernels["k"] = program
        torch.testing.assert_close(run(x), torch.tensor([4.0, 6.0, 8.0], dtype=torch.float64))


def test_eager_calls_do_not_go_through_the_operator():
    # eager autograd uses torch.autograd.Function (cheaper than a custom op's dispatch):
    # the statement's node (EinfuseFunction) or its prepared one (PreparedFunction), on
    # the first call as on later ones
    x = torch.randn(3, 4, requires_grad=True)
    for _ in range(2):
        y = ef.ein("y[i] := sum[j](X[i,j])", X=x)
        assert isinstance(y.grad_fn, torch.autograd.function.BackwardCFunction)
        assert type(y.grad_fn).__name__ in ("EinfuseFunctionBackward",
                                            "PreparedFunctionBackward")


def test_bfloat16_tensors_give_a_bfloat16_result_as_in_eager_mode():
    def model(a, b):
        return ef.ein("C[i,j] := A[i,k] * B[k,j]", A=a, B=b)

    a, b = torch.randn(3, 4, dtype=torch.bfloat16), torch.randn(4, 2, dtype=torch.bfloat16)
    result = compiled(model)(a, b)
    assert result.dtype == torch.bfloat16
    torch.testing.assert_close(result, model(a, b))


def test_dynamic_true_traces_statements_kernels_and_programs():
    # under dynamic=True Dynamo makes float options (fill) symbolic; the operator's key
    # must still be a constant
    kernel = ef.compile("y[i] := sum[j](x[i,j]) * a")
    program = ef.compile("m[i] := max[j](x[i,j])\ny[i,j] := exp(x[i,j] - m[i])")

    def model(x, a):
        return (ef.ein("y[i,j] := x[i,j] * 2.0", x=x), kernel(x=x, a=a), program(x=x))

    torch._dynamo.reset()
    run = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    for rows, a in [(5, 0.5), (3, 1.5), (8, 0.25)]:
        x = torch.randn(rows, 4, dtype=torch.float64)
        doubled, summed, shifted = run(x, a)
        torch.testing.assert_close(doubled, x * 2.0)
        torch.testing.assert_close(summed, x.sum(1) * a)
        torch.testing.assert_close(shifted, torch.exp(x - x.amax(1, keepdim=True)))


def test_program_gradient_with_a_padded_shift_and_signed_zero_pad():
    # the backward recomputes the forward with the program's pad and ranges, and the
    # gradient program derived for pad=0.0 is not the one for pad=-0.0 (1 / pad)
    source = "T[i] := X[i+1]\nY[i] := W[i] / T[i]"
    X = torch.arange(1.0, 6.0, dtype=torch.float64)
    W = torch.ones(5, dtype=torch.float64)
    for pad in (0.0, -0.0):
        program = ef.compile(source, pad=pad, ranges={"i": range(5)})
        _, (dx, dw) = grads(compiled(lambda X, W: program(X=X, W=W).sum()), X, W)
        shifted = torch.cat([X[1:], torch.tensor([pad], dtype=torch.float64)])
        torch.testing.assert_close(dw, 1 / shifted)
        torch.testing.assert_close(dx[1:], -(1 / shifted[:4] ** 2))
