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


# -- log-normaliser-as-division ------------------------------------------------------------
def test_a_log_domain_normaliser_is_a_division(backend):
    statement = ("P[i,j] := exp(X[i,j] - max[k](X[i,k]) - "
                 "log(sum[k](exp(X[i,k] - max[l](X[i,l])))))")
    text, fired = canonical_text(statement)
    assert "log-normaliser-as-division" in fired and "log(" not in text
    X = special_matrix()
    written = oracle(statement, {"X": X})
    assert close(oracle(text, {"X": X}), written)
    assert close(ef.ein(statement, X=X, backend=backend), written, rtol=1e-12)


def test_an_overflowing_normaliser_gives_nan_as_documented():
    # Keeps.LOG_NORMALISER: exp(1000) is inf, so the row's sum is inf: the written form
    # gives exp(x - inf) = 0 everywhere, the quotient inf / inf = NaN at that entry
    statement = "P[i,j] := exp(X[i,j] - log(sum[k](exp(X[i,k]))))"
    text, fired = canonical_text(statement)
    assert fired == ("log-normaliser-as-division",)
    X = np.array([[1000.0, 0.0, 1.0], [0.5, 0.25, -1.0]])
    written, rewritten = oracle(statement, {"X": X}), oracle(text, {"X": X})
    assert np.all(written[0] == 0) and np.isnan(rewritten[0, 0])
    assert np.all(rewritten[0, 1:] == 0) and close(rewritten[1], written[1], rtol=1e-15)
    assert rule_named("log-normaliser-as-division").keeps is Keeps.LOG_NORMALISER


def test_a_normaliser_of_other_terms_is_left():
    assert "log-normaliser-as-division" not in \
        canonical_text("P[i,j] := exp(X[i,j] - log(sum[k](exp(X[k,i]))))")[1]


# -- the program passes: intermediates put back, costly terms shared --------------------------
def oracle_program(text, arrays):
    """The program as written, each statement by the brute-force oracle in turn."""
    from einfuse.lang.split import split_program
    values = dict(arrays)
    for piece in split_program(text):
        spec = __import__("einfuse.analysis.spec", fromlist=["spec_of"]).spec_of(piece.text)
        values[spec.output] = oracle(piece.text, values)
    return values[spec.output]


SOFTMAX_PROGRAMS = [
    "M[i] := max[j](X[i,j])\nZ[i] := sum[j](exp(X[i,j] - M[i]))\n"
    "P[i,j] := exp(X[i,j] - M[i]) / Z[i]",
    "M[i] := max[j](X[i,j])\nZ[i] := sum[j](exp(X[i,j] - M[i]))\n"
    "P[i,j] := exp(X[i,j] - M[i] - log(Z[i]))",
]


@pytest.mark.parametrize("text", SOFTMAX_PROGRAMS)
def test_softmax_programs_keep_their_values(backend, text):
    X = special_matrix(6, 7)
    written = oracle_program(text, {"X": X})
    assert close(ef.ein(text, X=X, backend=backend), written, rtol=1e-12)
    program = ef.compile(text)
    assert len(program.statements) == 4      # M, the shared exponential, Z, P


def test_a_logsumexp_statement_put_back_is_softmax(backend):
    text = "L[i] := logsumexp[j](X[i,j])\nP[i,j] := exp(X[i,j] - L[i])"
    X = special_matrix(6, 7)
    written = oracle_program(text, {"X": X})
    got = np.asarray(ef.ein(text, X=X, backend=backend), np.float64)
    plus_inf = np.isposinf(X).any(axis=1)
    assert close(got[~plus_inf], written[~plus_inf], rtol=1e-12)
    # Keeps.SOFTMAX (logsumexp-as-softmax): a row holding +inf is NaN throughout
    assert np.isnan(got[plus_inf]).all()
    assert len(ef.compile(text).statements) == 1       # L is read by nothing: dropped


ROW_RECIPROCAL = ("M[i] := max[j](X[i,j])\nE[i,j] := exp(X[i,j] - M[i])\n"
                  "r[i] := 1 / sum[j](E[i,j])\n")


