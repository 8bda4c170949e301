"""JAX: arrays in and out, under jit, grad, value_and_grad and vmap; results and
gradients match jax.numpy formulations (rtol 1e-5)."""

import numpy as np
import pytest

import einfuse as ef

jax = pytest.importorskip("jax")
jnp = jax.numpy

rng = np.random.default_rng(0)


def r(*shape):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32))


CASES = [
    ("C[i,j] := A[i,k] * B[k,j]", lambda A, B: A @ B, {"A": r(3, 4), "B": r(4, 2)}),
    ("D[i,j] := (w[k,i] - x[k,j])**2",
     lambda w, x: ((w[:, :, None] - x[:, None, :]) ** 2).sum(0), {"w": r(5, 3), "x": r(5, 4)}),
    ("y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o]", lambda x, W, bias: x @ W + bias,
     {"x": r(2, 3), "W": r(3, 4), "bias": r(4)}),
    ("y[i] := x[i+a] * ker[a]",
     lambda x, ker: jnp.stack([x[i:i + 3] @ ker for i in range(7)]), {"x": r(9), "ker": r(3)}),
    ("o[i] := sum[j](exp(-sum[d]((x[i,d]-y[j,d])**2)) * b[j])",
     lambda x, y, b: (jnp.exp(-((x[:, None] - y[None]) ** 2).sum(-1)) * b).sum(1),
     {"x": r(4, 3), "y": r(5, 3), "b": r(5)}),
    ("z[i] := logsumexp[j](X[i,j])", lambda X: jax.nn.logsumexp(X, axis=1), {"X": r(3, 6)}),
    ("s := alpha * x[i]**2", lambda alpha, x: alpha * (x ** 2).sum(),
     {"alpha": jnp.float32(0.7), "x": r(6)}),
]
IDS = [c[0] for c in CASES]


def loss_of(fn):
    return lambda *values: jnp.sum(jnp.sin(fn(*values)))


@pytest.mark.parametrize("statement, reference, arrays", CASES, ids=IDS)
def test_values_under_jit_and_gradients(statement, reference, arrays, backend):
    names = list(arrays)

    def ours(*values):
        return ef.ein(statement, backend=backend, **dict(zip(names, values)))
    values = tuple(arrays.values())
    np.testing.assert_allclose(ours(*values), reference(*values), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.jit(ours)(*values), reference(*values), rtol=1e-5,
                               atol=1e-5)
    argnums = tuple(range(len(values)))
    got = jax.jit(jax.grad(loss_of(ours), argnums=argnums))(*values)
    want = jax.grad(loss_of(reference), argnums=argnums)(*values)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    value, _ = jax.value_and_grad(loss_of(ours))(*values)
    np.testing.assert_allclose(value, loss_of(reference)(*values), rtol=1e-5)


def test_vmap_is_one_batched_statement(backend, monkeypatch):
    from einfuse.runtime import jax_adapter
    seen = []
    original = jax_adapter._batched

    def spy(statement, levels):
        seen.append(levels)
        return original(statement, levels)
    monkeypatch.setattr(jax_adapter, "_batched", spy)
    A, B = r(5, 3, 4), r(4, 2)
    f = lambda A, B: ef.ein("C[i,j] := A[i,k] * B[k,j]", A=A, B=B, backend=backend)
    np.testing.assert_allclose(jax.vmap(f, in_axes=(0, None))(A, B), A @ B, rtol=1e-5)
    assert seen == [1]  # one host call for the whole batch, not five
    grads = jax.grad(lambda A, B: jax.vmap(f, in_axes=(0, None))(A, B).sum(),
                     argnums=(0, 1))(A, B)
    want = jax.grad(lambda A, B: (A @ B).sum(), argnums=(0, 1))(A, B)
    for g, w in zip(grads, want):  # float32 sums in another order: relative to the scale
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * float(np.abs(w).max()))


def test_gather_gradient_and_index_arrays(backend):
    W = r(6, 3)
    idx = jnp.asarray([1, 1, 5, 0])
    f = lambda W: ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=idx, backend=backend).sum()
    np.testing.assert_allclose(jax.grad(f)(W), jax.grad(lambda W: W[idx].sum())(W))


def test_assignment_into_jax_arrays_is_an_error():
    with pytest.raises(ef.EinfuseError, match="immutable"):
        ef.ein("C[i] = A[i]", A=jnp.ones(3), C=jnp.zeros(3))
