"""The rules the spelling audit added (rewrite/rules.py; tests/test_spelling_audit.py has
the spellings that needed them): each fires where it should, not where its guard
refuses, and keeps the values it documents -- against the brute-force oracle on the
statement as written, NaN, infinities and -0.0 included."""

import math

import numpy as np
import pytest

import einfuse as ef
from einfuse.rewrite.rules import Keeps, rule_named
from test_rewrite_rules import canonical_text, close, oracle, same_bits, special_matrix

INF, NAN = math.inf, math.nan


def special_row(rows=5, seed=3):
    """A row normaliser holding 0, -0.0, +inf, -inf and NaN (and a normal value)."""
    z = np.abs(np.random.default_rng(seed).standard_normal(rows)) + 0.5
    z[0], z[1], z[2], z[3] = 0.0, -0.0, INF, NAN
    return z


# -- reciprocal-product-as-division -------------------------------------------------------
@pytest.mark.parametrize("statement", [
    "Y[i,j] := X[i,j] * (1 / Z[i])",
    "Y[i,j] := X[i,j] * (1 / sqrt(Z[i] + 1e-05)) * 2.5",
])
def test_times_a_reciprocal_is_a_division(backend, statement):
    text, fired = canonical_text(statement)
    assert "reciprocal-product-as-division" in fired
    assert "1 /" not in text
    X, Z = special_matrix(), special_row()
    written = oracle(statement, {"X": X, "Z": Z})
    rewritten = oracle(text, {"X": X, "Z": Z})
    # NaN, infinities and signed zeros where the written form has them (0 * inf is NaN
    # either way, x / -0.0 is -inf as x * (1 / -0.0) is); finite values to rounding
    assert close(rewritten, written, rtol=1e-15)
    assert np.array_equal(np.signbit(rewritten), np.signbit(written)) or \
        np.isnan(written).any()
    finite = np.isfinite(written) & (written == 0)
    assert np.array_equal(np.signbit(rewritten[finite]), np.signbit(written[finite]))
    assert close(ef.ein(statement, X=X, Z=Z, backend=backend), written, rtol=1e-12)


def test_the_reciprocal_of_a_subnormal_overflows_only_as_written():
    # Keeps.RECIPROCAL: 1 / 1e-310 is inf in float64, so the written form gives inf
    # where the quotient is finite
    statement = "Y[i] := X[i] * (1 / Z[i])"
    text, _ = canonical_text(statement)
    X, Z = np.array([1e-300, 2.0]), np.array([1e-310, 4.0])
    written, rewritten = oracle(statement, {"X": X, "Z": Z}), oracle(text, {"X": X, "Z": Z})
    assert math.isinf(written[0]) and math.isfinite(rewritten[0])
    assert rewritten[1] == written[1] == 0.5
    assert rule_named("reciprocal-product-as-division").keeps is Keeps.RECIPROCAL


def test_a_reciprocal_written_first_or_of_another_numerator_is_left():
    # (1 / z) * x would read z before x: the rewrite would reorder first uses
    assert "reciprocal-product-as-division" not in \
        canonical_text("Y[i,j] := (1 / Z[i]) * X[i,j]")[1]
    assert "reciprocal-product-as-division" not in \
        canonical_text("Y[i,j] := X[i,j] * (2 / Z[i])")[1]


# -- mask-kept-where-true ------------------------------------------------------------------
@pytest.mark.parametrize("written, kept", [
    ("j > i", "j <= i"), ("j >= i", "j < i"), ("i < j", "i >= j"), ("i <= j", "i > j")])
def test_a_mask_names_what_it_keeps_bitwise(backend, written, kept):
    statement = f"Y[i,j] := where({written}, -inf, X[i,j])"
    text, fired = canonical_text(statement)
    assert fired == ("mask-kept-where-true",)
    assert text == f"Y[i, j] := where({kept}, X[i, j], -inf)"
    X = special_matrix()
    expected = oracle(statement, {"X": X})
    assert same_bits(oracle(text, {"X": X}), expected)
    assert same_bits(ef.ein(statement, X=X, backend=backend), expected)


