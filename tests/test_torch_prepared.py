"""The prepared forward and backward of a repeated call on CPU tensors (issue 11,
runtime/torch_prepared.py): from the second call of a signature on, the gradients come
from the gradient statements' prepared kernels.  Every check here runs on such calls and
compares with torch autograd of the same formula (or gradcheck in float64)."""

import threading

import numpy as np
import pytest

import einfuse as ef
from einfuse.errors import OutOfBoundsError
from einfuse.runtime import gradients
from einfuse.runtime.signatures import signature_of
from einfuse.runtime import kernel as kernel_module

torch = pytest.importorskip("torch")

_seed = iter(range(10**6))


def leaf(*shape, dtype=torch.float64, grad=True):
    gen = torch.Generator().manual_seed(next(_seed))
    return torch.randn(shape, dtype=dtype, generator=gen).requires_grad_(grad)


IDX = torch.tensor([2, 0, 1, 2, 3])

# statement, inputs, the same formula in torch
CASES = [
    ("C[i,j] := A[i,k] * B[k,j]", lambda: {"A": leaf(4, 4), "B": leaf(4, 3)},
     lambda A, B: A @ B),
    ("C[j,i] := A[i,k] * B[j,k]", lambda: {"A": leaf(3, 4), "B": leaf(2, 4)},
     lambda A, B: (A @ B.T).T),
    ("C[b,i,j] := A[b,i,k] * B[b,k,j]", lambda: {"A": leaf(2, 3, 4), "B": leaf(2, 4, 2)},
     lambda A, B: A @ B),
    ("C[i,j] := A[i,j] * b[j] + A[i,j]", lambda: {"A": leaf(4, 4), "b": leaf(4)},
     lambda A, b: A * b + A),
    ("s[i] := sum[j](A[i,j] * A[i,j])", lambda: {"A": leaf(4, 5)},
     lambda A: (A * A).sum(1)),
    ("y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o]",
     lambda: {"x": leaf(4, 3), "W": leaf(3, 5), "bias": leaf(5)},
     lambda x, W, bias: x @ W + bias),
    ("z[i] := max[j](X[i,j])", lambda: {"X": leaf(4, 4)}, lambda X: X.amax(1)),
    ("y[i] := x[i+a] * ker[a]", lambda: {"x": leaf(9), "ker": leaf(3)},
     lambda x, ker: torch.nn.functional.conv1d(x[None, None], ker[None, None])[0, 0]),
    ("y[i] := x[i] * c[] + c[]", lambda: {"x": leaf(5), "c": leaf()},
     lambda x, c: x * c + c),
    ("E[b,d] := W[idx[b], d]", lambda: {"W": leaf(4, 3), "idx": IDX},
     lambda W, idx: W[idx]),
]
IDS = [c[0] for c in CASES]


def _grads(fn, named, weights):
    leaves = {k: v for k, v in named.items() if v.requires_grad}
    out = fn(**named)
    return out, dict(zip(leaves, torch.autograd.grad((out * weights).sum(),
                                                     list(leaves.values()))))


@pytest.mark.parametrize("statement, make, formula", CASES, ids=IDS)
def test_repeated_calls_give_torch_autograds_gradients(statement, make, formula):
    k = ef.compile(statement, backend="c")
    named = make()
    for call in range(3):      # the first runs the full path, the others the prepared one
        for name, value in named.items():
            if value.requires_grad:
                with torch.no_grad():
                    value.copy_(torch.randn_like(value))
        want_out = formula(**named)
        weights = torch.randn_like(want_out)
        out, got = _grads(k, named, weights)
        _, want = _grads(formula, named, weights)
        torch.testing.assert_close(out, want_out)
        assert set(got) == set(want)
        for name in want:
            torch.testing.assert_close(got[name], want[name])
    # the gradcheck's calls share the signature of those above
    leaves = [name for name, value in named.items() if value.requires_grad]

    def run(*values):
        return k(**{**named, **dict(zip(leaves, values))})
    assert torch.autograd.gradcheck(run, tuple(named[n] for n in leaves), eps=1e-6,
                                    atol=1e-5)