def test_a_rows_reciprocal_put_back_is_a_division(backend):
    """``r[i] := 1 / sum[j](E[i,j])`` read as ``E[i,j] * r[i]`` is put back (a function
    of a reduction, its j a fresh copy inside the reader over [i, j]) and becomes
    ``E / sum(E)``: the softmax program (reciprocal-product-as-division)."""
    text = ROW_RECIPROCAL + "P[i,j] := E[i,j] * r[i]"
    X = special_matrix(6, 7)
    written = oracle_program(text, {"X": X})
    assert close(ef.ein(text, X=X, backend=backend), written, rtol=1e-12)
    assert "r" not in [s.output for s in ef.compile(text).statements]


def test_a_rows_reciprocal_written_first_stays_a_statement():
    # (1 / b) * a is left as written (its overflow for a subnormal b is NumPy's)
    text = ROW_RECIPROCAL + "P[i,j] := r[i] * E[i,j]"
    assert "r" in [s.output for s in ef.compile(text).statements]


def test_an_intermediate_read_once_is_computed_where_it_is_read(backend):
    text = "T[i,j,k] := A[i,k] - B[j,k]\nD[i,j] := sum[k](T[i,j,k]**2)"
    rng = np.random.default_rng(8)
    A, B = rng.standard_normal((4, 3)), rng.standard_normal((5, 3))
    A[0, 1], A[1, 2], B[2, 0], A[3, 0], B[3, 0] = NAN, INF, -INF, -0.0, 0.0
    written = oracle_program(text, {"A": A, "B": B})
    assert close(ef.ein(text, A=A, B=B, backend=backend), written, rtol=1e-12)
    assert len(ef.compile(text).statements) == 1


@pytest.mark.parametrize("text", [
    # read twice, an output, read with a shifted subscript: each stays a statement
    "T[i,k] := A[i,k] * 2\nD[i] := sum[k](T[i,k] * T[i,k])",
    "T[i,k] := A[i,k] * 2\nD[i] := sum[k](T[i,k])\nE[i] := max[k](T[i,k])",
    "T[i] := A[i,0] * 2\nD[i] := T[i+1] - A[i,0]",
])
def test_intermediates_that_are_not_read_once_stay(text):
    written = len(text.splitlines())
    assert len(ef.compile(text).statements) == written


def test_an_intermediate_put_back_is_still_the_programs_own():
    program = ef.compile("T[i,j,k] := A[i,k] - B[j,k]\nD[i,j] := sum[k](T[i,j,k]**2)")
    assert "T" in program.intermediates
    with pytest.raises(ef.EinfuseError, match="T is computed by the program"):
        program(A=np.ones((2, 3)), B=np.ones((2, 3)), T=np.ones((2, 2, 3)))


# -- product-as-square ---------------------------------------------------------------------
@pytest.mark.parametrize("statement", [
    "Y[i,j] := (X[i,j] - 0.5) * (X[i,j] - 0.5)",
    "v[i] := sum[j]((X[i,j] - X[i,0]) * (X[i,j] - X[i,0]))",
])
def test_a_product_of_equals_is_a_square_bitwise(backend, statement):
    text, fired = canonical_text(statement)
    assert fired[0] == "product-as-square" and "**2" in text
    X = special_matrix()
    written = oracle(statement, {"X": X})
    assert same_bits(oracle(text, {"X": X}), written)
    if "sum" not in statement:     # (a sum's order is the backend's)
        assert same_bits(ef.ein(statement, X=X, backend=backend), written)
    else:
        assert close(ef.ein(statement, X=X, backend=backend), written)


def test_a_product_of_booleans_or_different_terms_is_left():
    assert "product-as-square" not in canonical_text("Y[i,j] := (j <= i) * (j <= i)")[1]
    assert "product-as-square" not in canonical_text("Y[i,j] := X[i,j] * X[j,i]")[1]


