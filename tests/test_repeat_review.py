"""The fast path for a repeated call under hostile input: calls that must not be
prepared (names in another Unicode form, a float for a 0-d tensor, more arrays than the
kernel-call extension takes), eviction racing between threads, and a hoisted statement
that runs as written under autograd.  Every result is compared with NumPy or torch."""

import numpy as np
import pytest

import einfuse as ef


def test_evicting_a_signature_another_thread_evicted_first_is_no_error():
    """Two threads preparing at a full cache both pick the oldest signature to drop;
    the second finds it gone (simulated: dropping it removes it twice)."""
    from einfuse.runtime import repeat

    class EvictedMeanwhile(dict):
        def pop(self, key, *default):
            dict.pop(self, key, None)      # the other thread got there first
            return dict.pop(self, key, *default)

    k = ef.Kernel("z[i] := x[i] * 3.0", ef.compile("z[i] := x[i] * 3.0").options)
    k._repeat = EvictedMeanwhile()
    for n in range(1, repeat.SIGNATURES_KEPT + 3):
        np.testing.assert_allclose(k(x=np.ones(n)), np.full(n, 3.0))
    assert len(k._repeat) == repeat.SIGNATURES_KEPT


def test_a_hoisted_repeat_that_runs_as_written_still_records_autograd():
    torch = pytest.importorskip("torch")
    k = ef.compile("y[i,j] := A[i+1,j] + sum[k](W[idx[i], k])", backend="c")
    rng = np.random.default_rng(2)
    A = torch.tensor(rng.standard_normal((4, 2)), requires_grad=True)
    W = torch.tensor(rng.standard_normal((5, 4)), requires_grad=True)
    for idx in ([1, 0, 4, 2], [1, 0, 4, 99]):   # the second: the hoisted form cannot run
        y = k(A=A, W=W, idx=torch.tensor(idx))
        grad_a, grad_w = torch.autograd.grad(y.sum(), (A, W))
        torch.testing.assert_close(grad_a, torch.tensor([[0.0, 0], [1, 1], [1, 1], [1, 1]],
                                                        dtype=torch.float64))
        expected_w = torch.zeros(5, 4, dtype=torch.float64)
        for row in idx[:3]:
            expected_w[row] += 2
        torch.testing.assert_close(grad_w, expected_w)


def test_a_name_passed_in_another_unicode_form_repeats():
    # Python normalises identifiers (NFKC) but not the keys of a ** dict: the statement's
    # tensor H may arrive as the key "ℌ"
    k = ef.compile("y[i] := sum[j](ℌ[i,j]) * a")
    for a in (1.5, 2.5, 3.5):
        np.testing.assert_allclose(k(**{"ℌ": np.ones((2, 3)), "a": a}), [3 * a, 3 * a])


def test_a_statement_with_more_arrays_than_the_extension_takes_repeats():
    from einfuse.backends.c import call as c_call
    count = c_call.MAX_BUFFERS + 2
    k = ef.compile("y[i] := " + " + ".join(f"A{t}[i]" for t in range(count)), backend="c")
    arrays = {f"A{t}": np.full(3, float(t)) for t in range(count)}
    for _ in range(2):
        np.testing.assert_allclose(k(**arrays), np.full(3, count * (count - 1) / 2))


@pytest.mark.parametrize("statement", ["y[i] := z[i] * x[]",              # plain kernel
                                       "C[i,j] := z[i,k] * B[k,j] * x[]",  # BLAS
                                       "y[i,j] := z[i,j] / sum[k](z[i,k]) * x[]"])  # hoisted
def test_a_python_float_for_a_0d_tensor_repeats(statement):
    k = ef.compile(statement, backend="c")
    z, B = np.arange(1.0, 7.0).reshape(2, 3)[0], np.ones((3, 2))
    if "sum" in statement or "B" in statement:
        z = np.arange(1.0, 7.0).reshape(2, 3)
    arrays = {"z": z, "B": B} if "B" in statement else {"z": z}
    first = k(x=1.5, **arrays)
    np.testing.assert_allclose(k(x=3.0, **arrays), 2 * first)