@pytest.mark.parametrize("statement, make, formula", CASES[:8], ids=IDS[:8])
def test_prepared_backwards_neither_derive_nor_bind(statement, make, formula, monkeypatch):
    k = ef.compile(statement, backend="c")
    named = make()

    def step():
        out = k(**named)
        # dOUT contiguous, as in the calls checked below: a prepared backward is kept
        # per layout of dOUT, and the first backward of a layout binds its kernels
        # (``.sum().backward()`` hands a stride-0 dOUT, another layout)
        (out * torch.randn_like(out)).sum().backward()
    step()
    step()      # (the first backward of the prepared signature)
    bound, derived = [], []
    real_bind, real_compute = kernel_module.bind_call, gradients.compute_gradients
    monkeypatch.setattr(kernel_module, "bind_call",
                        lambda *a, **kw: bound.append(1) or real_bind(*a, **kw))
    monkeypatch.setattr(gradients, "compute_gradients",
                        lambda *a, **kw: derived.append(1) or real_compute(*a, **kw))
    for _ in range(2):
        step()
    assert bound == [] and derived == []


def test_only_inputs_that_require_grad_get_one_and_dtypes_follow_the_inputs():
    k = ef.compile("C[i,j] := sum[k](A[i,k] * B[k,j]) + c[j]", backend="c")
    A = leaf(3, 4, dtype=torch.float32)
    B, c = leaf(4, 2, grad=False), leaf(2)
    for _ in range(3):
        A.grad = c.grad = None
        out = k(A=A, B=B, c=c)
        assert out.dtype == torch.float64      # float32 with float64: promoted
        out.sum().backward()
        A2, c2 = A.detach().double().requires_grad_(), c.detach().clone().requires_grad_()
        (A2 @ B + c2).sum().backward()
        assert A.grad.dtype == torch.float32 and B.grad is None
        torch.testing.assert_close(A.grad, A2.grad.float())
        torch.testing.assert_close(c.grad, c2.grad)


def test_non_contiguous_inputs_and_output_gradients():
    k = ef.compile("C[i,j] := A[i,k] * B[k,j]", backend="c")
    base = leaf(5, 4)
    B = leaf(5, 3)
    for _ in range(3):
        base.grad = B.grad = None
        A = base.T                       # (4, 5), strides (1, 4)
        out = k(A=A, B=B)
        dout = torch.randn(3, 4, dtype=torch.float64).T     # a transposed dOUT
        out.backward(dout)
        base2, B2 = base.detach().clone().requires_grad_(), B.detach().clone().requires_grad_()
        (base2.T @ B2).backward(dout)
        torch.testing.assert_close(base.grad, base2.grad)
        torch.testing.assert_close(B.grad, B2.grad)


def test_double_backward_on_the_prepared_path():
    k = ef.compile("y[i] := sum[j](exp(A[i,j]) * x[j])", backend="c")
    A, x = leaf(3, 4), leaf(4)
    k(A=A, x=x).sum().backward()
    assert torch.autograd.gradgradcheck(lambda A, x: k(A=A, x=x), (A, x), eps=1e-6,
                                        atol=1e-5)


def test_an_input_modified_in_place_is_refused_on_the_prepared_path():
    k = ef.compile("C[i,j] := A[i,k] * B[k,j]", backend="c")
    A, B = leaf(3, 4), leaf(4, 2, grad=False)
    for _ in range(3):
        out = k(A=A, B=B)
    B.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_threads_share_a_prepared_signature():
    k = ef.compile("y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o]", backend="c")
    W, bias = leaf(3, 4), leaf(4)
    k(x=leaf(2, 3), W=W, bias=bias).sum().backward()
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(30):
                x = torch.tensor(rng.standard_normal((2, 3)), requires_grad=True)
                weights = torch.tensor(rng.standard_normal((2, 4)))
                (gx,) = torch.autograd.grad((k(x=x, W=W, bias=bias) * weights).sum(), x)
                torch.testing.assert_close(gx, weights @ W.detach().T)
        except Exception as error:      # reported below, in the main thread
            errors.append(error)
    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


