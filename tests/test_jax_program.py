"""Programs (and statements in their hoisted form) on JAX arrays are one differentiable
function whose reverse mode runs the program's backward (runtime/jax_program.py).
Results and gradients of every kind -- grad, jit(grad), vjp with several outputs, grad
of grad, jvp, jacfwd, hessian, vmap(grad), grad(vmap) -- are checked against jax.numpy
formulations in float64, and the backward is checked to be the program's (fewer
primitives, no gradient through softmax's row maximum)."""

import numpy as np
import pytest

import einfuse as ef
from program_texts import LAYERNORM, SOFTMAX, SOFTMAX_STATEMENT

jax = pytest.importorskip("jax")
jnp = jax.numpy
from jit_support import x64  # noqa: E402,F401  (x64 on for every test here)



def _layernorm(X, g, b):
    mu = X.mean(1, keepdims=True)
    return (X - mu) / jnp.sqrt(((X - mu) ** 2).mean(1, keepdims=True) + 1e-5) * g + b


def _softmax(X):
    return jax.nn.softmax(X, axis=1)


def _arrays(count, rows=6, cols=9, seed=0):     # (LAYERNORM below is for 9 columns)
    rng = np.random.default_rng(seed)
    shapes = [(rows, cols), (cols,), (cols,)][:count]
    return [jnp.asarray(rng.standard_normal(s)) for s in shapes]


CASES = [("softmax program", SOFTMAX, _softmax, 1),
         ("softmax statement", SOFTMAX_STATEMENT, _softmax, 1),
         ("layernorm", LAYERNORM.format(n=9), _layernorm, 3)]
IDS = [c[0] for c in CASES]
# layernorm's hessians and vmapped gradients are the slowest to build: the slow run's
LAYERNORM_SLOW = [pytest.param(*case, id=case[0],
                               marks=[pytest.mark.slow] if case[0] == "layernorm" else [])
                  for case in CASES]


def _ours(source):
    program = ef.compile(source)
    names = ("X", "g", "b")
    return lambda *arrays: program(**dict(zip(names, arrays)))


def _close(got, want):
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("name, source, formula, count", CASES, ids=IDS)
def test_reverse_mode_equals_jax(name, source, formula, count):
    ours, arrays = _ours(source), _arrays(count)
    seed = jnp.asarray(np.random.default_rng(9).standard_normal(arrays[0].shape))
    argnums = tuple(range(count))
    loss = lambda f: lambda *a: (f(*a) * seed).sum()
    _close(ours(*arrays), formula(*arrays))
    want = jax.grad(loss(formula), argnums)(*arrays)
    _close(jax.grad(loss(ours), argnums)(*arrays), want)
    _close(jax.jit(jax.grad(loss(ours), argnums))(*arrays), want)
    # grad of grad (each gradient statement is again an einfuse primitive)
    twice = lambda f: jax.grad(lambda *a: (jax.grad(loss(f))(*a) ** 2).sum())
    _close(twice(ours)(*arrays), twice(formula)(*arrays))


@pytest.mark.parametrize("name, source, formula, count", LAYERNORM_SLOW)
def test_forward_mode_and_hessian_equal_jax(name, source, formula, count):
    ours, arrays = _ours(source), _arrays(count, rows=2)
    tangents = [jnp.ones_like(a) * 0.5 for a in arrays]
    _close(jax.jvp(ours, arrays, tangents), jax.jvp(formula, arrays, tangents))
    _close(jax.jacfwd(ours)(*arrays), jax.jacfwd(formula)(*arrays))
    scalar = lambda f: lambda X: jnp.sin(f(X, *arrays[1:])).sum()
    _close(jax.hessian(scalar(ours))(arrays[0]), jax.hessian(scalar(formula))(arrays[0]))


@pytest.mark.parametrize("name, source, formula, count", LAYERNORM_SLOW)
def test_vmap_of_grad_and_grad_of_vmap_equal_jax(name, source, formula, count):
    ours, arrays = _ours(source), _arrays(count, rows=3)
    stacked = jnp.stack([arrays[0], 2 * arrays[0], -arrays[0]])
    rest = arrays[1:]
    per_example = lambda f: jax.vmap(jax.grad(lambda X: jnp.tanh(f(X, *rest)).sum()))
    _close(per_example(ours)(stacked), per_example(formula)(stacked))
    batched = lambda f: jax.grad(lambda S: jnp.tanh(jax.vmap(lambda X: f(X, *rest))(S)).sum())
    _close(jax.jit(batched(ours))(stacked), batched(formula)(stacked))


def test_several_outputs_under_vjp():
    program = ef.compile(SOFTMAX, outputs=("P", "m"))
    (X,) = _arrays(1)
    (P, m), pullback = jax.vjp(lambda X: program(X=X), X)
    _close((P, m), (_softmax(X), X.max(1)))
    dP = jnp.asarray(np.random.default_rng(3).standard_normal(P.shape))
    dm = jnp.arange(X.shape[0], dtype=X.dtype)
    (got,), want = pullback((dP, dm)), jax.vjp(lambda X: (_softmax(X), X.max(1)), X)[1](
        (dP, dm))
    _close(got, want[0])


def test_an_index_array_input_and_a_python_number():
    program = ef.compile("E[b,d] := W[idx[b], d] * s\ny[b] := sum[d](E[b,d]**2)")
    W = jnp.asarray(np.random.default_rng(1).standard_normal((5, 3)))
    idx = jnp.asarray([4, 0, 4, 2])
    got = jax.jit(jax.grad(lambda W: program(W=W, idx=idx, s=1.5).sum()))(W)
    want = jax.grad(lambda W: ((W[idx] * 1.5) ** 2).sum())(W)
    _close(got, want)


def test_the_backward_is_the_programs():
    """jax.grad of the softmax program runs two statements (the folded backward
    P*(dP - sum(dP*P))); statement by statement it ran eight, the row maximum's
    gradient among them."""
    program = ef.compile(SOFTMAX)
    (X,) = _arrays(1)
    jaxpr = str(jax.make_jaxpr(jax.grad(lambda X: (program(X=X) ** 2).sum()))(X))
    statements = [line for line in jaxpr.splitlines() if "statement=" in line]
    assert len(statements) == 4 + 2, statements      # the forward's four, then two
    assert not any("dm[" in line for line in statements)


def test_an_input_whose_gradient_cannot_be_derived_keeps_the_statements_rules():
    program = ef.compile("k[i] := argmax[j](X[i,j])\ny[i] := X[i, k[i]] * 2")
    (X,) = _arrays(1)
    got = jax.grad(lambda X: program(X=X).sum())(X)
    want = jax.grad(lambda X: (jnp.take_along_axis(X, X.argmax(1)[:, None], 1) * 2).sum())(X)
    _close(got, want)


def test_a_backward_statement_that_reads_no_jax_value():
    """The folded backward of this program has a per-row factor computed from the
    ranges alone (no JAX input): a NumPy array, which the next statement reads beside
    JAX values (found by tests/test_program_gradient_fuzz.py)."""
    program = ef.compile("t0[i] := sum[j](X[i,j])\nt1[i,j] := (X[i,j] + (X[i,j] + t0[i]))",
                         outputs=["t1"])
    (X,) = _arrays(1, rows=3, cols=4)
    got = jax.jit(jax.grad(lambda X: (program(X=X) ** 2).sum()))(X)
    want = jax.grad(lambda X: ((2 * X + X.sum(1, keepdims=True)) ** 2).sum())(X)
    _close(got, want)
