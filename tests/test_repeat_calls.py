"""The fast path for a repeated call (issue 11): a NumPy call whose signature (names,
shapes, dtypes, strides) was seen before skips binding and planning; every result
stays the full path's, whatever changes between calls."""

import numpy as np
import pytest

import einfuse as ef


def test_repeated_calls_skip_binding_and_follow_the_data(bind_count):
    k = ef.compile("z[i,j] := exp(x[i,j]) * y[j] + 1.5", backend="c")
    rng = np.random.default_rng(0)
    for _ in range(5):
        x, y = rng.standard_normal((6, 7)), rng.standard_normal(7)
        np.testing.assert_allclose(k(x=x, y=y), np.exp(x) * y + 1.5, rtol=1e-14)
    assert len(bind_count) == 1


@pytest.mark.parametrize("change", ["shape", "dtype", "strides", "names", "positional"])
def test_a_different_signature_takes_the_full_path(change, bind_count):
    k = ef.compile("z[i,j] := x[i,j] * 2 + y[j]", backend="c")
    x, y = np.arange(12.0).reshape(3, 4), np.arange(4.0)
    k(x=x, y=y)
    before = len(bind_count)     # (compile shares kernels: the first may be prepared)
    other = {"shape": lambda: k(x=np.ones((5, 4)), y=y),
             "dtype": lambda: k(x=x.astype(np.float32), y=y),
             "strides": lambda: k(x=np.ones((4, 3)).T, y=y),
             "names": lambda: k(y=y, x=x),
             "positional": lambda: k(x, y)}[change]
    got = other()
    assert len(bind_count) == before + 1
    expected = {"shape": np.ones((5, 4)) * 2 + y, "dtype": x * 2 + y,
                "strides": np.ones((3, 4)) * 2 + y, "names": x * 2 + y,
                "positional": x * 2 + y}[change]
    np.testing.assert_allclose(got, expected)
    if change == "dtype":
        assert got.dtype == np.float64


@pytest.mark.parametrize("statement,arrays", [
    ("z[i] := x[i] * s", {"x": np.arange(3.0), "s": 2}),            # an int parameter
])
def test_data_dependent_calls_are_not_prepared(statement, arrays, bind_count):
    k = ef.compile(statement, backend="c")
    first, second = k(**arrays), k(**arrays)
    np.testing.assert_array_equal(first, second)
    assert len(bind_count) >= 2


def test_a_gather_out_of_bounds_is_still_caught_on_the_second_call():
    k = ef.compile("z[i] := W[idx[i]]", backend="c")
    W = np.arange(3.0)
    k(W=W, idx=np.array([0, 1]))
    with pytest.raises(ef.EinfuseError):
        k(W=W, idx=np.array([0, 7]))


@pytest.mark.parametrize("bounds", ["check", "promise", "clip"])
@pytest.mark.parametrize("rows", [3, 40, 300])     # tested per value; min/max pass first
def test_prepared_gathers_follow_their_index_values(bounds, rows, bind_count):
    """Gathers of every size repeat without binding while their index values are in
    range; a value out of range on a later call gets the full path's error (check and
    promise), or its clipped read (clip); nested gathers and empty index arrays too."""
    statement = "E[b,d] := W[idx[jdx[b]], d]"
    k = ef.compile(statement, backend="c", bounds=bounds)
    rng = np.random.default_rng(rows)
    W = rng.standard_normal((50, 64))
    for _ in range(3):
        idx, jdx = rng.integers(0, 50, 20), rng.integers(0, 20, rows)
        np.testing.assert_array_equal(k(W=W, idx=idx, jdx=jdx), W[idx[jdx]])
    assert len(bind_count) == 1
    bad = idx.copy()
    bad[int(jdx[-1])] = 50                                  # read by the last row
    if bounds == "clip":
        np.testing.assert_array_equal(k(W=W, idx=bad, jdx=jdx), W[np.clip(bad, 0, 49)[jdx]])
    else:
        with pytest.raises(ef.EinfuseError, match="50"):
            k(W=W, idx=bad, jdx=jdx)
    unread = idx.copy()
    unread[np.setdiff1d(np.arange(20), jdx)[:1]] = 99       # never read: no error (where
    if len(np.setdiff1d(np.arange(20), jdx)):                # some entry is unread)
        np.testing.assert_array_equal(k(W=W, idx=unread, jdx=jdx), W[unread[jdx]])
    for _ in range(2):     # in range again: the prepared runner serves it
        np.testing.assert_array_equal(k(W=W, idx=idx, jdx=jdx), W[idx[jdx]])
    empty = ef.compile("E[b,d] := W[idx[b], d]", backend="c", bounds=bounds)
    assert empty(W=W, idx=np.zeros(0, np.int64)).shape == (0, 64)


def test_ein_reuses_its_kernel_and_warns_every_time(bind_count):
    x = np.arange(4.0)
    for _ in range(3):
        np.testing.assert_allclose(ef.ein("z[i] := x[i] + 1.25", x=x), x + 1.25)
    assert len(bind_count) == 1
    for _ in range(2):   # the implicit sum also adds b[i] once per k: a warning each time
        with pytest.warns(ef.EinfuseWarning, match="implicit sum"):
            ef.compile("y[i] := A[i,k] * x[k] + b[i]")


