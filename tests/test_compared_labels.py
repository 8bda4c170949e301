"""An array read only to be compared does not promote the statement (issue 31's
cross-entropy spellings; docs/notation.md section 10), as NumPy evaluates the same
expression: ``np.where(y[:, None] == np.arange(n), x, 0)`` and ``x * (y[:, None] ==
np.arange(n))`` are float32 for float32 ``x`` and int64 ``y``, so ``where(c == y[n],
X[n,c], 0)`` and ``X[n,c] * (c == y[n])`` are float32 statements -- while ``X[n,c] +
y[n]`` is float64.  The comparison still gives NumPy's answer (its operands compared in
their common type) on every backend: an int64 label of 2**24 + 1 never equals an index
of 2**24, which float32 rounding would make it; where float32 cannot promise that, the
statement computes in float64 and returns float32 (analysis/compared.py)."""

import math

import numpy as np
import pytest

import einfuse as ef
from einfuse.analysis.binding import bind_call
from einfuse.analysis.options import make_options
from einfuse.analysis.spec import spec_of
from einfuse.backends.c import build as c_build, rows as c_rows

INF, NAN = math.inf, math.nan
LABELS = ["int8", "int16", "int32", "int64", "uint8", "bool"]
LOGITS = ["float32", "float64"]
ROWS, COLS = 9, 6


def _numpy_forms(X, y):
    """Each statement's own evaluation in NumPy (its result dtype is NumPy's)."""
    hit = y[:, None] == np.arange(X.shape[1])
    with np.errstate(all="ignore"):
        lse = np.log(np.exp(X - X.max(1, keepdims=True)).sum(1)) + X.max(1)
        return {
            "Z[n,c] := where(c == y[n], X[n,c], 0)": np.where(hit, X, 0),
            "Z[n,c] := where(y[n] == c, X[n,c], 0)": np.where(hit, X, 0),
            "Z[n,c] := X[n,c] * (c == y[n])": X * hit,
            "Z[n,c] := (y[n] != c) * X[n,c]": (y[:, None] != np.arange(X.shape[1])) * X,
            "Z[n,c] := where(X[n,c] > y[n], X[n,c], 0)": np.where(X > y[:, None], X, 0),
            "L[n] := logsumexp[c](X[n,c]) - sum[c](X[n,c] * (c == y[n]))":
                lse - (X * hit).sum(1),
            "L[n] := logsumexp[c](X[n,c]) - sum[c](where(c == y[n], X[n,c], 0))":
                lse - np.where(hit, X, 0).sum(1),
            "Z[n,c] := X[n,c] + y[n]": X + y[:, None],           # y in arithmetic
            "Z[n,c] := X[n,c] * (c == y[n]) + y[n]": X * hit + y[:, None],
        }


def _inputs(logits, labels):
    rng = np.random.default_rng(7)
    X = rng.standard_normal((ROWS, COLS)).astype(logits)
    top = 2 if labels == "bool" else COLS
    y = rng.integers(0, top, ROWS).astype(labels)
    return X, y


@pytest.mark.parametrize("labels", LABELS)
@pytest.mark.parametrize("logits", LOGITS)
def test_result_dtype_is_numpys_own_evaluation(logits, labels):
    X, y = _inputs(logits, labels)
    for text, want in _numpy_forms(X, y).items():
        got = ef.ein(text, X=X, y=y)
        assert got.dtype == want.dtype, (text, got.dtype, want.dtype)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6, err_msg=text)


@pytest.mark.parametrize("logits", LOGITS)
def test_a_compared_int64_label_keeps_float32_and_addition_promotes(logits):
    X, y = _inputs(logits, "int64")
    assert ef.ein("Z[n,c] := where(c == y[n], X[n,c], 0)", X=X, y=y).dtype == logits
    assert ef.ein("Z[n,c] := X[n,c] + y[n]", X=X, y=y).dtype == np.float64


def _matrix(dtype):
    X = np.random.default_rng(3).standard_normal((ROWS, COLS))
    X[1, 4] = NAN                    # a NaN away from the label
    X[2, 5] = INF                    # an inf away from the label
    X[3, 3] = NAN                    # a NaN at the label
    X[4, 0] = -INF                   # -inf at the label
    return X.astype(dtype)


# labels at 0 and n-1, and rows 6.. naming no column (the comparison is simply false)
_LABELS = [0, COLS - 1, 1, 3, 0, 2, -1, COLS, 2**40]
_CROSS_ENTROPY = {
    "gather": "L[n] := logsumexp[c](X[n,c]) - X[n, y[n]]",
    "one-hot product": "L[n] := logsumexp[c](X[n,c]) - sum[c](X[n,c] * (c == y[n]))",
    "where": "L[n] := logsumexp[c](X[n,c]) - sum[c](where(c == y[n], X[n,c], 0))",
}


