"""Issue 29, items 1 and 10.

1. Nothing written when an error is raised: a program's '='/'+=' statement followed by
   a statement that fails (a shape that disagrees, an index value out of bounds -- also
   one computed from an intermediate, found only while running --, a result too large,
   a compile that fails) leaves the caller's arrays as they were, on every backend, for
   NumPy arrays and torch tensors, on the first call and on a prepared repeat; and a
   single '='/'+=' statement that raises leaves its output untouched.
2. Same inputs, same bits: a statement or program gives the same results and gradients
   on every call (torch.autograd.gradcheck's reentrancy check), its first call (which
   binds, groups and prepares) included, and whatever number of threads a call takes
   (without threads=, the free cores decide call by call: backends/c/threads.py)."""

import itertools

import numpy as np
import pytest
from conftest import BACKENDS

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.errors import (AllocationError, BackendError, OutOfBoundsError, ShapeError)
from einfuse.program.writes import guarded_names

torch = pytest.importorskip("torch")

FRAMEWORKS = ["numpy", "torch"]
HAVE_C = c_build.find_compiler() is not None


def _as(framework, array):
    array = np.array(array)
    return torch.from_numpy(array) if framework == "torch" else array


def _values(array) -> np.ndarray:
    return array.numpy().copy() if isinstance(array, torch.Tensor) else np.array(array)


# ---------------------------------------------------------------- 1: programs

@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_write_then_an_out_of_bounds_gather_writes_nothing(backend, framework):
    x, y = _as(framework, np.arange(3.0)), _as(framework, np.full(3, 7.0))
    with pytest.raises(OutOfBoundsError):
        ef.ein("y[i] = x[i] * 2\nz[i] := x[idx[i]]", x=x, y=y,
               idx=_as(framework, [0, 1, 9]), backend=backend)
    np.testing.assert_array_equal(_values(y), np.full(3, 7.0))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_an_update_then_a_shape_error_writes_nothing(backend, framework):
    x, y = _as(framework, np.arange(3.0)), _as(framework, np.full(3, 7.0))
    with pytest.raises(ShapeError):
        ef.ein("y[i] += x[i]\nz[i] := x[i] + w[i]", x=x, y=y, w=_as(framework, np.ones(4)),
               backend=backend)
    np.testing.assert_array_equal(_values(y), np.full(3, 7.0))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_an_index_computed_from_an_intermediate_out_of_bounds_writes_nothing(backend,
                                                                              framework):
    # j's values (0, 3, 6) exist only once the program runs: no check before it finds them
    x, y = _as(framework, np.arange(3.0)), _as(framework, np.full(3, 7.0))
    with pytest.raises(OutOfBoundsError):
        ef.ein("y[i] += x[i]\nj[i] := idx[i] * 3\nz[i] := x[j[i]]", x=x, y=y,
               idx=_as(framework, [0, 1, 2]), backend=backend)
    np.testing.assert_array_equal(_values(y), np.full(3, 7.0))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_write_before_the_failing_statement_is_undone(backend, framework):
    x = _as(framework, np.arange(4.0))
    y, w = _as(framework, np.full(4, 7.0)), _as(framework, np.full(4, -1.0))
    with pytest.raises(OutOfBoundsError):
        ef.ein("y[i] = x[i] * 2\nw[i] += y[i] * 3\nz[i] := x[idx[i]] + w[i]", x=x, y=y, w=w,
               idx=_as(framework, [0, 1, 2, -9]), backend=backend)
    np.testing.assert_array_equal(_values(y), np.full(4, 7.0))
    np.testing.assert_array_equal(_values(w), np.full(4, -1.0))


def test_a_result_too_large_after_a_write_writes_nothing(backend):
    x, y = np.arange(3.0), np.full(3, 7.0)
    big = 10 ** 6      # 3 * 10**18 elements: refused when the statement runs
    with pytest.raises(AllocationError):
        ef.ein("y[i] = x[i] * 2\nz[i,j,k,l] := x[i] * y[i]", x=x, y=y, backend=backend,
               ranges={"j": big, "k": big, "l": big})
    np.testing.assert_array_equal(y, np.full(3, 7.0))


