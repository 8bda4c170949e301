"""What the ef.jit tests share (test_jit.py, test_jit_vmap.py): JAX's x64 mode around
each test, and a comparison of two pytrees leaf by leaf (shape, dtype and values)."""

import jax
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