def _reference(X, y, dense):
    """NumPy's evaluation in float64 (the values; the dtype is checked above)."""
    X = X.astype(np.float64)
    hit = y[:, None] == np.arange(X.shape[1])
    with np.errstate(all="ignore"):
        m = X.max(1)
        lse = np.where(np.isfinite(m), m + np.log(np.exp(X - m[:, None]).sum(1)), m)
        pick = (X * hit).sum(1) if dense else np.where(hit, X, 0).sum(1)
    return lse - pick


@pytest.mark.parametrize("labels", ["int32", "int64"])
def test_values_equal_the_gathers_and_numpys(backend, labels):
    X = _matrix("float32")
    y = np.array(_LABELS, np.int64).astype(labels)
    inside = slice(0, 6)             # the gather raises for the labels naming no column
    gathered = ef.ein(_CROSS_ENTROPY["gather"], X=X[inside], y=y[inside], backend=backend)
    for name in ("one-hot product", "where"):
        got = ef.ein(_CROSS_ENTROPY[name], X=X, y=y, backend=backend)
        assert got.dtype == np.float32, name
        want = _reference(X, y, name == "one-hot product")
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=name)
        np.testing.assert_allclose(got, want, rtol=3e-6, atol=3e-6, err_msg=name)
        # the where picks what the gather reads (a NaN elsewhere in the row is its
        # product's alone: NaN * 0)
        if name == "where":
            np.testing.assert_allclose(got[inside], gathered, rtol=3e-6, atol=3e-6)
        else:
            clean = [0, 4, 5]        # rows with no NaN or inf away from the label
            np.testing.assert_allclose(got[clean], gathered[clean], rtol=3e-6, atol=3e-6)


_WIDE = 2**24 - 2          # an index range around 2**24: c in 2**24-2 .. 2**24+1


@pytest.mark.parametrize("label", [2**24 + 1, 2**24, 2**24 - 1, 2**53 + 1])
def test_a_label_past_float32s_integers_compares_as_an_integer(backend, label):
    # float32 rounds 2**24 + 1 to 2**24: the comparison must not (NumPy compares int64)
    x = np.arange(1, 5, dtype=np.float32)
    y = np.array([label], np.int64)
    text = f"Z[c] := where(c == y[0], x[c - {_WIDE}], 0)"
    got = ef.ein(text, x=x, y=y, ranges={"c": range(_WIDE, _WIDE + 4)}, backend=backend)
    want = np.where(np.arange(_WIDE, _WIDE + 4) == y[0], x, 0)
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_a_float32_logit_and_an_int64_label_compare_in_float64(backend):
    # NumPy compares float32 with int64 in float64: 2**24 is not 2**24 + 1
    X = np.array([2.0**24, 2.0**24, 3.0], np.float32)
    y = np.array([2**24 + 1, 2**24, 3], np.int64)
    for text, want in (("Z[n] := where(X[n] == y[n], X[n], 0)", np.where(X == y, X, 0)),
                       ("Z[n] := where(X[n] < y[n], X[n], -1)", np.where(X < y, X, -1))):
        got = ef.ein(text, X=X, y=y, backend=backend)
        assert got.dtype == want.dtype == np.float32, text
        np.testing.assert_array_equal(got, want, err_msg=text)


def _working(text, shapes_ranges=None, **arrays):
    spec = spec_of(text)
    call = bind_call(spec, make_options(ranges=shapes_ranges), (), arrays)
    return call.dtypes.working, call.dtypes.result


def test_the_working_dtype_widens_only_where_float32_cannot_compare():
    X = np.zeros((4, 6), np.float32)
    y = np.zeros(4, np.int64)
    # indices below 2**24: float32 compares them with any int64 label exactly
    assert _working("Z[n,c] := where(c == y[n], X[n,c], 0)", X=X, y=y) == \
        (np.float32, np.float32)
    # an index reaching 2**24: computed in float64, returned float32
    x = np.zeros(4, np.float32)
    assert _working(f"Z[c] := where(c == y[0], x[c - {_WIDE}], 0)",
                    {"c": range(_WIDE, _WIDE + 4)}, x=x, y=y) == (np.float64, np.float32)
    # a float32 logit against an int64 label: NumPy's float64
    assert _working("Z[n] := where(x[n] > y[n], x[n], 0)", x=x, y=y) == \
        (np.float64, np.float32)
    # an int16 label against a float32 logit: exact in float32
    assert _working("Z[n] := where(x[n] > y[n], x[n], 0)", x=x, y=y.astype(np.int16)) == \
        (np.float32, np.float32)


def test_an_arithmetic_operand_of_the_comparison_still_promotes():
    # (y[n] + 1 is arithmetic on y: its dtype reaches the statement, as before)
    X = np.zeros((4, 6), np.float32)
    y = np.zeros(4, np.int64)
    assert ef.ein("Z[n,c] := where(c == y[n] + 1, X[n,c], 0)", X=X, y=y).dtype == np.float64