def test_a_hoisted_statement_repeats_without_binding(bind_count):
    k = ef.compile("P[i,j] := exp(X[i,j] - max[k](X[i,k])) / sum[k](exp(X[i,k] - "
                   "max[l](X[i,l])))", backend="c")
    assert k.hoisted_form is not None
    rng = np.random.default_rng(1)
    k(X=rng.standard_normal((3, 5)))
    before = len(bind_count)
    for _ in range(3):
        X = rng.standard_normal((3, 5))
        expected = np.exp(X - X.max(1, keepdims=True))
        np.testing.assert_allclose(k(X=X), expected / expected.sum(1, keepdims=True),
                                   rtol=1e-13)
    assert len(bind_count) == before       # the statement and its three kernels


def test_a_hoisted_repeat_whose_form_cannot_run_runs_as_written():
    # the hoisted temporary reads idx[3], which the statement itself never reads
    statement = "y[i,j] := A[i+1,j] + sum[k](W[idx[i], k])"
    k = ef.compile(statement, backend="c")
    rng = np.random.default_rng(2)
    A, W = rng.standard_normal((4, 2)), rng.standard_normal((5, 4))
    fine = np.array([1, 0, 4, 2])
    np.testing.assert_allclose(k(A=A, W=W, idx=fine), A[1:] + W[fine[:3]].sum(1, keepdims=True))
    outside = np.array([1, 0, 4, 99])
    np.testing.assert_allclose(k(A=A, W=W, idx=outside),
                               A[1:] + W[outside[:3]].sum(1, keepdims=True))
    with pytest.raises(ef.EinfuseError, match="99|outside"):
        k(A=A, W=W, idx=np.array([1, 99, 4, 2]))     # read by the statement itself


def test_program_statements_take_their_fast_paths(bind_count):
    program = ef.compile("m[i] := max[j](X[i,j]); e[i,j] := exp(X[i,j] - m[i]); "
                         "P[i,j] := e[i,j] / sum[k](e[i,k])", backend="c")
    rng = np.random.default_rng(3)
    program(X=rng.standard_normal((2, 3)))
    before = len(bind_count)
    X = rng.standard_normal((2, 3))
    expected = np.exp(X - X.max(1, keepdims=True))
    np.testing.assert_allclose(program(X=X), expected / expected.sum(1, keepdims=True))
    assert len(bind_count) == before


def test_the_kernel_call_extension_gives_the_ctypes_results(monkeypatch):
    """Repeated calls go through a small CPython extension (backends/c/call.py) where
    Python's headers exist, else through ctypes: the same results, for strided,
    read-only and broadcast inputs."""
    import os
    import sysconfig

    from einfuse.analysis.options import Options
    from einfuse.backends.c import build as c_build, call as c_call
    if c_build.find_compiler() is None:
        pytest.skip("no C compiler")
    headers = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    assert (c_call.caller() is not None) == headers
    rng = np.random.default_rng(4)
    base = rng.standard_normal((6, 10))
    readonly = rng.standard_normal(5)
    readonly.flags.writeable = False
    cases = [(base[:, ::2], readonly), (base[::-1, 1:6], np.broadcast_to(2.0, (5,))),
             (np.asfortranarray(base[:, :5]), readonly)]
    results = {}
    for mode in ("extension", "ctypes"):
        if mode == "ctypes":
            monkeypatch.setitem(c_call._state, "caller", None)
        # a new Kernel (not compile's shared one): nothing prepared yet
        k = ef.Kernel("z[i,j] := exp(x[i,j]) * y[j] - 0.25", Options(backend="c"))
        results[mode] = [[k(x=x, y=y) for _ in range(3)] for x, y in cases]
        for (x, y), found in zip(cases, results[mode]):
            for value in found:
                np.testing.assert_allclose(value, np.exp(x) * y - 0.25, rtol=1e-14)
    for a, b in zip(results["extension"], results["ctypes"]):
        np.testing.assert_array_equal(a[-1], b[-1])


def test_the_kernel_call_extension_refuses_what_it_cannot_call():
    from einfuse.backends.c import call as c_call
    call = c_call.caller()
    if call is None:
        pytest.skip("no extension here")
    with pytest.raises(TypeError):
        call(1, [np.zeros(2)], 0, 0, 0, 0, 1)          # not a tuple
    with pytest.raises(ValueError):
        call(0, (np.zeros(2),), 0, 0, 0, 0, 1)         # no function
    with pytest.raises(TypeError):
        call(1, ("not a buffer",), 0, 0, 0, 0, 1)      # no buffer: nothing is called
    frozen = np.zeros(2)
    frozen.flags.writeable = False
    with pytest.raises((BufferError, ValueError)):
        call(1, (frozen,), 0, 0, 0, 0, 1)              # the output must be writable


