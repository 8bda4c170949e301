"""A divisor fixed along the innermost loop (plan/lower.py) is divided by as a
reciprocal and products, where that reciprocal is a normal number; elsewhere the loop
divides.  Results must stay within a rounding or two of NumPy's division whatever the
divisor: tiny, huge, subnormal, zero, infinite, NaN, negative zero."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="the rewrite is the C backend's")

SPECIALS = [1.0, -3.0, 7e-3, 1e30, -2e35, np.inf, -np.inf, np.nan, 0.0, -0.0]


def divisors(dtype):
    info = np.finfo(dtype)
    extra = [info.tiny, info.tiny / 8, -info.tiny / 64, info.max, info.max / 3,
             1 / info.max, 2.0 / info.max]
    return np.array(SPECIALS + extra, dtype=dtype)


def close_or_same(actual, expected, dtype):
    # a product by the reciprocal is within 2 roundings of the quotient
    rtol = 4 * np.finfo(dtype).eps
    both_nan = np.isnan(actual) & np.isnan(expected)
    same = (actual == expected) | both_nan
    near = np.isclose(actual, expected, rtol=rtol, atol=0)
    assert np.all(same | near), (actual[~(same | near)], expected[~(same | near)])
    # zeros keep their sign, infinities theirs
    exact = (expected == 0) | np.isinf(expected)
    np.testing.assert_array_equal(np.signbit(actual[exact]), np.signbit(expected[exact]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_divisors_of_every_kind(dtype):
    rows = divisors(dtype)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((len(rows), 37)).astype(dtype)
    x[:, 0], x[:, 1], x[:, 2] = 0.0, np.inf, info_max(dtype)
    with np.errstate(all="ignore"):
        expected = x / rows[:, None]
    out = ef.ein("y[i,j] := x[i,j] / s[i]", x=x, s=rows)
    close_or_same(out, expected, dtype)


def info_max(dtype):
    return np.finfo(dtype).max / 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_divisor_from_a_hoisted_reduction(dtype):
    # a row sum hoisted out of the loop, then each element divided by it (softmax's
    # last step); rows whose sums are 0, inf or NaN take the dividing loop
    rng = np.random.default_rng(1)
    x = rng.random((6, 50)).astype(dtype)
    x[1] = 0.0
    x[2, 3] = np.inf
    x[3, 4] = np.nan
    x[4] *= np.finfo(dtype).tiny     # sums in the subnormal range
    with np.errstate(all="ignore"):
        expected = x / x.sum(1, keepdims=True)
        out = ef.ein("y[i,j] := x[i,j] / sum[k](x[i,k])", x=x)
    close_or_same(out, expected, dtype)


def test_divisor_varying_along_the_inner_loop_still_divides():
    rng = np.random.default_rng(2)
    x, s = rng.standard_normal((5, 33)), rng.standard_normal(33)
    s[3] = 0.0
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(ef.ein("y[i,j] := x[i,j] / s[j]", x=x, s=s),
                                      x / s)


def test_several_fixed_divisors_in_one_statement():
    rng = np.random.default_rng(3)
    x, a, b = rng.standard_normal((7, 40)), rng.standard_normal(7), rng.standard_normal(7)
    a[2], b[5] = 0.0, np.finfo(float).tiny / 4
    with np.errstate(all="ignore"):
        expected = x / a[:, None] + 1 / b[:, None] * x
        out = ef.ein("y[i,j] := x[i,j] / a[i] + 1 / b[i] * x[i,j]", x=x, a=a, b=b)
    close_or_same(out, expected, np.float64)


def test_program_softmax_matches_numpy():
    rng = np.random.default_rng(4)
    X = (rng.standard_normal((300, 257)) * 30).astype(np.float32)
    program = ef.compile("""m[i] := max[j](X[i,j])
e[i,j] := exp(X[i,j] - m[i])
P[i,j] := e[i,j] / sum[k](e[i,k])""")
    e = np.exp(X.astype(np.float64) - X.max(1, keepdims=True))
    # float32 exp is within a few roundings; subnormal results keep fewer digits
    np.testing.assert_allclose(program(X=X), e / e.sum(1, keepdims=True), rtol=1e-5,
                               atol=np.finfo(np.float32).tiny)
