"""The rewrite rules kept as data (rewrite/rules.py) and the canonical form they reach
(rewrite/canonical.py): each rule fires where it should and not where its guard refuses,
and keeps the values -- checked against the brute-force oracle on the statement as
written, NaN, infinities and -0.0 included; an EXACT rule bitwise, the others up to
rounding on finite inputs and with the semantic they document on the special ones."""

import math
import re

import numpy as np
import pytest

import einfuse as ef
from einfuse.analysis.spec import spec_of
from einfuse.lang.ast import Binary
from einfuse.lang.parser import parse
from einfuse.lang.printer import format_statement
from einfuse.lang.split import split_program
from einfuse.rewrite.canonical import canonical_program, canonical_statement
from einfuse.rewrite.patterns import Capture, Op
from einfuse.rewrite.rules import (RULES, STEP_BOUND, Keeps, Rule, rewrite,
                                   rule_named)
from oracle import brute_force

INF, NAN = math.inf, math.nan


def canonical_text(statement: str):
    """The canonical statement's text and the rules that fired."""
    spec = spec_of(statement)
    new, fired = canonical_statement(spec.statement, spec.rhs)
    return format_statement(new), fired


def ranges_of(statement: str, arrays):
    """Each index's range from the axes it indexes as a plain subscript."""
    ranges = {}
    for node in spec_of(statement).rhs.walk():
        if hasattr(node, "tensor") and node.tensor in arrays:
            for axis, sub in enumerate(node.indices):
                if sub.plain_index is not None:
                    ranges[sub.plain_index] = (0, arrays[node.tensor].shape[axis])
    return ranges


def oracle(statement: str, arrays, params=None):
    return brute_force(statement, ranges_of(statement, arrays), arrays, params or {})


