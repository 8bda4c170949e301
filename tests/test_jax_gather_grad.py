"""JAX gradients of gathers (embedding lookups, ``take``, gathers under ``vmap``): the
compiled routes (runtime/jax_scatter_grad.py for ``ef.ein``, the vmapped backward of
``ef.jit``) against a NumPy ``np.add.at`` oracle and JAX's own gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import einfuse as ef
from einfuse.runtime import jax_scatter_grad

RNG = np.random.default_rng(11)


def table_and_ids(V=13, D=6, shape=(5, 7), dtype=np.float32):
    W = jnp.asarray(RNG.standard_normal((V, D)).astype(dtype))
    ids = jnp.asarray(RNG.integers(0, V, shape).astype(np.int32))
    G = jnp.asarray(RNG.standard_normal(shape + (D,)).astype(dtype))
    return W, ids, G


def oracle(V, ids, G):
    """dW[idx[...], d] += G[..., d], element by element in float64."""
    out = np.zeros((V, G.shape[-1]))
    np.add.at(out, np.asarray(ids).reshape(-1), np.asarray(G, np.float64).reshape(-1, G.shape[-1]))
    return out


def close(got, want, dtype=np.float32):
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jax.jit"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_embedding_gradient_through_ef_ein(jitted, dtype, x64):
    W, ids, G = table_and_ids(dtype=dtype)

    def loss(W):
        return jnp.sum(ef.ein("E[b,t,d] := W[idx[b,t], d]", W=W, idx=ids) * G)
    grad = jax.jit(jax.grad(loss)) if jitted else jax.grad(loss)
    got = grad(W)
    assert got.dtype == W.dtype
    close(got, oracle(W.shape[0], ids, G), dtype)


def test_the_gradient_is_one_compiled_kernel_per_signature():
    W, ids, G = table_and_ids(V=17)
    statement = "E[b,t,d] := W[idx[b,t], d]"

    def loss(W):
        return jnp.sum(ef.ein(statement, W=W, idx=ids) * G)
    before = len(jax_scatter_grad._COMPILED)
    close(jax.jit(jax.grad(loss))(W), oracle(17, ids, G))
    close(jax.grad(loss)(W), oracle(17, ids, G))
    made = [v for k, v in list(jax_scatter_grad._COMPILED.items())[before:]
            if k[0] == statement]
    assert made and all(v is not False for v in made)


@pytest.mark.parametrize("bounds", ["clip", "wrap", "fill"])
def test_out_of_range_indices_follow_the_bounds_mode(bounds):
    V, D = 9, 4
    W = jnp.asarray(RNG.standard_normal((V, D)).astype(np.float32))
    raw = np.array([-11, -1, 0, 3, 8, 9, 20, 3], dtype=np.int32)
    G = jnp.asarray(RNG.standard_normal((raw.size, D)).astype(np.float32))

    def loss(W):
        return jnp.sum(ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=jnp.asarray(raw),
                              bounds=bounds) * G)
    if bounds == "clip":
        where, keep = np.clip(raw, 0, V - 1), np.ones(raw.size, bool)
    elif bounds == "wrap":
        where, keep = raw % V, np.ones(raw.size, bool)
    else:
        where, keep = raw, (raw >= 0) & (raw < V)
    want = oracle(V, where[keep], np.asarray(G)[keep])
    for grad in (jax.grad(loss), jax.jit(jax.grad(loss))):
        close(grad(W), want)


def test_a_table_of_more_axes_and_a_scaled_lookup():
    W = jnp.asarray(RNG.standard_normal((8, 3, 2)).astype(np.float32))
    ids = jnp.asarray(RNG.integers(0, 8, 10).astype(np.int32))
    s = jnp.asarray(RNG.standard_normal(10).astype(np.float32))
    G = jnp.asarray(RNG.standard_normal((10, 3, 2)).astype(np.float32))

    def loss(W, s):
        return jnp.sum(ef.ein("E[b,d,e] := W[idx[b], d, e] * s[b]", W=W, idx=ids, s=s) * G)
    gW, gs = jax.jit(jax.grad(loss, argnums=(0, 1)))(W, s)
    want = np.zeros((8, 3, 2))
    np.add.at(want, np.asarray(ids), np.asarray(G, np.float64) * np.asarray(s)[:, None, None])
    close(gW, want)
    close(gs, np.einsum("bde,bde->b", np.asarray(W)[np.asarray(ids)], np.asarray(G)))


def test_an_element_scatter_stays_correct():
    """Two gathered axes: not rows, one position per element."""
    W = jnp.asarray(RNG.standard_normal((6, 5)).astype(np.float32))
    i = jnp.asarray(RNG.integers(0, 6, 12).astype(np.int32))
    j = jnp.asarray(RNG.integers(0, 5, 12).astype(np.int32))
    G = jnp.asarray(RNG.standard_normal(12).astype(np.float32))

    def loss(W):
        return jnp.sum(ef.ein("E[b] := W[i[b], j[b]]", W=W, i=i, j=j) * G)
    want = np.zeros((6, 5))
    np.add.at(want, (np.asarray(i), np.asarray(j)), np.asarray(G, np.float64))
    for grad in (jax.grad(loss), jax.jit(jax.grad(loss))):
        close(grad(W), want)


def test_embedding_gradient_of_ef_ein_under_vmap():
    W, ids, G = table_and_ids(V=11, shape=(4, 6))

    def loss(W):
        lookup = jax.vmap(lambda row: ef.ein("e[t,d] := W[idx[t], d]", W=W, idx=row))
        return jnp.sum(lookup(ids) * G)
    close(jax.jit(jax.grad(loss))(W), oracle(11, ids, G))


def look(W, i):
    return W[i]


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jax.jit"])
def test_vmap_of_an_ef_jit_lookup_with_a_shared_table(jitted):
    W, ids, G = table_and_ids(V=12, shape=(5, 3))
    fast = ef.jit(look)

    def loss(W, forward):
        return jnp.sum(jax.vmap(forward, in_axes=(None, 0))(W, ids) * G)
    grad = jax.grad(loss)
    if jitted:
        grad = jax.jit(grad, static_argnums=1)
    close(grad(W, fast), oracle(12, ids, G))
    close(grad(W, fast), np.asarray(jax.jit(jax.grad(loss), static_argnums=1)(W, look)))


def test_vmap_of_an_ef_jit_function_with_mapped_and_shared_inputs():
    W = jnp.asarray(RNG.standard_normal((7, 4)).astype(np.float32))
    ids = jnp.asarray(RNG.integers(0, 7, (6, 3)).astype(np.int32))
    scale = jnp.asarray(RNG.standard_normal((6, 4)).astype(np.float32))    # mapped
    bias = jnp.asarray(RNG.standard_normal(4).astype(np.float32))          # shared

    def element(W, i, s, b):
        return jnp.tanh(W[i] * s + b)

    def loss(forward, W, s, b):
        return jnp.sum(jax.vmap(forward, in_axes=(None, 0, 0, None))(W, ids, s, b) ** 2)
    got = jax.grad(loss, argnums=(1, 2, 3))(ef.jit(element), W, scale, bias)
    want = jax.grad(loss, argnums=(1, 2, 3))(element, W, scale, bias)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        close(g, np.asarray(w, np.float64))


def test_vmap_of_an_ef_jit_lookup_with_the_table_mapped_too():
    W = jnp.asarray(RNG.standard_normal((3, 9, 4)).astype(np.float32))
    ids = jnp.asarray(RNG.integers(0, 9, (3, 5)).astype(np.int32))
    fast = ef.jit(look)

    def loss(forward, W):
        return jnp.sum(jax.vmap(forward)(W, ids) ** 2)
    close(jax.grad(loss, argnums=1)(fast, W),
          np.asarray(jax.grad(loss, argnums=1)(look, W), np.float64))
