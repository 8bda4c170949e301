"""Hoisting and CSE of reductions (programs.md section 1: shared work is computed once,
also inside one statement): results equal the brute-force oracle on every backend, the
cost that explain reports is the hoisted one, and the rewrite stays out of the cases
where it could change a result."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.errors import EinfuseError, OutOfBoundsError
from oracle import brute_force

rng = np.random.default_rng(3)

SOFTMAX = "P[i,j] := exp(X[i,j] - max[k](X[i,k])) / sum[k](exp(X[i,k] - max[l](X[i,l])))"
LAYERNORM = ("y[i,j] := (x[i,j] - sum[k](x[i,k]) / 6) / sqrt(sum[k]((x[i,k] - "
             "sum[l](x[i,l]) / 6)**2) / 6 + 0.00001) * g[j] + b[j]")

CASES = [
    # (statement, arrays, ranges for the oracle, temporaries expected)
    (SOFTMAX, {"X": rng.standard_normal((4, 6))}, {"i": (0, 4), "j": (0, 6), "k": (0, 6),
                                                  "l": (0, 6)}, 2),
    (LAYERNORM, {"x": rng.standard_normal((3, 6)), "g": rng.standard_normal(6),
                 "b": rng.standard_normal(6)},
     {"i": (0, 3), "j": (0, 6), "k": (0, 6), "l": (0, 6)}, 2),
    # matrix-vector first: O(N^2) instead of O(N^3)
    ("y[i] := sum[j](B[i,j] * sum[k](C[j,k] * x[k]))",
     {"B": rng.standard_normal((4, 5)), "C": rng.standard_normal((5, 3)),
      "x": rng.standard_normal(3)}, {"i": (0, 4), "j": (0, 5), "k": (0, 3)}, 1),
    # a scalar parameter and a gather inside the hoisted reduction
    ("z[i,j] := A[i,j] * s + logsumexp[k](W[idx[i], k])",
     {"A": rng.standard_normal((3, 4)), "W": rng.standard_normal((5, 6)),
      "idx": np.array([4, 0, 2]), "s": 0.5}, {"i": (0, 3), "j": (0, 4), "k": (0, 6)}, 1),
    # the same reduction twice, and a second one over the column index
    ("n[i,j] := X[i,j] / max[k](abs(X[i,k])) + X[i,j] / max[m](abs(X[i,m])) - "
     "min[r](X[r,j])", {"X": rng.standard_normal((4, 5))},
     {"i": (0, 4), "j": (0, 5), "k": (0, 5), "m": (0, 5), "r": (0, 4)}, 2),
]


@pytest.mark.parametrize("statement,arrays,ranges,temporaries", CASES,
                         ids=["softmax", "layernorm", "matvec-first", "gather+param",
                              "cse"])
def test_hoisted_statement_equals_oracle(backend, statement, arrays, ranges, temporaries):
    kernel = ef.compile(statement, backend=backend)
    assert kernel.hoisted_form is not None
    assert len(kernel.hoisted_form.hoisted.temporaries) == temporaries
    tensors = {k: v for k, v in arrays.items() if not np.isscalar(v)}
    params = {k: v for k, v in arrays.items() if np.isscalar(v)}
    expected = brute_force(statement, ranges, tensors, params)
    np.testing.assert_allclose(kernel(**arrays), expected, rtol=1e-10, atol=1e-12)
    # float32 inputs: computed in float32, as the statement would be
    single = {k: (v.astype(np.float32) if not np.isscalar(v) and v.dtype.kind == "f" else v)
              for k, v in arrays.items()}
    result = kernel(**single)
    assert result.dtype == np.float32
    np.testing.assert_allclose(result, expected, rtol=2e-5, atol=2e-5)


def test_softmax_costs_rows_times_columns():
    """explain's FLOP count is that of the hoisted form: linear in the row length."""
    small = ef.explain(SOFTMAX, shapes={"X": (64, 100)}).flops
    large = ef.explain(SOFTMAX, shapes={"X": (64, 1000)}).flops
    assert large < 12 * small
    text = str(ef.explain(SOFTMAX, shapes={"X": (64, 100)}))
    assert "Computed once" in text


def test_mixed_precision_hoists_in_the_working_dtype():
    """A float32 tensor inside the hoisted reduction, float64 outside: the temporary is
    computed in float64, as the statement computes it."""
    X = (rng.standard_normal((3, 5000)) * 1e3).astype(np.float32)
    A = rng.standard_normal((3, 2))
    got = ef.ein("y[i,j] := A[i,j] + sum[k](X[i,k] * 1.0001)", A=A, X=X)
    want = A + (X.astype(np.float64) * 1.0001).sum(1, keepdims=True)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("statement,options", [
    ("y[i,j] := A[i,j] * sum[k](X[i+1,k])", {}),        # an affine subscript of i
    ("y[i,j] := A[i,j] * sum[k](X[i,k]) + sum[k](X[i,k+1])", {}),  # k shared
    ("y[i,j] := A[i,j] * sum[k](X[i,k])", {"pad": 0.0}),
    ("y[i,j] := A[i,j] * sum[k](X[i,k])", {"ranges": {"i": range(1, 3)}}),
])
def test_not_hoisted_where_ranges_could_change(statement, options):
    kernel = ef.compile(statement, **options)
    assert kernel.hoisted_form is None or not kernel.hoisted_form.hoisted.temporaries


