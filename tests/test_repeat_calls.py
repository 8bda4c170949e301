"""The fast path for a repeated call (issue 11): a NumPy call whose signature (names,
shapes, dtypes, strides) was seen before skips binding and planning; every result
stays the full path's, whatever changes between calls."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.runtime import kernel as kernel_module


@pytest.fixture
def bind_count(monkeypatch):
    calls = []
    real = kernel_module.bind_call

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(kernel_module, "bind_call", counting)
    return calls


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
    ("z[i] := x[i] * s", {"x": np.arange(3.0), "s": 2.0}),                 # a scalar
    ("z[i] := W[idx[i]]", {"W": np.arange(3.0), "idx": np.array([2, 0])}),  # a gather
    ("P[i,j] := exp(X[i,j] - max[k](X[i,k]))", {"X": np.ones((2, 3))}),     # hoisted
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


def test_ein_reuses_its_kernel_and_warns_every_time(bind_count):
    x = np.arange(4.0)
    for _ in range(3):
        np.testing.assert_allclose(ef.ein("z[i] := x[i] + 1.25", x=x), x + 1.25)
    assert len(bind_count) == 1
    for _ in range(2):   # the implicit sum also adds b[i] once per k: a warning each time
        with pytest.warns(ef.EinfuseWarning, match="implicit sum"):
            ef.compile("y[i] := A[i,k] * x[k] + b[i]")
