"""Review of the Triton row groups (schedule/row_groups.py, backends/triton/rows.py and
the row-group hook of schedule/fusion.py): inputs given in forms a statement accepts
but the group's launch did not, and other cases where the fused kernel disagreed with
the statements run one by one.  Each test compares with the NumPy backend (or torch)
on the same data; under TRITON_INTERPRET=1 on CPU tensors (tests/conftest.py)."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.triton import backend as triton_backend, rows as triton_rows

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not triton_backend.available(),
                                reason="Triton is not installed")
DEVICE = torch.device("cpu" if triton_backend.interpreted() else "cuda")
X = np.random.default_rng(8).standard_normal((6, 8))


def _tensor(array):
    return torch.from_numpy(np.array(array, copy=True)).to(DEVICE)


def _compare(source, arrays, tensors, rtol=1e-12, **options):
    want = ef.compile(source, backend="numpy", **options)(**arrays)
    program = ef.compile(source, backend="triton", **options)
    for _ in range(2):
        got = program(**tensors)
        np.testing.assert_allclose(got.detach().cpu().numpy(), want, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("scalar", [2.0, np.float64(2.0)])
def test_a_number_given_for_a_0d_array_runs(scalar, row_launches):
    # s[] given as a Python or NumPy number: the statements accept it; the group's
    # launch read .device/.stride() of it (AttributeError)
    source = "a[i,j] := X[i,j] * s[]\nb[i] := sum[j](a[i,j])"
    _compare(source, {"X": X, "s": scalar}, {"X": _tensor(X), "s": scalar})


def test_a_list_given_for_an_array_runs(row_launches):
    source = "a[i,j] := X[i,j] * w[j]\nb[i] := sum[j](a[i,j])"
    w = [0.5 * k for k in range(8)]
    _compare(source, {"X": X, "w": w}, {"X": _tensor(X), "w": w})


def test_signed_zero_constants_are_not_merged(row_launches):
    # Const(-0.0) == Const(0.0): X*0.0 and X*-0.0 were one shared subexpression, so
    # 1/(X*-0.0) came out +inf
    x = np.random.default_rng(2).uniform(0.5, 1.5, (4, 8))
    source = "a[i,j] := 1 / (X[i,j] * 0.0)\nb[i,j] := 1 / (X[i,j] * -0.0)\n" \
             "c[i] := sum[j](a[i,j] + b[i,j])"
    want = ef.compile(source, backend="numpy", outputs=("a", "b"))(X=x)
    program = ef.compile(source, backend="triton", outputs=("a", "b"))
    for _ in range(2):
        got = program(X=_tensor(x))
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.cpu().numpy(), w)
    assert row_launches == [3, 3]


@pytest.mark.parametrize("make", [
    lambda t: t[:, ::2],                      # integers, a strided slice
    lambda t: (t > 0)[:, ::2],                # bools, a strided slice
    lambda t: t.t()[::2],                     # integers, transposed and sliced
])
def test_converted_strided_inputs_are_read_with_their_own_strides(make, row_launches):
    # an integer or bool input is converted to the working dtype before the launch;
    # the copy of a strided slice is contiguous, and was read with the slice's strides
    base = torch.from_numpy(np.random.default_rng(3).integers(-5, 5, (6, 16))).to(DEVICE)
    x = make(base)
    source = "a[i,j] := X[i,j] * 0.5\nb[i] := sum[j](a[i,j])"
    _compare(source, {"X": x.cpu().numpy()}, {"X": x})
    assert row_launches == [2, 2]


def test_a_lazily_negated_view_is_read_as_its_values(row_launches):
    # z.conj().imag is a float64 view with the negative bit set: its storage holds
    # the values' negatives
    z = torch.from_numpy(np.random.default_rng(4).standard_normal((6, 8)) +
                         1j * np.random.default_rng(5).standard_normal((6, 8))).to(DEVICE)
    x = z.conj().imag
    assert x.is_neg()
    source = "m[i] := max[j](X[i,j])\ny[i,j] := X[i,j] - m[i]"
    _compare(source, {"X": x.resolve_neg().cpu().numpy()}, {"X": x})
    assert row_launches == [2, 2]


@pytest.mark.parametrize("expression", [
    "1.25 / 0.0",                 # Python's float division raised ZeroDivisionError
    "1.25 / -0.0",
    "(0.5 <= -1.25)",             # a Python bool has no .to
])
def test_operations_on_constants_alone(expression, row_launches):
    # (the constant written last, the order rewrite/rules.wider-addend-first gives: a
    # program some rule rewrites has its read-once intermediates computed where they
    # are read, and the group would have no row member)
    source = f"y[i,j] := X[i,j] + {expression}\nz[i] := sum[j](y[i,j])"
    _compare(source, {"X": X}, {"X": _tensor(X)})
    assert row_launches == [2, 2]


def test_where_of_constants_keeps_float64(row_launches):
    # tl.where of two Python floats is float32: 0.1 came out 0.10000000149
    source = "a[i] := sum[j](X[i,j])\nb[i] := where(a[i] > 0, 0.1, 0.3)\n" \
             "c[i,j] := X[i,j] * where(X[i,j] > 0, 0.1, 0.3) + b[i]"
    want = ef.compile(source, backend="numpy", outputs=("b", "c"))(X=X)
    got = ef.compile(source, backend="triton", outputs=("b", "c"))(X=_tensor(X))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.cpu().numpy(), w, rtol=1e-15, atol=0)
    assert row_launches == [3]


def test_threads_calling_a_program_at_once(row_launches):
    # Triton's interpreter swaps module-level state while a kernel runs: the group's
    # row_launches did not take turns as the statements' do ("Did you forget to add
    # @triton.jit ?" from another thread's kernel); on a GPU a first launch compiles
    import threading
    source = "m[i] := max[j](X[i,j])\ne[i,j] := exp(X[i,j] - m[i])\n" \
             "s[i] := sum[j](e[i,j])\ny[i,j] := e[i,j] / s[i] * p"
    program = ef.compile(source, backend="triton")
    reference = ef.compile(source, backend="numpy")
    barrier, errors = threading.Barrier(8), []

    def work(k):
        try:
            barrier.wait()
            for t in range(3):
                x = np.random.default_rng(10 * k + t).standard_normal((7, 9))
                got = program(X=_tensor(x), p=float(k + t)).cpu().numpy()
                np.testing.assert_allclose(got, reference(X=x, p=float(k + t)),
                                           rtol=1e-12)
        except Exception as error:     # (reported by the main thread)
            errors.append(error)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]
    assert len(row_launches) == 24


def test_programs_differing_in_a_zero_sign_get_their_own_kernels(row_launches):
    # the kernel cache is keyed by the group, whose constants compared 0.0 == -0.0:
    # the second program ran the first one's kernel
    x = np.random.default_rng(6).standard_normal((5, 4))
    for zero in ("0.0", "-0.0"):
        source = f"a[i] := sum[j](X[i,j])\nb[i] := 1 / (a[i] * 0.0 + {zero})"
        want = ef.compile(source, backend="numpy")(X=x)
        got = ef.compile(source, backend="triton")(X=_tensor(x))
        np.testing.assert_array_equal(got.cpu().numpy(), want)
    assert row_launches == [2, 2]


def test_bfloat16_inputs_give_bfloat16_results(row_launches):
    # the statements store a bfloat16 result for bfloat16 inputs (float16 gives
    # float16 and does not join); the group gave float32, and kept the intermediates
    # unrounded where the statements read them rounded
    source = "s[i] := sum[j](X[i,j] * 1.0)\ny[i,j] := X[i,j] / s[i]"
    x = torch.from_numpy(X).to(DEVICE).to(torch.bfloat16)
    got = ef.compile(source, backend="triton", outputs=("s", "y"))(X=x)
    want = ef.compile(source, backend="numpy", outputs=("s", "y"))(
        X=x.float().cpu().numpy())
    for g, w in zip(got, want):
        assert g.dtype == torch.bfloat16
        np.testing.assert_allclose(g.float().cpu().numpy(), w, rtol=2e-2, atol=1e-2)


def test_a_result_larger_than_memory_is_the_statements_error(monkeypatch, row_launches):
    # the statement refuses a result larger than the machine's memory (AllocationError)
    # before anything runs; the group went on to allocate it (a raw RuntimeError from
    # the allocator, or on a GPU torch.OutOfMemoryError).  The machine is said to have
    # 64 kB here, so that nothing large is allocated whatever happens.
    from einfuse.errors import EinfuseError
    from einfuse.analysis import result_size
    monkeypatch.setattr(result_size, "_physical_memory", lambda: 1 << 16)
    v = torch.ones(20, dtype=torch.float64, device=DEVICE)
    w = torch.ones(1024, dtype=torch.float64, device=DEVICE)     # y: 160 kB
    # (y read twice: read once inside the sum, the canonical program would compute it
    # where it is read, rewrite/inline_reductions.py, and never make it)
    program = ef.compile("y[i,j] := v[i] * w[j]\nz[i] := sum[j](y[i,j]) + max[j](y[i,j])",
                         backend="triton")
    with pytest.raises(EinfuseError, match="memory"):
        program(v=v, w=w)
    assert not row_launches


def test_outputs_that_cannot_be_allocated_fall_back_to_the_statements(monkeypatch):
    # an out-of-memory at the group's launch: the statements run alone (and report it
    # as theirs where one of them does not fit either)
    def refused(self, env):
        raise MemoryError
    monkeypatch.setattr(triton_rows.RowRunner, "__call__", refused)
    source = "m[i] := max[j](X[i,j])\ny[i,j] := X[i,j] - m[i]"
    program = ef.compile(source, backend="triton")
    want = ef.compile(source, backend="numpy")(X=X[:5])
    for _ in range(2):      # the first call prepares a run, the second repeats it
        got = program(X=_tensor(X[:5]))
        np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-12)
