"""A reduction over an elementwise function of a contraction (plan/epilogue_blocks.py):
``o[i] := sum[j](f(sum[k](...)))`` runs as a register block over (j rows, i lanes)
with f as its epilogue.  Values against tests/oracle.py and the NumPy backend, for
several f and outer reductions, on ragged extents (i past the lane tile, j past the
rows, k not a multiple of a vector), sums long enough for the compensated branches,
NaN/inf inputs, float32/float64, on the native target and on AVX2
(``EINFUSE_CPU=avx2`` in a child process)."""

import os
import subprocess
import sys

import numpy as np
import pytest

import einfuse as ef
from einfuse.analysis import machine as machine_module

from oracle import brute_force

pytest.importorskip("einfuse.backends.c.build")

# (statement, inputs by name -> (shape over "i", "j", "k" extents)); i and j ragged
STATEMENTS = [
    ("o[i] := sum[j](exp(-sum[k]((w[k,i] - x[k,j])**2) * 0.5))", {"w": "ki", "x": "kj"}),
    ("o[i] := sum[j](tanh(sum[k](w[k,i] * x[k,j])) * b[j])", {"w": "ki", "x": "kj", "b": "j"}),
    ("o[i] := sum[j](sqrt(sum[k]((w[k,i] - x[k,j])**2)))", {"w": "ki", "x": "kj"}),
    ("o[i] := sum[j](where(sum[k](w[k,i] * x[k,j]) > 0.5, 1.0, -2.0))",
     {"w": "ki", "x": "kj"}),
    ("o[i] := max[j](sum[k]((w[k,i] - x[k,j])**2) - b[j])", {"w": "ki", "x": "kj", "b": "j"}),
    ("o[i] := min[j](exp(sum[k](w[k,i] * x[k,j])))", {"w": "ki", "x": "kj"}),
]


def _inputs(names, extents, dtype, seed=0, scale=0.3):
    rng = np.random.default_rng(seed)
    return {name: (rng.standard_normal(tuple(extents[c] for c in axes)) * scale).astype(dtype)
            for name, axes in names.items()}


def _ranges(extents):
    return {name: (0, n) for name, n in extents.items()}


