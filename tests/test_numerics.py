"""Floating point on every backend (issue 9, item 5): long sums accurate whatever their
length (float32 within 1e-6, float64 within 1e-14, against math.fsum), IEEE signed
zeros kept, tanh/expm1/log1p accurate for tiny arguments, and pow with the special
cases of np.power."""

import math

import numpy as np
import pytest

import einfuse as ef

TOLERANCE = {np.float32: 1e-6, np.float64: 1e-14}


def sum_cases(n, n_matvec, n_points=None):
    """(label, statement, arrays, options, exact result): 0.1 everywhere, the worst case
    for a running sum (every addition rounds the same way).  ``n_points`` (default
    ``n // 50``) is the nested reduction's outer length: a compensated, long sum only
    above 2048 terms (docs/backends.md, long sums)."""
    def full(shape, dtype):
        return np.full(shape, 0.1, dtype)

    def fsum(a):
        return math.fsum(np.asarray(a, np.float64).ravel())

    def cases(dtype):
        x, rows, cols = full(n, dtype), full((4, n // 4), dtype), full((n // 4, 4), dtype)
        flat, points = full((n // 3, 3), dtype), full((n_points or n // 50, 1), dtype)
        gauss = math.exp(-float(points[0, 0]) ** 2)
        return [
            ("one sum", "s := x[i]", {"x": x}, {}, fsum(x)),
            ("in an expression", "s := 2 * sqrt(sum[i](x[i]) / n)", {"x": x, "n": n}, {},
             2 * math.sqrt(fsum(x) / n)),
            ("row sums", "s[r] := R[r,k]", {"R": rows}, {}, fsum(rows[0])),
            ("column sums", "s[c] := C[k,c]", {"C": cols}, {}, fsum(cols[:, 0])),
            ("matvec without BLAS", "y[c] := C[k,c] * w[k]",
             {"C": cols[:n_matvec], "w": np.ones(n_matvec, dtype)}, {"pad": 0},
             fsum(cols[:n_matvec, 0])),
            ("short inner index", "s := sum[i,d](P[i,d])", {"P": flat}, {}, fsum(flat)),
            ("nested reduction", "g[i] := sum[j](exp(-sum[d]((G[i,d] - H[j,d])**2)))",
             {"G": points[:2], "H": np.zeros_like(points)}, {},
             math.fsum([float(dtype(gauss))] * len(points))),
        ]
    return cases


# The Triton interpreter takes a few ms a step: in the default run its sums are 10^4 terms
# long (still blocked and compensated) without the two cases it runs slowest; the slow run
# has them all at 10^5 terms.
INTERPRETER_SLOWEST = ("matvec without BLAS", "nested reduction")


def assert_sums_accurate(backend, dtype, n, n_matvec, n_points=None, skip=()):
    for label, statement, arrays, options, want in sum_cases(n, n_matvec, n_points)(dtype):
        if label in skip:
            continue
        got = np.asarray(ef.ein(statement, **arrays, **options, backend=backend),
                         np.float64)
        error = float(np.max(np.abs(got - want))) / abs(want)
        assert error <= TOLERANCE[dtype], f"{label}: {statement} is {error:.1e} off"


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_long_sums_on_the_triton_interpreter_at_full_length(dtype):
    assert_sums_accurate("triton", dtype, 10**5, 3000)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_long_sums_are_accurate(backend, dtype):
    if backend == "triton":
        assert_sums_accurate(backend, dtype, 10**4, 2100, skip=INTERPRETER_SLOWEST)
    else:
        assert_sums_accurate(backend, dtype, 10**6, 10**6 // 4)
    # compensation must not turn an infinite sum into NaN, nor the empty sum into -0
    big = np.full(5000, np.inf, dtype)
    big[7] = 1.0
    assert float(ef.ein("s := x[i]", x=big, backend=backend)) == np.inf
    big[9] = -np.inf
    assert np.isnan(float(ef.ein("s := x[i]", x=big, backend=backend)))
    empty = ef.ein("s[r] := X[r,k]", X=np.zeros((2, 0), dtype), backend=backend)
    np.testing.assert_array_equal(empty, [0.0, 0.0])
    assert not np.signbit(empty).any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_signed_zeros(backend, dtype):
    d = np.array([0.0, -0.0, 2.0], dtype)
    with np.errstate(divide="ignore"):
        for statement, want in [
                ("y[i] := 1/(0 - d[i])", 1 / (0 - d)),
                ("y[i] := 1/(d[i] + 0)", 1 / (d + 0)),
                ("y[i] := 1/-(0 - d[i])", 1 / -(0 - d)),
                ("y[i] := 0 - d[i]", 0 - d),
                ("y[i] := sqrt(d[i]) * 1", np.sqrt(d)),
                ("y[i] := floor(-d[i])", np.floor(-d))]:
            got = ef.ein(statement, d=d, backend=backend)
            np.testing.assert_array_equal(got, want, err_msg=statement)
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want),
                                          err_msg=statement)
    assert float(ef.ein("s := 1/(0 - sum[i](d[i] * 0))", d=d, backend=backend)) == np.inf


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tanh_expm1_log1p_for_tiny_arguments(backend, dtype):
    tiny = np.array([1e-12, -1e-12, 1e-30, 3e-5, -3e-5, 1e-3, -0.2, 0.3, -0.0, 5.0, -0.9,
                     40.0], dtype)
    for func, exact in [("tanh", np.tanh), ("expm1", np.expm1), ("log1p", np.log1p)]:
        got = ef.ein(f"y[i] := {func}(x[i])", x=tiny, backend=backend)
        want = exact(tiny.astype(np.float64))
        np.testing.assert_allclose(got, want, rtol=4 * np.finfo(dtype).eps, atol=0,
                                   err_msg=func)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want), err_msg=func)


SPECIAL = [-np.inf, -3.0, -2.5, -2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, 2.5, 3.0,
           np.inf, np.nan, 1e-300, -1e300, 1e300]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pow_follows_numpy_special_cases(backend, dtype):
    with np.errstate(all="ignore"):   # 1e300 is inf in float32
        a, b = (grid.astype(dtype) for grid in np.meshgrid(SPECIAL, SPECIAL, indexing="ij"))
        wants = {"P[i,j] := pow(a[i,j], b[i,j])": np.power(a, b),
                 "P[i,j] := a[i,j] ** b[i,j]": np.power(a, b),
                 "P[i,j] := a[i,j] ** -1": np.power(a, dtype(-1)),
                 "P[i,j] := pow(a[i,j], 3)": np.power(a, dtype(3)),
                 # C's pow, not NumPy's sqrt shortcut for a scalar 0.5 (-inf ** 0.5 = inf)
                 "P[i,j] := a[i,j] ** 0.5": np.power(a, np.full_like(a, 0.5))}
    for statement, want in wants.items():
        got = ef.ein(statement, a=a, **({"b": b} if "b[" in statement else {}),
                     backend=backend)
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=statement)
        same_sign = (np.signbit(got) == np.signbit(want)) | np.isnan(want)
        assert same_sign.all(), list(zip(a[~same_sign], b[~same_sign], got[~same_sign]))
