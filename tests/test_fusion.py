"""Fusion groups (schedule/fusion.py): consecutive statements that share their outer
parallel loop run as one C kernel, reading each row of an intermediate right after
writing it; results equal the statements run one by one, and statements that must not
share a loop (another row read, a column reduction, an intermediate used as an index
array) run alone."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build, fused as c_fused
from einfuse.errors import OutOfBoundsError

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="fusion runs C kernels")

rng = np.random.default_rng(7)
X = rng.standard_normal((70, 90))
G, B = rng.standard_normal(90), rng.standard_normal(90)


@pytest.fixture
def groups(monkeypatch):
    """The statements of each fused kernel that runs."""
    seen = []
    run = c_fused.run

    def spy(members, thread_rows=frozenset()):
        seen.append([m.kernel.spec.output for m in members])
        return run(members, thread_rows)
    monkeypatch.setattr(c_fused, "run", spy)
    return seen


def softmax(X):
    e = np.exp(X - X.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def layernorm(x):
    mu = x.mean(1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + 1e-5) * G + B


FUSED = [
    ("softmax program", """m[i] := max[j](X[i,j])
                          e[i,j] := exp(X[i,j] - m[i])
                          P[i,j] := e[i,j] / sum[k](e[i,k])""", softmax, 4),
    # hoisted: the max, the shared row exp(X - max) (runtime/hoisted.py), its sum, P
    ("softmax statement",
     "P[i,j] := exp(X[i,j] - max[k](X[i,k])) / sum[k](exp(X[i,k] - max[l](X[i,l])))",
     softmax, 4),
    ("layernorm program", """mu[i] := sum[j](X[i,j]) / 90
                            v[i] := sum[j]((X[i,j] - mu[i])**2) / 90
                            y[i,j] := (X[i,j] - mu[i]) / sqrt(v[i] + 0.00001) * G[j] + B[j]""",
     layernorm, 3),
    ("layernorm statement",
     "y[i,j] := (X[i,j] - sum[k](X[i,k]) / 90) / sqrt(sum[k]((X[i,k] - sum[l](X[i,l]) / 90)"
     "**2) / 90 + 0.00001) * G[j] + B[j]", layernorm, 3),
    ("rmsnorm", """r[a] := sqrt(sum[b](X[a,b]**2) / 90 + 0.000001)
                  y[i,j] := X[i,j] / r[i] * G[j]""",
     lambda X: X / np.sqrt((X ** 2).mean(1, keepdims=True) + 1e-6) * G, 2),
]


@pytest.mark.parametrize("name,source,reference,members", FUSED, ids=[c[0] for c in FUSED])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fused_groups_equal_the_reference(groups, name, source, reference, members, dtype):
    arrays = {"X": X.astype(dtype), "G": G.astype(dtype), "B": B.astype(dtype)}
    program = ef.compile(source, backend="c")
    got = program(**{name: arrays[name] for name in program.inputs})
    assert got.dtype == dtype
    tolerance = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(got, reference(X), rtol=tolerance, atol=tolerance)
    assert [len(g) for g in groups] == [members]


@pytest.mark.parametrize("source,reference", [
    # the row maximum read at another row (m[j]): not the row just written
    ("m[i] := max[j](S[i,j]); y[i,j] := S[i,j] * m[j]",
     lambda S: S * S.max(1)[None, :]),
    # a column reduction: its loop runs over j, the next statement's over i
    ("m[j] := max[i](S[i,j]); y[i,j] := S[i,j] - m[j]", lambda S: S - S.max(0)),
])
def test_statements_that_cannot_share_a_loop_run_alone(groups, source, reference):
    S = rng.standard_normal((80, 80))
    np.testing.assert_allclose(ef.ein(source, S=S), reference(S), rtol=1e-12)
    assert groups == []


def test_intermediate_used_as_an_index_array_is_not_fused(groups):
    W = rng.standard_normal((80, 90))
    idx = np.arange(70)[::-1].copy()
    got = ef.ein("m[i] := idx[i] + 0; y[i,j] := W[m[i], j] * 2", idx=idx, W=W)
    np.testing.assert_allclose(got, W[idx] * 2)
    assert groups == []


def test_out_of_bounds_gather_in_a_group_raises_the_statements_error(groups):
    W = rng.standard_normal((70, 90))
    idx = np.concatenate([np.arange(69), [500]])
    statement = "y[i,j] := W[idx[i], j] / m[i]"
    with pytest.raises(OutOfBoundsError) as info:
        ef.ein("m[i] := max[j](X[i,j])\n" + statement, X=X, W=W, idx=idx)
    assert statement in str(info.value)
    assert [len(g) for g in groups] == [2]


def test_small_calls_run_statement_by_statement(groups):
    small = X[:3, :4]
    np.testing.assert_allclose(ef.ein("m[i] := max[j](S[i,j]); y[i,j] := S[i,j] - m[i]",
                                      S=small), small - small.max(1, keepdims=True))
    assert groups == []


def test_group_stops_at_a_statement_that_cannot_join(groups):
    """softmax's statements fuse; the loss over all rows (no output index) runs after."""
    program = ef.compile("""m[i] := max[j](X[i,j])
                            z[i] := m[i] + log(sum[j](exp(X[i,j] - m[i])))
                            loss := sum[i](z[i]) / 70""")
    z = X.max(1) + np.log(np.exp(X - X.max(1, keepdims=True)).sum(1))
    np.testing.assert_allclose(program(X=X), z.mean(), rtol=1e-12)
    assert groups == [["m", "z"]]



