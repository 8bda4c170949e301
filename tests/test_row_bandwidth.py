"""The row kernels' fast paths (backends/c/rows_source.py) give the statements' values:
the exponential without special cases gives the full one's bits on its range; a row's
range is found with NaN-blind max/min instructions, so rows holding NaN (anywhere,
the partial last vector included) are taken again as written; each vector width the
machine may build (16, 32, 64 bytes: SSE, AVX2, AVX-512) computes the same."""

import ctypes

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build, fused as c_fused
from einfuse.backends.c.rows_source import source
from einfuse.plan import row_kernel
from program_texts import SOFTMAX

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="row kernels are C kernels")

# ef_vexp_fast's range: [-EF_BIG, EF_BIG]
# the AVX2 and AVX-512 widths by default; SSE's (a rare build) among the slow tests
WIDTHS = [pytest.param(16, marks=pytest.mark.slow), 32, 64]
RANGE = {np.float32: (-84.0, 84.0), np.float64: (-704.0, 704.0)}


def _library(dtype, vector_bytes):
    library = c_build.load(source(np.dtype(dtype), vector_bytes))
    for name in ("ef_exp_values", "ef_exp_values_fast"):
        getattr(library, name).argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64]
    library.ef_softmax_rows.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4 + \
        [ctypes.c_int]
    return library


def _exp(library, name, x):
    y = np.empty_like(x)
    getattr(library, name)(x.ctypes.data, y.ctypes.data, x.size)
    return y


def _in_range(dtype):
    lo, hi = RANGE[dtype]
    if dtype == np.float32:       # every 97th float32 of the range, both signs
        bits = np.arange(0, 0x42B17218, 97, dtype=np.uint32)
        x = np.concatenate([bits.view(np.float32), -bits.view(np.float32)])
    else:
        x = np.random.default_rng(3).uniform(lo, hi, 1 << 20)
    x = np.concatenate([x, [lo, hi, 0.0, -0.0]]).astype(dtype)
    return x[(x >= lo) & (x <= hi)]


