"""The C backend's vectorised plans agree with the reference, edge values included."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")


def both(statement, **arrays):
    return (ef.ein(statement, backend="c", **arrays),
            ef.ein(statement, backend="numpy", **arrays))


@pytest.mark.parametrize("op", ["max", "min", "logsumexp"])
@pytest.mark.parametrize("length", [1, 5, 16, 17, 40])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lane_partial_reductions_keep_nan_and_inf_rules(op, length, dtype):
    rng = np.random.default_rng(length)
    X = rng.standard_normal((7, length)).astype(dtype) * 30
    X[1, :] = -np.inf
    X[2, length // 2] = np.inf
    X[3, length - 1] = np.nan
    X[4, 0] = np.nan
    X[5, :] = np.inf
    got, want = both(f"z[i] := {op}[j](X[i,j])", X=X)
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12)


def test_lane_tiled_outer_reduction_over_nested_ones():
    rng = np.random.default_rng(0)
    for n in (1, 63, 64, 65, 200):
        x = rng.standard_normal((9, 3))
        y = rng.standard_normal((n, 3))
        b = rng.standard_normal(n)
        got, want = both("o[i] := sum[j](exp(-sum[d]((x[i,d] - y[j,d])**2)) * b[j])",
                         x=x, y=y, b=b)
        np.testing.assert_allclose(got, want, rtol=1e-10)
    got, want = both("o[i] := prod[j,l](1 + max[d](x[i,d] * y[j,d]) * z[l])",
                     x=rng.standard_normal((4, 3)), y=rng.standard_normal((70, 3)) * 0.01,
                     z=rng.standard_normal(3) * 0.01)
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_verified_gathers_still_raise_and_still_respect_ranges():
    W = np.arange(12.0).reshape(6, 2)
    idx = np.array([0, 5, 2])
    np.testing.assert_array_equal(ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=idx,
                                         backend="c"), W[idx])
    for bad in (np.array([0, 6]), np.array([-1, 0])):
        with pytest.raises(ef.EinfuseError, match="outside its valid range"):
            ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=bad, backend="c")
    # the affine part counts: 5 + 1 leaves W
    with pytest.raises(ef.EinfuseError):
        ef.ein("E[b,d] := W[idx[b] + 1, d]", W=W, idx=idx, backend="c")


def test_vector_math_declarations_only_with_libmvec():
    from einfuse.backends.c.render import render_c
    from einfuse.ir import LoopNest, LoopProgram
    program = LoopProgram("float32", (LoopNest("k", (), (), 0, ()),))
    assert "__simd__" in render_c(program, vector_math=True)
    assert "__simd__" not in render_c(program, vector_math=False)


@pytest.mark.parametrize("statement", [
    "D[i,j] := (w[k,i] - x[k,j])**2",
    "D[b,i,j] := max[k](w[k,i] * x[k,j] + z[b])",
    "D[i,j] := logsumexp[k](w[k,i] - x[k,j])",
    "D[j,i] := sum[k](abs(w[k,i] - x[k,j]))",
])
@pytest.mark.parametrize("n, m", [(1, 1), (7, 33), (9, 31), (17, 70)])
def test_register_blocked_outputs_with_remainders(statement, n, m):
    rng = np.random.default_rng(n * m)
    arrays = {"w": rng.standard_normal((5, n)), "x": rng.standard_normal((5, m)),
              "z": rng.standard_normal(3)}
    if "z[" not in statement:
        del arrays["z"]
    got, want = both(statement, **arrays)
    np.testing.assert_allclose(got, want, rtol=1e-10)


@pytest.mark.parametrize("backend_name", ["c", "numpy"])
def test_an_empty_index_array_does_not_excuse_other_gathers(backend_name):
    """Regression: an empty index array once marked every gather of the statement as
    verified, and the C kernel then read x far out of bounds (a crash)."""
    with pytest.raises(ef.EinfuseError, match="100000000"):
        ef.ein("y[i] := sum[b](z[jdx[b]]) + x[idx[i]]", x=np.arange(3.0), z=np.arange(4.0),
               idx=np.array([0, 100000000]), jdx=np.zeros(0, dtype=np.int64),
               backend=backend_name)
    got = ef.ein("y[i] := sum[b](z[jdx[b]]) + x[idx[i]]", x=np.arange(3.0),
                 z=np.arange(4.0), idx=np.array([2, 0]), jdx=np.zeros(0, dtype=np.int64),
                 backend=backend_name)
    np.testing.assert_array_equal(got, [2.0, 0.0])