@pytest.mark.parametrize("statement, shapes, subscripts", [
    ("C[i,j] := A[i,k] * B[k,j]", ((3, 4), (4, 5)), "ik,kj->ij"),
    ("C[i,j] := A[k,i] * B[j,k]", ((4, 3), (5, 4)), "ki,jk->ij"),
    ("C[j,i] := A[i,k] * B[k,j]", ((3, 4), (4, 5)), "ik,kj->ji"),
    ("C[b,i,j] := A[b,i,k] * B[b,k,j]", ((2, 3, 4), (2, 4, 5)), "bik,bkj->bij"),
    ("C[i,b,j] := A[b,i,k] * B[k,b,j]", ((2, 3, 4), (4, 2, 5)), "bik,kbj->ibj"),
    ("C[i,j,l] := A[i,k] * B[k,j,l]", ((3, 4), (4, 2, 5)), "ik,kjl->ijl"),
])
@pytest.mark.parametrize("dtypes", [(np.float64, np.float64), (np.float32, np.float64),
                                    (np.int32, np.int32)])
def test_repeated_contractions_match_einsum(statement, shapes, subscripts, dtypes):
    k = ef.compile(statement, backend="c")
    rng = np.random.default_rng(3)
    for _ in range(3):
        A, B = ((rng.standard_normal(s) * 4).astype(d) for s, d in zip(shapes, dtypes))
        got = k(A=A, B=B)
        want = np.einsum(subscripts, A, B)
        if want.dtype.kind == "i":    # a sum of int32 widens, as a.sum() does
            want = np.einsum(subscripts, A.astype(np.int64), B.astype(np.int64))
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_repeated_contraction_over_part_of_an_axis():
    k = ef.compile("C[i,j] := A[i,k] * B[k,j]", backend="c", ranges={"k": range(1, 3)})
    rng = np.random.default_rng(4)
    for _ in range(3):
        A, B = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
        np.testing.assert_allclose(k(A=A, B=B), A[:, 1:3] @ B[1:3], rtol=1e-12)


@pytest.mark.parametrize("bounds", ["check", "promise", "clip", "wrap", "fill"])
def test_a_prepared_gather_keeps_every_bounds_mode(bounds, bind_count):
    options = {"fill": -1.0} if bounds == "fill" else {}
    k = ef.compile("z[i] := W[idx[i]]", backend="c", bounds=bounds, **options)
    W = np.arange(3.0)
    for _ in range(2):
        np.testing.assert_array_equal(k(W=W, idx=np.array([2, 0, 1, 0])), [2.0, 0.0, 1.0, 0.0])
    assert len(bind_count) == 1          # the second call was prepared
    bad = np.array([2, 0, 5, -3])
    if bounds in ("check", "promise"):
        with pytest.raises(ef.EinfuseError, match="5"):
            k(W=W, idx=bad)
    else:
        want = {"clip": [2.0, 0.0, 2.0, 0.0], "wrap": [2.0, 0.0, 2.0, 0.0],
                "fill": [2.0, 0.0, -1.0, -1.0]}[bounds]
        np.testing.assert_array_equal(k(W=W, idx=bad), want)
        np.testing.assert_array_equal(k(W=W, idx=np.array([4, 1, 1, -1])),
                                      {"clip": [2.0, 1.0, 1.0, 0.0],
                                       "wrap": [1.0, 1.0, 1.0, 2.0],
                                       "fill": [-1.0, 1.0, 1.0, -1.0]}[bounds])