def test_intermediates_read_only_inside_a_group_live_in_per_thread_rows(groups):
    """e is read only at the row just written, inside the group: it lives as one row per
    thread (explain says so), on one thread or several, and results do not change."""
    X = np.random.default_rng(3).standard_normal((300, 90))
    source = """m[i] := max[j](X[i,j])
                e[i,j,c] := exp(X[i,j] - m[i]) * (c + 1)
                P[i,j] := e[i,j,1] / sum[k](e[i,k,0])"""
    expected = 2 * softmax(X)
    for threads in (1, 2, None):
        np.testing.assert_allclose(ef.compile(source, threads=threads, ranges={"c": 2})(X=X),
                                   expected, rtol=1e-12)
    text = str(ef.explain(source, shapes={"X": X.shape}, ranges={"c": 2}))
    assert "e  float32 300x90x2  720 B per thread" in text   # shapes= means float32
    assert "m  float32 300" in text          # m is 1-d: materialised (one value a row)


def test_intermediates_needed_after_the_group_are_materialised():
    X = np.random.default_rng(4).standard_normal((300, 90))
    e, P = ef.compile("""m[i] := max[j](X[i,j])
                         e[i,j] := exp(X[i,j] - m[i])
                         P[i,j] := e[i,j] / sum[k](e[i,k])""", outputs=("e", "P"))(X=X)
    np.testing.assert_allclose(e, np.exp(X - X.max(1, keepdims=True)), rtol=1e-14)
    np.testing.assert_allclose(P, softmax(X), rtol=1e-12)
    # read by a statement after a statement that cannot join the group
    got = ef.ein("""e[i,j] := exp(X[i,j])
                    s[i] := sum[k](e[i,k])
                    t[i,j] := e[j,i] * 0 + X[i,j] / s[i]""", X=X[:, :90].T @ X[:, :90])
    Y = X[:, :90].T @ X[:, :90]
    np.testing.assert_allclose(got, Y / np.exp(Y).sum(1, keepdims=True), rtol=1e-12)


def test_a_division_after_a_row_maximum_in_one_kernel_keeps_nan_and_inf(groups):
    """The group's kernel is compiled with reciprocal math when only members without a
    division (the row maximum) would forbid it: NaN and inf rows still come out as
    NumPy gives them, and the others within rounding."""
    X2 = rng.standard_normal((70, 90)).astype(np.float32)
    X2[3, 5] = np.nan
    X2[4, :] = -np.inf
    X2[5, 7] = np.inf
    got = ef.ein("""m[i] := max[j](X[i,j])
                    e[i,j] := exp(X[i,j] - m[i])
                    P[i,j] := e[i,j] / sum[k](e[i,k])""", X=X2, backend="c")
    assert groups and len(groups[0]) >= 3
    with np.errstate(invalid="ignore"):
        want = softmax(X2.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