def same_bits(a, b) -> bool:
    """Equal values, NaN where NaN, and the same sign on zeros."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=True) and \
        np.array_equal(np.signbit(a[a == 0]), np.signbit(b[a == 0]))


def close(got, expected, rtol=1e-12) -> bool:
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    special = ~np.isfinite(expected)
    return np.array_equal(np.isnan(got), np.isnan(expected)) and \
        np.array_equal(got[special & ~np.isnan(expected)],
                       expected[special & ~np.isnan(expected)]) and \
        np.allclose(got[~special], expected[~special], rtol=rtol, atol=1e-12)


def special_matrix(rows=5, cols=6, seed=0):
    """Normal values with NaN, +inf, -inf and -0.0 at masked (j > i) and unmasked
    positions."""
    X = np.random.default_rng(seed).standard_normal((rows, cols))
    X[1, 0], X[1, 4] = NAN, NAN
    X[2, 1], X[2, 5] = INF, INF
    X[3, 2], X[3, 5] = -INF, -INF
    X[4, 3], X[0, 3] = -0.0, -0.0
    return X


# -- the table ------------------------------------------------------------------------------
def test_every_rule_is_named_once_and_documented():
    names = [rule.name for rule in RULES]
    assert len(names) == len(set(names))
    for rule in RULES:
        assert rule.doc and isinstance(rule.keeps, Keeps)


@pytest.mark.parametrize("statement", [
    "P[i,j] := where(j <= i, exp(X[i,j]), 0)",
    "P[i,j] := where(j > i, 0, exp(X[i,j]))",
    "P[i,j] := where(j <= i & i < 4, exp(X[i,j] * 2), 0)",
])
def test_masks_move_into_the_exponential_bitwise(backend, statement):
    text, fired = canonical_text(statement)
    assert fired and set(fired) <= {"mask-into-exp", "mask-out-into-exp", "mask-kept-where-true"}
    assert "where(" in text and text.index("exp(") < text.index("where(")
    X = special_matrix()
    written = oracle(statement, {"X": X})
    assert same_bits(oracle(text, {"X": X}), written)       # the rule itself: exact
    got = ef.ein(statement, X=X, backend=backend)
    assert close(got, written)
    masked = np.triu(np.ones_like(X, bool), 1)
    assert same_bits(np.asarray(got, np.float64)[masked], written[masked])


def test_a_mask_that_is_not_boolean_is_left(backend):
    # where(x, exp(y), 0) with a value condition: no rule (x may be NaN: not a mask)
    statement = "P[i,j] := where(X[i,j], exp(X[i,j]), 0)"
    assert canonical_text(statement)[1] == ()


def test_boolean_product_becomes_the_mask(backend):
    statement = "P[i,j] := exp(X[i,j]) * (j <= i)"
    text, fired = canonical_text(statement)
    assert fired == ("boolean-product-to-where", "mask-into-exp")
    X = np.random.default_rng(1).standard_normal((5, 6))
    assert close(ef.ein(statement, X=X, backend=backend), oracle(statement, {"X": X}))
    # the semantic it keeps (Keeps.MASK): a masked-out inf or NaN weight gives 0, where
    # the product as written gives NaN (inf * 0); unmasked positions are as written
    X = special_matrix()
    got = np.asarray(ef.ein(statement, X=X, backend=backend), np.float64)
    written = oracle(statement, {"X": X})
    masked = np.triu(np.ones_like(X, bool), 1)
    assert np.all(got[masked] == 0) and not np.signbit(got[masked]).any()
    assert np.isnan(written[masked]).any()
    assert close(got[~masked], written[~masked], rtol=1e-14)
    assert rule_named("boolean-product-to-where").keeps is Keeps.MASK


def test_product_with_a_value_is_not_a_mask():
    assert canonical_text("P[i,j] := exp(X[i,j]) * X[i,j]")[1] == ()
    assert canonical_text("P[i,j] := X[i,j] * (j <= i)")[1] == ()     # -0.0 would change


def test_logsumexp_weights_become_softmax(backend):
    statement = "P[i,j] := exp(X[i,j] - logsumexp[k](X[i,k]))"
    text, fired = canonical_text(statement)
    assert fired == ("logsumexp-as-softmax",)
    assert "logsumexp" not in text and "max[" in text
    spec_of(text)      # a valid statement (its nested max binds a fresh index)
    X = np.random.default_rng(2).standard_normal((4, 7)) * 30
    X[1, 2] = -INF             # a -inf entry: weight 0 either way
    X[2, :] = -INF             # a row of -inf: NaN either way
    X[3, 3] = NAN              # NaN propagates to the whole row either way
    written = oracle(statement, {"X": X})
    assert close(oracle(text, {"X": X}), written, rtol=1e-13)
    assert close(ef.ein(statement, X=X, backend=backend), written, rtol=1e-12)
    # the semantic kept (Keeps.SOFTMAX): a row holding +inf is NaN throughout
    X[0, 1] = INF
    got = np.asarray(ef.ein(statement, X=X, backend=backend))
    assert np.isnan(got[0]).all()
    assert rule_named("logsumexp-as-softmax").keeps is Keeps.SOFTMAX


@pytest.mark.parametrize("statement", [
    "P[i,j] := exp(Y[i,j] - logsumexp[k](X[i,k]))",        # another tensor's weights
    "P[i,j] := exp(X[j,i] - logsumexp[k](X[i,k]))",        # read the other way round
    "P[i] := exp(X[i,0] - logsumexp[k](X[i,k]))",          # a constant subscript
])
def test_logsumexp_rule_refuses_what_is_not_softmax(statement):
    assert "logsumexp-as-softmax" not in canonical_text(statement)[1]


def test_expanded_logsumexp_is_one_reduction(backend):
    statement = "L[i] := max[j](X[i,j]) + log(sum[k](exp(X[i,k] - max[l](X[i,l]))))"
    text, fired = canonical_text(statement)
    assert fired == ("logsumexp-from-parts",)
    assert text == "L[i] := logsumexp[j](X[i, j])"
    X = np.random.default_rng(3).standard_normal((4, 6)) * 20
    X[1, 1] = -INF
    written = oracle(statement, {"X": X})
    assert close(ef.ein(statement, X=X, backend=backend), written, rtol=1e-12)
    # the semantic kept (Keeps.LOGSUMEXP, notation.md's logsumexp): a row of -inf is
    # -inf and a row holding +inf is +inf, where the expanded form gives NaN
    X[2, :] = -INF
    X[3, 0] = INF
    got = np.asarray(ef.ein(statement, X=X, backend=backend))
    assert got[2] == -INF and got[3] == INF
    assert np.isnan(oracle(statement, {"X": X})[2:]).all()


def test_expanded_logsumexp_of_two_different_rows_is_left():
    statement = "L[i] := max[j](X[i,j]) + log(sum[k](exp(Y[i,k] - max[l](X[i,l]))))"
    assert canonical_text(statement)[1] == ()


@pytest.mark.parametrize("statement,expected", [
    ("S[i,j] := sum[d](Q[i,d] * K[j,d] * 0.125)", "S[i, j] := sum[d](Q[i, d] * K[j, d]) * 0.125"),
    ("S[i,j] := Q[i,d] * K[j,d] / c", "S[i, j] := sum[d](Q[i, d] * K[j, d]) / c"),
    # (a factor written first stays first: the order of positional arguments)
    ("S[i,j] := sum[d](c * Q[i,d] * K[j,d])", "S[i, j] := c * sum[d](Q[i, d] * K[j, d])"),
    ("O[i,e] := sum[j](Q[i,j] / Z[i] * K[j,e])", "O[i, e] := sum[j](Q[i, j] * K[j, e]) / Z[i]"),
])
def test_factors_move_out_of_sums(backend, statement, expected):
    text, fired = canonical_text(statement)
    assert fired == ("factor-out-of-sum",) and text == expected
    rng = np.random.default_rng(4)
    arrays = {"Q": rng.standard_normal((3, 5)), "K": rng.standard_normal((4, 5)),
              "Z": rng.standard_normal(3) + 3}
    if "O[" in statement:
        arrays["K"] = rng.standard_normal((5, 4))
    arrays = {k: v for k, v in arrays.items() if f"{k}[" in statement}
    params = {"c": 0.3} if re.search(r"\bc\b", statement) else {}
    written = oracle(statement, arrays, params)
    assert close(ef.ein(statement, **arrays, **params, backend=backend), written, rtol=1e-12)
    # infinities: the same positions are inf or NaN (a factor is never 0 here)
    arrays["Q"] = arrays["Q"].copy()
    arrays["Q"][0, 0], arrays["Q"][1, 1] = INF, NAN
    written = oracle(statement, arrays, params)
    assert close(ef.ein(statement, **arrays, **params, backend=backend), written, rtol=1e-12)


def test_a_plain_sum_of_one_term_keeps_its_factor():
    # a column sum of X[i,j] * 2 runs compensated as written (schedule/fusion.py)
    assert canonical_text("s[j] := X[i,j] * 2")[1] == ()
    assert canonical_text("s[j] := sum[i](c * X[i,j])")[1] == ()


def test_a_reciprocal_stays_in_its_sum():
    assert canonical_text("y[i] := sum[j](c / X[i,j])")[1] == ()
    assert canonical_text("y[i] := sum[j](X[i,j] / X[i,j+1])")[1] == ()


def test_mean_and_var_counts_are_written_by_access(backend):
    statement = "v[i] := mean[j]((X[i,j] - m[i])**2)"
    text, fired = canonical_text(statement)
    assert fired == ("count-by-access",)
    assert "where(X[i, j] == X[i, j], 1, 1)" in text
    X = special_matrix()
    arrays = {"X": X, "m": np.arange(5.0)}
    written = oracle(statement, arrays)
    assert same_bits(oracle(text, arrays), written)      # exact: the count is a count
    assert close(ef.ein(statement, **arrays, backend=backend), written, rtol=1e-12)


def test_a_count_over_two_arrays_keeps_its_body():
    # j indexes X and W: K's range is inferred from both, so the body stays whole
    assert canonical_text("y[i] := mean[j](X[i,j] * W[j])")[1] == ()


def test_the_callers_variance_is_not_recentred():
    # E[x^2] - E[x]^2 stays as written (v3.md: einfuse keeps the caller's numerics)
    statement = "v[i] := sum[j](X[i,j]**2) / 8 - (sum[j](X[i,j]) / 8)**2"
    assert canonical_text(statement)[1] == ()
    centred = "v[i] := sum[j]((X[i,j] - sum[k](X[i,k]) / 8)**2) / 8"
    assert canonical_text(centred)[1] == ()


def test_a_cycling_table_stops_at_the_step_bound():
    swap = Rule("swap", Op("+", Capture("a"), Capture("b")),
                lambda c, e, fresh: Binary("+", c["b"], c["a"]), Keeps.EXACT, "a + b -> b + a")
    expr = parse("y[i] := X[i] + Y[i]").rhs
    result = rewrite(expr, (swap,))
    assert len(result.fired) == STEP_BOUND
    assert rewrite(expr, (swap,), step_bound=3).fired == ("swap",) * 3


def test_rules_apply_bottom_up_to_a_fixed_point():
    # the inner mask fires first, then the product: the result has no rule left to fire
    expr = spec_of("P[i,j] := sum[k](exp(X[i,k]) * (k <= i) * W[k] * 3) * Y[i,j]").rhs
    result = rewrite(expr)
    assert "factor-out-of-sum" in result.fired
    assert rewrite(result.expr).fired == ()


# -- the program-level pass -----------------------------------------------------------------
def program_form(source, outputs, plain_ranges=True):
    specs = [spec_of(piece.text) for piece in split_program(source)]
    return canonical_program([(s.statement, s.rhs) for s in specs], outputs, plain_ranges)


def oracle_program(source, arrays):
    env = dict(arrays)
    for piece in split_program(source):
        spec = spec_of(piece.text)
        env[spec.output] = oracle(piece.text, env)
    return env


PROGRAM = """M[i] := max[j](X[i,j])
M2[a] := max[b](X[a,b])
P[i,j] := exp(X[i,j] - max[k](X[i,k])) + M2[i]
Q[i,j] := P[i,j] * sum[k](X[i,k])"""


def test_repeated_work_is_read_from_the_earlier_intermediate(backend):
    form = program_form(PROGRAM, ("Q",))
    assert form.shared == ("M2 is M", "P: M")
    assert form.texts == ("M[i] := max[j](X[i, j])", "P[i, j] := exp(X[i, j] - M[i]) + M[i]",
                          "Q[i, j] := P[i, j] * sum[k](X[i, k])")
    assert form.origins == (0, 2, 3)
    X = special_matrix()
    program = ef.compile(PROGRAM, outputs="Q", backend=backend)
    assert [s.output for s in program.statements] == ["M", "P", "Q"]
    assert close(program(X=X), oracle_program(PROGRAM, {"X": X})["Q"])


def test_an_output_is_never_dropped_and_ranges_turn_the_pass_off():
    form = program_form(PROGRAM, ("M2", "Q"))
    assert "M2 is M" not in form.shared
    assert program_form(PROGRAM, ("Q",), plain_ranges=False).shared == ()
    program = ef.compile(PROGRAM, outputs=("M2", "Q"))
    assert "M2" in [s.output for s in program.statements]


def test_a_shifted_read_is_not_replaced():
    source = "M[i] := max[j](X[i,j])\nP[i] := max[j](X[i+1,j])"
    assert program_form(source, ("P",)).shared == ()
    source = "M[i] := max[j](X[i,j])\nP[i] := max[j](X[i,j]) + W[i+1]"
    assert program_form(source, ("P",)).shared == ("P: M",)      # i plain in the max


def test_errors_are_the_written_programs():
    # a program whose canonical form would differ raises the written form's error
    with pytest.raises(ef.EinfuseError, match="defined later"):
        ef.compile("P[i,j] := where(j <= i, exp(E[i,j]), 0)\nE[i,j] := X[i,j] * 2")


def test_positional_arguments_keep_their_order(backend):
    x = np.random.default_rng(5).standard_normal(6)
    # alpha is used first as written; the canonical form would read x first
    got = ef.ein("s := sum[i](x[i]**2 * alpha)", x, 0.5, backend=backend)
    assert np.isclose(float(got), 0.5 * (x ** 2).sum())
    program = ef.compile("t[i] := x[i] * 2\nu := sum[i](t[i] * alpha) + sum[i](y[i])")
    assert program.inputs == ("x", "alpha", "y")
    assert np.isclose(float(program(x, 0.5, x)), x.sum() + x.sum())


def test_an_intermediate_with_two_reductions_is_split(backend):
    source = "m[i] := sum[j](X[i,j]) / sum[j](X[i,j]**2)\nY[i,j] := X[i,j] - m[i]"
    form = program_form(source, ("Y",))
    assert form.shared == ("m: 2 reductions as statements",)
    assert len(form.texts) == 4 and form.origins == (0, 0, 0, 1)
    X = special_matrix()
    assert close(ef.ein(source, X=X, backend=backend), oracle_program(source, {"X": X})["Y"])
    # a count (mean's divisor) is no pass over the data: mean's sum and count stay one
    # statement, as sum[j](X[i,j]) / n does
    mean = "m[i] := mean[j](X[i,j])\nY[i,j] := X[i,j] - m[i]"
    assert program_form(mean, ("Y",)).shared == ()
    assert close(ef.ein(mean, X=X, backend=backend), oracle_program(mean, {"X": X})["Y"])
    # the last statement's reductions stay in its own loop nest
    assert program_form("Y[i] := sum[j](X[i,j]) / sum[j](X[i,j]**2)", ("Y",)).shared == ()


# -- the order of commutative terms ---------------------------------------------------------
@pytest.mark.parametrize("statement, rule, expected", [
    ("P[i,j] := exp(-M[i] + X[i,j])", "negation-as-difference",
     "P[i, j] := exp(X[i, j] - M[i])"),
    ("P[i,j] := exp(X[i,j] + -M[i])", "negation-as-difference",
     "P[i, j] := exp(X[i, j] - M[i])"),
    ("Y[i,j] := b[j] + X[i,j] * M[i]", "wider-addend-first",
     "Y[i, j] := X[i, j] * M[i] + b[j]"),
    ("y[i] := sqrt(1e-05 + M[i])", "wider-addend-first", "y[i] := sqrt(M[i] + 1e-05)"),
    ("v[i] := sum[j]((M[i] - X[i,j])**2)", "difference-squared-wider-first",
     "v[i] := sum[j]((X[i, j] - M[i])**2)"),
    ("Y[i,j] := b[j] * ((X[i,j] - M[i]) / sqrt(M[i] + 1e-05))", "wider-factor-first",
     "Y[i, j] := (X[i, j] - M[i]) / sqrt(M[i] + 1e-05) * b[j]"),
])
def test_commutative_terms_take_one_order_bitwise(backend, statement, rule, expected):
    """A negated addend, a narrower addend written first and a difference squared the
    other way round are rewritten to the one order (the row kernels' templates), and
    the values are the written statement's bit for bit: NaN, infinities, -0.0."""
    text, fired = canonical_text(statement)
    assert rule in fired and text == expected
    X = special_matrix()
    M = np.array([0.5, -0.0, INF, NAN, -2.0])
    b = np.array([1.0, -0.0, 0.0, -INF, NAN, 3.0])
    arrays = {name: value for name, value in (("X", X), ("M", M), ("b", b))
              if f"{name}[" in statement}
    written = oracle(statement, arrays)
    assert same_bits(oracle(text, arrays), written)
    assert close(ef.ein(statement, backend=backend, **arrays), written)


@pytest.mark.parametrize("statement", [
    "Y[i,j] := X[i,j] + -Y2[i,j]",            # (the negation rule fires, no order rule)
    "Y[i,j] := A[i,j] + B[i,j]",              # the same indices: as written
    "Y[i,j] := b[j] + c[i]",                  # neither a subset of the other
    "v[i,j] := (A[i,j] - B[i,j])**2",
    "v[i] := sum[j]((X[i,j] - M[i])**3)",     # not a square
])
def test_terms_of_equal_or_unrelated_indices_keep_their_order(statement):
    text, fired = canonical_text(statement)
    assert "wider-addend-first" not in fired and "difference-squared-wider-first" not in fired


@pytest.mark.parametrize("statement", [
    "Y[i,j] := 2 * (X[i,j] / M[i])",          # a number written first stays first
    "Y[i,j] := b[j] * (1 / M[i])",             # a reciprocal: never moved
    "Y[i,j] := W[i,j] * (X[i,j] / M[i])",     # as many indices
    "Y[i,j] := b[j] * (X[i,j] - M[i])",       # not a quotient
])
def test_a_factor_that_is_no_gain_before_a_quotient_keeps_its_place(statement):
    assert "wider-factor-first" not in canonical_text(statement)[1]
