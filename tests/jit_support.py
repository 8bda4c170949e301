"""What the ef.jit tests share (test_jit.py, test_jit_vmap.py, test_jit_ffi.py): JAX's
x64 mode around each test, a comparison of two pytrees leaf by leaf (shape, dtype and
values), and the seed workload (a tiny MLP in a scan) with its inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest


@pytest.fixture(autouse=True)
def x64():
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


def close(a, b, dtype=np.float64):
    tol = 1e-9 if dtype == np.float64 else 2e-4
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert np.shape(x) == np.shape(y) and np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


def seed_run(params, noise):
    def body(x, n):
        for w in params:
            x = jax.nn.sigmoid(x @ jax.nn.softplus(w))
        return x + n, None
    return jax.lax.scan(body, jnp.zeros(1, noise.dtype), noise)[0]


def seed_inputs(dtype=np.float64, steps=40, hidden=12, chains=0, seed=0):
    """The seed's weights and noise (``chains`` > 0: that many noise sequences)."""
    rng = np.random.default_rng(seed)
    params = [jnp.asarray(rng.normal(size=s).astype(dtype))
              for s in [(1, hidden), (hidden, hidden), (hidden, 1)]]
    shape = (chains, steps, 1) if chains else (steps, 1)
    return params, jnp.asarray((rng.normal(size=shape) * 0.1).astype(dtype))
