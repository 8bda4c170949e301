"""``ef.jit`` on Equinox and Flax NNX modules: ``eqx.filter_jit``'s rule (array leaves
traced, every other leaf static and part of the cache key), checked against the same
model run by ``eqx.filter_jit`` / ``jax.jit``, forward and through ``eqx.filter_grad``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import einfuse as ef
from einfuse.errors import EinfuseTypeError

eqx = pytest.importorskip("equinox")


def close(got, want, tol=2e-5):
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten(want)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves):
        if eqx.is_array(w):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tol, atol=tol)
        else:
            assert g is w or g == w


def call(model, x):
    return model(x)


def mlp(activation=jax.nn.relu, seed=0):
    return eqx.nn.MLP(5, 3, 16, 2, activation=activation, key=jax.random.key(seed))


def test_an_equinox_mlp_runs_forward_as_filter_jit_does():
    model, x = mlp(), jnp.linspace(-1.0, 1.0, 5)
    fast = ef.jit(call)
    close(fast(model, x), eqx.filter_jit(call)(model, x))
    # a batch of inputs under vmap, the model shared
    xs = jax.random.normal(jax.random.key(3), (7, 5))
    batched = ef.jit(lambda m, xs: jax.vmap(m)(xs))
    close(batched(model, xs), eqx.filter_jit(lambda m, xs: jax.vmap(m)(xs))(model, xs))


def test_an_equinox_mlp_gradient_through_ef_jit_matches_filter_grad():
    model = mlp(jax.nn.tanh)
    xs = jax.random.normal(jax.random.key(4), (6, 5))
    fast = ef.jit(lambda m, xs: jax.vmap(m)(xs))

    def loss(m, xs, forward):
        return jnp.mean(forward(m, xs) ** 2)
    got = eqx.filter_grad(loss)(model, xs, fast)
    want = eqx.filter_jit(eqx.filter_grad(loss))(model, xs, lambda m, xs: jax.vmap(m)(xs))
    close(got, want)
    # and under jax.jit around the whole step (the kernel as an XLA call)
    stepped = eqx.filter_jit(eqx.filter_grad(lambda m, xs: loss(m, xs, fast)))
    close(stepped(model, xs), want)


def test_the_activation_is_static_and_part_of_the_cache_key():
    x = jnp.linspace(-2.0, 2.0, 5)
    fast = ef.jit(call)
    for activation in (jax.nn.relu, jnp.sin, lambda v: v * v):
        model = mlp(activation)
        close(fast(model, x), call(model, x))
    assert len(fast._cache) == 3
    fast(mlp(jnp.sin, seed=1), x)      # new weights, same activation: no new kernel
    assert len(fast._cache) == 3


def test_an_equinox_embedding_lookup_and_its_gradient():
    table = eqx.nn.Embedding(11, 4, key=jax.random.key(5))
    ids = jnp.array([0, 3, 3, 10, 7, 3], dtype=jnp.int32)
    lookup = ef.jit(lambda e, ids: jax.vmap(e)(ids))
    reference = eqx.filter_jit(lambda e, ids: jax.vmap(e)(ids))
    close(lookup(table, ids), reference(table, ids))
    weights = jnp.arange(24.0).reshape(6, 4) / 10.0

    def loss(e, ids, forward):
        return jnp.sum(forward(e, ids) * weights)
    close(eqx.filter_grad(loss)(table, ids, lookup),
          eqx.filter_grad(loss)(table, ids, reference))


def test_a_module_with_an_embedding_and_an_mlp():
    class Model(eqx.Module):
        embed: eqx.nn.Embedding
        head: eqx.nn.MLP

        def __call__(self, ids):
            return jax.vmap(self.head)(jax.vmap(self.embed)(ids)).sum(0)
    model = Model(eqx.nn.Embedding(9, 5, key=jax.random.key(6)), mlp(jax.nn.gelu))
    ids = jnp.array([1, 8, 2, 2], dtype=jnp.int32)
    fast = ef.jit(call)
    close(fast(model, ids), eqx.filter_jit(call)(model, ids))
    close(eqx.filter_grad(lambda m, i: fast(m, i).sum())(model, ids),
          eqx.filter_grad(lambda m, i: call(m, i).sum())(model, ids))


def test_a_returned_module_keeps_its_static_leaves():
    model = mlp()
    scaled = ef.jit(lambda m, s: jax.tree_util.tree_map(
        lambda leaf: leaf * s if eqx.is_array(leaf) else leaf, m))
    got = scaled(model, 2.0)
    assert got.activation is model.activation
    close(got, eqx.filter_jit(lambda m, s: jax.tree_util.tree_map(
        lambda leaf: leaf * s if eqx.is_array(leaf) else leaf, m))(model, 2.0))


def test_a_string_leaf_is_static():
    fast = ef.jit(lambda x, options: x * 2.0 if options["mode"] == "double" else -x)
    x = jnp.arange(3.0)
    close(fast(x, {"mode": "double"}), x * 2.0)
    close(fast(x, {"mode": "negate"}), -x)


class Unhashable:
    __hash__ = None

    def __eq__(self, other):
        return isinstance(other, Unhashable)


def test_an_unhashable_static_leaf_is_refused_by_path():
    fast = ef.jit(lambda x, options: x + 1.0)
    with pytest.raises(EinfuseTypeError, match=r"\['thing'\].*Unhashable.*hashable"):
        fast(jnp.ones(2), {"thing": Unhashable()})


def test_a_flax_nnx_linear_stack_split_and_merged():
    nnx = pytest.importorskip("flax.nnx")

    class Stack(nnx.Module):
        def __init__(self, rngs):
            self.first = nnx.Linear(4, 8, rngs=rngs)
            self.second = nnx.Linear(8, 8, rngs=rngs)
            self.last = nnx.Linear(8, 2, rngs=rngs)

        def __call__(self, x):
            return self.last(nnx.gelu(self.second(jnp.tanh(self.first(x)))))
    model = Stack(nnx.Rngs(0))
    graph, state = nnx.split(model)
    x = jax.random.normal(jax.random.key(7), (5, 4))

    def run(graph, state, x):
        return nnx.merge(graph, state)(x)
    fast = ef.jit(run)
    want = jax.jit(run, static_argnums=0)(graph, state, x)
    close(fast(graph, state, x), want)

    def loss(state, forward):
        return jnp.mean(forward(graph, state, x) ** 2)
    close(jax.grad(loss)(state, fast),
          jax.jit(jax.grad(loss), static_argnums=1)(state, run), tol=5e-5)
    # the module itself, a pytree in NNX
    close(ef.jit(call)(model, x), want)
