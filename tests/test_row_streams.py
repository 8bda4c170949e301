"""Row kernels whose output is larger than the caches (8 MiB or more: row_streams'
EF_STREAM) write it with streaming stores (backends/c/row_streams.py): a softmax's
rows through a buffer of the thread's, a layernorm's directly, a log-softmax's (a
log-sum-exp group's member over [i, j]) through a buffer.  The values are those of the
cached stores: checked against NumPy in float64, on rows of NaN, inf and -inf, on rows
whose start is not aligned to a vector, with one thread and two."""

import ctypes

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build, rows as c_rows
from einfuse.backends.c.rows_source import source
from program_texts import LAYERNORM, SOFTMAX

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="row kernels are C kernels")

STREAMED = 8 << 20          # row_streams EF_STREAM: outputs from it on stream
# more than EF_STREAM bytes at either element size, rows short enough to stream (8 KiB at
# most: EF_SHORT); rows after the first start off a vector's alignment
SHAPES = {"float32": (2100, 1031), "float64": (1100, 1001)}


def _special(shape, dtype):
    X = np.random.default_rng(shape[0]).standard_normal(shape).astype(dtype)
    assert X.nbytes > STREAMED
    X[1, 5] = np.nan                    # a NaN row
    X[2, :] = -np.inf                   # every entry -inf
    X[3, -1] = np.inf                   # an inf entry
    X[4, ::2] = -np.inf                 # -inf beside finite values
    X[5] *= 1e4                         # exponentials that underflow
    X[-1, 0] = np.nan                   # the last row
    return X


def _softmax(X):
    with np.errstate(all="ignore"):
        wide = X.astype(np.float64)
        e = np.exp(wide - wide.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)


def _close(got, want, dtype):
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    tolerance = 3e-6 if dtype == "float32" else 1e-13
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance * 1e-3)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_streamed_softmax_rows(row_patterns, dtype):
    X = _special(SHAPES[dtype], dtype)
    program = ef.compile(SOFTMAX)
    P = program(X=X)
    assert row_patterns == [c_rows.RowPattern.SOFTMAX]
    _close(P, _softmax(X), dtype)
    two = ef.compile(SOFTMAX, threads=2)(X=X)
    np.testing.assert_array_equal(P, two)


@pytest.mark.parametrize("vector_bytes", [16, 32, 64])
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_streamed_softmax_rows_written_off_alignment(offset, vector_bytes):
    # the kernel (each vector width the machine may build) called on an output whose rows
    # start 0, 1 or 3 elements past a vector boundary: the lanes before the first aligned
    # vector are stored one by one
    rows, cols = 2100, 1024
    X = _special((rows, cols), "float32")
    library = c_build.load(source(np.dtype(np.float32), vector_bytes))
    library.ef_softmax_rows.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4 + \
        [ctypes.c_int]
    space = np.zeros(rows * cols + 64, np.float32)
    start = (-space.ctypes.data // 4) % 16 + offset          # elements to the offset
    P = space[start:start + rows * cols].reshape(rows, cols)
    M, S = np.empty(rows, np.float32), np.empty(rows, np.float32)
    library.ef_softmax_rows(X.ctypes.data, P.ctypes.data, M.ctypes.data, S.ctypes.data,
                            rows, cols, cols, cols, 1)
    _close(P, _softmax(X), "float32")
    assert not space[:start].any() and not space[start + rows * cols:].any()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_streamed_layernorm_rows(row_patterns, dtype):
    shape = SHAPES[dtype]
    rng = np.random.default_rng(4)
    X = (rng.standard_normal(shape) * 3 + 5).astype(dtype)
    X[1] = 2.5                          # variance 0
    X[2, 7] = np.nan
    X[3, 1] = np.inf
    g, b = (rng.standard_normal(shape[1]).astype(dtype) for _ in range(2))
    text = LAYERNORM.format(n=shape[1])
    y = ef.compile(text)(X=X, g=g, b=b)
    assert row_patterns == [c_rows.RowPattern.LAYERNORM]
    wide = X.astype(np.float64)
    with np.errstate(all="ignore"):
        mean = wide.mean(1, keepdims=True)
        var = ((wide - mean) ** 2).mean(1, keepdims=True)
        want = (wide - mean) / np.sqrt(var + 1e-5) * g + b
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    tolerance = 2e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(y, want, rtol=tolerance, atol=tolerance)
    np.testing.assert_array_equal(y, ef.compile(text, threads=2)(X=X, g=g, b=b))


@pytest.mark.parametrize("vector_bytes", [pytest.param(16, marks=pytest.mark.slow), 32, 64])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_streamed_log_softmax_rows(monkeypatch, row_patterns, dtype, vector_bytes):
    # (the AVX2 and SSE builds take their own range pass, AVX-512's scans it with the
    # previous row's exponentials: rows_source.ef_scans_next)
    monkeypatch.setattr(c_rows, "VECTOR_BYTES", vector_bytes)
    X = _special(SHAPES[dtype], dtype)
    text = "Y[i,j] := X[i,j] - logsumexp[k](X[i,k])"
    Y = ef.compile(text)(X=X)
    assert row_patterns == [c_rows.RowPattern.LOGSUMEXP]
    wide = X.astype(np.float64)
    with np.errstate(all="ignore"):
        m = wide.max(1, keepdims=True)
        # logsumexp's semantic: -inf for a row of -inf (m there, not m + log(0))
        lse = np.where(np.isfinite(m), m + np.log(np.exp(wide - m).sum(1, keepdims=True)), m)
        want = wide - lse
    np.testing.assert_array_equal(np.isnan(Y), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(Y[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    tolerance = 3e-6 if dtype == "float32" else 1e-13
    np.testing.assert_allclose(Y[finite], want[finite], rtol=tolerance, atol=tolerance * 10)
    np.testing.assert_array_equal(Y, ef.compile(text, threads=2)(X=X))
