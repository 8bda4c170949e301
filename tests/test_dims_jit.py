"""ef.jit of functions that build named expressions: the expression's program is part
of the one converted kernel (frontends/jaxpr_statements.py), forward and jax.grad,
inside lax loops too, against the same functions in jax.numpy."""

import math

import numpy as np
import pytest

import einfuse as ef

jax = pytest.importorskip("jax")
jnp = jax.numpy


def named_dist(w, x):
    i, j, k = ef.dims("i j k")
    return ((ef.wrap(w)[k, i] - ef.wrap(x)[k, j]) ** 2).sum(k).order(i, j)


def jnp_dist(w, x):
    return ((w[:, :, None] - x[:, None, :]) ** 2).sum(0)


def named_layernorm(X, g):
    i, j = ef.dims("i j")
    x = ef.named(X, i, j)
    return ((x - x.mean(j)) / ef.sqrt(x.var(j) + 1e-5) * ef.named(g, j)).order(j, i)


def jnp_layernorm(X, g):
    return ((X - X.mean(1, keepdims=True)) / jnp.sqrt(X.var(1, keepdims=True) + 1e-5) * g).T


def named_attention(Q, K, V):
    b, t, T, h, r = ef.dims("b t T h r")
    s = (ef.wrap(Q)[b, t, h, r] * ef.wrap(K)[b, T, h, r]).sum(r) * (r.size ** -0.5)
    p = ef.where(T <= t, s, -math.inf).softmax(T)
    return (p * ef.wrap(V)[b, T, h, r]).sum(T).order(b, t, h, r)


def jnp_attention(Q, K, V):
    s = jnp.einsum("bthr,bThr->bhtT", Q, K) * Q.shape[-1] ** -0.5
    n = Q.shape[1]
    s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -jnp.inf)
    return jnp.einsum("bhtT,bThr->bthr", jax.nn.softmax(s, -1), V)


