"""Every spelling of layernorm (src/einfuse/bench/spellings.py's LAYERNORM and
spelling_audit.py's LAYERNORM_MORE; issue 31 item 1) runs the layernorm row kernel on
the C backend: ``mean``'s and ``var``'s count is no pass in a fused group (read as its
value for the call's ranges), a mean is hoisted whole, and a centred intermediate
``C[i,j] := X[i,j] - m[i]`` is recomputed in its readers.  The values are the
spelling's as written: against a NumPy float64 reference, the brute-force oracle
(tests/oracle.py) statement by statement, and the generic fused kernel on rows holding
NaN, inf, -inf and -0.0."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.analysis.spec import spec_of
from einfuse.backends.c import build as c_build, fused as c_fused, rows as c_rows
from einfuse.bench.spelling_audit import LAYERNORM_MORE, RMSNORM
from einfuse.bench.spellings import LAYERNORM
from einfuse.lang.split import split_program
from einfuse.plan import row_kernel
from oracle import brute_force

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="row kernels are C kernels")

SPELLINGS = {f"{name}": text for name, text in LAYERNORM + LAYERNORM_MORE}


def texts(n: int):
    return [(name, text.replace("{n}", str(n))) for name, text in SPELLINGS.items()]


def reference(X, g, b):
    X = X.astype(np.float64)
    with np.errstate(all="ignore"):
        m = X.mean(axis=1, keepdims=True)
        v = ((X - m) ** 2).mean(axis=1, keepdims=True)
        return (X - m) / np.sqrt(v + 1e-5) * g + b


def special(rows, cols, dtype, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((rows, cols)).astype(dtype)
    X[1, cols // 2] = np.nan          # a NaN in a row
    X[2, 3] = np.inf                   # an inf entry
    X[3, ::2] = -np.inf                # -inf entries beside finite ones
    X[4] = 0.0
    X[4, ::3] = -0.0                   # signed zeros only: variance 0
    X[5] *= 1e4                        # large values
    g = rng.standard_normal(cols).astype(dtype)
    b = rng.standard_normal(cols).astype(dtype)
    return X, g, b


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_layernorm_spelling_runs_the_row_kernel(row_patterns, dtype):
    X, g, b = special(63, 1000, dtype)
    want = reference(X, g, b)
    tolerance = 2e-4 if dtype == "float32" else 1e-10
    for name, text in texts(1000):
        program = ef.compile(text)
        row_patterns.clear()
        got = program(X=X, g=g, b=b)
        again = program(X=X, g=g, b=b)            # the prepared run
        assert row_patterns == [c_rows.RowPattern.LAYERNORM] * 2, name
        np.testing.assert_array_equal(got, again, err_msg=name)
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance,
                                   equal_nan=True, err_msg=name)


def test_the_row_kernel_gives_the_generic_kernels_special_values(monkeypatch):
    X, g, b = special(63, 1000, "float64", seed=1)
    for name, text in texts(1000):
        fast = ef.compile(text)(X=X, g=g, b=b)
        with monkeypatch.context() as patch:
            patch.setattr(row_kernel, "match", lambda members, rows: None)
            patch.setattr(c_fused, "_fused", {})
            generic = ef.compile(text)(X=X, g=g, b=b)
        assert np.array_equal(np.isnan(fast), np.isnan(generic)), name
        np.testing.assert_allclose(fast, generic, rtol=1e-12, atol=1e-12,
                                   equal_nan=True, err_msg=name)


def oracle_program(text, arrays):
    """The program as written, each statement by the brute-force oracle in turn."""
    values = dict(arrays)
    for piece in split_program(text):
        spec = spec_of(piece.text)
        ranges = {}
        for node in spec.rhs.walk():
            if hasattr(node, "tensor") and node.tensor in values:
                for axis, sub in enumerate(node.indices):
                    if sub.plain_index is not None:
                        ranges[sub.plain_index] = (0, np.shape(values[node.tensor])[axis])
        values[spec.output] = brute_force(piece.text, ranges, values, {})
    return values[spec.output]


def test_every_spelling_is_the_oracles(backend):
    X, g, b = special(6, 9, "float64", seed=2)
    for name, text in texts(9):
        got = np.asarray(ef.ein(text, X=X, g=g, b=b, backend=backend), np.float64)
        want = oracle_program(text, {"X": X, "g": g, "b": b})
        assert np.array_equal(np.isnan(got), np.isnan(want)), name
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, equal_nan=True,
                                   err_msg=name)


def test_a_count_is_its_value_for_the_calls_ranges(row_patterns):
    # the count is the number of points of the call's ranges, whatever the row length:
    # one program, two widths, both run the row kernel with their own divisor
    text = dict(LAYERNORM)["mean then centred mean"]
    program = ef.compile(text)
    for cols in (700, 1300):
        X, g, b = special(40, cols, "float64", seed=cols)
        row_patterns.clear()
        got = program(X=X, g=g, b=b)
        assert row_patterns == [c_rows.RowPattern.LAYERNORM]
        np.testing.assert_allclose(got, reference(X, g, b), rtol=1e-10, atol=1e-10,
                                   equal_nan=True)


def test_the_gradients_of_every_spelling_are_the_explicit_ones():
    torch = pytest.importorskip("torch")
    X, g, b = special(8, 600, "float64", seed=3)
    X = np.nan_to_num(X, nan=0.5, posinf=3.0, neginf=-3.0)     # finite gradients
    seed = np.random.default_rng(4).standard_normal(X.shape)
    found = []
    for name, text in texts(600):
        tensors = [torch.tensor(a, requires_grad=True) for a in (X, g, b)]
        out = ef.compile(text)(X=tensors[0], g=tensors[1], b=tensors[2])
        out.backward(torch.tensor(seed))
        found.append((name, [t.grad.numpy() for t in tensors]))
    tensors = [torch.tensor(a, requires_grad=True) for a in (X, g, b)]
    x, gg, bb = tensors
    m = x.mean(1, keepdim=True)
    v = ((x - m) ** 2).mean(1, keepdim=True)
    ((x - m) / torch.sqrt(v + 1e-5) * gg + bb).backward(torch.tensor(seed))
    for name, grads in found:
        for got, want in zip(grads, tensors):
            np.testing.assert_allclose(got, want.grad.numpy(), rtol=1e-8, atol=1e-9,
                                       err_msg=name)


def test_rmsnorm_spellings_keep_their_values(backend):
    X, g, _ = special(6, 9, "float64", seed=5)
    with np.errstate(all="ignore"):
        want = X / np.sqrt((X * X).mean(axis=1, keepdims=True) + 1e-6) * g
    for name, text in RMSNORM:
        text = text.replace("{n}", "9")
        got = np.asarray(ef.ein(text, X=X, g=g, backend=backend), np.float64)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, equal_nan=True,
                                   err_msg=name)


@pytest.mark.parametrize("text", [
    "m[i] := sum[j](A[i,j]) * sum[j](where(A[i,j] == A[i,j], 1, 1))\nY[i,j] := A[i,j] - m[i]",
    "m[i] := mean[j](A[i,j])\nY[i,j] := A[i,j] - m[i]"])
def test_a_count_in_an_integer_group_keeps_the_statements_dtype(text):
    # a count read as its value is an integer count: the fused member gives the
    # statement's own dtype and values (int64 for the product, float64 for the mean)
    A = np.arange(64 * 200, dtype=np.int32).reshape(64, 200) % 7
    alone = [np.asarray(ef.ein(piece.text, A=A)) for piece in split_program(text)[:1]][0]
    got = ef.compile(text)(A=A)
    if "mean" in text:
        want = A - A.mean(axis=1, keepdims=True)
    else:
        want = A - A.sum(axis=1, keepdims=True).astype(np.int64) * 200
    assert got.dtype == np.result_type(alone.dtype, A.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
