"""Prepared fused runs of groups that gather (backends/c/fused_prepared.py): a repeated
call of cross-entropy (``X[i, t[i]]``) or of an embedding lookup followed by a row
operation goes straight to the fused kernel, reading the index array as one more input.
Results must stay those of the first call and of the oracle; an out-of-bounds index on a
later call must raise exactly the error a first call raises; clip/wrap/fill must behave
as on the full path."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.errors import EinfuseError
from oracle import brute_force

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="fusion runs C kernels")

B, V, D, ROWS = 48, 96, 128, 40      # 48x96 reaches the fusion threshold (4096 points)
CROSS_ENTROPY = [("m[i] := max[j](X[i,j])", {"i": B, "j": V}),
                 ("l[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - X[i, t[i]]",
                  {"i": B, "j": V}),
                 (f"L := sum[i](l[i]) / {B}", {"i": B})]
EMBED_NORM = [("h[b,d] := E[ids[b], d] * s[d]", {"b": B, "d": D}),
              (f"r[b] := sqrt(sum[d](h[b,d]**2) / {D} + 0.000001)", {"b": B, "d": D}),
              ("y[b,d] := h[b,d] / r[b]", {"b": B, "d": D})]


def text(statements):
    return "\n".join(s for s, _ in statements)


def oracle(statements, arrays, bounds="check", fill=0.0):
    """Each statement by brute force (tests/oracle.py), in order; scalars in
    ``arrays`` are its parameters."""
    env = {k: v for k, v in arrays.items() if not isinstance(v, (int, float))}
    params = {k: v for k, v in arrays.items() if isinstance(v, (int, float))}
    for statement, extents in statements:
        ranges = {name: (0, n) for name, n in extents.items()}
        name = statement.split("[")[0].split(" ")[0].strip()
        env[name] = brute_force(statement, ranges, env, params, bounds=bounds, fill=fill)
    return env


def labels(rng, n=B, high=V):
    t = rng.integers(0, high, n)
    t[:2] = (0, high - 1)       # both ends of the axis read
    return t


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cross_entropy_repeated_numpy(full_runs, dtype):
    program = ef.compile(text(CROSS_ENTROPY))
    rng = np.random.default_rng(0)
    X, t = rng.standard_normal((B, V)).astype(dtype), labels(rng)
    first = program(X=X, t=t)
    runs = len(full_runs)
    for _ in range(3):
        np.testing.assert_array_equal(program(X=X, t=t), first)
    assert len(full_runs) == runs      # grouped on the first call only
    want = oracle(CROSS_ENTROPY, {"X": X.astype(np.float64), "t": t})["L"]
    np.testing.assert_allclose(first, want, rtol=1e-5 if dtype == np.float32 else 1e-12)
    # new data, same layouts: still prepared, still right
    for _ in range(3):
        X, t = rng.standard_normal((B, V)).astype(dtype), labels(rng)
        want = oracle(CROSS_ENTROPY, {"X": X.astype(np.float64), "t": t})["L"]
        np.testing.assert_allclose(program(X=X, t=t), want,
                                   rtol=1e-5 if dtype == np.float32 else 1e-12)
    assert len(full_runs) == runs


@pytest.mark.parametrize("label_dtype", [np.int32, np.uint64])
def test_labels_of_another_dtype_are_prepared_for_their_own(full_runs, label_dtype):
    program = ef.compile(text(CROSS_ENTROPY))
    rng = np.random.default_rng(1)
    X, t = rng.standard_normal((B, V)), labels(rng)
    want = oracle(CROSS_ENTROPY, {"X": X, "t": t})["L"]
    np.testing.assert_allclose(program(X=X, t=t), want, rtol=1e-12)
    before = len(full_runs)
    for _ in range(3):
        np.testing.assert_allclose(program(X=X, t=t.astype(label_dtype)), want, rtol=1e-12)
    # the int64 labels' run refuses these: their own signature, grouped once
    assert len(full_runs) == before + 1
    np.testing.assert_allclose(program(X=X, t=t), want, rtol=1e-12)
    assert len(full_runs) == before + 1


def torch_cross_entropy_case(seed):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    X = torch.tensor(rng.standard_normal((B, V)), requires_grad=True)
    return torch, X, torch.tensor(labels(rng))


def test_cross_entropy_repeated_torch_forward_and_backward(full_runs):
    torch, X, t = torch_cross_entropy_case(2)
    program = ef.compile(text(CROSS_ENTROPY))
    want = torch.nn.functional.cross_entropy(X, t)
    want_grad, = torch.autograd.grad(want, [X])
    results = []
    for _ in range(4):
        loss = program(X=X, t=t)
        grad, = torch.autograd.grad(loss, [X])
        results.append((loss.detach().clone(), grad))
        with torch.no_grad():
            results.append((program(X=X, t=t), None))
    runs = len(full_runs)
    for loss, grad in results:
        assert torch.equal(loss, results[0][0])
        if grad is not None:
            assert torch.equal(grad, results[0][1])
    torch.testing.assert_close(results[0][0], want.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(results[0][1], want_grad, rtol=1e-10, atol=1e-14)
    program(X=X, t=t).backward()
    assert len(full_runs) == runs       # every group grouped on the first call only


def test_cross_entropy_backward_numpy_repeated():
    rng = np.random.default_rng(3)
    X, t = rng.standard_normal((B, V)), labels(rng)
    gradient = ef.derive(text(CROSS_ENTROPY), "X")
    arrays = {"X": X, "t": t, "dL": np.array(1.0)}
    first = ef.run_reference(gradient, arrays)["dX"]
    for _ in range(3):
        np.testing.assert_array_equal(ef.run_reference(gradient, arrays)["dX"], first)
    e = np.exp(X - X.max(1, keepdims=True))
    want = e / e.sum(1, keepdims=True)
    want[np.arange(B), t] -= 1
    np.testing.assert_allclose(first, want / B, rtol=1e-10, atol=1e-15)


def embedding_case(seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return {"E": rng.standard_normal((ROWS, D)).astype(dtype),
            "ids": labels(rng, B, ROWS), "s": rng.standard_normal(D).astype(dtype)}


def test_embedding_then_row_op_repeated_numpy(full_runs):
    program = ef.compile(text(EMBED_NORM))
    arrays = embedding_case(4)
    first = program(**arrays)
    runs = len(full_runs)
    for _ in range(3):
        np.testing.assert_array_equal(program(**arrays), first)
    assert len(full_runs) == runs
    np.testing.assert_allclose(first, oracle(EMBED_NORM, arrays)["y"], rtol=1e-12)


def test_embedding_then_row_op_repeated_torch_backward():
    torch = pytest.importorskip("torch")
    arrays = embedding_case(5)
    E = torch.tensor(arrays["E"], requires_grad=True)
    s = torch.tensor(arrays["s"], requires_grad=True)
    ids = torch.tensor(arrays["ids"])
    seed = torch.tensor(np.random.default_rng(6).standard_normal((B, D)))
    program = ef.compile(text(EMBED_NORM))

    def twin():
        h = E[ids] * s
        return h / torch.sqrt((h * h).mean(1, keepdim=True) + 1e-6)
    want = twin()
    want_grads = torch.autograd.grad(want, [E, s], seed)
    first = None
    for _ in range(4):
        y = program(E=E, ids=ids, s=s)
        grads = torch.autograd.grad(y, [E, s], seed)
        if first is None:
            first = (y.detach().clone(), grads)
            torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-14)
            for got, expected in zip(grads, want_grads):
                torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
        assert torch.equal(y, first[0])
        for got, kept in zip(grads, first[1]):
            assert torch.equal(got, kept)


def error_of(call):
    with pytest.raises(EinfuseError) as info:
        call()
    return type(info.value), str(info.value)


@pytest.mark.parametrize("bad", [V, -1, 2**40])
def test_out_of_bounds_label_on_a_later_call(full_runs, bad):
    rng = np.random.default_rng(7)
    X, t = rng.standard_normal((B, V)), labels(rng)
    wrong = t.copy()
    wrong[5] = bad
    fresh = ef.compile(text(CROSS_ENTROPY))
    expected = error_of(lambda: fresh(X=X, t=wrong))     # as a first call raises it
    assert "t" in expected[1]
    program = ef.compile(text(CROSS_ENTROPY))
    good = program(X=X, t=t)
    program(X=X, t=t)
    runs = len(full_runs)
    X_before, wrong_before = X.copy(), wrong.copy()
    assert error_of(lambda: program(X=X, t=wrong)) == expected     # the 3rd call
    np.testing.assert_array_equal(X, X_before)
    np.testing.assert_array_equal(wrong, wrong_before)
    # the prepared run is intact: the next good call is prepared and right
    runs_after_error = len(full_runs)
    assert runs_after_error > runs        # the error came from the full path
    np.testing.assert_array_equal(program(X=X, t=t), good)
    assert len(full_runs) == runs_after_error


def test_out_of_bounds_label_on_a_later_torch_call():
    torch, X, t = torch_cross_entropy_case(8)
    wrong = t.clone()
    wrong[3] = V
    expected = error_of(lambda: ef.compile(text(CROSS_ENTROPY))(X=X, t=wrong))
    program = ef.compile(text(CROSS_ENTROPY))
    for _ in range(2):
        program(X=X, t=t).backward()
    with torch.no_grad():
        program(X=X, t=t)
        program(X=X, t=t)
        assert error_of(lambda: program(X=X, t=wrong)) == expected
    assert error_of(lambda: program(X=X, t=wrong)) == expected
    X.grad = None
    loss = program(X=X, t=t)
    loss.backward()
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(X, t).detach(),
                               rtol=1e-12, atol=0)


WIDE_GATHER = [("h[b,d] := E[2 * ids[b] - jds[b], d] * s[d]", {"b": B, "d": D}),
               (f"r[b] := sum[d](h[b,d]) / {D}", {"b": B, "d": D}),
               ("y[b,d] := h[b,d] - r[b]", {"b": B, "d": D})]


def test_kernel_error_flag_on_a_later_call(full_runs):
    """A subscript whose bounds the index arrays' extremes cannot prove (2*ids - jds
    with ids = jds): the kernel tests each value, and its error flag on a later call
    raises the first call's error."""
    program = ef.compile(text(WIDE_GATHER))
    arrays = embedding_case(9)
    arrays["jds"] = arrays["ids"].copy()
    first = program(**arrays)
    np.testing.assert_allclose(first, oracle(WIDE_GATHER, arrays)["y"], rtol=1e-12,
                               atol=1e-15)
    np.testing.assert_array_equal(program(**arrays), first)
    runs = len(full_runs)
    wrong = dict(arrays, jds=arrays["jds"].copy())
    wrong["jds"][4] = arrays["ids"][4] - ROWS      # reads row ids[4] + ROWS
    expected = error_of(lambda: ef.compile(text(WIDE_GATHER))(**wrong))
    assert error_of(lambda: program(**wrong)) == expected
    np.testing.assert_array_equal(program(**arrays), first)
    assert len(full_runs) > runs


