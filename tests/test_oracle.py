"""The brute-force oracle itself, checked against results computed by hand with NumPy.

If the oracle is wrong, every randomized comparison against it is worthless, so
these tests pin down each semantic rule it implements.
"""

import math

import numpy as np
import pytest

from oracle import OracleOutOfBounds, brute_force, brute_force_with_scale

RNG = np.random.default_rng(1234)


def rand(*shape):
    return RNG.standard_normal(shape)


def test_matmul_implicit_sum():
    A, B = rand(3, 4), rand(4, 2)
    got = brute_force("C[i,j] := A[i,k] * B[k,j]", {"i": (0, 3), "j": (0, 2), "k": (0, 4)},
                      {"A": A, "B": B})
    assert got.dtype == np.float64 and got.shape == (3, 2)
    np.testing.assert_allclose(got, A @ B, rtol=1e-12)


def test_implicit_sum_covers_the_whole_right_side():
    x, W, bias = rand(2, 3), rand(3, 4), rand(4)
    ranges = {"b": (0, 2), "i": (0, 3), "o": (0, 4)}
    implicit = brute_force("y[b,o] := x[b,i]*W[i,o] + bias[o]", ranges,
                           {"x": x, "W": W, "bias": bias})
    np.testing.assert_allclose(implicit, x @ W + 3 * bias, rtol=1e-12)
    explicit = brute_force("y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o]", ranges,
                           {"x": x, "W": W, "bias": bias})
    np.testing.assert_allclose(explicit, x @ W + bias, rtol=1e-12)


def test_valid_convolution_via_shifts():
    x, k = rand(9), rand(3)
    got = brute_force("y[i] := x[i+a] * k[a]", {"i": (0, 7), "a": (0, 3)}, {"x": x, "k": k})
    expected = sum(k[a] * x[a:a + 7] for a in range(3))
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    np.testing.assert_allclose(got, np.convolve(x, k[::-1], mode="valid"), rtol=1e-12)


def test_strided_affine_access_with_offset_range():
    x = rand(12)
    got = brute_force("y[i] := x[2*i + a - 1]", {"i": (1, 5), "a": (0, 3)}, {"x": x})
    expected = [x[2 * i - 1] + x[2 * i] + x[2 * i + 1] for i in range(1, 5)]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_pad_makes_out_of_range_reads_the_pad_value():
    x = rand(5)
    got = brute_force("y[i] := x[i-1] + x[i+1]", {"i": (0, 5)}, {"x": x}, pad=0.5)
    padded = np.concatenate([[0.5], x, [0.5]])
    np.testing.assert_allclose(got, padded[:-2] + padded[2:], rtol=1e-12)


def test_out_of_range_affine_read_without_pad_is_an_oracle_misuse():
    with pytest.raises(AssertionError):
        brute_force("y[i] := x[i+1]", {"i": (0, 5)}, {"x": rand(5)})


def test_ranges_with_an_offset_start():
    x = rand(6)
    got = brute_force("y[i] := x[i] * 2", {"i": (2, 5)}, {"x": x})
    np.testing.assert_allclose(got, 2 * x[2:5], rtol=1e-12)


IDX = np.array([1, -1, 4, 3, -6, 0], dtype=np.int64)


@pytest.mark.parametrize("mode, rows", [
    ("clip", np.clip(IDX, 0, 3)),
    ("wrap", IDX % 4),
])
def test_gather_clip_and_wrap(mode, rows):
    W = rand(4, 3)
    got = brute_force("E[b,d] := W[idx[b], d]", {"b": (0, 6), "d": (0, 3)},
                      {"W": W, "idx": IDX}, bounds=mode)
    np.testing.assert_allclose(got, W[rows], rtol=1e-12)


def test_gather_fill():
    W = rand(4, 3)
    got = brute_force("E[b,d] := W[idx[b], d]", {"b": (0, 6), "d": (0, 3)},
                      {"W": W, "idx": IDX}, bounds="fill", fill=-7.0)
    inside = (IDX >= 0) & (IDX < 4)
    expected = np.where(inside[:, None], W[np.clip(IDX, 0, 3)], -7.0)
    np.testing.assert_allclose(got, expected, rtol=1e-12)


@pytest.mark.parametrize("mode", ["check", "promise"])
def test_gather_out_of_bounds_raises_under_check_and_promise(mode):
    with pytest.raises(OracleOutOfBounds):
        brute_force("E[b,d] := W[idx[b], d]", {"b": (0, 6), "d": (0, 3)},
                    {"W": rand(4, 3), "idx": IDX}, bounds=mode)