def test_integer_statement_runs_as_written():
    X = rng.integers(-5, 5, (3, 4))
    got = ef.ein("y[i,j] := X[i,j] - max[k](X[i,k])", X=X)
    np.testing.assert_array_equal(got, X - X.max(1, keepdims=True))
    assert got.dtype == X.dtype


def test_gather_outside_the_statements_range_is_not_read():
    """The statement reads idx[i] only for i < 3 (A has 3 rows); idx[3] is out of
    bounds.  The hoisted temporary would read it, so the statement runs as written and
    succeeds, as it always did."""
    A = rng.standard_normal((4, 2))
    W = rng.standard_normal((5, 4))
    idx = np.array([1, 0, 4, 99])
    statement = "y[i,j] := A[i+1,j] + sum[k](W[idx[i], k])"
    assert ef.compile(statement).hoisted_form is not None
    got = ef.ein(statement, A=A, W=W, idx=idx)
    np.testing.assert_allclose(got, A[1:] + W[idx[:3]].sum(1, keepdims=True))


def test_errors_name_the_statement_as_written():
    W = rng.standard_normal((5, 4))
    statement = "y[i,j] := B[i,j] + sum[k](W[idx[i], k])"
    with pytest.raises(OutOfBoundsError) as info:
        ef.ein(statement, B=np.ones((2, 3)), W=W, idx=np.array([0, 7]))
    assert statement in str(info.value)
    with pytest.raises(EinfuseError) as info:
        ef.ein(statement, B=np.ones((3, 3)), W=W, idx=np.array([0, 1]))
    assert statement in str(info.value)


def test_write_statements_hoist():
    X = rng.standard_normal((4, 5))
    out = np.ones((4, 5))
    ef.ein("out[i,j] += X[i,j] - max[k](X[i,k])", X=X, out=out)
    np.testing.assert_allclose(out, 1 + X - X.max(1, keepdims=True))


def test_torch_gradients_through_the_hoisted_form():
    torch = pytest.importorskip("torch")
    X = torch.tensor(rng.standard_normal((3, 5)), requires_grad=True)
    kernel = ef.compile(SOFTMAX)
    assert torch.autograd.gradcheck(lambda X: kernel(X=X), (X,))
    assert torch.autograd.gradgradcheck(lambda X: kernel(X=X), (X,))
    x = torch.tensor(rng.standard_normal((3, 6)), requires_grad=True)
    g = torch.tensor(rng.standard_normal(6), requires_grad=True)
    b = torch.tensor(rng.standard_normal(6), requires_grad=True)
    layernorm = ef.compile(LAYERNORM)
    assert torch.autograd.gradcheck(lambda x, g, b: layernorm(x=x, g=g, b=b), (x, g, b))
    want = torch.nn.functional.layer_norm(x, (6,), g, b, eps=1e-5)
    torch.testing.assert_close(layernorm(x=x, g=g, b=b), want)


def test_jax_through_the_hoisted_form():
    jax = pytest.importorskip("jax")
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        check_jax_through_the_hoisted_form(jax)
    finally:    # x64 left on changed what later tests saw (a sharding test skipped)
        jax.config.update("jax_enable_x64", previous)


def check_jax_through_the_hoisted_form(jax):
    jnp = jax.numpy
    X = jnp.asarray(rng.standard_normal((3, 5)))
    kernel = ef.compile(SOFTMAX)

    def loss(X):
        return (kernel(X=X) * jnp.arange(5.0)).sum()

    def want(X):
        return (jax.nn.softmax(X, axis=1) * jnp.arange(5.0)).sum()

    np.testing.assert_allclose(jax.jit(loss)(X), want(X), rtol=1e-12)
    np.testing.assert_allclose(jax.grad(loss)(X), jax.grad(want)(X), rtol=1e-10, atol=1e-12)
    batched = jax.vmap(lambda X: kernel(X=X))(jnp.stack([X, 2 * X]))
    np.testing.assert_allclose(batched[1], jax.nn.softmax(2 * X, axis=1), rtol=1e-12)


def test_program_statements_hoist():
    X = rng.standard_normal((4, 6))
    program = ef.compile("""m[i] := max[j](X[i,j])
                            P[i,j] := exp(X[i,j] - m[i]) / sum[k](exp(X[i,k] - m[i]))""")
    assert program.statements[1].kernel.hoisted_form is not None
    e = np.exp(X - X.max(1, keepdims=True))
    np.testing.assert_allclose(program(X=X), e / e.sum(1, keepdims=True), rtol=1e-12)


@pytest.mark.skipif(c_build.find_compiler() is None, reason="the C backend's groups")
def test_explain_says_how_the_hoisted_statements_run():
    """'How it runs' of a hoisted form says which kernels its statements run as for
    this call (it said 'each line its own kernel' where one fused kernel ran)."""
    statement = ("P[i,j] := exp(X[i,j] - max[k](X[i,k])) / "
                 "sum[k](exp(X[i,k] - max[l](X[i,l])))")
    fused = ef.explain(statement, X=np.ones((64, 300), np.float32), backend="c")
    assert "the 3 statements above as 1 kernel: statements 1, 2, 3 fused" in str(fused)
    small = ef.explain(statement, X=np.ones((4, 3), np.float32), backend="c")
    assert "the 3 statements above, each its own kernel" in str(small)
