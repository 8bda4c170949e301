"""What a repeated call on CPU torch tensors asks per call, answered by the C++ node's
extension (backends/c/torch_node_calls.cpp): its tensors' NumPy views (the last tests
here: the same arrays as Python's, declining what Python resolves), and its signature,
remembered by the extension
(backends/c/torch_node_calls.cpp, asked by runtime/signatures.signature_of): for
CPU tensors and floats whose layout it has seen it gives back the tuple Python built
then, so it must be exactly what Python builds now, and every case Python treats
specially (NumPy arrays, subclasses, torch.func's wrappers, forward-mode tangents,
sparse tensors) must be left to Python."""

import numpy as np
import pytest
import torch

import einfuse as ef
from einfuse.runtime import signatures, torch_autograd
from einfuse.runtime.signatures import signature_of


@pytest.fixture
def native(node):
    assert signatures._NATIVE, "the loaded node's signature lookup is not in use"
    return node


def _python(kwargs):
    """signature_of as Python alone builds it."""
    saved = list(signatures._NATIVE)
    signatures._NATIVE[:] = []
    try:
        return signature_of(kwargs)
    finally:
        signatures._NATIVE[:] = saved


def _cases():
    x = torch.randn(3, 4)
    return [
        {"x": x, "W": torch.nn.Parameter(torch.randn(4, 5)), "s": 2.0},
        {"x": x.t()},                                  # other strides
        {"x": x[:, 1:]},                               # an offset view
        {"x": x.to(torch.float64), "y": torch.zeros((), dtype=torch.int64)},
        {"y": torch.randn(2, 2, requires_grad=True), "x": x},    # names in another order
        {"x": torch.randn(0, 3)},
        {},
    ]


@pytest.mark.parametrize("number", range(7))
def test_remembered_signature_is_pythons(native, number):
    kwargs = _cases()[number]
    first = signature_of(kwargs)
    assert first == _python(kwargs)
    again = signature_of(dict(kwargs))
    assert again == first and hash(again) == hash(first)
    assert again is first     # (remembered: the tuple built the first time)


def test_what_changes_the_layout_changes_the_signature(native):
    x = torch.randn(4, 4)
    before = signature_of({"x": x})
    x.requires_grad_()
    assert signature_of({"x": x}) == _python({"x": x}) != before
    y = torch.randn(4, 4)
    assert signature_of({"x": y}) == before
    y.t_()          # (in place: the same tensor, new strides)
    assert signature_of({"x": y}) == _python({"x": y}) != before
    assert signature_of({"x": y.to(torch.float64)}) != signature_of({"x": y})
    assert signature_of({"z": y}) != signature_of({"x": y})


def test_python_decides_what_the_node_declines(native):
    x = torch.randn(3, 3)
    with_array = {"x": x, "a": np.ones(3)}
    assert signature_of(with_array) == _python(with_array)
    assert signature_of(with_array) is not signature_of(with_array)   # (not remembered)

    class Sub(torch.Tensor):
        pass
    sub = x.as_subclass(Sub)
    assert signature_of({"x": sub}) is None
    sparse = {"x": x.to_sparse()}
    assert signature_of(sparse) == _python(sparse) and \
        signature_of(sparse) is not signature_of(sparse)
    seen = []
    torch.func.grad(lambda t: seen.append(signature_of({"x": t})) or t.sum())(x)
    assert seen == [None]
    signature_of({"x": x})           # (its layout remembered: a tangent still refuses)
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.ones(3, 3))
        assert signature_of({"x": dual}) is None
        assert signature_of({"x": x}) == _python({"x": x})


def test_torch_func_wrappers_of_a_remembered_layout_are_pythons(native):
    """A layout remembered from plain calls is not found again for the same layout inside
    torch.func: grad's and vmap's wrappers and functionalize's functional tensors (whose
    storage is not their values) are Python's to refuse, and a statement called there
    raises einfuse's error, as without the node, not a value read from the wrong memory."""
    x = torch.randn(3, 3)
    signature_of({"x": x})
    assert signature_of({"x": x}) is signature_of({"x": x})      # (remembered)
    seen = []

    def look(t):
        seen.append(signature_of({"x": t}))
        return t * 2
    torch.func.functionalize(look)(x)
    torch.func.grad(lambda t: look(t).sum())(x)
    torch.func.vmap(look)(torch.randn(2, 3, 3))
    assert seen == [None, None, None]
    k = ef.compile("y[b,o] := max(sum[i](x[b,i]*W[o,i]) + bias[o], 0)  ")
    args = {"x": torch.randn(4, 8), "W": torch.randn(5, 8), "bias": torch.randn(5)}
    for _ in range(4):
        k(**args)
    with pytest.raises(ef.errors.EinfuseTypeError, match="torch.func"):
        torch.func.functionalize(lambda **a: k(**a))(**args)