def test_gather_in_range_with_affine_part_and_int32():
    x = rand(5)
    idx = np.array([0, 3, 2], dtype=np.int32)
    got = brute_force("y[i] := x[idx[i] + 1]", {"i": (0, 3)}, {"x": x, "idx": idx})
    np.testing.assert_allclose(got, x[idx + 1], rtol=1e-12)
    # the bounds policy applies to the full value, affine part included
    wrapped = brute_force("y[i] := x[idx[i] + 2]", {"i": (0, 3)}, {"x": x, "idx": idx},
                          bounds="wrap")
    np.testing.assert_allclose(wrapped, x[(idx + 2) % 5], rtol=1e-12)


def test_logsumexp_is_stable():
    X = rand(3, 4) + 1000.0
    got = brute_force("L[i] := logsumexp[j](X[i,j])", {"i": (0, 3), "j": (0, 4)}, {"X": X})
    m = X.max(axis=1)
    expected = m + np.log(np.exp(X - m[:, None]).sum(axis=1))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_nested_reductions_with_a_finaliser():
    X = rand(3, 5)
    ranges = {"i": (0, 3), "j": (0, 5), "k": (0, 5)}
    got = brute_force("Z[i] := log(sum[j](exp(X[i,j] - max[k](X[i,k]))))", ranges, {"X": X})
    expected = np.log(np.exp(X - X.max(axis=1, keepdims=True)).sum(axis=1))
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    norms = brute_force("N[i] := sqrt(sum[j](X[i,j]**2))", ranges, {"X": X})
    np.testing.assert_allclose(norms, np.linalg.norm(X, axis=1), rtol=1e-12)
    # reductions over two indices at once, nested inside a prod
    T = rand(2, 3, 4)
    got = brute_force("P[i] := prod[j](sum[k, l](T[i,j,k] * T[l,j,k]))",
                      {"i": (0, 2), "j": (0, 3), "k": (0, 4), "l": (0, 2)}, {"T": T})
    expected = np.einsum("ijk,ljk->ij", T, T).prod(axis=1)
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_where_with_a_causal_mask_and_softmax():
    S = rand(4, 4)
    ranges = {"i": (0, 4), "j": (0, 4)}
    got = brute_force("M[i,j] := where(j <= i, S[i,j], -inf)", ranges, {"S": S})
    np.testing.assert_array_equal(got, np.where(np.tri(4, dtype=bool), S, -np.inf))
    lse = brute_force("L[i] := logsumexp[j](where(j <= i, S[i,j], -inf))", ranges, {"S": S})
    expected = [np.log(np.exp(S[i, :i + 1]).sum()) for i in range(4)]
    np.testing.assert_allclose(lse, expected, rtol=1e-12)


def test_scalar_output_and_zero_d_input():
    x, y = rand(5), rand(5)
    got = brute_force("s := sum[i](x[i] * y[i])", {"i": (0, 5)}, {"x": x, "y": y})
    assert got.shape == ()
    np.testing.assert_allclose(got, x @ y, rtol=1e-12)
    scaled = brute_force("z[i] := x[i] * s[]", {"i": (0, 5)}, {"x": x, "s": np.array(3.0)})
    np.testing.assert_allclose(scaled, 3 * x, rtol=1e-12)


def test_prod_max_min():
    X = rand(3, 4)
    ranges = {"i": (0, 3), "j": (0, 4)}
    for op, numpy_op in [("prod", np.prod), ("max", np.max), ("min", np.min)]:
        got = brute_force(f"R[i] := {op}[j](X[i,j])", ranges, {"X": X})
        np.testing.assert_allclose(got, numpy_op(X, axis=1), rtol=1e-12)


@pytest.mark.parametrize("op, empty", [("sum", 0.0), ("prod", 1.0), ("max", -math.inf),
                                       ("min", math.inf), ("logsumexp", -math.inf)])
def test_empty_reductions(op, empty):
    got = brute_force(f"R[i] := {op}[j](X[i,j])", {"i": (0, 2), "j": (0, 0)},
                      {"X": np.zeros((2, 0))})
    np.testing.assert_array_equal(got, [empty, empty])


