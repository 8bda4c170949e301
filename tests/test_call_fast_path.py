"""A repeated statement call's fast path (Kernel.__call__, runtime/signatures.py):
the signature asks whether a forward-mode level is open once per call, and the call by
keyword goes straight to the signature; every guard still sends a call whose layout,
dtype, flag or mode changed after the repeats to the right path."""

import numpy as np
import pytest

import einfuse as ef

torch = pytest.importorskip("torch")
forward_ad = pytest.importorskip("torch.autograd.forward_ad")

LINEAR_RELU = "y[b,o] := max(sum[i](x[b,i] * W[o,i]) + c[o], 0)"
PRODUCT = "C[i,k] := sum[j](A[i,j] * B[j,k])"


def linear_relu(a):
    return torch.relu(a["x"].double() @ a["W"].double().t() + a["c"].double())


def product(a):
    return a["A"].double() @ a["B"].double()


CASES = {
    "linear+relu": (LINEAR_RELU, dict(x=(8, 16), W=(12, 16), c=(12,)), linear_relu),
    "product": (PRODUCT, dict(A=(4, 4), B=(4, 4)), product),
}


def inputs(shapes, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=generator, dtype=dtype)
            for name, shape in shapes.items()}


def repeated(statement, args):
    kernel = ef.compile(statement, backend="c")
    for _ in range(4):
        kernel(**args)
    return kernel


def check(result, expected, tol=1e-5):
    assert isinstance(result, torch.Tensor)
    np.testing.assert_allclose(result.detach().double().numpy(), expected.detach().numpy(),
                               rtol=tol, atol=tol)


@pytest.mark.parametrize("case", CASES)
def test_a_dual_tensor_after_repeats_is_refused_whichever_argument_it_is(case):
    statement, shapes, oracle = CASES[case]
    args = inputs(shapes)
    kernel = repeated(statement, args)
    for name in shapes:      # (the level is asked about once per call, at any tensor)
        with forward_ad.dual_level():
            dual = forward_ad.make_dual(args[name], torch.ones_like(args[name]))
            with pytest.raises(ef.EinfuseError, match="tangent"):
                kernel(**dict(args, **{name: dual}))
            check(kernel(**args), oracle(args))    # plain tensors inside the level
    check(kernel(**args), oracle(args))


@pytest.mark.parametrize("case", CASES)
def test_a_changed_layout_dtype_or_flag_after_repeats_takes_the_right_path(case):
    statement, shapes, oracle = CASES[case]
    args = inputs(shapes)
    kernel = repeated(statement, args)
    first = next(iter(shapes))
    variants = {
        "transposed": {first: args[first].t().contiguous().t()} if args[first].dim() == 2
        else {},
        "float64": inputs(shapes, torch.float64, seed=1),
        "requires grad": {first: args[first].clone().requires_grad_()},
        "negative view": {first: torch._neg_view(args[first])},
        "bigger": inputs({k: tuple(2 * d for d in s) for k, s in shapes.items()}, seed=2),
    }
    for name, change in variants.items():
        changed = dict(args, **change)
        for _ in range(3):       # the first call of the signature and its repeats
            check(kernel(**changed), oracle(changed), 1e-5 if name != "float64" else 1e-12)
        check(kernel(**args), oracle(args))
    with torch.inference_mode():
        frozen = {k: v.clone() for k, v in args.items()}
    for _ in range(3):
        check(kernel(**frozen), oracle(frozen))
    with torch.no_grad():
        check(kernel(**args), oracle(args))


@pytest.mark.parametrize("case", CASES)
def test_positional_and_arrays_calls_after_repeats_agree_with_keyword_calls(case):
    statement, shapes, oracle = CASES[case]
    args = inputs(shapes)
    kernel = repeated(statement, args)
    expected = oracle(args)
    for _ in range(3):
        check(kernel(*args.values()), expected)
        check(kernel(arrays=dict(args)), expected)
        check(kernel(**args), expected)
    with pytest.raises(ef.EinfuseError):
        kernel(**dict(args, **{next(iter(shapes)): torch.ones(3, 5, 7)}))
