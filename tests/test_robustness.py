"""Empty gathered axes, calls from many threads, big-endian inputs and expanded torch
outputs: one behaviour on every backend, never a crash or a raw library error."""

import threading

import numpy as np
import pytest

import einfuse as ef


# -- an empty gathered axis (every index value is out of range) -----------------------
@pytest.mark.parametrize("policy", ["clip", "wrap"])
def test_clip_and_wrap_into_an_empty_axis_are_errors(backend, policy):
    x, idx = np.zeros((0, 3)), np.array([0, 1])
    with pytest.raises(ef.EinfuseError, match="axis 0 of x is empty") as info:
        ef.ein("y[i,d] := x[idx[i], d]", x=x, idx=idx, bounds=policy, backend=backend)
    assert "x[idx[i], d]" in str(info.value)


def test_fill_from_an_empty_axis_gives_the_fill_value(backend):
    x, idx = np.zeros((0, 3)), np.array([0, 5, -1])
    got = ef.ein("y[i,d] := x[idx[i], d]", x=x, idx=idx, bounds="fill", fill=2.5,
                 backend=backend)
    np.testing.assert_array_equal(got, np.full((3, 3), 2.5))


def test_an_empty_index_array_reads_nothing(backend):
    x, idx = np.zeros((0, 3)), np.zeros(0, dtype=np.int64)
    got = ef.ein("y[i,d] := x[idx[i], d]", x=x, idx=idx, bounds="clip", backend=backend)
    assert got.shape == (0, 3)


def test_padded_reads_of_an_empty_array(backend):
    x, k = np.zeros(0), np.ones(3)
    got = ef.ein("y[i] := x[i+a] * k[a]", x=x, k=k, pad=1.0, ranges={"i": 4},
                 backend=backend)
    np.testing.assert_array_equal(got, np.full(4, 3.0))


# -- threads -------------------------------------------------------------------------------
def test_calls_from_eight_threads_agree_with_numpy(backend):
    rng = np.random.default_rng(0)
    jobs = [("D[i,j] := (w[k,i] - x[k,j])**2", {"w": rng.random((5, 7)), "x": rng.random((5, 6))},
             lambda w, x: ((w[:, :, None] - x[:, None, :]) ** 2).sum(0)),
            ("z[i] := logsumexp[j](X[i,j])", {"X": rng.random((9, 40))},
             lambda X: np.log(np.exp(X).sum(1)))]
    errors, results = [], []

    def work(n):
        try:
            statement, arrays, reference = jobs[n % len(jobs)]
            for _ in range(3):
                got = ef.ein(statement, backend=backend, **arrays)
                results.append(np.allclose(got, reference(**arrays), rtol=1e-10))
        except Exception as error:   # noqa: BLE001 -- reported below
            errors.append(repr(error))
    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(results) == 24 and all(results)


# -- layouts ---------------------------------------------------------------------------------
def test_big_endian_inputs(backend):
    x = np.arange(6.0).reshape(2, 3).astype(">f8")
    idx = np.array([1, 0], dtype=">i8")
    got = ef.ein("y[b,d] := 2 * x[idx[b], d]", x=x, idx=idx, backend=backend)
    np.testing.assert_array_equal(got, 2 * x.astype("<f8")[[1, 0]])


def test_an_expanded_torch_output_is_refused_before_writing():
    torch = pytest.importorskip("torch")
    base = torch.zeros(1)
    with pytest.raises(ef.EinfuseError, match="expanded tensor"):
        ef.ein("y[i] = x[i]", x=torch.ones(4), y=base.expand(4))
    assert base.item() == 0.0


def test_in_place_writes_that_autograd_would_miss_are_refused():
    """'=' and '+=' are not recorded by autograd: with grad mode on and a tensor that
    requires grad involved, a later backward would be silently wrong, so they raise."""
    torch = pytest.importorskip("torch")
    x = torch.ones(3, requires_grad=True)
    y = torch.zeros(3)
    with pytest.raises(ef.EinfuseError, match="autograd would not record"):
        ef.ein("y[i] = 2 * x[i]", x=x, y=y)
    assert y.abs().sum() == 0
    hidden = torch.zeros(3, requires_grad=True) * 1.0   # not a leaf, requires grad
    with pytest.raises(ef.EinfuseError, match="autograd would not record"):
        ef.ein("h[i] += x[i]", x=torch.ones(3), h=hidden)
    with torch.no_grad():   # an optimiser-style update is allowed
        ef.ein("y[i] += 2 * x[i]", x=x, y=y)
    assert y.tolist() == [2.0, 2.0, 2.0]