def named_shifted(x, k):
    # one dimension per range: a dimension's range is one per expression (the
    # intersection of its uses), as an index's is one per statement
    i, j, m, a = ef.dims("i j m a")
    X, Kk = ef.wrap(x), ef.wrap(k)
    conv = (X[i + a] * Kk[a]).sum(a)                       # the valid correlation
    return (conv.logsumexp(i) + (X[2 * j + 1] - X[j]).max(j) * 0.5
            + (X[m] // 0.5 % 3.0).sum(m)).order()


def jnp_shifted(x, k):
    n, m = x.shape[0], k.shape[0]
    conv = jnp.stack([jnp.dot(x[p:p + m], k) for p in range(n - m + 1)])
    half = (n - 1) // 2
    return (jax.nn.logsumexp(conv) + (x[1:2 * half + 1:2] - x[:half]).max() * 0.5
            + (x // 0.5 % 3.0).sum())


def rng_arrays(*shapes, seed):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s)) for s in shapes]


CASES = {
    "dist": (named_dist, jnp_dist, [(3, 4), (3, 5)]),
    "layernorm": (named_layernorm, jnp_layernorm, [(3, 6), (6,)]),
    "attention": (named_attention, jnp_attention, [(1, 6, 2, 4)] * 3),
    "shifted reads, logsumexp": (named_shifted, jnp_shifted, [(9,), (3,)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_ef_jit_runs_named_expressions_as_one_kernel(x64, name):
    ours, theirs, shapes = CASES[name]
    args = rng_arrays(*shapes, seed=1)
    compiled = ef.jit(lambda *a: jnp.sin(ours(*a)))
    np.testing.assert_allclose(compiled(*args), jnp.sin(theirs(*args)), rtol=1e-10,
                               atol=1e-12)
    argnums = tuple(range(len(args)))
    ours_grad = jax.grad(lambda *a: jnp.sum(jnp.sin(compiled(*a))), argnums)(*args)
    their_grad = jax.grad(lambda *a: jnp.sum(jnp.sin(jnp.sin(theirs(*a)))), argnums)(*args)
    for g, h in zip(ours_grad, their_grad):
        np.testing.assert_allclose(g, h, rtol=1e-9, atol=1e-12)
    # jax.grad inside the converted function: the gradient statements are converted too
    inner = ef.jit(jax.grad(lambda *a: jnp.sum(jnp.sin(ours(*a))), argnums))(*args)
    for g, h in zip(inner, jax.grad(lambda *a: jnp.sum(jnp.sin(theirs(*a))), argnums)(*args)):
        np.testing.assert_allclose(g, h, rtol=1e-9, atol=1e-12)


def test_ef_jit_named_expression_in_scan_and_fori_loop(x64):
    w, x = rng_arrays((3, 4), (3, 5), seed=2)

    def scanned(f):
        def run(w, x):
            def body(carry, step):
                return carry + 0.1 * jnp.tanh(f(carry, x)).sum(1)[None, :] * step, None
            out, _ = jax.lax.scan(body, w, jnp.arange(1.0, 4.0))
            return out
        return run

    def looped(f):
        def run(w, x):
            return jax.lax.fori_loop(0, 3, lambda n, c: c - 0.05 * f(c, x).mean(1)[None, :], w)
        return run

    for wrap in (scanned, looped):
        ours, theirs = ef.jit(wrap(named_dist)), wrap(jnp_dist)
        np.testing.assert_allclose(ours(w, x), theirs(w, x), rtol=1e-10)
        loss = lambda f: (lambda w: jnp.sum(jnp.sin(f(w, x))))   # noqa: E731
        np.testing.assert_allclose(jax.grad(loss(ours))(w), jax.grad(loss(theirs))(w),
                                   rtol=1e-9, atol=1e-12)


def test_ef_jit_runs_named_expressions_in_float32():
    w, x = (a.astype(jnp.float32) for a in rng_arrays((3, 4), (3, 5), seed=3))
    out = ef.jit(lambda w, x: named_dist(w, x) * 2.0)(w, x)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, 2.0 * jnp_dist(w, x), rtol=1e-5)


def test_ef_jit_argmax_and_gather_policies(x64):
    (x,) = rng_arrays((4, 6), seed=4)
    table = jnp.asarray(np.random.default_rng(5).standard_normal((5, 3)))
    positions = jnp.asarray([0, 4, 7, -1])

    def ours(x, table):
        i, c, d = ef.dims("i c d")
        best = ef.named(x, i, c).argmax(c)
        return best.order(i), ef.ein("o[i, d] := T[p[i], d]", T=table, p=positions,
                                     bounds="clip")

    found, gathered = ef.jit(ours)(x, table)
    np.testing.assert_array_equal(found, jnp.argmax(x, 1))
    np.testing.assert_allclose(gathered, table[jnp.clip(positions, 0, 4)])


def test_ef_jit_refuses_a_checked_gather_loudly(x64):
    (table,) = rng_arrays((5, 3), seed=6)

    def gather(table, positions):
        b, d = ef.dims("b d")
        return ef.wrap(table)[ef.wrap(positions)[b], d].order(b, d)

    positions = jnp.asarray([0, 4, 2])
    with pytest.raises(ef.EinfuseError, match="bounds='check'"):
        ef.jit(gather)(table, positions)
    # with fallback=True the gather stays an einfuse call and checks its positions
    np.testing.assert_allclose(ef.jit(gather, fallback=True)(table, positions), table[positions])


def test_ef_jit_statement_arithmetic_follows_the_notation(x64):
    """Comparisons counted as 0 or 1, Python's floor division and modulo (on negative
    integers and floats), true division of integers: as ef.ein computes them eagerly."""
    (x,) = rng_arrays((4, 6), seed=7)
    p = jnp.asarray(np.random.default_rng(8).integers(-9, 9, (4, 6)))

    def f(x, p):
        i, j = ef.dims("i j")
        X = ef.named(x, i, j)
        return (((X > 0) + (X > 0.5)).sum(j).order(i),
                ef.ein("o[i] := sum[j](A[i,j] % 0.7 + A[i,j] // 0.3)", A=x),
                ef.ein("o[i, j] := P[i,j] // 4 + P[i,j] % 4 + P[i,j] / 4", P=p),
                ef.ein("o[i] := sum[j](A[i,j] > 0)", A=x),
                # a reduction inside a statement that is one reduction
                ef.ein("o[i] := sum[j](exp(A[i,j] - max[k](A[i,k])))", A=x))
    for ours, eager in zip(ef.jit(f)(x, p), f(x, p)):
        assert ours.dtype == eager.dtype
        np.testing.assert_allclose(ours, eager, rtol=1e-12)