@pytest.mark.parametrize("bounds", ["clip", "wrap", "fill"])
def test_bounds_modes_repeated(full_runs, bounds):
    rng = np.random.default_rng(10)
    X = rng.standard_normal((B, V))
    program = ef.compile(text(CROSS_ENTROPY), bounds=bounds, fill=-2.5)
    runs = None
    for _ in range(4):
        t = rng.integers(-2 * V, 3 * V, B)
        want = oracle(CROSS_ENTROPY, {"X": X, "t": t}, bounds=bounds, fill=-2.5)["L"]
        np.testing.assert_allclose(program(X=X, t=t), want, rtol=1e-12)
        runs = len(full_runs) if runs is None else runs
    assert len(full_runs) == runs


TEMPERED = [("m[i] := max[j](X[i,j])", {"i": B, "j": V}),
            ("l[i] := log(sum[j](exp((X[i,j] - m[i]) / T))) + (m[i] - X[i, t[i]]) / T",
             {"i": B, "j": V}),
            (f"L := sum[i](l[i]) / {B}", {"i": B})]


def test_scalar_parameters_are_per_call_arguments(full_runs):
    """A temperature T (a Python float) with a gather: prepared once, each call's T
    used; a T of another type (an int) takes the full path and is still right."""
    program = ef.compile(text(TEMPERED))
    rng = np.random.default_rng(11)
    X, t = rng.standard_normal((B, V)), labels(rng)

    def want(T):
        return oracle(TEMPERED, {"X": X, "t": t, "T": T})["L"]
    np.testing.assert_allclose(program(X=X, t=t, T=1.0), want(1.0), rtol=1e-12)
    runs = len(full_runs)
    for T in (0.5, 2.0, 7.25, 1.0):
        np.testing.assert_allclose(program(X=X, t=t, T=T), want(T), rtol=1e-12)
    assert len(full_runs) == runs       # prepared: T is a per-call argument
    np.testing.assert_allclose(program(X=X, t=t, T=3), want(3.0), rtol=1e-12)
    np.testing.assert_allclose(program(X=X, t=t, T=0.25), want(0.25), rtol=1e-12)


def test_scalar_parameters_from_threads_at_once():
    """Calls from several threads at once (the runner's own doubles are one call's):
    each gets its own T's result."""
    from concurrent.futures import ThreadPoolExecutor
    program = ef.compile(text(TEMPERED))
    rng = np.random.default_rng(12)
    X, t = rng.standard_normal((B, V)), labels(rng)
    program(X=X, t=t, T=1.0)
    temperatures = [0.5 + 0.25 * n for n in range(24)]
    wanted = {T: program(X=X, t=t, T=T) for T in temperatures[:4]}
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda T: (T, program(X=X, t=t, T=T)), temperatures * 2))
    for T, value in got:
        if T in wanted:
            assert value == wanted[T]
    np.testing.assert_allclose(got[5][1], oracle(TEMPERED, {"X": X, "t": t, "T": got[5][0]}
                                                 )["L"], rtol=1e-12)
