"""A fused group's column sums on its prepared (repeated-call) path
(backends/c/fused_prepared.py): each compensated slice plus its error, added in slice
order, the bits of the first (full) call; a column whose sum is not finite keeps it."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build, fused_prepared

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="fused groups are C kernels")

PROGRAM = "r[i] := sum[j](A[i,j]) / {n}\ny[i,j] := A[i,j] - r[i]\nc[j] := sum[i](y[i,j] * g[j])"


def _count_prepared_totals(monkeypatch):
    """[[calls]] of the prepared column totals made from now on."""
    made = []
    original = fused_prepared._column_total

    def counted(member, sums, errors):
        total, calls = original(member, sums, errors), [0]
        made.append(calls)

        def run():
            calls[0] += 1
            return total()
        return run
    monkeypatch.setattr(fused_prepared, "_column_total", counted)
    return made


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bad", [None, np.inf, np.nan])
def test_prepared_column_sums_are_the_first_calls(monkeypatch, dtype, bad):
    rng = np.random.default_rng(3)
    # a program text of its own per case (fresh plans)
    n = {None: 61, np.inf: 59, np.nan: 57}[bad] + (dtype == np.float64)
    made = _count_prepared_totals(monkeypatch)
    A = rng.standard_normal((64, 64)).astype(dtype)
    g = rng.standard_normal(64).astype(dtype)
    if bad is not None:
        g[5] = bad
    program = ef.compile(PROGRAM.format(n=n), outputs=("y", "c"))
    first = program(A=A, g=g)[1]
    again = [program(A=A, g=g)[1] for _ in range(3)]
    for found in again:
        np.testing.assert_array_equal(found, first)
    A64 = A.astype(np.float64)
    with np.errstate(all="ignore"):
        want = ((A64 - A64.sum(1)[:, None] / n) * g).sum(0)
    finite = np.arange(64) != 5
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(first[finite], want[finite], rtol=tolerance, atol=tolerance)
    assert made and made[0][0] == 3       # the repeated calls ran the prepared totals
    if bad is not None:
        assert not np.isfinite(first[5])
        np.testing.assert_array_equal(first[5], want[5])      # nan, as the reference
    else:
        np.testing.assert_allclose(first[5], want[5], rtol=tolerance, atol=tolerance)