def test_a_comparison_of_values_is_not_negated():
    # X[i,j] > 0 is false for NaN, and so is X[i,j] <= 0: no exact negation
    assert canonical_text("Y[i,j] := where(X[i,j] > 0, -inf, X[i,j])")[1] == ()


# -- additive-mask-as-where ----------------------------------------------------------------
@pytest.mark.parametrize("statement", [
    "Y[i,j] := X[i,j] * 2 + where(j <= i, 0, -inf)",
    "Y[i,j] := where(j <= i, 0, -inf) + X[i,j] * 2",
    "Y[i,j] := X[i,j] * 2 + where(j > i, -inf, 0)",
])
def test_an_additive_mask_is_a_mask(backend, statement):
    text, fired = canonical_text(statement)
    assert "additive-mask-as-where" in fired and "+" not in text
    X = special_matrix()
    written = oracle(statement, {"X": X})
    rewritten = oracle(text, {"X": X})
    keep = np.tril(np.ones_like(X, bool))
    # kept positions: the score (bitwise, but -0.0 stays -0.0 where the sum gave +0.0)
    assert np.array_equal(rewritten[keep], X[keep] * 2, equal_nan=True)
    assert np.array_equal(written[keep], rewritten[keep], equal_nan=True)
    negative_zero = keep & (X == 0) & np.signbit(X)
    assert negative_zero.any() and np.signbit(rewritten[negative_zero]).all() and \
        not np.signbit(written[negative_zero]).any()
    # masked positions: -inf, where the sum gives NaN for a +inf or NaN score
    assert np.all(rewritten[~keep] == -INF)
    assert np.isnan(written[~keep]).any()
    assert same_bits(ef.ein(statement, X=X, backend=backend), rewritten)
    assert rule_named("additive-mask-as-where").keeps is Keeps.ADDITIVE_MASK


def test_an_addend_that_is_not_a_mask_is_left():
    assert "additive-mask-as-where" not in \
        canonical_text("Y[i,j] := X[i,j] + where(j <= i, 1, -inf)")[1]
    assert "additive-mask-as-where" not in \
        canonical_text("Y[i,j] := X[i,j] + where(j <= i, 0, -1e30)")[1]


# -- nested-sums-merged --------------------------------------------------------------------
@pytest.mark.parametrize("statement", [
    "y[b] := sum[h](sum[w](x[b,h,w]))",
    "y[o,i] := sum[a](sum[c](x[c,i+a] * w[o,c,a]))",
])
def test_nested_sums_are_one_sum(backend, statement):
    text, fired = canonical_text(statement)
    assert "nested-sums-merged" in fired and text.count("sum[") == 1
    rng = np.random.default_rng(4)
    if "w[" in statement:
        arrays = {"x": rng.standard_normal((3, 9)), "w": rng.standard_normal((2, 3, 4))}
        ranges = {"o": (0, 2), "c": (0, 3), "a": (0, 4), "i": (0, 6)}
    else:
        x = rng.standard_normal((4, 3, 5))
        x[1, 0, 0], x[2, 1, 1], x[2, 2, 2], x[3, :, :] = NAN, INF, -INF, -0.0
        arrays = {"x": x}
        ranges = {"b": (0, 4), "h": (0, 3), "w": (0, 5)}
    from oracle import brute_force
    written = brute_force(statement, ranges, arrays)
    assert close(brute_force(text, ranges, arrays), written)
    got = np.asarray(ef.ein(statement, **arrays, backend=backend))
    assert close(got, written)
    if "w[" not in statement:
        assert np.isnan(got[2]) and not np.signbit(got[3])   # inf + -inf; a sum of -0.0s


def test_a_sum_nested_in_another_expression_is_left():
    assert "nested-sums-merged" not in \
        canonical_text("y[b] := sum[h](sum[w](x[b,h,w]) * 2)")[1]
