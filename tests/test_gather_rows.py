"""The embedding form of a gather, ``E[b,d] := W[idx[b], d]``, on its prepared path
(backends/c/gather_rows.py): one test and one memcpy per row.  Results are compared with
np.take (and torch.nn.functional.embedding); an index value out of bounds on a repeated
call still gets the full path's error naming it."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.analysis.spec import analyse
from einfuse.backends.c import build as c_build
from einfuse.backends.c.gather_rows import row_gather
from einfuse.errors import OutOfBoundsError
from einfuse.lang import parse

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")


@pytest.mark.parametrize("statement, found", [
    ("E[b,d] := W[idx[b], d]", ("W", "idx")),
    ("E[b,c,d,e] := W[idx[b,c], d, e]", ("W", "idx")),
    ("e[b] := v[idx[b]]", ("v", "idx")),
    ("E[b,d] := W[idx[b] + 1, d]", None),      # an affine part
    ("E[b,d] := W[2 * idx[b], d]", None),      # a coefficient
    ("E[d,b] := W[idx[b], d]", None),          # the rows transposed
    ("E[b,d] := W[idx[b], d] * 2", None),      # arithmetic
    ("E[b,d] := W[idx[jdx[b]], d]", None),     # nested
    ("E[b,d] := W[d, idx[b]]", None),          # not the first axis
])
def test_the_form_recognised(statement, found):
    assert row_gather(analyse(parse(statement))) == found


def _check_repeated(statement, arrays, want, bind_count, **options):
    kernel = ef.compile(statement, backend="c", **options)
    # (the dtype as the reference backend gives it: bool values gather as int64)
    dtype = ef.ein(statement, backend="numpy", **arrays, **options).dtype
    bind_count.clear()
    for _ in range(3):
        got = kernel(**arrays)
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert len(bind_count) == 1        # the later calls took the prepared path
    return kernel


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.bool_])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32, np.uint8, np.uint64])
def test_rows_of_every_dtype(dtype, index_dtype, bind_count):
    rng = np.random.default_rng(1)
    W = (rng.standard_normal((200, 33)) * 100).astype(dtype)
    idx = rng.integers(0, 200, 57).astype(index_dtype)
    _check_repeated("E[b,d] := W[idx[b], d]", {"W": W, "idx": idx},
                    np.take(W, idx, axis=0), bind_count)


@pytest.mark.parametrize("make", [
    lambda W: W[::-1],                      # rows in reverse (a negative row stride)
    lambda W: W[::3],                       # every third row
    lambda W: np.asfortranarray(W),         # rows not contiguous: the general kernel
    lambda W: W[:, ::2],                    # likewise
])
def test_table_views(make, bind_count):
    rng = np.random.default_rng(2)
    W = make(rng.standard_normal((90, 16)))
    idx = rng.integers(0, W.shape[0], 40)[::2]     # a strided index array too
    _check_repeated("E[b,d] := W[idx[b], d]", {"W": W, "idx": idx}, W[idx], bind_count)


def test_more_axes_and_a_vector(bind_count):
    rng = np.random.default_rng(3)
    W = rng.standard_normal((30, 4, 5)).astype(np.float32)
    idx = rng.integers(0, 30, (6, 7))
    _check_repeated("E[b,c,d,e] := W[idx[b,c], d, e]", {"W": W, "idx": idx}, W[idx],
                    bind_count)
    v = rng.standard_normal(30)
    _check_repeated("e[b] := v[idx[b]]", {"v": v, "idx": idx[0]}, v[idx[0]], bind_count)


@pytest.mark.parametrize("rows", [5, 3000])        # one thread; shared among threads
@pytest.mark.parametrize("bad", [-1, 50, 2**63 + 5])
def test_a_value_out_of_bounds_on_a_repeated_call_is_named(rows, bad, monkeypatch):
    from einfuse.schedule import row_gather as schedule_row_gather
    if rows > 5:       # rows shared among threads from a smaller size
        monkeypatch.setattr(schedule_row_gather, "COPY_PARALLEL_BYTES", 1024)
    kernel = ef.compile("E[b,d] := W[idx[b], d]", backend="c")
    W = np.arange(50 * 64, dtype=np.float32).reshape(50, 64)
    dtype = np.uint64 if bad > 2**62 else np.int64
    idx = (np.arange(rows) % 50).astype(dtype)
    for _ in range(2):
        np.testing.assert_array_equal(kernel(W=W, idx=idx), W[idx])
    broken = idx.copy()
    broken[rows - 2] = bad
    with pytest.raises(OutOfBoundsError, match=f"idx\\[{rows - 2}\\] = {bad}"):
        kernel(W=W, idx=broken)
    np.testing.assert_array_equal(kernel(W=W, idx=idx), W[idx])


def test_threads_and_clip_keep_their_results(monkeypatch):
    from einfuse.schedule import row_gather as schedule_row_gather
    monkeypatch.setattr(schedule_row_gather, "COPY_PARALLEL_BYTES", 1024)
    rng = np.random.default_rng(4)
    W = rng.standard_normal((500, 64))
    idx = rng.integers(0, 500, 4000)
    for threads in (None, 1, 2):
        kernel = ef.compile("E[b,d] := W[idx[b], d]", backend="c", threads=threads)
        for _ in range(2):
            np.testing.assert_array_equal(kernel(W=W, idx=idx), W[idx])
    clipped = ef.compile("E[b,d] := W[idx[b], d]", backend="c", bounds="clip")
    wide = idx + 300
    for _ in range(2):
        np.testing.assert_array_equal(clipped(W=W, idx=wide), W[np.clip(wide, 0, 499)])


def test_torch_embedding_forward_and_backward():
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(5)
    W = torch.randn(100, 24, generator=gen, requires_grad=True)
    W2 = W.detach().clone().requires_grad_(True)
    idx = torch.randint(0, 100, (300,), generator=gen)
    seed = torch.randn(300, 24, generator=gen)
    kernel = ef.compile("E[b,d] := W[idx[b], d]", backend="c")
    torch.nn.functional.embedding(idx, W2).backward(seed)
    for _ in range(3):
        W.grad = None
        out = kernel(W=W, idx=idx)
        assert torch.equal(out, torch.nn.functional.embedding(idx, W.detach()))
        out.backward(seed)
        torch.testing.assert_close(W.grad, W2.grad)