def test_a_statement_on_remembered_signatures(native):
    """The repeated calls that take the remembered signature give torch's values, and a
    call of another layout takes its own runner."""
    # (a text of its own: kernels of one text share their prepared signatures)
    k = ef.compile("C[i,k] := sum[j](A[i,j] * B[j,k])  ", backend="c")
    A, B = torch.randn(4, 6, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64)
    for _ in range(3):
        torch.testing.assert_close(k(A=A, B=B), A @ B)
    other = B.t().contiguous().t()
    torch.testing.assert_close(k(A=A, B=other), A @ B)
    first, second = signature_of({"A": A, "B": B}), signature_of({"A": A, "B": other})
    assert first != second
    assert k._repeat.get(first) is not None and k._repeat.get(second) is not None


def _python_views(values, names):
    saved = list(torch_autograd._NATIVE_VIEWS)
    torch_autograd._NATIVE_VIEWS[:] = []
    try:
        return torch_autograd.numpy_views(values, names)
    finally:
        torch_autograd._NATIVE_VIEWS[:] = saved


def test_numpy_views_are_pythons(native):
    assert torch_autograd._NATIVE_VIEWS
    base = torch.randn(6, 5, dtype=torch.float64)
    values = {"x": base.t()[1:, ::2], "W": torch.nn.Parameter(torch.randn(3)),
              "i": torch.arange(4), "s": torch.zeros(()), "e": torch.ones(0, 2),
              "r": torch.randn(2, 2, requires_grad=True), "other": 1.5}
    names = ("x", "W", "i", "s", "e", "r")
    got, want = torch_autograd.numpy_views(values, names), _python_views(values, names)
    assert list(got) == list(want)
    for name in names:
        assert type(got[name]) is np.ndarray
        assert (got[name].shape, got[name].strides, got[name].dtype) == \
            (want[name].shape, want[name].strides, want[name].dtype)
        assert values[name].numel() == 0 or \
            got[name].ctypes.data == want[name].ctypes.data     # (no copy)
        np.testing.assert_array_equal(got[name], values[name].detach().numpy())
    got["x"][0, 0] = 7.0               # a view: the tensor's own memory
    assert base.t()[1, 0].item() == 7.0
    with pytest.raises(RuntimeError):  # (torch's rule: its memory cannot move now)
        values["s"].resize_(100)


def test_numpy_views_leave_lazy_views_to_python(native):
    z = torch.randn(3, dtype=torch.complex64)
    for lazy in (z.conj(), torch.randn(3).neg()._neg_view()):
        got = torch_autograd.numpy_views({"z": lazy}, ("z",))
        np.testing.assert_array_equal(got["z"], lazy.resolve_conj().resolve_neg().numpy())


@pytest.mark.parametrize("statement, shapes", [
    ("y[b,o] := max(sum[i](x[b,i] * W[o,i]) + c[o], 0)", {"x": (5, 4), "W": (3, 4), "c": (3,)}),
    ("C[i,k] := sum[j](A[i,j] * B[j,k])", {"A": (4, 4), "B": (4, 4)}),
])
def test_gradients_on_remembered_signatures(native, statement, shapes):
    """Repeated recorded calls whose signature and views the extension gives: the fast
    path's runner is the one prepared for that signature, and gradcheck (float64)
    passes through it."""
    k = ef.compile(statement + "   ", backend="c")
    generator = torch.Generator().manual_seed(3)
    args = {n: torch.randn(s, dtype=torch.float64, generator=generator,
                           requires_grad=True) for n, s in shapes.items()}
    names = tuple(args)
    torch.autograd.gradcheck(lambda *v: k(**dict(zip(names, v))), tuple(args.values()))
    signature = signature_of(args)
    assert signature is signature_of(dict(args)) and k._repeat.get(signature) is not None
    out = k(**args)
    seed = torch.randn(out.shape, dtype=torch.float64, generator=generator)
    out.backward(seed)
    twins = {n: v.detach().clone().requires_grad_() for n, v in args.items()}
    if "W" in twins:
        want = torch.relu(torch.addmm(twins["c"], twins["x"], twins["W"].t()))
    else:
        want = twins["A"] @ twins["B"]
    want.backward(seed)
    torch.testing.assert_close(out, want)
    for name in names:
        torch.testing.assert_close(args[name].grad, twins[name].grad)
