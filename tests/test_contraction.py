"""Pure two-tensor contractions are recognised and run as one BLAS call."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.analysis.spec import analyse
from einfuse.lang import parse
from einfuse.plan.contraction import match_contraction


def match(statement):
    return match_contraction(analyse(parse(statement)))


@pytest.mark.parametrize("statement, groups", [
    ("C[i,j] := A[i,k] * B[k,j]", ((), ("i",), ("j",), ("k",))),
    ("C[i,j,b] := A[i,k,b] * B[k,j,b]", (("b",), ("i",), ("j",), ("k",))),
    ("C[b,i,j] := sum[k](A[b,i,k] * B[b,k,j])", (("b",), ("i",), ("j",), ("k",))),
    ("T[i,l] := A[i,j,k] * B[k,j,l]", ((), ("i",), ("l",), ("j", "k"))),
    ("O[i,j] := u[i] * v[j]", ((), ("i",), ("j",), ())),
    ("C[j,i] := 0.5 * A[i,k] * alpha * B[k,j]", ((), ("i",), ("j",), ("k",))),
])
def test_recognised(statement, groups):
    found = match(statement)
    assert found is not None
    assert (found.batch, found.m, found.n, found.k) == groups


@pytest.mark.parametrize("statement", [
    "D[i,j] := (w[k,i] - x[k,j])**2",          # not a product
    "C[i,j] := A[i,k] * B[k,j] * E[k]",         # three tensors
    "C[i,j] := max[k](A[i,k] * B[k,j])",        # not a sum
    "y[i] := x[i+a] * k[a]",                    # affine subscript
    "E[b,d] := W[idx[b], d] * v[d]",            # gather
    "d[i] := A[i,i] * B[i]",                    # repeated index
    "C[i,j,l] := A[i,k] * B[k,j]",              # index only in the output
    "s[i] := A[i,k] * B[i]",                    # k summed from one side only
])
def test_not_recognised(statement):
    assert match(statement) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_blas_results_match_the_reference(dtype):
    rng = np.random.default_rng(3)
    A = rng.standard_normal((6, 5, 4)).astype(dtype)
    B = rng.standard_normal((5, 7, 4)).astype(dtype)
    for statement in ["C[i,j,b] := A[i,k,b] * B[k,j,b]", "C[j,b,i] := 3 * A[i,k,b] * B[k,j,b]",
                      "T[i,j] := A[i,k,b] * B[k,j,b]"]:
        want = ef.ein(statement, A=A, B=B, backend="numpy")
        got = ef.ein(statement, A=A, B=B, backend="c")
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12,
                                   atol=1e-5)
    part = ef.ein("C[i,j] := A[i,k] * B[k,j]", A=A[:, :, 0], B=B[:, :, 0],
                  ranges={"k": range(1, 4)}, backend="c")
    np.testing.assert_allclose(part, A[:, 1:4, 0] @ B[1:4, :, 0], rtol=1e-5)


def test_explain_reports_blas():
    text = str(ef.explain("C[i,j] := A[i,k] * B[k,j]", backend="c",
                          shapes={"A": (64, 32), "B": (32, 16)}))
    assert "one BLAS matmul" in text