def test_a_prepared_gathers_error_is_the_full_paths():
    k = ef.compile("E[b,d] := W[idx[b], d]", backend="c")
    W = leaf(4, 3)
    k(W=W, idx=IDX).sum().backward()
    assert any(runner is not None for runner in k._repeat.values())
    with pytest.raises(OutOfBoundsError) as prepared:
        k(W=W, idx=torch.tensor([0, 9, 1, 2, 3]))
    with pytest.raises(OutOfBoundsError) as reference:     # (ef.compile would give k)
        ef.compile("E[b,d] := W[idx[b], d]", backend="numpy")(
            W=W, idx=torch.tensor([0, 9, 1, 2, 3]))
    assert str(prepared.value) == str(reference.value)


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32, torch.uint8])
def test_an_embedding_backward_adds_repeated_rows(index_dtype):
    k = ef.compile("E[b,c,d] := W[idx[b,c], d]", backend="c")
    W = leaf(6, 3, dtype=torch.float32)
    idx = torch.tensor([[1, 1, 5], [0, 1, 1]], dtype=index_dtype)
    for _ in range(3):
        W.grad = None
        weights = torch.randn(2, 3, 3)
        (k(W=W, idx=idx) * weights).sum().backward()
        W2 = W.detach().clone().requires_grad_()
        (torch.nn.functional.embedding(idx.long(), W2) * weights).sum().backward()
        torch.testing.assert_close(W.grad, W2.grad)
    big = torch.randint(0, 6, (300,), dtype=index_dtype)   # past np.add.at's sizes
    k2 = ef.compile("E[b,d] := W[idx[b], d]", backend="c")
    for _ in range(2):
        W.grad = None
        k2(W=W, idx=big).sum().backward()
    torch.testing.assert_close(W.grad, torch.bincount(big.long(), minlength=6)[:, None]
                               .expand(6, 3).float())


def test_half_precision_on_the_prepared_path():
    k = ef.compile("C[i,j] := sum[k](A[i,k] * B[k,j]) * 0.5", backend="c")
    A, B = leaf(3, 4, dtype=torch.float16), leaf(4, 2, dtype=torch.float16)
    for _ in range(3):
        A.grad = B.grad = None
        out = k(A=A, B=B)
        assert out.dtype == torch.float16
        out.sum().backward()
        A2, B2 = (t.detach().float().requires_grad_() for t in (A, B))
        (A2 @ B2 * 0.5).sum().backward()
        assert A.grad.dtype == B.grad.dtype == torch.float16
        torch.testing.assert_close(A.grad.float(), A2.grad, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(B.grad.float(), B2.grad, rtol=1e-2, atol=1e-2)


def test_an_arrays_dict_changed_after_the_call_does_not_change_second_derivatives():
    k = ef.compile("y := sum[i](exp(x[i]) * w[i])", backend="c")
    x, w = leaf(4), leaf(4, grad=False)
    k(arrays={"x": x, "w": w})
    given = {"x": x, "w": w}
    y = k(arrays=given)
    given["w"] = torch.zeros(4, dtype=torch.float64)
    (gx,) = torch.autograd.grad(y, x, create_graph=True)
    (hx,) = torch.autograd.grad(gx.sum(), x)
    torch.testing.assert_close(hx, (torch.exp(x) * w).detach())


def test_a_flagged_gather_given_more_arrays_still_names_the_value():
    # a prepared backward passes a gradient kernel's runner every array it holds
    k = ef.compile("z[i] := W[idx[i]]", backend="c")
    W = np.arange(3.0)
    k(W=W, idx=np.array([0, 1]))
    runner = k._repeat[signature_of({"W": W, "idx": np.array([0, 1])})]
    np.testing.assert_array_equal(runner({"W": W, "idx": np.array([2, 1]), "dz": W}),
                                  [2.0, 1.0])
    with pytest.raises(OutOfBoundsError, match="7"):
        runner({"W": W, "idx": np.array([0, 7]), "dz": W})