# -- nested-means-merged (and count-by-access's bound indices) ----------------------------
@pytest.mark.parametrize("statement", [
    "y[b] := mean[h](mean[w](x[b,h,w]))",
    "y[b] := mean[h](mean[w](x[b,h,w] * g[w]))",
    "y[b] := mean[w](mean[h](x[b,h,w]))",
])
def test_nested_means_are_one_mean(backend, statement):
    text, fired = canonical_text(statement)
    assert "nested-means-merged" in fired
    assert text.count("sum[") == 2 and ("sum[h, w]" in text or "sum[w, h]" in text)
    x = np.random.default_rng(5).standard_normal((4, 3, 5))
    x[1, 0, 0], x[2, 1, 1], x[2, 2, 2], x[3, :, :] = NAN, INF, -INF, -0.0
    arrays = {"x": x, "g": np.array([1.0, -0.0, 2.0, INF, -3.0])}
    given = {k: v for k, v in arrays.items() if f"{k}[" in statement}
    from oracle import brute_force
    ranges = {"b": (0, 4), "h": (0, 3), "w": (0, 5)}
    written = brute_force(statement, ranges, given)
    assert close(brute_force(text, ranges, given), written)
    got = np.asarray(ef.ein(statement, **given, backend=backend))
    assert close(got, written)
    assert np.isnan(got[1]) and np.isnan(got[2])           # a NaN; inf + -inf
    if "g[" not in statement:
        assert got[3] == 0 and not np.signbit(got[3])       # a mean of -0.0s: +0.0 both


@pytest.mark.parametrize("shape", [(2, 0, 5), (2, 3, 0)])
def test_nested_means_of_nothing_are_nan_both_ways(backend, shape):
    statement = "y[b] := mean[h](mean[w](x[b,h,w]))"
    got = np.asarray(ef.ein(statement, x=np.ones(shape), backend=backend))
    assert got.shape == (2,) and np.isnan(got).all()


@pytest.mark.parametrize("statement", [
    "y[b] := mean[h](mean[w](x[b,h,w+h]))",        # the inner extent depends on h
    "y[b] := mean[h](mean[w](x[b,h,t[w]]))",       # w read through an index array
    "y[b] := mean[h](mean[w](x[b,h,w]) * 2)",      # not a mean of means
])
def test_means_whose_inner_count_may_vary_are_left(statement):
    text, fired = canonical_text(statement)
    assert "nested-means-merged" not in fired
    # and no count reads an index bound inside what it counts (count-by-access)
    from einfuse.analysis.spec import spec_of
    assert spec_of(text).statement is not None


def test_a_count_by_access_keeps_its_bound_indices_bound():
    # the outer mean's count of a mean written with a gather: the one access using h
    # also uses w through t[w], bound inside the inner mean; picking it would leave w free
    statement = "y[b] := mean[h](mean[w](x[b,h,t[w]]))"
    text, _ = canonical_text(statement)
    rng = np.random.default_rng(6)
    x, t = rng.standard_normal((2, 3, 4)), np.array([3, 0, 0, 2, 1])
    from oracle import brute_force
    ranges = {"b": (0, 2), "h": (0, 3), "w": (0, 5)}
    written = brute_force(statement, ranges, {"x": x, "t": t})
    assert close(brute_force(text, ranges, {"x": x, "t": t}), written)
    assert close(ef.ein(statement, x=x, t=t), written)


# -- gain-after-quotient -------------------------------------------------------------------
@pytest.mark.parametrize("statement", [
    "Y[i,j] := g[j] * X[i,j] / Z[i]",
    "Y[i,j] := g[j] * (X[i,j] - 1) / sqrt(Z[i] + 1e-05) + 2",
])
def test_a_gain_written_first_is_applied_after_the_quotient(backend, statement):
    text, fired = canonical_text(statement)
    assert "gain-after-quotient" in fired and text.count("* g[j]") == 1
    X, Z = special_matrix(), special_row()
    g = np.array([1.0, -0.0, INF, NAN, -2.5, 3.0])
    written = oracle(statement, {"X": X, "Z": Z, "g": g})
    rewritten = oracle(text, {"X": X, "Z": Z, "g": g})
    # NaN and infinities where the written form has them (0 * inf, inf / inf, a NaN
    # gain), finite values to rounding, zeros with the written sign
    assert close(rewritten, written, rtol=1e-15)
    zeros = written == 0
    assert np.array_equal(np.signbit(rewritten[zeros]), np.signbit(written[zeros]))
    assert close(ef.ein(statement, X=X, Z=Z, g=g, backend=backend), written, rtol=1e-12)


def test_a_gain_with_as_many_indices_or_a_number_is_left():
    assert "gain-after-quotient" not in canonical_text("Y[i,j] := W[i,j] * X[i,j] / Z[i]")[1]
    assert "gain-after-quotient" not in canonical_text("Y[i,j] := 2 * X[i,j] / Z[i]")[1]
