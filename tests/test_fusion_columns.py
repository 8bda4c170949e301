"""Column sums inside a fused loop over rows (plan/fuse_columns.py): a statement summing
over the group's row index (layernorm's dg[j], db[j]) joins the group and adds each row
into per-thread accumulators (compensated; float64 for float32).  Results equal the statements run one by one
(NumPy, float64 sums) up to rounding; inf and NaN columns are those of a plain sum;
statements reading a column sum run after the group."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build, fused as c_fused

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="fusion runs C kernels")

rng = np.random.default_rng(11)


@pytest.fixture
def groups(monkeypatch):
    """Per fused kernel run: (statement output, is a column member) of its members."""
    seen = []
    run = c_fused.run

    def spy(members, thread_rows=frozenset()):
        seen.append([(m.column.kernel.spec.output if m.column else m.kernel.spec.output,
                      m.column is not None) for m in members])
        return run(members, thread_rows)
    monkeypatch.setattr(c_fused, "run", spy)
    return seen


LAYERNORM_GRADIENTS = """mu[i] := sum[j](X[i,j]) / 61
r[i] := 1 / sqrt(sum[j]((X[i,j] - mu[i])**2) / 61 + 0.00001)
dg[j] := dy[i,j] * (X[i,j] - mu[i]) * r[i]
db[j] := dy[i,j]"""


def layernorm_gradients(X, dy):
    mu = X.mean(1, keepdims=True)
    r = 1 / np.sqrt(((X - mu) ** 2).mean(1, keepdims=True) + 1e-5)
    return (dy * (X - mu) * r).sum(0), dy.sum(0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [1000, 90])
def test_column_sums_join_the_loop_over_rows(groups, dtype, threads, rows):
    X = rng.standard_normal((rows, 61))
    dy = rng.standard_normal((rows, 61))
    program = ef.compile(LAYERNORM_GRADIENTS, outputs=("dg", "db"), threads=threads)
    want = layernorm_gradients(X, dy)
    tolerance = 1e-12 if dtype == np.float64 else 2e-5
    for _ in range(2):        # the first call groups and binds, the second is prepared
        got = program(X=X.astype(dtype), dy=dy.astype(dtype))
        for value, reference in zip(got, want):
            assert value.dtype == dtype and value.shape == (61,)
            np.testing.assert_allclose(value, reference, rtol=tolerance, atol=tolerance)
    assert groups == [[("mu", False), ("r", False), ("dg", True), ("db", True)]]


def test_non_finite_columns_are_those_of_a_plain_sum(groups):
    X = rng.standard_normal((500, 70))
    X[100, 0] = np.inf                       # inf
    X[7, 1], X[400, 1] = np.inf, -np.inf     # nan
    X[250, 2] = np.nan                       # nan
    X[3, 3] = -np.inf                        # -inf
    X[:, 4] = -0.0                           # +0, as any sum starting at 0
    program = ef.compile("s[j] := X[i,j] * 2; t[j] := X[i,j] * 3", outputs=("s", "t"))
    s, t = program(X=X)
    with np.errstate(invalid="ignore"):
        want_s, want_t = (X * 2).sum(0), (X * 3).sum(0)
    np.testing.assert_array_equal(np.isnan(s), np.isnan(want_s))
    np.testing.assert_array_equal(s[:4], want_s[:4])
    np.testing.assert_array_equal(t[:4], want_t[:4])
    assert s[4] == 0 and not np.signbit(s[4])
    np.testing.assert_allclose(s[5:], want_s[5:], rtol=1e-12)
    assert groups == [[("s", True), ("t", True)]]


def test_long_columns_are_summed_with_compensation(groups):
    """1e8, 1, -1e8, 1, ...: a plain float32 sum loses every 1; the compensated one
    keeps them (the exact total, 2 per group of four rows)."""
    column = np.tile(np.array([1e8, 1, -1e8, 1], np.float32), 5000)
    X = np.stack([column, column[::-1].copy()] * 32, axis=1)
    program = ef.compile("a[j] := X[i,j]; b[j] := X[i,j] * 1", outputs=("a", "b"),
                         threads=1)
    a, b = program(X=X)
    np.testing.assert_array_equal(a, np.float32(10000))
    np.testing.assert_array_equal(b, np.float32(10000))
    assert groups == [[("a", True), ("b", True)]]


@pytest.mark.parametrize("width", [3, 7, 33, 130, 1000])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_float32_columns_of_any_width_on_any_threads(groups, width, threads):
    """float32 columns are summed in float64 per thread, in rows padded to whole cache
    lines: every width (padded or not) and thread count gives the float64 sum rounded
    once; the prepared (repeated) call too."""
    X = rng.standard_normal((2001, width)).astype(np.float32)
    w = rng.standard_normal(2001).astype(np.float32)
    program = ef.compile("n[i] := sum[j](X[i,j]**2); s[j] := X[i,j] * w[i] / n[i]",
                         outputs=("s",), threads=threads)
    n = (X.astype(np.float64) ** 2).sum(1)
    want = (X * (w / n.astype(np.float32))[:, None]).astype(np.float64).sum(0)
    for _ in range(3):
        got = program(X=X, w=w)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5)
    assert groups and all(g == [("n", False), ("s", True)] for g in groups)


def test_a_statement_reading_a_column_sum_runs_after_the_group(groups):
    X = rng.standard_normal((300, 40))
    program = ef.compile("""mu[i] := sum[j](X[i,j]) / 40
                            s[j] := X[i,j] - mu[i]
                            y[i,j] := X[i,j] * s[j]""", outputs=("y", "s"))
    y, s = program(X=X)
    want_s = (X - X.mean(1, keepdims=True)).sum(0)
    np.testing.assert_allclose(s, want_s, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(y, X * want_s, rtol=1e-10, atol=1e-10)
    assert groups == [[("mu", False), ("s", True)]]


def test_column_sums_keeping_two_axes(groups):
    X = rng.standard_normal((200, 5, 7))
    w = rng.standard_normal(200)
    program = ef.compile("n[i] := sum[j,k](X[i,j,k]**2); s[j,k] := X[i,j,k] * w[i] / n[i]")
    got = program(X=X, w=w)
    want = (X * (w / (X ** 2).sum((1, 2)))[:, None, None]).sum(0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert groups == [[("n", False), ("s", True)]]


def test_layernorm_backward_under_torch_autograd_fuses_the_column_sums(groups):
    torch = pytest.importorskip("torch")
    X = torch.tensor(rng.standard_normal((300, 50)), requires_grad=True)
    g = torch.tensor(rng.standard_normal(50), requires_grad=True)
    b = torch.tensor(rng.standard_normal(50), requires_grad=True)
    seed = torch.tensor(rng.standard_normal((300, 50)))
    program = ef.compile("""mu[i] := sum[j](X[i,j]) / 50
        v[i] := sum[j]((X[i,j] - mu[i])**2) / 50
        y[i,j] := (X[i,j] - mu[i]) / sqrt(v[i] + 0.00001) * g[j] + b[j]""")
    program(X=X, g=g, b=b).backward(seed)
    ours = [t.grad.clone() for t in (X, g, b)]
    for t in (X, g, b):
        t.grad = None
    torch.nn.functional.layer_norm(X, (50,), g, b, eps=1e-5).backward(seed)
    for value, reference in zip(ours, (X.grad, g.grad, b.grad)):
        torch.testing.assert_close(value, reference, rtol=1e-10, atol=1e-10)
    backward = [g for g in groups if any(column for _, column in g)]
    assert backward and {"dg_1", "db_1"} <= {name for name, column in backward[0] if column}


def test_explain_names_the_column_sums():
    text = str(ef.explain(LAYERNORM_GRADIENTS, shapes={"X": (1000, 61), "dy": (1000, 61)}))
    assert "kernel 1: statements 1, 2, 3, 4 (fused" in text
    assert "3, 4 summed over the rows" in text


def test_columns_too_long_for_the_cache_keep_their_own_kernel(groups):
    X = rng.standard_normal((3, 20000))          # 160 kB accumulators per thread
    program = ef.compile("mu[i] := sum[j](X[i,j]); s[j] := X[i,j] - mu[i]", outputs=("s",))
    np.testing.assert_allclose(program(X=X), (X - X.sum(1, keepdims=True)).sum(0),
                               rtol=1e-12, atol=1e-9)
    assert all(not column for g in groups for _, column in g)


def test_integer_columns_keep_their_own_kernel(groups):
    X = rng.integers(-1000, 1000, (300, 40))
    program = ef.compile("m[i] := max[j](X[i,j]); s[j] := X[i,j] - m[i]", outputs=("s",))
    np.testing.assert_array_equal(program(X=X), (X - X.max(1, keepdims=True)).sum(0))
    assert all(not column for g in groups for _, column in g)


def test_a_contraction_over_the_rows_stays_with_blas(groups):
    W = rng.standard_normal((300, 40))
    program = ef.compile("n[i] := sum[j](W[i,j]**2); s[o] := W[i,o] * n[i]", outputs=("s",))
    np.testing.assert_allclose(program(W=W), W.T @ (W ** 2).sum(1), rtol=1e-12)
    assert all(not column for g in groups for _, column in g)
