"""JAX: arrays in and out, under jit, grad, value_and_grad and vmap; results and
gradients match jax.numpy formulations (rtol 1e-5)."""

import numpy as np
import pytest

import einfuse as ef

jax = pytest.importorskip("jax")
jnp = jax.numpy

from jax_cases import CASES, IDS, loss_of, r  # noqa: E402


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