@pytest.mark.skipif(not HAVE_C, reason="a compile of the C backend")
def test_a_compile_failure_after_a_write_writes_nothing(monkeypatch):
    def refuse(*args, **kwargs):
        raise c_build.CompileError("the compiler was not available (test)")
    x, y = np.arange(3.0), np.full(3, 7.0)
    program = ef.compile("y[i] = x[i] * 2\nz[i] := x[i] * 3.0625 + 0.40625", backend="c")
    monkeypatch.setattr(c_build, "load", refuse)     # (the '=' runs before anything loads)
    with pytest.raises(BackendError):
        program(x=x, y=y)
    np.testing.assert_array_equal(y, np.full(3, 7.0))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_prepared_repeat_that_fails_writes_nothing(backend, framework):
    """The repeated call runs the prepared run of its signature (schedule/fusion.py)."""
    program = ef.compile("y[i] = x[i] * 2\nz[i] := x[idx[i]] + y[i]", backend=backend)
    x = _as(framework, np.arange(5.0))
    for _ in range(2):
        y = _as(framework, np.zeros(5))
        z = program(x=x, y=y, idx=_as(framework, [4, 3, 2, 1, 0]))
        np.testing.assert_array_equal(_values(z), np.arange(5.0)[::-1] + np.arange(5.0) * 2)
        np.testing.assert_array_equal(_values(y), np.arange(5.0) * 2)
    y = _as(framework, np.full(5, 7.0))
    with pytest.raises(OutOfBoundsError):
        program(x=x, y=y, idx=_as(framework, [4, 3, 2, 1, 5]))
    np.testing.assert_array_equal(_values(y), np.full(5, 7.0))