@pytest.mark.parametrize("statement,expected", [
    ("z[i,j] := exp(x[i,j]) * s + t", lambda x, s, t: np.exp(x) * s + t),    # a kernel
    ("z[i,j] := s * x[i,k] * x[j,k]", lambda x, s, t: s * x @ x.T),          # BLAS
    ("P[i,j] := exp(s * (x[i,j] - max[k](x[i,k])))",                         # hoisted
     lambda x, s, t: np.exp(s * (x - x.max(1, keepdims=True)))),
])
def test_float_parameters_change_between_prepared_calls(statement, expected, bind_count):
    k = ef.compile(statement, backend="c")
    x = np.random.default_rng(5).standard_normal((3, 4))
    takes = {name: value for name, value in (("s", 0.5), ("t", -1.0))
             if name in k.inputs}
    k(x=x, **takes)
    before = len(bind_count)
    for s, t in [(2.0, 3.5), (-0.25, float("nan")), (1e300, 0.0)]:
        values = {name: value for name, value in (("s", s), ("t", t)) if name in k.inputs}
        with np.errstate(over="ignore", invalid="ignore"):
            np.testing.assert_allclose(k(x=x, **values), expected(x, s, t), rtol=1e-13)
    assert len(bind_count) == before


def test_an_int_parameter_still_takes_the_full_path(bind_count):
    k = ef.compile("z[i] := x[i] + s", backend="c")
    x = np.arange(3, dtype=np.int8)
    k(x=x, s=1)
    with pytest.raises(ef.EinfuseError, match="300"):
        k(x=x, s=300)          # checked against int8 on every call
    np.testing.assert_array_equal(k(x=x, s=2.5), x + 2.5)


def test_repeated_torch_calls_under_autograd_skip_binding(bind_count):
    torch = pytest.importorskip("torch")
    k = ef.compile("y[i,j] := exp(A[i,k]) * B[k,j] * s", backend="c")
    rng = np.random.default_rng(6)

    def leaves():
        return [torch.tensor(rng.standard_normal(shape), requires_grad=True)
                for shape in ((3, 4), (4, 2))]
    A, B = leaves()
    # as in the loop: dy is then a plain (3, 2) tensor, not sum()'s expanded ones
    (k(A=A, B=B, s=0.5) * torch.randn(3, 2, dtype=torch.float64)).sum().backward()
    before = len(bind_count)
    for s in (2.0, -1.5):
        A, B = leaves()
        y = k(A=A, B=B, s=s)
        weights = torch.randn(3, 2, dtype=torch.float64)
        (y * weights).sum().backward()
        A2, B2 = A.detach().clone().requires_grad_(), B.detach().clone().requires_grad_()
        ((torch.exp(A2) @ B2 * s) * weights).sum().backward()
        torch.testing.assert_close(A.grad, A2.grad)
        torch.testing.assert_close(B.grad, B2.grad)
        with torch.no_grad():     # the same signature, not recorded
            assert k(A=A, B=B, s=s).grad_fn is None
        assert len(bind_count) == before
        # second derivatives through the prepared path too (their statements bind)
        (gA,) = torch.autograd.grad(k(A=A, B=B, s=s).sum(), A, create_graph=True)
        (hA,) = torch.autograd.grad(gA.sum(), A)
        torch.testing.assert_close(hA, (torch.exp(A) * (B * s).sum(1)).detach())
        before = len(bind_count)


def test_prepared_backward_follows_changing_shapes_and_gathers_with_fallbacks():
    torch = pytest.importorskip("torch")
    k = ef.compile("y[b,o] := sum[i](x[b,i] * W[i,o]) + bias[o]", backend="c")
    shift = ef.compile("y[i] := x[i+a] * ker[a]", backend="c")     # a gather with ranges
    rng = np.random.default_rng(7)
    for b in (3, 5, 3, 1, 5):
        x, W, bias = (torch.tensor(rng.standard_normal(s), requires_grad=True)
                      for s in ((b, 4), (4, 2), (2,)))
        weights = torch.tensor(rng.standard_normal((b, 2)))
        (k(x=x, W=W, bias=bias) * weights).sum().backward()
        x2, W2, bias2 = (t.detach().clone().requires_grad_() for t in (x, W, bias))
        ((x2 @ W2 + bias2) * weights).sum().backward()
        for got, want in ((x, x2), (W, W2), (bias, bias2)):
            torch.testing.assert_close(got.grad, want.grad)
        n = 4 + b
        xs, ker = (torch.tensor(rng.standard_normal(s), requires_grad=True)
                   for s in ((n,), (3,)))
        out = shift(x=xs, ker=ker)
        (out * torch.arange(float(n - 2), dtype=torch.float64)).sum().backward()
        xs2, ker2 = xs.detach().clone().requires_grad_(), ker.detach().clone().requires_grad_()
        want = torch.nn.functional.conv1d(xs2[None, None], ker2[None, None])[0, 0]
        (want * torch.arange(float(n - 2), dtype=torch.float64)).sum().backward()
        torch.testing.assert_close(xs.grad, xs2.grad)
        torch.testing.assert_close(ker.grad, ker2.grad)
