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
   (without threads=, the free cores decide call by call: backends/c_threads.py)."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends import c_build
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