def _check(statement, arrays, extents, got, dtype):
    want = brute_force(statement, _ranges(extents),
                       {n: a.astype(np.float64) for n, a in arrays.items()})
    rtol = 2e-5 if dtype == np.float32 else 1e-12
    scale = max(1.0, float(np.max(np.abs(want))))
    np.testing.assert_allclose(np.asarray(got), want, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("statement, names", STATEMENTS)
def test_values_against_the_oracle(statement, names, dtype):
    extents = {"i": 37, "j": 23, "k": 11}     # a partial lane tile, a partial row block
    arrays = _inputs(names, extents, dtype)
    got = ef.ein(statement, **arrays, backend="c")
    assert np.asarray(got).dtype == dtype
    _check(statement, arrays, extents, got, dtype)


def test_the_block_is_chosen_over_the_reduced_index():
    # the schedule names the register block over (j rows, i lanes), not a lane loop
    # of scalar chains over k
    w, x = (np.ones((40, 70), np.float32) for _ in range(2))
    text = str(ef.explain("o[i] := sum[j](exp(-sum[k]((w[k,i] - x[k,j])**2)))", w=w, x=x))
    assert "register block j x i" in text
    # x[k, j] is read across the block's rows at each k: explain names its copy
    # along k, as the run makes it
    report = ef.explain("o[i] := sum[j](exp(-sum[k]((w[k,i] - x[k,j])**2)))", backend="c",
                        shapes={"w": (96, 1000), "x": (96, 1024)})
    assert "x (copied" in (report.schedule or "")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_long_outer_sum_takes_the_compensated_chunks(dtype):
    # 1500 > 1024 terms over j: chunks of whole row blocks folded with compensation;
    # each term is about 0.1, so a plain float32 running sum would drift
    extents = {"i": 5, "j": 1500, "k": 9}
    arrays = _inputs({"w": "ki", "x": "kj"}, extents, dtype, seed=3, scale=0.01)
    statement = "o[i] := sum[j](exp(-sum[k]((w[k,i] - x[k,j])**2)) * 0.1)"
    got = np.asarray(ef.ein(statement, **arrays, backend="c"))
    _check(statement, arrays, extents, got, dtype)
    want = brute_force(statement, _ranges(extents),
                       {n: a.astype(np.float64) for n, a in arrays.items()})
    if dtype == np.float32:     # (float64's exp error, not the sum's, dominates)
        assert np.all(np.abs(got - want) <= 4 * np.finfo(dtype).eps * np.abs(want))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_long_inner_sum(dtype):
    extents = {"i": 19, "j": 8, "k": 1100}     # > 1024 terms over k: its blocked branch
    arrays = _inputs({"w": "ki", "x": "kj"}, extents, dtype, seed=5, scale=0.05)
    statement = "o[i] := sum[j](exp(-sum[k]((w[k,i] - x[k,j])**2)))"
    _check(statement, arrays, extents, ef.ein(statement, **arrays, backend="c"), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("statement", [
    "o[i] := sum[j](exp(-sum[k]((w[k,i] - x[k,j])**2)))",
    "o[i] := max[j](sum[k](w[k,i] * x[k,j]))",
    "o[i] := min[j](sum[k](w[k,i] * x[k,j]))",
])
def test_nan_and_inf_as_numpy(statement, dtype):
    # NaN and +-inf in both operands: exp(-inf) = 0, inf - inf = NaN, a NaN term makes
    # the row's sum/max/min NaN -- as the NumPy backend computes the statement
    extents = {"i": 29, "j": 17, "k": 9}
    arrays = _inputs({"w": "ki", "x": "kj"}, extents, dtype, seed=7)
    arrays["w"][2, 3] = np.inf
    arrays["w"][4, 20] = np.nan
    arrays["x"][1, 5] = -np.inf
    arrays["x"][6, 11] = np.inf
    arrays["w"][1, 7] = np.inf     # with x[1, 5] = -inf: inf - (-inf) = inf
    with np.errstate(all="ignore"):
        want = np.asarray(ef.ein(statement, **arrays, backend="numpy"))
        got = np.asarray(ef.ein(statement, **arrays, backend="c"))
    assert np.isnan(want).any() or np.isinf(want).any() or "exp" in statement
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    rtol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=rtol)


CHILD = """
import numpy as np, einfuse as ef
rng = np.random.default_rng(11)
res = {}
for dtype in (np.float32, np.float64):
    tag = np.dtype(dtype).name
    w = (rng.standard_normal((13, 45)) * 0.3).astype(dtype)
    x = (rng.standard_normal((13, 1100)) * 0.3).astype(dtype)
    b = rng.standard_normal(1100).astype(dtype)
    res["w_" + tag], res["x_" + tag], res["b_" + tag] = w, x, b
    for n, st in enumerate(STATEMENTS):
        named = {"w": w, "x": x, "b": b}
        res[f"{n}_{tag}"] = ef.ein(st, **{k: v for k, v in named.items()
                                        if k + "[" in st}, backend="c")
np.savez(OUT, **res)
"""

TARGET_STATEMENTS = [
    "o[i] := sum[j](exp(-sum[k]((w[k,i] - x[k,j])**2) * 0.5) * b[j])",
    "o[i] := sum[j](tanh(sum[k](w[k,i] * x[k,j])))",
    "o[i] := max[j](sum[k]((w[k,i] - x[k,j])**2) - b[j])",
]


@pytest.mark.slow      # (a child process per target, each compiling its kernels cold)
@pytest.mark.parametrize("target", ["native", "avx2"])
def test_either_target_against_numpy(target, tmp_path):
    # 45 lanes (AVX2 tiles of 16, AVX-512 of 64: both ragged), 1100 terms over j (the
    # compensated chunks), 13 over k
    if target == "avx2" and not {"avx2", "fma", "bmi2"} <= machine_module._cpu_flags():
        pytest.skip("the host cannot run avx2 code")
    out = tmp_path / "out.npz"
    env = dict(os.environ, EINFUSE_CPU=target)
    subprocess.run([sys.executable, "-c", f"OUT = {str(out)!r}\nSTATEMENTS = "
                    f"{TARGET_STATEMENTS!r}\n" + CHILD], env=env, check=True, timeout=600)
    got = np.load(out)
    for tag, rtol in (("float32", 2e-5), ("float64", 1e-12)):
        w, x, b = (got[f"{n}_{tag}"].astype(np.float64) for n in "wxb")
        d2 = ((w[:, :, None] - x[:, None, :]) ** 2).sum(0)
        wants = [(np.exp(-d2 * 0.5) * b).sum(1), np.tanh(w.T @ x).sum(1),
                 (d2 - b).max(1)]
        for n, want in enumerate(wants):
            np.testing.assert_allclose(got[f"{n}_{tag}"], want, rtol=rtol,
                                       atol=rtol * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_major_operands(dtype):
    # w[i, k], x[j, k] (cdist's layout): the run packs w so that the output lanes walk
    # it and blocks j in rows; big enough for the packing (plan/lane_layout.MIN_WORK),
    # ragged on every extent
    rng = np.random.default_rng(13)
    w = (rng.standard_normal((83, 41)) * 0.2).astype(dtype)
    x = (rng.standard_normal((101, 41)) * 0.2).astype(dtype)
    statement = "o[i] := sum[j](exp(-sum[k]((w[i,k] - x[j,k])**2) * 0.5))"
    got = np.asarray(ef.ein(statement, w=w, x=x, backend="c"))
    d2 = ((w.astype(np.float64)[:, None, :] - x.astype(np.float64)[None, :, :]) ** 2).sum(-1)
    want = np.exp(-d2 * 0.5).sum(1)
    rtol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=rtol)
    report = ef.explain(statement, backend="c", shapes={"w": w.shape, "x": x.shape})
    assert "register block j x i" in (report.schedule or "")
