"""The output loop order's vote (plan/lower.output_votes): the store walking its unit
stride counts as two transfers, a load outside the reductions that an inner loop does
not move counts as one, and values stay the oracle's whatever order is chosen."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import backend as c_backend
from einfuse.plan import plan_for
from oracle import brute_force

rng = np.random.default_rng(30)


def _inner(statement, **arrays):
    """The innermost output loop of the C lowering for these arrays."""
    call = ef.compile(statement, backend="numpy", ranges=arrays.pop("ranges", None)
                      ).bind(**arrays)
    layouts = tuple(c_backend._buffers_layout_only(call))
    return plan_for(call.spec, call.dtypes.working.name, False, call.options.bounds,
                    layouts).inner


# (statement, arrays, the innermost output index)
CASES = [
    # one-hot rows (cross-entropy's backward through its maximum): h[i], dm[i] do not
    # move along j, the store does
    ("dX[i,j] := where(j == h[i], dm[i], 0)",
     dict(h=rng.integers(0, 6, 5), dm=rng.standard_normal(5), ranges={"j": 6}), "j"),
    # a broadcast row plus a matrix: both reads and the store agree on j
    ("y[i,j] := A[i,j] + b[i]", dict(A=rng.standard_normal((5, 6)),
                                     b=rng.standard_normal(5)), "j"),
    # a transposed read: one load walks i, the store walks j (two transfers)
    ("y[i,j] := A[j,i] * 2", dict(A=rng.standard_normal((6, 5))), "j"),
    # two reads along i, none invariant along either index: 2 loads vs the store's 2
    # (the tie goes to the store's index)
    ("y[i,j] := A[j,i] + B[j,i]", dict(A=rng.standard_normal((6, 5)),
                                       B=rng.standard_normal((6, 5))), "j"),
]


@pytest.mark.parametrize("statement, arrays, inner", CASES, ids=[c[0] for c in CASES])
def test_innermost_output_index(statement, arrays, inner):
    assert _inner(statement, **dict(arrays)) == inner


@pytest.mark.parametrize("backend", ["numpy", "c"])
@pytest.mark.parametrize("statement, arrays, inner", CASES, ids=[c[0] for c in CASES])
def test_values_are_the_oracles(statement, arrays, inner, backend):
    arrays = dict(arrays)
    ranges = arrays.pop("ranges", None)
    kernel = ef.compile(statement, backend=backend, ranges=ranges)
    got = kernel(**arrays)
    call = kernel.bind(**arrays)
    expected = brute_force(statement, call.bounds.range_map, arrays)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0)


def test_explain_shows_the_store_index_innermost():
    h, dm = rng.integers(0, 8, 8), rng.standard_normal(8)
    text = ef.explain("dX[i,j] := where(j == h[i], dm[i], 0)", ranges={"j": 8},
                      h=h, dm=dm, backend="c")
    schedule = next(line for line in str(text).splitlines() if "schedule:" in line)
    assert "loops i, j" in schedule
