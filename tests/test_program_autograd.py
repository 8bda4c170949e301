"""A program (or a statement's hoisted form) under torch autograd is one node whose
forward and backward run fused (program/autograd.py): gradients equal torch autograd of
the same formula, pass gradcheck and gradgradcheck, and the backward's rewrites (the
softmax shift left out, recomputed intermediates, shared subexpressions) never change a
gradient."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.autodiff.shift import zero_gradient_shifts
from einfuse.analysis.spec import spec_of
from program_texts import LAYERNORM, SOFTMAX, SOFTMAX_STATEMENT

torch = pytest.importorskip("torch")
from torch_checks import close as _close, grads as _grads  # noqa: E402  (needs torch)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (37, 129), (130, 64)])
@pytest.mark.parametrize("form", ["program", "statement"])
def test_softmax_gradients_equal_torch(form, shape, dtype):
    gen = torch.Generator().manual_seed(sum(shape))
    X = (torch.randn(shape, generator=gen, dtype=dtype) * 3).requires_grad_()
    seed = torch.randn(shape, generator=gen, dtype=dtype)
    kernel = ef.compile(SOFTMAX if form == "program" else SOFTMAX_STATEMENT)
    out, (dX,) = _grads(lambda X: kernel(X=X), [X], seed)
    want_out, (want,) = _grads(lambda X: torch.softmax(X, 1), [X], seed)
    _close(out, want_out, dtype)
    _close(dX, want, dtype)
    # one node: the Python autograd Function, or the C++ node once a backward planned it
    assert kernel(X=X).grad_fn.name() in ("ProgramFunctionBackward", "EinfuseProgramBackward")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(2, 3), (33, 257)])
@pytest.mark.parametrize("affine_grad", [True, False])
def test_layernorm_gradients_equal_torch(shape, dtype, affine_grad):
    rows, cols = shape
    gen = torch.Generator().manual_seed(rows)
    X = torch.randn(shape, generator=gen, dtype=dtype).requires_grad_()
    g = torch.randn(cols, generator=gen, dtype=dtype).requires_grad_(affine_grad)
    b = torch.randn(cols, generator=gen, dtype=dtype).requires_grad_(affine_grad)
    seed = torch.randn(shape, generator=gen, dtype=dtype)
    program = ef.compile(LAYERNORM.format(n=cols))
    out, got = _grads(lambda X, g, b: program(X=X, g=g, b=b), [X, g, b], seed)
    want_out, want = _grads(
        lambda X, g, b: torch.nn.functional.layer_norm(X, (cols,), g, b, eps=1e-5),
        [X, g, b], seed)
    _close(out, want_out, dtype)
    assert len(got) == len(want) == (3 if affine_grad else 1)
    for a, w in zip(got, want):
        _close(a, w, dtype)


@pytest.mark.parametrize("source", [SOFTMAX, SOFTMAX_STATEMENT,
                                    pytest.param(LAYERNORM.format(n=4), marks=pytest.mark.slow)])
def test_gradcheck_and_gradgradcheck(source):
    gen = torch.Generator().manual_seed(5)
    X = torch.randn(3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    kernel = ef.compile(source)
    if "g[j]" in source:
        g = torch.randn(4, generator=gen, dtype=torch.float64, requires_grad=True)
        b = torch.randn(4, generator=gen, dtype=torch.float64, requires_grad=True)
        fn, inputs = (lambda X, g, b: kernel(X=X, g=g, b=b)), (X, g, b)
    else:
        fn, inputs = (lambda X: kernel(X=X)), (X,)
    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradgradcheck(fn, inputs)


def _shifts(source, outputs):
    return zero_gradient_shifts([spec_of(s) for s in source.split("\n")], outputs)


def test_shift_invariance_is_recognised_only_where_exact():
    assert _shifts(SOFTMAX, ["P"]) == {"m"}
    assert _shifts(SOFTMAX, ["P", "m"]) == set()          # m itself is asked for
    assert _shifts(SOFTMAX, ["P", "e"]) == set()          # e scales with m
    times_m = SOFTMAX + "\nQ[i,j] := P[i,j] * m[i]"
    assert _shifts(times_m, ["Q"]) == set()                # m read bare
    log_softmax = SOFTMAX.replace("P[i,j] := e[i,j] / sum[k](e[i,k])",
                                  "P[i,j] := log(e[i,j] / sum[k](e[i,k]))")
    assert _shifts(log_softmax, ["P"]) == {"m"}           # log of a ratio: still zero
    across = SOFTMAX.replace("sum[k](e[i,k])", "sum[a](e[a,j])")
    assert _shifts(across, ["P"]) == set()                 # normalised along the rows
    scalar = "m := max[j](x[j])\nP[j] := exp(x[j] - m) / sum[k](exp(x[k] - m))"
    assert _shifts(scalar, ["P"]) == {"m"}


CROSS_ENTROPY = """m[i] := max[j](X[i,j])
l[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - X[i, t[i]]
L := sum[i](l[i]) / 4"""


def test_a_log_sum_exp_shift_is_recognised_only_where_exact():
    assert _shifts(CROSS_ENTROPY, ["L"]) == {"m"}
    assert _shifts(CROSS_ENTROPY, ["l"]) == {"m"}
    lse = "m[i] := max[j](X[i,j])\ny[i] := m[i] + log(sum[j](exp(X[i,j] - m[i])))"
    assert _shifts(lse, ["y"]) == {"m"}
    # log-softmax: X - m - log(sum(exp(X - m))) moves by nothing
    log_softmax = "m[i] := max[j](X[i,j])\n" \
        "y[i,j] := X[i,j] - m[i] - log(sum[k](exp(X[i,k] - m[i])))"
    assert _shifts(log_softmax, ["y"]) == {"m"}
    twice = "m[i] := max[j](X[i,j])\ny[i] := 2 * m[i] + 2 * log(sum[j](exp(X[i,j] - m[i])))"
    assert _shifts(twice, ["y"]) == {"m"}
    # each of these moves with m (or is undefined): m's gradient is kept
    for source in ["m[i] := max[j](X[i,j])\ny[i] := log(sum[j](exp(X[i,j] - m[i])))",
                   "m[i] := max[j](X[i,j])\ny[i] := 2 * log(sum[j](exp(X[i,j] - m[i]))) + m[i]",
                   "m[i] := max[j](X[i,j])\ny[i] := (m[i] + log(sum[j](exp(X[i,j] - m[i])))) * m[i]",
                   "m[i] := max[j](X[i,j])\ny[i] := sum[j](m[i] - X[i,j]) + log(sum[j](exp(X[i,j] - m[i])))",
                   "m[i] := max[j](X[i,j])\ny[i] := where(X[i,0] > 0, log(sum[j](exp(X[i,j] - m[i]))), 0)",
                   "m[i] := max[j](X[i,j])\ny[i,j] := m[j] + log(sum[k](exp(X[i,k] - m[i])))",
                   "m[i] := max[j](X[i,j])\ny[i] := exp(m[i] + log(sum[j](exp(X[i,j] - m[i])))) - m[i]"]:
        assert _shifts(source, ["y"]) == set(), source
    # exp turns the additive degree back into a factor: a ratio of them is invariant
    ratio = "m[i] := max[j](X[i,j])\nq[i] := exp(log(sum[j](exp(X[i,j] - m[i])))) / sum[j](exp(X[i,j] - m[i]))"
    assert _shifts(ratio, ["q"]) == {"m"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cross_entropy_gradients_equal_torch(dtype):
    gen = torch.Generator().manual_seed(7)
    X = torch.randn(4, 6, generator=gen, dtype=dtype, requires_grad=True)
    t = torch.tensor([0, 5, 2, 2])
    program = ef.compile(CROSS_ENTROPY)
    for _ in range(3):      # the first call, then the prepared one
        X.grad = None
        loss = program(X=X, t=t)
        loss.backward()
        want_loss = torch.nn.functional.cross_entropy(X, t)
        _close(loss.detach(), want_loss.detach(), dtype)
        X2 = X.detach().clone().requires_grad_(True)
        torch.nn.functional.cross_entropy(X2, t).backward()
        _close(X.grad, X2.grad, dtype)
    if dtype == torch.float64:
        assert torch.autograd.gradcheck(lambda X: program(X=X, t=t), (X,))


def test_a_max_that_is_not_a_shift_passes_its_gradient():
    # the row maximum also scales the result: its arg-max gradient must be there
    source = SOFTMAX + "\nQ[i,j] := P[i,j] * m[i]"
    gen = torch.Generator().manual_seed(2)
    X = torch.randn(4, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    seed = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    program = ef.compile(source)
    _, (got,) = _grads(lambda X: program(X=X), [X], seed)
    _, (want,) = _grads(lambda X: torch.softmax(X, 1) * X.max(1, keepdim=True).values,
                        [X], seed)
    _close(got, want, torch.float64)


def test_several_outputs_and_an_output_read_later():
    program = ef.compile(SOFTMAX + "\nr[i] := sum[j](P[i,j] * e[i,j])",
                         outputs=("r", "e", "m"))
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(5, 7, generator=gen, dtype=torch.float64, requires_grad=True)

    def formula(X):
        m = X.max(1, keepdim=True).values
        e = torch.exp(X - m)
        P = e / e.sum(1, keepdim=True)
        return (P * e).sum(1), e, m[:, 0]
    seeds = [torch.randn(5, generator=gen, dtype=torch.float64),
             torch.randn(5, 7, generator=gen, dtype=torch.float64),
             torch.randn(5, generator=gen, dtype=torch.float64)]
    got = torch.autograd.grad(program(X=X), [X], seeds)[0]
    want = torch.autograd.grad(formula(X), [X], seeds)[0]
    _close(got, want, torch.float64)


def test_a_scattered_gradient_inside_a_program():
    # W is read through an index array: its gradient is a scatter-add between kernels
    program = ef.compile("E[b,d] := W[idx[b], d]\n"
                         "m[b] := max[d](E[b,d])\n"
                         "P[b,d] := exp(E[b,d] - m[b]) / sum[k](exp(E[b,k] - m[b]))")
    gen = torch.Generator().manual_seed(4)
    W = torch.randn(6, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    idx = torch.tensor([0, 3, 3, 5, 1, 0, 2])
    seed = torch.randn(7, 5, generator=gen, dtype=torch.float64)
    _, (got,) = _grads(lambda W: program(W=W, idx=idx), [W], seed)
    _, (want,) = _grads(lambda W: torch.softmax(W[idx], 1), [W], seed)
    _close(got, want, torch.float64)


def test_an_input_modified_in_place_after_the_forward_is_refused():
    X = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    Y = X * 1.0
    out = ef.compile(SOFTMAX)(X=Y)
    Y.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_numpy_and_no_grad_calls_are_unchanged():
    X = np.random.default_rng(0).standard_normal((6, 9))
    program = ef.compile(SOFTMAX)
    want = np.exp(X - X.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    np.testing.assert_allclose(program(X=X), want, rtol=1e-12)
    with torch.no_grad():
        out = program(X=torch.from_numpy(X).requires_grad_())
    assert out.grad_fn is None
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-12)


def test_an_output_read_by_a_recomputed_intermediate():
    # e is recomputed in the backward from t, an output: t must be kept for it
    program = ef.compile("t[i,j] := X[i,j] * 2\nm[i] := max[j](t[i,j])\n"
                         "e[i,j] := exp(t[i,j] - m[i])\nP[i,j] := e[i,j] / sum[k](e[i,k])",
                         outputs=("P", "t"))
    gen = torch.Generator().manual_seed(6)
    X = torch.randn(5, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    seeds = [torch.randn(5, 6, generator=gen, dtype=torch.float64) for _ in range(2)]
    got = torch.autograd.grad(program(X=X), [X], seeds)[0]
    want = torch.autograd.grad((torch.softmax(2 * X, 1), 2 * X), [X], seeds)[0]
    _close(got, want, torch.float64)


@pytest.mark.parametrize("first", ["detached", "recorded"])
def test_a_call_without_grad_then_one_with_grad_on_the_same_shapes(first):
    # both calls share the prepared runs of the fused forward; the recorded one keeps
    # the intermediates its backward reads, the other does not: the prepared run of one
    # must not serve the other
    program = ef.compile(SOFTMAX)
    gen = torch.Generator().manual_seed(7)
    X = torch.randn(512, 256, generator=gen, dtype=torch.float32, requires_grad=True)
    seed = torch.randn(512, 256, generator=gen, dtype=torch.float32)
    want = torch.autograd.grad(torch.softmax(X, 1), [X], seed)[0]
    for _ in range(2):
        calls = [lambda: program(X=X.detach()), lambda: program(X=X)]
        for call in calls if first == "detached" else calls[::-1]:
            out = call()
        got = torch.autograd.grad(program(X=X), [X], seed)[0]
        _close(out.detach(), torch.softmax(X, 1).detach(), torch.float32)
        _close(got, want, torch.float32)
