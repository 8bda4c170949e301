"""Row kernels (backends/c/rows.py): a fused softmax or layernorm group runs a
hand-written kernel.  Checked against NumPy (and the generic fused kernel for rows of
NaN, inf and -inf), its exponential against NumPy's over the float32 range, and the
calls it must leave to the generic kernel (other statements, other layouts)."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build, fused as c_fused, rows as c_rows
from einfuse.plan import row_kernel
from program_texts import SOFTMAX, SOFTMAX_STATEMENT as STATEMENT

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="row kernels are C kernels")

LAYERNORM = """mu[i] := sum[j](X[i,j]) / {n}
v[i] := sum[j]((X[i,j] - mu[i])**2) / {n}
y[i,j] := (X[i,j] - mu[i]) / sqrt(v[i] + {eps}) * g[j] + b[j]"""


def _generic(monkeypatch, run):
    """``run()`` on the generic fused kernel (row kernels off)."""
    with monkeypatch.context() as patch:
        patch.setattr(row_kernel, "match", lambda members, rows: None)
        patch.setattr(c_fused, "_fused", {})
        return run()


def _softmax(X):
    with np.errstate(all="ignore"):
        e = np.exp(X - X.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)


def _special(rows, cols, dtype):
    X = np.random.default_rng(rows * cols).standard_normal((rows, cols)).astype(dtype)
    X[1, cols // 2] = np.nan           # a NaN row
    X[2, :] = -np.inf                  # every entry -inf: 0/0
    X[3, cols - 1] = np.inf            # an inf entry
    X[4, ::2] = -np.inf                # -inf entries beside finite ones
    X[5] = 0.0
    X[5, ::3] = -0.0                   # signed zeros only
    X[6] *= 1e4                        # exponentials that underflow
    X[7] *= 60                         # subnormal exponentials
    return X


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(63, 1000), (41, 2049), (301, 37), (9, 6000), (300, 16), (2000, 3)])
@pytest.mark.parametrize("source", [SOFTMAX, STATEMENT], ids=["program", "statement"])
def test_softmax_rows(monkeypatch, row_patterns, source, shape, dtype):
    X = _special(*shape, dtype)
    program = ef.compile(source)
    out = program(X=X)
    again = program(X=X)                     # the prepared run
    assert row_patterns == [c_rows.RowPattern.SOFTMAX] * 2
    np.testing.assert_array_equal(out, again)
    tolerance = 2e-6 if dtype == "float32" else 1e-14
    np.testing.assert_allclose(out, _softmax(X), rtol=tolerance, atol=tolerance * 1e-3)
    generic = _generic(monkeypatch, lambda: ef.compile(source)(X=X))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(generic))
    np.testing.assert_allclose(out, generic, rtol=tolerance, atol=tolerance * 1e-3)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(63, 1000), (41, 2049), (301, 37), (9, 6000)])
def test_layernorm_rows(monkeypatch, row_patterns, shape, dtype):
    rng = np.random.default_rng(shape[1])
    X = (rng.standard_normal(shape) * 3 + 5).astype(dtype)
    X[1] = 2.5                                      # variance 0: divided by sqrt(eps)
    X[2, 7] = np.nan
    X[3, 1] = np.inf
    X[4, ::2], X[4, 1::2] = 2.0**66, -2.0**66      # sums exact; squares past float32: inf
    g, b = (rng.standard_normal(shape[1]).astype(dtype) for _ in range(2))
    source = LAYERNORM.format(n=shape[1], eps=1e-5)
    program = ef.compile(source, outputs=("y", "mu", "v"))
    y, mu, v = program(X=X, g=g, b=b)
    y2, _, _ = program(X=X, g=g, b=b)
    assert row_patterns == [c_rows.RowPattern.LAYERNORM] * 2
    np.testing.assert_array_equal(y, y2)
    with np.errstate(all="ignore"):
        mean = X.mean(1)
        var = ((X - mean[:, None]) ** 2).mean(1)
        expected = (X - mean[:, None]) / np.sqrt(var[:, None] + 1e-5) * g + b
    tolerance = 2e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(mu, mean, rtol=tolerance)
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(v, var.astype(dtype), rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(y, expected, rtol=tolerance, atol=tolerance)
    generic = _generic(monkeypatch, lambda: ef.compile(source)(X=X, g=g, b=b))
    np.testing.assert_allclose(y, generic, rtol=tolerance, atol=tolerance)


def test_exponential_within_one_unit_float32():
    # every 401st float32 bit pattern (10 million values over the whole range) and the
    # edges: overflow, the last finite, subnormal results, underflow to 0, inf, NaN
    bits = np.arange(0, 1 << 32, 401, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), np.array(
        [88.72283, 88.72284, 89.0, -87.33655, -87.5, -100.0, -103.97, -103.98, -104.0,
         0.0, -0.0, 1e-30, np.inf, -np.inf, np.nan], np.float32)])
    got = c_rows.exp_values(x)
    with np.errstate(all="ignore"):
        want = np.exp(x.astype(np.float64)).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    units = np.abs(got[~nan].view(np.int32).astype(np.int64) -
                   want[~nan].view(np.int32).astype(np.int64))
    assert units.max() <= 1


def test_exponential_within_one_unit_float64():
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.uniform(-760, 720, 1 << 20), rng.standard_normal(1 << 16),
                        [709.782712893384, 709.79, -708.39, -745.1, -745.2, 0.0, -0.0,
                         np.inf, -np.inf, np.nan]])
    got = c_rows.exp_values(x)
    with np.errstate(all="ignore"):
        want = np.exp(x)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    units = np.abs(got[~nan].view(np.int64) - want[~nan].view(np.int64))
    assert units.max() <= 2          # NumPy's exp is itself within a unit


@pytest.mark.parametrize("case", ["exponentials asked for", "shifted range", "transposed",
                                  "other function", "other layernorm"])
def test_other_groups_run_the_generic_kernel(row_patterns, case):
    X = np.random.default_rng(2).standard_normal((200, 90))
    if case == "exponentials asked for":
        P, e = ef.compile(SOFTMAX, outputs=("P", "e"))(X=X)
        np.testing.assert_allclose(e, np.exp(X - X.max(1, keepdims=True)), rtol=1e-14)
    elif case == "shifted range":
        P = ef.compile(SOFTMAX, ranges={"k": range(1, 90)})(X=X)
        e = np.exp(X - X.max(1, keepdims=True))
        np.testing.assert_allclose(P, e / e[:, 1:].sum(1, keepdims=True), rtol=1e-12)
    elif case == "transposed":
        P = ef.compile(SOFTMAX)(X=X.T)          # rows of unit stride only
        np.testing.assert_allclose(P, _softmax(X.T), rtol=1e-12)
    elif case == "other function":
        P = ef.compile(SOFTMAX.replace("exp(", "tanh("))(X=X)
        t = np.tanh(X - X.max(1, keepdims=True))
        np.testing.assert_allclose(P, t / t.sum(1, keepdims=True), rtol=1e-10)
    else:
        g = np.ones(90)
        y = ef.compile(LAYERNORM.format(n=90, eps=1e-5).replace("**2", "**3"))(X=X, g=g, b=g)
        mu = X.mean(1, keepdims=True)
        v = ((X - mu) ** 3).mean(1, keepdims=True)
        with np.errstate(invalid="ignore"):
            np.testing.assert_allclose(y, (X - mu) / np.sqrt(v + 1e-5) + 1, rtol=1e-10)
    assert row_patterns == []


def test_strided_rows_and_changed_layouts(row_patterns):
    # rows 2 apart (a view), then contiguous rows, then an int array: each call right
    base = np.random.default_rng(5).standard_normal((400, 130)).astype(np.float32)
    program = ef.compile(SOFTMAX)
    for X in (base[::2], base[::2], base[:200], base[::-2], np.ascontiguousarray(base[::2])):
        np.testing.assert_allclose(program(X=X), _softmax(X), rtol=2e-6, atol=1e-9)
    assert set(row_patterns) == {c_rows.RowPattern.SOFTMAX} and len(row_patterns) == 5
    ints = np.arange(200 * 130).reshape(200, 130) % 7
    np.testing.assert_allclose(program(X=ints), _softmax(ints.astype(float)), rtol=1e-12)


def test_threads_do_not_change_bits(row_patterns):
    X = np.random.default_rng(6).standard_normal((512, 300)).astype(np.float32)
    one = ef.compile(STATEMENT, threads=1)(X=X)
    two = ef.compile(STATEMENT, threads=2)(X=X)
    assert len(row_patterns) == 2
    np.testing.assert_array_equal(one, two)


def test_explain_names_the_row_kernel():
    shown = str(ef.explain(SOFTMAX, shapes={"X": (256, 1024)}))
    assert "statements 1, 2, 3 (fused: the softmax row kernel" in shown
    shown = str(ef.explain(LAYERNORM.format(n=512, eps=1e-5),
                           shapes={"X": (64, 512), "g": (512,), "b": (512,)}))
    assert "the layernorm row kernel" in shown
    shown = str(ef.explain(SOFTMAX, shapes={"X": (256, 1024)}, outputs=("P", "e")))
    assert "row kernel" not in shown and "statements 1, 2, 3 (fused" in shown