def test_functions_and_index_values():
    x = np.array([-1.5, -0.2, 0.0, 0.7, 3.0])
    ranges = {"i": (0, 5)}
    cases = {
        "exp(x[i])": np.exp(x), "log1p(abs(x[i]))": np.log1p(np.abs(x)),
        "expm1(x[i])": np.expm1(x), "abs(x[i])": np.abs(x), "sin(x[i])": np.sin(x),
        "cos(x[i])": np.cos(x), "tanh(x[i])": np.tanh(x), "sigmoid(x[i])": 1 / (1 + np.exp(-x)),
        "relu(x[i])": np.maximum(x, 0), "softplus(x[i])": np.log1p(np.exp(x)),
        "floor(x[i])": np.floor(x), "ceil(x[i])": np.ceil(x), "erf(x[i])": [math.erf(v) for v in x],
        "log(abs(x[i]) + 1)": np.log(np.abs(x) + 1), "sqrt(abs(x[i]))": np.sqrt(np.abs(x)),
        "min(x[i], 0.5)": np.minimum(x, 0.5), "max(x[i], 0.5)": np.maximum(x, 0.5),
        "pow(abs(x[i]), 1.5)": np.abs(x) ** 1.5, "x[i] ** 2": x ** 2,
        "x[i] / (i + 1)": x / np.arange(1, 6), "i * 2 - 3": np.arange(5) * 2 - 3,
        "alpha * x[i]": 0.25 * x,
        "(x[i] > 0) * 10": np.where(x > 0, 10.0, 0.0),
        "(x[i] > -1) & (i < 3)": ((x > -1) & (np.arange(5) < 3)).astype(float) * 1,
        "-((x[i] < -1) | (x[i] >= 3))": -(((x < -1) | (x >= 3)).astype(float)),
        "where(x[i], 1, 2)": np.where(x != 0, 1.0, 2.0),
        "sign(x[i])": np.sign(x), "tan(x[i])": np.tan(x),
        "atan2(x[i], -0.5)": np.arctan2(x, -0.5), "x[i] // 0.5": x // 0.5,
        "x[i] % -0.5": x % -0.5, "i // 2 - i % 3": np.arange(5) // 2 - np.arange(5) % 3,
    }
    for rhs, expected in cases.items():
        got = brute_force(f"y[i] := {rhs}", ranges, {"x": x}, {"alpha": 0.25})
        np.testing.assert_allclose(got, expected, rtol=1e-12, err_msg=rhs)


def test_softplus_is_stable():
    got = brute_force("y[i] := softplus(x[i])", {"i": (0, 2)}, {"x": np.array([800.0, -800.0])})
    np.testing.assert_allclose(got, [800.0, 0.0], atol=1e-300)


def test_ieee_special_values():
    x = np.array([0.0, -1.0, 2.0, -0.0])
    ranges = {"i": (0, 4)}
    with np.errstate(all="ignore"):
        cases = {
            "1 / x[i]": 1 / x, "x[i] / x[i]": x / x, "log(x[i])": np.log(x),
            "sqrt(x[i])": np.sqrt(x), "exp(x[i] * 1000)": np.exp(x * 1000),
            "pow(x[i], 0.5)": np.power(x, 0.5), "pow(x[i], -1)": np.power(x, -1.0),
            "x[i] ** 2000": np.power(x, 2000.0), "log1p(x[i])": np.log1p(x),
            "min(x[i] / x[i], 1)": np.minimum(x / x, 1), "expm1(x[i] * 1000)": np.expm1(x * 1000),
        }
    for rhs, expected in cases.items():
        got = brute_force(f"y[i] := {rhs}", ranges, {"x": x})
        np.testing.assert_allclose(got, expected, rtol=1e-15, err_msg=rhs)  # inf/nan match too


def test_whole_comparison_gives_bool():
    A = rand(3, 3)
    got = brute_force("B[i,j] := (A[i,j] > 0) & (i != j)", {"i": (0, 3), "j": (0, 3)}, {"A": A})
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, (A > 0) & ~np.eye(3, dtype=bool))
    chained = brute_force("B[i,j] := 0 < A[i,j] < 0.5", {"i": (0, 3), "j": (0, 3)}, {"A": A})
    np.testing.assert_array_equal(chained, (A > 0) & (A < 0.5))


def test_assign_and_accumulate():
    A, B, C = rand(2, 3), rand(3, 4), rand(2, 4)
    ranges = {"i": (0, 2), "j": (0, 4), "k": (0, 3)}
    overwritten = brute_force("C[i,j] = A[i,k] * B[k,j]", ranges, {"A": A, "B": B}, out=C)
    np.testing.assert_allclose(overwritten, A @ B, rtol=1e-12)
    accumulated = brute_force("C[i,j] += A[i,k] * B[k,j]", ranges, {"A": A, "B": B}, out=C)
    np.testing.assert_allclose(accumulated, C + A @ B, rtol=1e-12)
    updated = brute_force("C[i,j] = C[i,j] * 2 + 1", {}, {}, out=C)
    np.testing.assert_allclose(updated, C * 2 + 1, rtol=1e-12)
    shifted = brute_force("y[i] = y[i] + x[i]", {"i": (2, 4)}, {"x": np.arange(5.0)},
                          out=np.array([10.0, 20.0]))
    np.testing.assert_allclose(shifted, [12.0, 23.0], rtol=1e-12)
    scalar = brute_force("s += sum[i](x[i])", {"i": (0, 3)}, {"x": np.ones(3)},
                         out=np.array(0.5))
    assert scalar.shape == () and scalar == 3.5


def test_scale_bounds_cancellation():
    x = np.array([1e8, 1.0, -1e8])
    value, scale = brute_force_with_scale("s := sum[i](x[i])", {"i": (0, 3)}, {"x": x})
    assert value == 1.0
    assert scale >= 2e8  # the float32 error of this sum is relative to 1e8, not to 1
