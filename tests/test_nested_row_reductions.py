"""A reduction over rows of a row reduction -- ``sum[n](max[c](X[n,c]))``, a mean
cross-entropy ``mean[n](logsumexp[c](X[n,c]) - X[n, y[n]])`` -- runs each row's
reduction along the row, not the rows across SIMD lanes (plan/lane_reductions.
nested_lanes_pay: lanes each walking their own long row, 4 kB apart, ran 12x slower),
and a mean over the rows of a cross-entropy takes the log-sum-exp row kernel as the sum
over them does (plan/row_statistics: mean's count over the rows is the number of
rows).  Values against tests/oracle.py's brute force in float64, NaN and inf rows
included, on every backend."""

import re

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import backend as c_backend
from einfuse.plan import plan_for
from einfuse.schedule.library import Library
from einfuse.schedule.choose import choose
from oracle import brute_force

rng = np.random.default_rng(51)

STATEMENTS = [
    "L := sum[n](max[c](X[n,c]))",
    "L := sum[n](exp(-max[c](X[n,c])))",
    "L := sum[n](logsumexp[c](X[n,c]) - X[n, y[n]])",
    "L := mean[n](logsumexp[c](X[n,c]) - X[n, y[n]])",
    "L := mean[n](max[c](X[n,c]) + log(sum[c](exp(X[n,c] - max[k](X[n,k])))) - X[n, y[n]])",
    "L[b] := sum[n](max[c](X[n,c]) * W[b,n])",
]


def arrays(dtype, rows=37, cols=45, special=True):
    X = rng.standard_normal((rows, cols)).astype(dtype)
    if special:
        X[3, 7], X[5, :] = np.nan, -np.inf
        X[8, 2] = np.inf
    return {"X": X, "y": rng.integers(0, cols, rows),
            "W": rng.standard_normal((3, rows)).astype(dtype)}


def used(statement, given):
    return {k: v for k, v in given.items() if re.search(rf"\b{k}\[", statement)}


def oracle(kernel, statement, given):
    call = kernel.bind(**given)
    return brute_force(statement, call.bounds.range_map,
                       {k: v.astype(np.float64) if v.dtype.kind == "f" else v
                        for k, v in given.items()})


@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("statement", STATEMENTS)
def test_values_are_the_oracles(backend, statement, dtype, special):
    given = used(statement, arrays(dtype, special=special))
    kernel = ef.compile(statement, backend=backend)
    got, want = np.asarray(kernel(**given)), oracle(kernel, statement, given)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)],
                                  want[~finite & ~np.isnan(want)])
    tolerance = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got[finite], want[finite], rtol=tolerance, atol=tolerance)


def _lane_indices(statement, given):
    call = ef.compile(statement, backend="numpy").bind(**given)
    layouts = tuple(c_backend._buffers_layout_only(call))
    return plan_for(call.spec, call.dtypes.working.name, False, call.options.bounds,
                    layouts).lane_indices


def test_a_long_row_reduction_walks_its_row_on_lanes():
    given = used(STATEMENTS[0], arrays(np.float32, special=False))
    lanes = _lane_indices(STATEMENTS[0], given)
    assert "n" not in lanes and "c" in lanes


def test_rows_stored_down_the_columns_keep_lanes_across_rows():
    # X[c, n]: a load walks n, so the lanes over n read one vector per step
    statement = "L := sum[n](max[c](X[c,n]))"
    assert "n" in _lane_indices(statement, {"X": rng.standard_normal((45, 64))})


def test_a_short_nested_sum_keeps_lanes_across_the_long_one():
    # gauss's sum over j of exp(-sum over d of 3): lanes over j, d a loop in each lane
    statement = "G[i] := sum[j](exp(-sum[d]((a[i,d] - b[j,d])**2)))"
    given = {"a": rng.standard_normal((40, 3)), "b": rng.standard_normal((500, 3))}
    call = ef.compile(statement, backend="numpy").bind(**given)
    layouts = tuple(c_backend._buffers_layout_only(call))
    plan = plan_for(call.spec, call.dtypes.working.name, False, call.options.bounds,
                    layouts, short=("d",))
    assert "j" in plan.lane_indices


@pytest.mark.parametrize("statement", [STATEMENTS[2], STATEMENTS[3]])
def test_a_sum_or_mean_cross_entropy_takes_the_row_kernel(statement):
    given = used(statement, arrays(np.float32))
    kernel = ef.compile(statement, backend="c")
    assert choose(kernel, kernel.bind(**given)).prepared is Library.ROW_STATISTICS
