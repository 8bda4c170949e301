"""A window's sum (average pooling's ``sum[p,q](x[b, c, 2*i+p, 2*j+q])``, its mean, a
sum over a few taps) runs on lane tiles that step by the stride, as max-pooling does
(plan/windows.wide_lanes), rather than as a scalar loop whose SIMD spreads a window row
of 3 over the lanes.  Values against tests/oracle.py's brute force in float64 (NaN,
inf and -0.0 included) and torch's avg_pool2d; the schedule explain reports."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build

from oracle import brute_force

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
rng = np.random.default_rng(32)

WINDOW_SUMS = [
    ("y[b,c,i,j] := sum[p,q](x[b,c,2*i+p,2*j+q])", {"p": 3, "q": 3}, (2, 3, 19, 21)),
    ("y[b,c,i,j] := sum[p,q](x[b,c,3*i+p,3*j+q]) / 9", {"p": 3, "q": 3}, (2, 2, 20, 80)),
    ("y[b,c,i,j] := mean[p,q](x[b,c,2*i+p,2*j+q])", {"p": 2, "q": 2}, (2, 3, 18, 40)),
    ("y[c,i] := sum[a](x[c,2*i+a] * 0.5)", {"a": 4}, (3, 101)),
    ("y[b,c,i,j] := sum[p,q](x[b,c,i+p,j+q])", {"p": 3, "q": 3}, (1, 2, 17, 35)),
]


def _ranges(kernel, arrays):
    return dict(kernel.bind(**arrays).bounds.range_map)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("statement, window, shape", WINDOW_SUMS)
def test_window_sums_on_lanes_match_the_oracle(statement, window, shape, dtype):
    x = rng.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    flat[5], flat[40], flat[77] = np.nan, np.inf, -np.inf
    flat[100:140] = -0.0
    kernel = ef.compile(statement, backend="c", ranges=window)
    text = str(ef.explain(statement, x=x, ranges=window, backend="c"))
    assert "tiled" in text.split("How it runs")[1], text
    got = kernel(x=x)
    want = brute_force(statement, _ranges(kernel, {"x": x}), {"x": x.astype(np.float64)})
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    tolerance = 1e-5 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(got[finite], want[finite], rtol=tolerance, atol=tolerance)
    zeros = want == 0
    np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(want[zeros]))


def test_average_pooling_as_a_window_sum_is_torchs():
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 8, 33, 34)
    got = ef.ein("y[b,c,i,j] := sum[p,q](x[b,c,2*i+p,2*j+q]) / 9", x=x,
                 ranges={"p": 3, "q": 3})
    torch.testing.assert_close(got, torch.nn.functional.avg_pool2d(x, 3, 2))


def test_a_long_sum_keeps_its_plan():
    """A sum over an index a vector's width or longer is no window: its plan is left
    (the lane plan would round it otherwise than the scalar plan's SIMD sum)."""
    x = np.zeros((64, 512), np.float32)
    text = str(ef.explain("y[i] := sum[j](x[i,j])", x=x, backend="c"))
    assert "tiled" not in text.split("How it runs")[1].split("Compiled kernel")[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_mean_is_its_sum_over_the_count_bit_for_bit(dtype):
    """A loop nest's count (mean's divisor) is the window's extents multiplied, not a sum
    of ones over the data (plan/lower.count): the mean is the window's sum divided by 9
    exactly (NumPy's division of the sum kernel's result), NaN and infinities where the
    window holds them, and an empty window's mean is NaN (0 / 0)."""
    x = rng.standard_normal((2, 3, 30, 64)).astype(dtype)
    x[0, 1, 4, 9], x[1, 2, 7, 20], x[1, 0, 3, 3] = np.nan, np.inf, -np.inf
    window = {"p": 3, "q": 3}
    mean = ef.ein("y[b,c,i,j] := mean[p,q](x[b,c,2*i+p,2*j+q])", x=x, ranges=window,
                  backend="c")
    total = ef.ein("y[b,c,i,j] := sum[p,q](x[b,c,2*i+p,2*j+q])", x=x, ranges=window,
                   backend="c")
    np.testing.assert_array_equal(mean.view(np.uint8), (total / dtype(9)).view(np.uint8))
    assert np.isnan(mean).any() and np.isinf(mean).any()
    rows = ef.ein("y[i] := mean[j](x[i,j])", x=np.zeros((3, 0), dtype), backend="c")
    assert rows.shape == (3,) and np.isnan(rows).all()
