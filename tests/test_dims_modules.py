"""A layer written with named dimensions inside an Equinox module and a Flax (nnx) module,
trained for a few steps with optax next to its jax.numpy twin from the same weights
(docs/dims.md, "The same in JAX"): the weights agree after every step."""

import numpy as np
import pytest

import einfuse as ef

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
optax = pytest.importorskip("optax")


def named_layer(W1, W2, bias, x):
    """tanh(x @ W1) @ W2 + bias, with named dimensions: the body both modules share."""
    b, i, h, o = ef.dims("b i h o")
    hidden = ef.tanh((ef.named(x, b, i) * ef.named(W1, i, h)).sum(i))
    return ((hidden * ef.named(W2, h, o)).sum(h) + ef.named(bias, o)).order(b, o)


def jnp_layer(W1, W2, bias, x):
    return jnp.tanh(x @ W1) @ W2 + bias


def weights(seed=3):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal((5, 7)) / 3, jnp.float32),
            jnp.asarray(rng.standard_normal((7, 3)) / 3, jnp.float32),
            jnp.asarray(rng.standard_normal(3) / 3, jnp.float32))


def batches(steps=3, seed=4):
    rng = np.random.default_rng(seed)
    return [(jnp.asarray(rng.standard_normal((8, 5)), jnp.float32),
             jnp.asarray(rng.standard_normal((8, 3)), jnp.float32)) for _ in range(steps)]


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_equinox_module_trains_as_its_jax_numpy_twin():
    eqx = pytest.importorskip("equinox")

    class MLP(eqx.Module):
        W1: jax.Array
        W2: jax.Array
        bias: jax.Array
        named: bool = eqx.field(static=True)

        def __call__(self, x):
            layer = named_layer if self.named else jnp_layer
            return layer(self.W1, self.W2, self.bias, x)

    models = [MLP(*weights(), named=True), MLP(*weights(), named=False)]
    optimiser = optax.sgd(0.1)
    states = [optimiser.init(eqx.filter(m, eqx.is_array)) for m in models]

    @eqx.filter_jit
    def step(model, state, x, y):
        loss, grads = eqx.filter_value_and_grad(
            lambda m: jnp.mean((m(x) - y) ** 2))(model)
        updates, state = optimiser.update(grads, state)
        return eqx.apply_updates(model, updates), state, loss

    for x, y in batches():
        (ours, ours_state, ours_loss), (twin, twin_state, twin_loss) = (
            step(m, s, x, y) for m, s in zip(models, states))
        models, states = [ours, twin], [ours_state, twin_state]
        close(ours_loss, twin_loss)
        for name in ("W1", "W2", "bias"):
            close(getattr(ours, name), getattr(twin, name))


def test_flax_nnx_module_trains_as_its_jax_numpy_twin():
    nnx = pytest.importorskip("flax.nnx")

    class MLP(nnx.Module):
        def __init__(self, named):
            W1, W2, bias = weights()
            self.W1, self.W2, self.bias = nnx.Param(W1), nnx.Param(W2), nnx.Param(bias)
            self.named = named

        def __call__(self, x):
            layer = named_layer if self.named else jnp_layer
            return layer(self.W1[...], self.W2[...], self.bias[...], x)

    models = [MLP(True), MLP(False)]
    optimisers = [nnx.Optimizer(m, optax.sgd(0.1), wrt=nnx.Param) for m in models]

    @nnx.jit
    def step(model, optimiser, x, y):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        optimiser.update(model, grads)
        return loss

    for x, y in batches():
        ours_loss, twin_loss = (step(m, o, x, y) for m, o in zip(models, optimisers))
        close(ours_loss, twin_loss)
        for name in ("W1", "W2", "bias"):
            close(getattr(models[0], name)[...], getattr(models[1], name)[...])