@pytest.mark.skipif(c_build.find_compiler() is None, reason="a C kernel")
@pytest.mark.parametrize("name", ["one-hot product", "where"])
def test_int64_labels_run_the_float32_row_kernel(row_patterns, name):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((64, 300)).astype(np.float32)
    y = rng.integers(-2, 302, 64).astype(np.int64)
    got = ef.ein(_CROSS_ENTROPY[name], X=X, y=y)
    assert row_patterns == [c_rows.RowPattern.LOGSUMEXP]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _reference(X, y, name == "one-hot product"),
                               rtol=3e-6, atol=3e-6)


def test_torch_tensors_and_gradients():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    X = torch.from_numpy(rng.standard_normal((5, 6)).astype(np.float32)).requires_grad_(True)
    y = torch.tensor([0, 5, 2, -1, 6])          # int64; two labels that name no column
    for name in ("one-hot product", "where"):
        program = ef.compile(_CROSS_ENTROPY[name])
        loss = program(X=X, y=y)
        assert loss.dtype == torch.float32, name
        got = torch.autograd.grad(loss.sum(), X)[0]
        want = torch.softmax(X, 1) - torch.nn.functional.one_hot(
            y.clamp(0, 5), 6) * ((y >= 0) & (y < 6))[:, None]
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(loss, torch.logsumexp(X, 1) - (X * torch.nn.functional.
                                   one_hot(y.clamp(0, 5), 6) * ((y >= 0) & (y < 6))[:, None]
                                   ).sum(1), rtol=1e-5, atol=1e-6)


def test_jax_arrays():
    jnp = pytest.importorskip("jax.numpy")
    X, y = _inputs("float32", "int32")
    for text, want in list(_numpy_forms(X, y).items())[:4]:
        got = ef.ein(text, X=jnp.asarray(X), y=jnp.asarray(y))
        assert got.dtype == jnp.float32, text
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-6, atol=2e-6)


def test_two_compared_arrays_and_a_float_parameter():
    x = np.zeros(4, np.float32)
    y = np.array([2**40, -3, 7, 2**24 + 1], np.int64)
    # an int16 array is below 2**24: float32 compares it with any int64 exactly
    assert _working("Z[n] := where(y[n] == s[n], x[n], 0)", x=x, y=y,
                    s=y.astype(np.int16)) == (np.float32, np.float32)
    # two int64 arrays: neither float type compares them as integers, so they promote
    # as before (the statement is float64)
    assert _working("Z[n] := where(y[n] == t[n], x[n], 0)", x=x, y=y, t=y) == \
        (np.float64, np.float64)
    # a Python float parameter: only its type decides (its value is a kernel argument,
    # not part of a repeated call's signature), and NumPy compares it in float64
    for k in (0.5, 3.0):
        assert _working("Z[n] := where(y[n] > k, x[n], 0)", x=x, y=y, k=k) == \
            (np.float64, np.float32)
    program = ef.compile("Z[n] := where(y[n] > k, x[n] + 1, 0)")
    for k in (0.5, 2.0**24, 2.0**24 + 2, -4.0):        # the repeated call's fast path too
        for _ in range(2):
            got = program(x=x, y=y, k=k)
            want = np.where(y > k, x + 1, 0)
            assert got.dtype == want.dtype == np.float32
            np.testing.assert_array_equal(got, want)


def test_labels_of_every_width_against_an_index_compare_exactly(backend):
    # y[n] == c for labels near each dtype's limits: no match past the row
    X = np.arange(12, dtype=np.float32).reshape(2, 6)
    for dtype in ("int8", "uint8", "int16", "int32", "int64", "uint64"):
        info = np.iinfo(dtype)
        y = np.array([info.max, 5], dtype)
        got = ef.ein("Z[n,c] := where(y[n] == c, X[n,c], 0)", X=X, y=y, backend=backend)
        want = np.where(y[:, None] == np.arange(6), X, 0)
        assert got.dtype == np.float32, dtype
        np.testing.assert_array_equal(got, want, err_msg=dtype)


@pytest.mark.parametrize("labels", ["int8", "int64"])
def test_a_label_both_gathered_and_compared(labels):
    X, y = _inputs("float32", labels)
    t = np.arange(ROWS)[::-1].copy()
    hit = y[:, None] == np.arange(COLS)
    cases = {
        # the gather's subscript and the comparison: neither promotes
        "L[n] := X[n, y[n]] - sum[c](X[n,c] * (c == y[n]))":
            X[np.arange(ROWS), y.astype(np.int64)] - (X * hit).sum(1),
        # a label read through a gather, then compared
        "Z[n,c] := where(c == y[t[n]], X[n,c], 0)":
            np.where(y[t][:, None] == np.arange(COLS), X, 0),
        # no array in arithmetic: NumPy's where of two Python ints is int64
        "Z[n,c] := where(c == y[n], 1, 0)": np.where(hit, 1, 0),
        "B[n,c] := c == y[n]": hit,
    }
    for text, want in cases.items():
        given = {name: array for name, array in (("X", X), ("y", y), ("t", t))
                 if f"{name}[" in text.split(":=")[1]}
        got = ef.ein(text, **given, ranges={"c": COLS})
        assert got.dtype == want.dtype, (text, got.dtype, want.dtype)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6, err_msg=text)
