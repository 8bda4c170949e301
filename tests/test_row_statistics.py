"""The log-sum-exp row kernel (plan/row_statistics.py, backends/c/rows.py, row_values.py):
every spelling of a log-sum-exp or a cross-entropy whose members are values per row of
a matrix's row maximum and sum of shifted exponentials runs it, with the statements'
values (against tests/oracle.py, statement by statement) on rows of NaN, inf, -inf and
large values; an out-of-bounds label is the statements' error, first call and repeat;
anything else stays on the generic kernel."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build, rows as c_rows
from einfuse.errors import EinfuseError
from einfuse.lang.parser import parse
from oracle import brute_force

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="row kernels are C kernels")

LSE = "m[i] := max[j](X[i,j])\nl[i] := m[i] + log(sum[j](exp(X[i,j] - m[i])))"
CROSS_ENTROPY = ("m[i] := max[j](X[i,j])\n"
                 "l[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - X[i, t[i]]")
SPELLINGS = {
    "lse": LSE,
    "lse, sum first": "m[i] := max[j](X[i,j])\ns[i] := sum[j](exp(X[i,j] - m[i]))\n"
                      "l[i] := log(s[i]) + m[i]",
    "cross-entropy": CROSS_ENTROPY,
    "logsumexp": "l[i] := logsumexp[j](X[i,j])",
    "cross-entropy as one statement": "l[i] := logsumexp[j](X[i,j]) - X[i, t[i]]",
    # (canonically logsumexp[j]: its semantic, -inf for a row of -inf, rewrite/rules.py)
    "lse as one statement": "l[i] := max[k](X[i,k]) + log(sum[j](exp(X[i,j] - max[k](X[i,k]))))",
    "cross-entropy, logsumexp in a group": "m[i] := max[j](X[i,j])\n"
                                           "l[i] := logsumexp[j](X[i,j]) - X[i, t[i]] + 0 * m[i]",
    "cross-entropy, mean": CROSS_ENTROPY + "\nL[] := sum[i](l[i]) / 37",
    "cross-entropy, mean as one statement": "L[] := sum[i](logsumexp[j](X[i,j]) - X[i, t[i]]) / 37",
    "weighted cross-entropy": "m[i] := max[j](X[i,j])\n"
                              "l[i] := w[i] * (log(sum[j](exp(X[i,j] - m[i]))) + m[i] - X[i, t[i]])",
    "log-softmax at the label": "m[i] := max[j](X[i,j])\n"
                                "p[i] := exp(X[i, t[i]] - m[i]) / sum[j](exp(X[i,j] - m[i]))",
}
# the text the oracle evaluates, where it is not the spelling's own
ORACLE_TEXT = {"lse as one statement": "l[i] := logsumexp[j](X[i,j])"}


def _special(rows, cols, dtype):
    X = np.random.default_rng(rows + cols).standard_normal((rows, cols)).astype(dtype)
    X[1, cols // 2] = np.nan           # a NaN
    X[2, :] = -np.inf                  # a row of -inf
    X[3, cols - 1] = np.inf            # an inf
    X[4, ::2] = -np.inf                # -inf beside finite values
    X[5] *= 1e4                        # exponentials that underflow
    X[6] += 80                         # large values: exp(x) alone would overflow float32
    X[7, 0] = np.inf
    X[7, 1] = -np.inf
    return X


def _arrays(rows, cols, dtype):
    rng = np.random.default_rng(cols)
    return {"X": _special(rows, cols, dtype), "t": rng.integers(0, cols, rows),
            "w": rng.uniform(0.5, 2, rows).astype(dtype)}


def _oracle(text, arrays):
    """Each statement by brute force, in float64, in order."""
    env = {k: (v.astype(np.float64) if v.dtype.kind == "f" else v) for k, v in arrays.items()}
    for line in text.splitlines():
        statement = parse(line)
        rows, cols = arrays["X"].shape
        ranges = {"i": (0, rows), "j": (0, cols), "k": (0, cols)}
        env[statement.output] = brute_force(line, ranges, env)
    return env[statement.output]


def _compare(got, want, dtype):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)],
                                  want[~finite & ~np.isnan(want)])
    tolerance = 3e-6 if dtype == "float32" else 1e-13
    np.testing.assert_allclose(got[finite], want[finite], rtol=tolerance,
                               atol=tolerance * 10)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(37, 1000), (9, 2100), (700, 7)])
@pytest.mark.parametrize("name", list(SPELLINGS))
def test_spellings_run_the_row_kernel_with_the_statements_values(row_patterns, name, shape,
                                                                 dtype):
    text = SPELLINGS[name]
    if "mean" in name and shape[0] != 37:
        text = text.replace("/ 37", f"/ {shape[0]}")
    arrays = _arrays(*shape, dtype)
    given = {k: v for k, v in arrays.items() if f"{k}[" in text}
    program = ef.compile(text)
    first = program(**given)
    again = program(**given)                 # the prepared run
    np.testing.assert_array_equal(first, again)
    assert row_patterns == [c_rows.RowPattern.LOGSUMEXP] * 2
    _compare(first, _oracle(ORACLE_TEXT.get(name, text), given), dtype)


LOG_SOFTMAX = {
    "program": "z[i] := logsumexp[k](X[i,k])\nY[i,j] := X[i,j] - z[i]",
    "one statement": "Y[i,j] := X[i,j] - logsumexp[k](X[i,k])",
    "max and sum": "m[i] := max[k](X[i,k])\n"
                   "Y[i,j] := X[i,j] - m[i] - log(sum[k](exp(X[i,k] - m[i])))",
    "scaled": "m[i] := max[k](X[i,k])\ns[i] := sum[k](exp(X[i,k] - m[i]))\n"
              "Y[i,j] := 2 * (X[i,j] - m[i]) - log(s[i])",
    # a row of values calling a function: the SIMD loop through libmvec's exp
    "softmax, its normaliser inline": "m[i] := max[k](X[i,k])\n"
                                      "Y[i,j] := exp(X[i,j] - m[i]) / "
                                      "sum[k](exp(X[i,k] - m[i]))",
    "log-softmax through exp and log": "m[i] := max[k](X[i,k])\n"
                                       "Y[i,j] := log(exp(X[i,j] - m[i]) / "
                                       "sum[k](exp(X[i,k] - m[i])))",
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", list(LOG_SOFTMAX))
def test_log_softmax_rows(row_patterns, name, dtype):
    # members over [i, j] from the row's values and X[i, j] itself
    text = LOG_SOFTMAX[name]
    X = _special(40, 123, dtype)
    program = ef.compile(text)
    first, again = program(X=X), program(X=X)
    np.testing.assert_array_equal(first, again)
    assert row_patterns == [c_rows.RowPattern.LOGSUMEXP] * 2
    _compare(first, _oracle(text, {"X": X}), dtype)


@pytest.mark.parametrize("text", [
    CROSS_ENTROPY, SPELLINGS["cross-entropy as one statement"],
    SPELLINGS["cross-entropy, mean as one statement"].replace("37", "64")])
def test_an_out_of_bounds_label_is_the_statements_error(row_patterns, text):
    arrays = _arrays(64, 300, "float32")
    program = ef.compile(text)
    program(X=arrays["X"], t=arrays["t"])              # prepares the repeat
    for bad in (300, -1):
        t = arrays["t"].copy()
        t[5] = bad
        with pytest.raises(EinfuseError, match=r"t\[5\]"):
            program(X=arrays["X"], t=t)
        with pytest.raises(EinfuseError, match=r"t\[5\]"):
            ef.compile(text)(X=arrays["X"], t=t)     # the full path first
    np.testing.assert_allclose(program(X=arrays["X"], t=arrays["t"]),
                               _oracle(text, arrays), rtol=3e-6, atol=3e-5)
    assert set(row_patterns) == {c_rows.RowPattern.LOGSUMEXP}


def test_int32_labels_and_strided_rows(row_patterns):
    base = _arrays(128, 300, "float32")
    X = base["X"][::2]
    t = base["t"][:64].astype(np.int32)
    got = ef.compile(CROSS_ENTROPY)(X=X, t=t)
    _compare(got, _oracle(CROSS_ENTROPY, {"X": X, "t": t}), "float32")
    assert row_patterns == [c_rows.RowPattern.LOGSUMEXP]


@pytest.mark.parametrize("text", [
    # shifted by something that is not the row maximum
    "m[i] := min[j](X[i,j])\nl[i] := m[i] + log(sum[j](exp(X[i,j] - m[i])))",
    "m[i] := max[j](X[i,j])\nl[i] := m[i] + log(sum[j](exp(2 * X[i,j] - m[i])))",
    # a value along the columns is asked for
    "m[i] := max[j](X[i,j])\ne[i,j] := exp(X[i,j] - m[i])",
    # a parameter, an index as a value
    "m[i] := max[j](X[i,j])\nl[i] := a * log(sum[j](exp(X[i,j] - m[i])))",
    "m[i] := max[j](X[i,j])\nl[i] := i + log(sum[j](exp(X[i,j] - m[i])))",
    # a column's array read along the row
    "z[i] := logsumexp[k](X[i,k])\nY[i,j] := X[i,j] - z[i] + X[0,j]",
])
def test_other_groups_run_the_generic_kernel(row_patterns, text):
    X = np.random.default_rng(1).standard_normal((40, 300))
    given = {"X": X, "a": 2.0} if " a *" in text else {"X": X}
    got = ef.compile(text)(**given)
    assert row_patterns == []
    if " a *" in text:
        text = text.replace("a *", "2.0 *")
    np.testing.assert_allclose(got, _oracle(text, {"X": X}), rtol=1e-12)


def test_a_member_over_the_row_kept_as_an_output_runs_the_generic_kernel(row_patterns):
    # a member over [i, j] read by a later one and written whole (an output: not
    # recomputed in its reader) is no value per row: the generic fused kernel runs it
    text = "z[i] := logsumexp[k](X[i,k])\nY[i,j] := X[i,j] - z[i]\nw[i] := sum[j](Y[i,j])"
    X = np.random.default_rng(1).standard_normal((40, 300))
    Y, w = ef.compile(text, outputs=("Y", "w"))(X=X)
    assert row_patterns == []
    first_two = "\n".join(text.splitlines()[:2])
    np.testing.assert_allclose(Y, _oracle(first_two, {"X": X}), rtol=1e-12)
    np.testing.assert_allclose(w, _oracle(text, {"X": X}), rtol=1e-12)


def test_a_broadcast_difference_read_by_a_sum_is_recomputed_there(row_patterns):
    # Y := X - z is one operation of the row and a row value: rewrite/inline_reductions
    # computes it inside w's sum, so the group is the row statistics and a value per row
    # from them (w = sum(X) - n z), the log-sum-exp row kernel, with the statements' values
    text = "z[i] := logsumexp[k](X[i,k])\nY[i,j] := X[i,j] - z[i]\nw[i] := sum[j](Y[i,j])"
    X = np.random.default_rng(1).standard_normal((40, 300))
    got = ef.compile(text)(X=X)
    assert row_patterns == [c_rows.RowPattern.LOGSUMEXP]
    np.testing.assert_allclose(got, _oracle(text, {"X": X}), rtol=1e-12)


def test_explain_names_the_row_kernel():
    shown = str(ef.explain(CROSS_ENTROPY, X=np.zeros((256, 1024), np.float32),
                           t=np.zeros(256, np.int64)))
    assert "the logsumexp row kernel" in shown


@pytest.mark.parametrize("vector_bytes", [pytest.param(16, marks=pytest.mark.slow), 32, 64])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_vector_width_gives_the_statements_values(monkeypatch, row_patterns,
                                                        vector_bytes, dtype):
    # the SSE, AVX2 and AVX-512 builds of the kernel (the host runs each)
    monkeypatch.setattr(c_rows, "VECTOR_BYTES", vector_bytes)
    arrays = _arrays(41, 1037, dtype)
    for text in (CROSS_ENTROPY, SPELLINGS["cross-entropy as one statement"]):
        got = ef.compile(text)(X=arrays["X"], t=arrays["t"])
        _compare(got, _oracle(text, arrays), dtype)
    assert row_patterns == [c_rows.RowPattern.LOGSUMEXP] * 2


def test_threads_do_not_change_bits(row_patterns):
    arrays = _arrays(517, 300, "float32")
    for text in (CROSS_ENTROPY, SPELLINGS["logsumexp"]):
        given = {k: v for k, v in arrays.items() if f"{k}[" in text}
        one = ef.compile(text, threads=1)(**given)
        two = ef.compile(text, threads=2)(**given)
        np.testing.assert_array_equal(one, two)
    assert row_patterns == [c_rows.RowPattern.LOGSUMEXP] * 4
