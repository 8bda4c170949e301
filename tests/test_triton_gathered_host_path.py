"""A repeated gathered statement on the Triton backend takes its prepared launch
(backends/triton/repeat.py) and still checks its index values on every call as the
bounds policy asks: a label changed out of range (in place, so the call's signature is
the same) raises the statement's error, nothing launched; clip/wrap/fill give the
oracle's values whatever the labels hold.  Also: a lazily negated view with the first
call's signature (``z.conj().imag`` after ``z.imag``) is resolved, not read raw."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.triton import backend as triton_backend, launch
from einfuse.errors import OutOfBoundsError
from einfuse.runtime.signatures import signature_of

from oracle import brute_force

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not triton_backend.available(),
                                reason="Triton is not installed")
DEVICE = torch.device("cpu" if triton_backend.interpreted() else "cuda")
GATHER = "y[i] := x[i, t[i]] * 2.0 + 1.0"


def _oracle(text, ranges, bounds="check", fill=0.0, **arrays):
    """The brute-force loops' result (tests/oracle.py) on the tensors' values."""
    return brute_force(text, {k: (0, n) for k, n in ranges.items()},
                       {k: v.cpu().numpy() for k, v in arrays.items()}, bounds=bounds,
                       fill=fill)


def _prepared(kernel, **arrays):
    """Whether the kernel holds a prepared runner for the signature of ``arrays``."""
    return kernel._repeat.get(signature_of(arrays)) is not None


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_a_repeated_gather_takes_its_prepared_launch(index_dtype):
    kernel = ef.compile(GATHER, backend="triton")
    x = torch.randn(6, 5, dtype=torch.float64, device=DEVICE)
    t = torch.tensor([0, 4, 2, 1, 3, 3], dtype=index_dtype, device=DEVICE)
    with torch.no_grad():
        for _ in range(2):
            kernel(x=x, t=t)
        assert _prepared(kernel, x=x, t=t)
        with launch.observed() as seen:
            y = kernel(x=x, t=t)
    assert [r.kernel for r in seen] == ["einfuse_kernel"]
    np.testing.assert_array_equal(y.cpu().numpy(), _oracle(GATHER, {"i": 6}, x=x, t=t))
    torch.testing.assert_close(y, x[torch.arange(6), t.long()] * 2.0 + 1.0,
                               rtol=0, atol=0)


@pytest.mark.parametrize("bad", [5, -1, 2 ** 40])
def test_a_label_changed_out_of_range_raises_the_statements_error(bad):
    kernel = ef.compile(GATHER, backend="triton")
    x = torch.randn(4, 5, device=DEVICE)
    t = torch.tensor([0, 4, 2, 1], device=DEVICE)
    for _ in range(3):
        kernel(x=x, t=t)
    assert _prepared(kernel, x=x, t=t)
    t[2] = bad                 # in place: the same signature
    with launch.observed() as seen, pytest.raises(OutOfBoundsError, match=r"t\[2\]"):
        kernel(x=x, t=t)
    assert not [r for r in seen if r.kernel == "einfuse_kernel"]    # nothing launched
    t[2] = 3                   # back in range: the prepared launch again
    with launch.observed() as seen:
        y = kernel(x=x, t=t)
    assert len(seen) == 1
    np.testing.assert_allclose(y.cpu().numpy(), _oracle(GATHER, {"i": 4}, x=x, t=t),
                               rtol=1e-6)


def test_an_empty_index_array_reads_nothing_and_repeats():
    text = "y[i] := sum[k](x[i, t[k]])"
    kernel = ef.compile(text, backend="triton")
    x = torch.randn(3, 4, device=DEVICE)
    t = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    for _ in range(3):
        y = kernel(x=x, t=t)
    np.testing.assert_array_equal(y.cpu().numpy(), np.zeros(3, np.float32))


@pytest.mark.parametrize("bounds", ["clip", "wrap", "fill"])
def test_clip_wrap_fill_repeat_with_any_label(bounds):
    kernel = ef.compile(GATHER, backend="triton", bounds=bounds, fill=-7.0)
    x = torch.randn(5, 4, dtype=torch.float64, device=DEVICE)
    t = torch.tensor([0, 1, 2, 3, 0], device=DEVICE)
    for _ in range(3):
        kernel(x=x, t=t)
    assert _prepared(kernel, x=x, t=t)
    for labels in ([9, -3, 2, 4, -100], [0, 1, 2, 3, 4], [-1, -1, -1, -1, -1]):
        t.copy_(torch.tensor(labels))
        with launch.observed() as seen:
            y = kernel(x=x, t=t)
        assert len(seen) == 1
        expected = _oracle(GATHER, {"i": 5}, bounds=bounds, fill=-7.0, x=x, t=t)
        np.testing.assert_allclose(y.cpu().numpy(), expected, rtol=1e-12)


def test_a_nested_gather_checks_both_index_arrays():
    text = "y[i] := x[u[t[i]]]"
    kernel = ef.compile(text, backend="triton")
    x = torch.randn(6, device=DEVICE)
    u = torch.tensor([5, 0, 3], device=DEVICE)
    t = torch.tensor([2, 0, 1, 2], device=DEVICE)
    for _ in range(3):
        kernel(x=x, u=u, t=t)
    assert _prepared(kernel, x=x, u=u, t=t)
    u[1] = 6
    with pytest.raises(OutOfBoundsError, match="u"):
        kernel(x=x, u=u, t=t)
    u[1] = 4
    t[3] = 3
    with pytest.raises(OutOfBoundsError, match="t"):
        kernel(x=x, u=u, t=t)
    t[3] = 0
    y = kernel(x=x, u=u, t=t)
    np.testing.assert_array_equal(y.cpu().numpy(), _oracle(text, {"i": 4}, x=x, u=u, t=t))


def test_a_lazily_negated_view_of_the_first_calls_layout_is_resolved():
    kernel = ef.compile("y[i] := x[i] * 2.0", backend="triton")
    z = torch.randn(8, dtype=torch.complex64, device=DEVICE)
    with torch.no_grad():
        for _ in range(3):
            kernel(x=z.imag)
        negated = z.conj().imag
        assert negated.is_neg() and signature_of({"x": negated}) == \
            signature_of({"x": z.imag})
        y = kernel(x=negated)
    torch.testing.assert_close(y, -z.imag * 2.0, rtol=0, atol=0)