def test_a_fused_group_after_a_write_that_fails_writes_nothing(backend):
    """Rows enough for a fused kernel (C): its gather flags the bad row mid-kernel."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((200, 64))
    idx = np.arange(200)[::-1].copy()
    source = """Y[i,j] = X[i,j] * 2
                m[i] := max[j](X[idx[i], j])
                e[i,j] := exp(X[i,j] - m[i])
                P[i,j] := e[i,j] / sum[k](e[i,k])"""
    program = ef.compile(source, backend=backend, outputs="P")
    Y = np.zeros((200, 64))
    P = program(X=X, Y=Y, idx=idx)
    shifted = np.exp(X - X[idx].max(1, keepdims=True))
    np.testing.assert_allclose(P, shifted / shifted.sum(1, keepdims=True), rtol=1e-12)
    np.testing.assert_array_equal(Y, X * 2)
    bad = idx.copy()
    bad[-1] = 200
    Y = np.full((200, 64), 7.0)
    with pytest.raises(OutOfBoundsError):
        program(X=X, Y=Y, idx=bad)
    np.testing.assert_array_equal(Y, np.full((200, 64), 7.0))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_later_statement_still_reads_the_new_values(backend, framework):
    """By the written name, and by another name for the same array (as before)."""
    x, y = _as(framework, np.arange(3.0)), _as(framework, np.zeros(3))
    z = ef.ein("y[i] = x[i] * 2\nz[i] := y[i] + 1", x=x, y=y, backend=backend)
    np.testing.assert_array_equal(_values(z), np.arange(3.0) * 2 + 1)
    np.testing.assert_array_equal(_values(y), np.arange(3.0) * 2)
    a = _as(framework, np.arange(3.0))
    z = ef.ein("y[i] = x[i] + 1\nz[i] := x[i] * 2", x=a, y=a, backend=backend,
               outputs="z")
    np.testing.assert_array_equal(_values(z), (np.arange(3.0) + 1) * 2)
    np.testing.assert_array_equal(_values(a), np.arange(3.0) + 1)


def test_arrays_sharing_memory_with_the_written_one_are_restored_too(backend):
    base = np.arange(6.0)
    x, y = base[:5], base[1:]          # overlapping views of one array
    with pytest.raises(OutOfBoundsError):
        ef.ein("y[i] = x[i] * 10\nz[i] := x[idx[i]]", x=x, y=y,
               idx=np.array([0, 1, 2, 3, 5]), backend=backend)
    np.testing.assert_array_equal(base, np.arange(6.0))
    a = np.arange(4.0)
    with pytest.raises(OutOfBoundsError):
        ef.ein("y[i] = x[i] + 1\nz[i] := x[idx[i]]", x=a, y=a, idx=np.array([0, 9, 1, 2]),
               backend=backend)
    np.testing.assert_array_equal(a, np.arange(4.0))


def test_only_writes_that_a_statement_follows_are_kept():
    """No copy for a program without '='/'+=', or whose only write is its last
    statement (that statement writes only once it has succeeded)."""
    def kept(source):
        return guarded_names([s.kernel for s in ef.compile(source).statements])
    assert kept("h[i] := x[i] * 2\nz[i] := h[i] + 1") == ()
    assert kept("h[i] := x[i] * 2\ny[i] = h[i] + 1") == ()
    assert kept("y[i] = x[i]\nh[i] := y[i] * 2\ny[i] += h[i]") == ("y",)
    assert kept("y[i] = x[i]\nw[i] += y[i]\nz[i] := w[i]") == ("y", "w")


# ---------------------------------------------------------------- 1: single statements

@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("assign", ["=", "+="])
def test_a_statement_whose_gather_fails_mid_kernel_writes_nothing(backend, framework,
                                                                  assign):
    """The bad index value is the last of 200000: a kernel has written most rows of
    its result when it finds it (C flags it; the result is its own array)."""
    n = 200_000
    x = _as(framework, np.arange(10.0))
    idx = np.arange(n) % 10
    idx[-1] = 10
    y = _as(framework, np.full(n, 7.0))
    statement = ef.compile(f"y[i] {assign} x[idx[i]] * 2", backend=backend)
    with pytest.raises(OutOfBoundsError):
        statement(x=x, y=y, idx=_as(framework, idx))
    np.testing.assert_array_equal(_values(y), np.full(n, 7.0))
    good = _as(framework, idx % 10)
    statement(x=x, y=y, idx=good)       # and after a call that succeeded (its fast path)
    y = _as(framework, np.full(n, 7.0))
    with pytest.raises(OutOfBoundsError):
        statement(x=x, y=y, idx=_as(framework, idx))
    np.testing.assert_array_equal(_values(y), np.full(n, 7.0))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_statement_with_a_hoisted_form_that_fails_writes_nothing(backend, framework):
    rng = np.random.default_rng(2)
    X = _as(framework, rng.standard_normal((64, 80)))
    idx = np.arange(64)
    idx[-1] = 64
    Y = _as(framework, np.full((64, 80), 7.0))
    with pytest.raises(OutOfBoundsError):
        ef.ein("Y[i,j] = exp(X[idx[i],j] - max[k](X[idx[i],k]))", X=X, Y=Y,
               idx=_as(framework, idx), backend=backend)
    np.testing.assert_array_equal(_values(Y), np.full((64, 80), 7.0))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_statement_with_a_shape_error_writes_nothing(backend, framework):
    y = _as(framework, np.full((3, 2), 7.0))
    with pytest.raises(ShapeError):
        ef.ein("y[i,j] += A[i,k] * B[k,j]", A=_as(framework, np.ones((3, 4))),
               B=_as(framework, np.ones((5, 2))), y=y, backend=backend)
    np.testing.assert_array_equal(_values(y), np.full((3, 2), 7.0))


# ---------------------------------------------------------------- 10: the same bits

SOFTMAX = """m[i] := max[j](X[i,j])
             e[i,j] := exp(X[i,j] - m[i])
             P[i,j] := e[i,j] / sum[k](e[i,k])"""
LAYERNORM = """mu[i] := mean[j](X[i,j])
               v[i] := mean[j]((X[i,j] - mu[i])**2)
               Y[i,j] := (X[i,j] - mu[i]) / sqrt(v[i] + 0.00001) * g[j] + b[j]"""


def _arrays(rows, cols, seed=0):
    rng = np.random.default_rng(seed)
    return {"X": rng.standard_normal((rows, cols)), "g": rng.standard_normal(cols),
            "b": rng.standard_normal(cols), "W": rng.standard_normal((7, cols)),
            "idx": rng.integers(0, 7, rows), "A": rng.standard_normal((rows, 300)),
            "B": rng.standard_normal((300, cols))}


# (name, source, rows, cols): small ones run statement by statement, large ones fused
REPRODUCED = [
    ("a gather and a mean", "s := mean[b,d](W[idx[b], d] * X[b,d])", 3, 4),
    ("a gather and a mean, program",
     "e[b,d] := W[idx[b], d] * X[b,d]\nm[b] := mean[d](e[b,d])\ny[b,d] := e[b,d] - m[b]",
     5, 6),
    ("a gather inside a mean of an intermediate",
     "t0[i] := mean[j](X[i,j])\nt1[i] := mean[j](exp(-abs(t0[i] / (1 + abs(W[idx[i], j])))))",
     16, 24),
    ("a gather and a mean, fused",
     "e[b,d] := W[idx[b], d] * X[b,d]\nm[b] := mean[d](e[b,d])\ny[b,d] := e[b,d] - m[b]",
     300, 40),
    ("softmax", SOFTMAX, 4, 5),
    ("softmax, fused", SOFTMAX, 300, 40),
    ("layernorm", LAYERNORM, 4, 5),
    ("layernorm, fused", LAYERNORM, 1024, 64),
    ("a scatter gradient", "e[b,d] := W[idx[b], d]\ny[b,d] := e[b,d] * X[b,d]", 600, 40),
    ("a column sum", "e[i,j] := tanh(X[i,j])\nc[j] := sum[i](e[i,j] * X[i,j])", 1024, 64),
    ("a product BLAS computes", "C[i,j] := A[i,k] * B[k,j]", 257, 257),
]


def _bits(values):
    return [np.asarray(v).tobytes() for v in values]


def _forward_backward(compiled, arrays, framework):
    """The results (and, on torch, the gradients of every float input for a fixed
    seed) of one call."""
    if framework == "numpy":
        found = compiled(**{n: v.copy() for n, v in arrays.items()})
        return _bits(found if isinstance(found, tuple) else (found,))
    tensors = {n: torch.from_numpy(v.copy()).requires_grad_(v.dtype.kind == "f")
               for n, v in arrays.items()}
    found = compiled(**tensors)
    found = found if isinstance(found, tuple) else (found,)
    loss = sum((r * torch.linspace(-1, 1, r.numel(), dtype=r.dtype).reshape(r.shape)).sum()
               for r in found)
    loss.backward()
    return _bits([r.detach().numpy() for r in found] +
                 [t.grad.numpy() for t in tensors.values() if t.grad is not None])


def _used(source, arrays):
    return {n: v for n, v in arrays.items() if f"{n}[" in source}


def _large_on_numpy(backend, rows):
    """The NumPy backend runs the large cases statement by statement as it runs the
    small ones (fusing is the C backend's): there they are the slow run's."""
    return backend == "numpy" and rows >= 257


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("backend, threads, name, source, rows, cols", [
    # the reference runs on one thread anyway
    pytest.param(b, t, *case, id=f"{b}-{t}-{case[0]}",
                 marks=[pytest.mark.slow] if t == 2 or _large_on_numpy(b, case[2]) else [])
    for case in REPRODUCED
    for b in BACKENDS if b != "triton" for t in ([1] if b == "numpy" else [1, 2])])
def test_every_call_gives_the_same_bits(backend, framework, threads, name, source, rows,
                                        cols):
    compiled = ef.compile(source, backend=backend, threads=threads)
    for extra in range(3):        # each a new signature: its first call binds and prepares
        arrays = _used(source, _arrays(rows + extra, cols, seed=extra))
        first = _forward_backward(compiled, arrays, framework)
        for _ in range(3):
            assert _forward_backward(compiled, arrays, framework) == first, name


@pytest.mark.skipif(not HAVE_C, reason="the C backend's threads")
@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("name, source, rows, cols",
                         [c for c in REPRODUCED if c[2] >= 1024],
                         ids=[c[0] for c in REPRODUCED if c[2] >= 1024])
def test_the_free_cores_changing_from_call_to_call_change_no_bit(monkeypatch, framework,
                                                                 name, source, rows, cols):
    """Without threads= each kernel takes the cores other tasks leave (c_threads.py),
    so consecutive calls run on different thread counts: a fused column sum (layernorm's
    dg, db) must not depend on how its rows are split among them."""
    from einfuse.backends.c import (fused_prepared as c_fused_prepared, repeat as c_repeat,
                                    threads as c_threads)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    counts = itertools.cycle([1, 2])

    def changing():
        return next(counts)
    for module in (c_threads, c_fused_prepared, c_repeat):
        monkeypatch.setattr(module, "free_threads", changing)
    arrays = _used(source, _arrays(rows, cols))
    compiled = ef.compile(source, backend="c")
    first = _forward_backward(compiled, arrays, framework)
    for _ in range(3):
        assert _forward_backward(compiled, arrays, framework) == first, name
    pinned = [_forward_backward(ef.compile(source, backend="c", threads=t), arrays, framework)
              for t in (1, 2)]
    assert pinned[0] == pinned[1] == first, name


def test_a_sum_over_slices_is_still_the_sum():
    """The column sums by slices of rows against NumPy (float64 and float32)."""
    rng = np.random.default_rng(4)
    for dtype, rtol in ((np.float64, 1e-12), (np.float32, 1e-5)):
        X = rng.standard_normal((1031, 70)).astype(dtype)
        for threads in (1, 2, 3):
            c = ef.ein("e[i,j] := tanh(X[i,j])\nc[j] := sum[i](e[i,j] * X[i,j])", X=X,
                       threads=threads)
            np.testing.assert_allclose(c, (np.tanh(X.astype(np.float64)) * X).sum(0),
                                       rtol=rtol, atol=rtol)


@pytest.mark.parametrize("name, source, rows, cols",
                         [c for c in REPRODUCED if c[2] * c[3] <= 600],
                         ids=[c[0] for c in REPRODUCED if c[2] * c[3] <= 600])
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "triton"])
def test_backwards_of_one_call_agree_and_gradcheck_passes(backend, name, source, rows,
                                                          cols):
    """gradcheck's reentrancy check: backward twice through the same graph gives the
    same bits (its first backward plans and prepares, the second runs prepared)."""
    arrays = _used(source, _arrays(rows, cols, seed=5))
    compiled = ef.compile(source, backend=backend, threads=1)
    names = [n for n, v in arrays.items() if v.dtype.kind == "f"]
    tensors = {n: torch.from_numpy(v.copy()).requires_grad_(n in names)
               for n, v in arrays.items()}
    found = compiled(**tensors)
    found = found[-1] if isinstance(found, tuple) else found
    seed = torch.linspace(-1, 1, found.numel(), dtype=found.dtype).reshape(found.shape)
    grads = [torch.autograd.grad(found, [tensors[n] for n in names], seed,
                                 retain_graph=True) for _ in range(3)]
    for later in grads[1:]:
        assert _bits(later) == _bits(grads[0]), name

    def function(*values):
        result = compiled(**{**tensors, **dict(zip(names, values))})
        return result[-1] if isinstance(result, tuple) else result
    inputs = tuple(torch.from_numpy(arrays[n].copy()).requires_grad_() for n in names)
    assert torch.autograd.gradcheck(function, inputs, nondet_tol=0.0)