@pytest.mark.parametrize("vector_bytes", WIDTHS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fast_exponential_gives_the_full_ones_bits(dtype, vector_bytes):
    library = _library(dtype, vector_bytes)
    x = _in_range(dtype)
    np.testing.assert_array_equal(_exp(library, "ef_exp_values_fast", x),
                                  _exp(library, "ef_exp_values", x))


def _rows(dtype, cols):
    X = np.random.default_rng(cols).standard_normal((12, cols)).astype(dtype)
    X[0, 0] = np.nan                       # NaN first
    X[1, cols // 2] = np.nan               # in the middle
    X[2, cols - 1] = np.nan                # in the partial last vector
    X[3, :] = np.nan                       # all NaN
    X[4, 1] = np.nan
    X[4, 2] = np.inf                       # NaN beside inf
    X[5, 3] = np.inf
    X[6, ::5] = -np.inf
    X[7] *= 1e3                            # a range wider than the fast exponential's
    X[8, 0] = -1e3
    return X


def _softmax_rows(library, X):
    """(P, M, S) of ef_softmax_rows on X's rows, one thread."""
    rows, cols = X.shape
    P, M, S = np.empty_like(X), np.empty(rows, X.dtype), np.empty(rows, X.dtype)
    library.ef_softmax_rows(X.ctypes.data, P.ctypes.data, M.ctypes.data, S.ctypes.data,
                            rows, cols, cols, cols, 1)
    return P, M, S


@pytest.mark.parametrize("vector_bytes", WIDTHS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cols", [5, 37, 1024, 2051])
def test_softmax_rows_at_every_vector_width(dtype, vector_bytes, cols):
    library = _library(dtype, vector_bytes)
    X = _rows(dtype, cols)
    P, M, S = _softmax_rows(library, X)
    with np.errstate(all="ignore"):
        m = np.max(X, 1)                   # NaN where a row holds one
        e = np.exp(X - m[:, None])
        s = e.sum(1)
        p = e / s[:, None]
    np.testing.assert_array_equal(M, m)
    tolerance = 3e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(S, s, rtol=tolerance)
    np.testing.assert_allclose(P, p, rtol=tolerance, atol=tolerance * 1e-3)
    np.testing.assert_array_equal(np.isnan(P), np.isnan(p))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_program_rows_with_nan_as_the_generic_kernel(monkeypatch, dtype):
    X = _rows(np.dtype(dtype).type, 1000)
    program = ef.compile(SOFTMAX, outputs=("P", "m"))
    P, M = program(X=X)
    with monkeypatch.context() as patch:
        patch.setattr(row_kernel, "match", lambda members, rows: None)
        patch.setattr(c_fused, "_fused", {})
        P2, M2 = ef.compile(SOFTMAX, outputs=("P", "m"))(X=X)
    np.testing.assert_array_equal(M, M2)
    np.testing.assert_array_equal(np.isnan(P), np.isnan(P2))
    tolerance = 2e-6 if dtype == "float32" else 1e-14
    np.testing.assert_allclose(P, P2, rtol=tolerance, atol=tolerance * 1e-3)


def _payload_nans(dtype):
    """Quiet NaNs (both signs) with every low payload bit set: the bits the fast
    exponential shifts into a result's exponent field (a NaN whose bits are kept there
    would come out a number)."""
    if dtype == np.float32:
        return np.array([0x7FC001FF, 0xFFC001FF], np.uint32).view(np.float32)
    return np.array([0x7FF8000000000FFF, 0xFFF8000000000FFF], np.uint64).view(np.float64)


def _payload_rows(dtype, cols):
    X = np.random.default_rng(cols + 1).standard_normal((9, cols)).astype(dtype)
    plus, minus = _payload_nans(dtype)
    X[0, 0] = plus                         # the first row (the range pass of its own)
    X[2, cols // 2] = minus                # a row scanned with the previous one's exponentials
    X[4, cols - 1] = plus                  # in the partial last vector
    X[5, :] = minus                        # all NaN
    X[7, 1] = plus
    X[7, 2] = -np.inf                      # beside -inf
    X[8, 0] = minus                        # the last row
    return X


@pytest.mark.parametrize("vector_bytes", WIDTHS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cols", [37, 1024, 2051])
def test_softmax_rows_with_nan_payloads(dtype, vector_bytes, cols):
    library = _library(dtype, vector_bytes)
    X = _payload_rows(dtype, cols)
    P, M, S = _softmax_rows(library, X)
    nan = np.isnan(X).any(1)
    assert np.isnan(M[nan]).all() and np.isnan(S[nan]).all() and np.isnan(P[nan]).all()
    m = X[~nan].max(1)
    e = np.exp(X[~nan] - m[:, None])
    np.testing.assert_array_equal(M[~nan], m)
    tolerance = 3e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(P[~nan], e / e.sum(1)[:, None], rtol=tolerance,
                               atol=tolerance * 1e-3)


LSE_ROWS = {"logsumexp": "l[i] := logsumexp[j](X[i,j])",
            "quotient cross-entropy": "l[i] := -log(exp(X[i, t[i]]) / sum[j](exp(X[i,j])))"}


@pytest.mark.parametrize("vector_bytes", WIDTHS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cols", [37, 1024, 2051])
@pytest.mark.parametrize("name", list(LSE_ROWS))
def test_log_sum_exp_rows_with_nan_payloads(monkeypatch, row_patterns, name, dtype,
                                            vector_bytes, cols):
    # the log-sum-exp kernel (backends/c/row_values.py) scans a short row's range with
    # the previous row's exponentials, a long one's in a pass of its own; a NaN is
    # passed over by both, and each row that holds one is NaN, as its statement's value
    from einfuse.backends.c import rows as c_rows
    monkeypatch.setattr(c_rows, "VECTOR_BYTES", vector_bytes)
    X = _payload_rows(np.dtype(dtype).type, cols)
    t = np.arange(len(X)) % cols
    text = LSE_ROWS[name]
    got = ef.compile(text)(**({"X": X, "t": t} if "t[" in text else {"X": X}))
    assert row_patterns == [c_rows.RowPattern.LOGSUMEXP]
    wide = X.astype(np.float64)
    with np.errstate(all="ignore"):
        if name == "logsumexp":
            m = wide.max(1)
            want = m + np.log(np.exp(wide - m[:, None]).sum(1))
        else:
            want = -np.log(np.exp(wide[np.arange(len(X)), t]) / np.exp(wide).sum(1))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[np.isnan(X).any(1)]).all()
    keep = ~np.isnan(want)
    np.testing.assert_allclose(got[keep], want[keep], rtol=3e-6 if dtype == "float32"
                               else 1e-13, atol=1e-6 if dtype == "float32" else 1e-12)
