"""A register block's epilogue that calls a vector math function, ``G[i,j] :=
f(sum[k](...))`` (exp, tanh, log1p, sigmoid, softplus, erf of a contraction or a distance):
the C renderer hides the lane loop's bound from GCC there (backends/c/render.py,
``calls_vector_math``) so that the loop is vectorised with libmvec instead of being
unrolled into scalar calls.  These tests hold the values of every such epilogue against
tests/oracle.py and the NumPy backend on full tiles, partial tiles and partial row
blocks, float32 and float64, with NaN and infinities, and check that the register block
is what runs (the schedule's choice, not the C text)."""

import numpy as np
import pytest

import einfuse as ef

from oracle import brute_force

pytest.importorskip("einfuse.backends.c.build")

STATEMENTS = [
    "G[i,j] := exp(-sum[k]((A[k,i] - B[k,j])**2) / 3.0)",
    "G[i,j] := tanh(sum[k](A[k,i] * B[k,j]))",
    "G[i,j] := log1p(sum[k]((A[k,i] - B[k,j])**2))",
    "G[i,j] := sigmoid(sum[k](A[k,i] * B[k,j]) + c[j])",
    "G[i,j] := softplus(sum[k](A[k,i] * B[k,j]))",
    "G[i,j] := erf(sum[k](A[k,i] * B[k,j])) * c[j]",
    "G[i,j] := exp(sum[k](A[k,i] * B[k,j])) + exp(-sum[k]((A[k,i] - B[k,j])**2))",
]

# (rows i, lanes j, terms k): whole register blocks only; ragged lanes; ragged rows
# and lanes; a few terms (lane tiles without row blocks); a single lane and row
EXTENTS = [(24, 64, 40), (18, 45, 33), (37, 29, 21), (30, 50, 3), (1, 1, 3)]


def _inputs(m, n, k, dtype, seed):
    rng = np.random.default_rng(seed)
    return {"A": (rng.standard_normal((k, m)) * 0.4).astype(dtype),
            "B": (rng.standard_normal((k, n)) * 0.4).astype(dtype),
            "c": rng.standard_normal(n).astype(dtype)}


def _given(statement, arrays):
    return {name: value for name, value in arrays.items() if f"{name}[" in statement}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("extents", EXTENTS)
@pytest.mark.parametrize("statement", STATEMENTS)
def test_values_against_the_oracle(statement, extents, dtype):
    m, n, k = extents
    arrays = _given(statement, _inputs(m, n, k, dtype, seed=m + n + k))
    got = np.asarray(ef.ein(statement, **arrays, backend="c"))
    assert got.dtype == dtype and got.shape == (m, n)
    want = brute_force(statement, {"i": (0, m), "j": (0, n), "k": (0, k)},
                       {name: a.astype(np.float64) for name, a in arrays.items()})
    rtol = 3e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("statement", STATEMENTS)
def test_nan_and_inf_as_numpy(statement, dtype):
    arrays = _given(statement, _inputs(18, 45, 33, dtype, seed=3))
    arrays["A"][1, 2] = np.nan
    arrays["A"][0, 5] = np.inf
    arrays["B"][3, 7] = -np.inf
    arrays["B"][2, 30] = np.inf
    arrays["B"][20, 40] = np.nan
    with np.errstate(all="ignore"):
        want = np.asarray(ef.ein(statement, **arrays, backend="numpy"))
        got = np.asarray(ef.ein(statement, **arrays, backend="c"))
    for test in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(test(got), test(want))
    finite = np.isfinite(want)
    rtol = 3e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=rtol)


@pytest.mark.parametrize("extents", EXTENTS[:3])
def test_the_register_block_runs(extents):
    # the epilogue under test is the register block's: the schedule says it runs (the
    # products' statements may take BLAS and an elementwise epilogue instead)
    arrays = _inputs(*extents, np.float32, seed=1)
    for statement in (STATEMENTS[0], STATEMENTS[2]):     # (the distances' epilogues)
        report = ef.explain(statement, **_given(statement, arrays), backend="c")
        assert "register block" in (report.schedule or ""), statement


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_major_operands_packed(dtype):
    # A[i,k], B[j,k] (cdist's layout), big enough that the run packs B for the lanes
    rng = np.random.default_rng(5)
    A = (rng.standard_normal((101, 40)) * 0.3).astype(dtype)
    B = (rng.standard_normal((133, 40)) * 0.3).astype(dtype)
    statement = "G[i,j] := exp(-sum[k]((A[i,k] - B[j,k])**2) / 3.0)"
    report = ef.explain(statement, A=A, B=B, backend="c")
    assert "register block" in (report.schedule or "")
    got = np.asarray(ef.ein(statement, A=A, B=B, backend="c"))
    d2 = ((A.astype(np.float64)[:, None, :] - B.astype(np.float64)[None]) ** 2).sum(-1)
    rtol = 3e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(got, np.exp(-d2 / 3.0), rtol=rtol, atol=rtol)


def test_one_statement_as_the_program_of_two():
    # the distance then its exponential, one statement or two: the same values (the
    # exponential is computed by the same vector function in both: at most one rounding
    # of the distance apart)
    arrays = _inputs(96, 128, 40, np.float32, seed=2)
    one = np.asarray(ef.ein(STATEMENTS[0], A=arrays["A"], B=arrays["B"]))
    two = np.asarray(ef.compile("D[i,j] := sum[k]((A[k,i] - B[k,j])**2)\n"
                                "G[i,j] := exp(-D[i,j] / 3.0)")(A=arrays["A"], B=arrays["B"]))
    np.testing.assert_allclose(one, two, rtol=1e-6, atol=0)
