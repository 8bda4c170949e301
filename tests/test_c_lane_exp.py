"""exp inside the C statement kernels' SIMD lane loops (the loops under ``#pragma omp
simd``: a row sum, an elementwise map, gauss's kernel sum), on the arguments where a
vector exp goes wrong: NaN, +-inf, the overflow threshold, results in the subnormal range
and results that round to 0.  The reference is NumPy's long double exp rounded to the
dtype; the bound is 4 ulp (glibc's documented bound for its vector math functions, which
these loops call), counted in subnormal steps where the exact result is subnormal."""

import numpy as np
import pytest

import einfuse as ef

pytest.importorskip("einfuse.backends.c.build")


def _special(dtype):
    info = np.finfo(dtype)
    top = float(np.log(np.longdouble(info.max)))           # last finite result
    low = float(np.log(np.longdouble(info.tiny)))           # subnormal results below
    bottom = float(np.log(np.longdouble(info.smallest_subnormal)))
    values = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 1.0, 10.0,
              -10.0, top - 0.01, top, top + 0.01, top + 1.0, 1e30, low + 0.5, low,
              low - 0.5, low - 3.0, (low + bottom) / 2, bottom + 0.5, bottom, bottom - 0.5,
              bottom - 1.0, -1e30]
    values += list(np.linspace(bottom - 1, top + 1, 301))
    return np.array(values, dtype=dtype)


def _ulp_error(got, x):
    """The error of got against exp(x) (long double, rounded to got's dtype) in ulp of
    the exact result (in subnormal steps below the normal range); 0 where both are the
    same NaN/inf/zero."""
    dtype = got.dtype
    with np.errstate(over="ignore", invalid="ignore"):
        exact = np.exp(x.astype(np.longdouble))
        rounded = exact.astype(dtype)
    same = (np.isnan(got) & np.isnan(rounded)) | (got == rounded)
    step = np.maximum(np.spacing(np.abs(rounded)), np.finfo(dtype).smallest_subnormal)
    finite = np.isfinite(got) & np.isfinite(rounded)
    with np.errstate(invalid="ignore"):
        error = np.where(finite, np.abs(got.astype(np.longdouble) - exact) / step.astype(
            np.longdouble), np.inf)
    return np.where(same, 0.0, error.astype(np.float64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exp_in_a_row_sum_lane_loop(dtype):
    # each row holds one value and -inf elsewhere: the row's sum is that value's exp
    # exactly (the other terms are exact zeros), through the reduction's lane loop
    values = _special(dtype)
    x = np.full((values.size, 67), -np.inf, dtype=dtype)
    x[np.arange(values.size), np.arange(values.size) % 67] = values
    got = ef.compile("o[i] := sum[j](exp(x[i,j]))")(x=x)
    assert got.dtype == dtype
    error = _ulp_error(np.asarray(got), values)
    assert error.max() <= 4, values[np.argmax(error)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exp_in_an_elementwise_lane_loop(dtype):
    values = _special(dtype)
    x = np.resize(values, (7, values.size))
    got = np.asarray(ef.compile("o[i,j] := exp(x[i,j])")(x=x))
    error = _ulp_error(got.ravel(), x.ravel())
    assert error.max() <= 4, x.ravel()[np.argmax(error)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [200, 3000])
def test_gauss_kernel_sum_against_long_double(dtype, n):
    # gauss's shape: the lane loop holds exp of a nested sum; 3000 > 2048 terms takes
    # the blocked, compensated branch as well
    rng = np.random.default_rng(31)
    x = (rng.standard_normal((64, 3)) * 6).astype(dtype)
    y = (rng.standard_normal((n, 3)) * 6).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)
    got = np.asarray(ef.compile(
        "o[i] := sum[j](exp(-sum[d]((x[i,d] - y[j,d])**2)) * b[j])")(x=x, y=y, b=b))
    xl, yl, bl = (a.astype(np.longdouble) for a in (x, y, b))
    d2 = ((xl[:, None, :] - yl[None, :, :]) ** 2).sum(-1)
    want = (np.exp(-d2) * bl).sum(1)
    # exp(-d2) carries d2's own rounding (relative error ~ d2 eps) besides exp's
    scale = (np.exp(-d2) * np.abs(bl) * (8 + 4 * d2)).sum(1)
    eps = np.finfo(dtype).eps
    assert np.all(np.abs(got - want) <= eps * scale + np.finfo(dtype).tiny)
