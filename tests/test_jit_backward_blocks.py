"""The fused backward of a vmapped ef.jit function over blocks of the batch
(runtime/jit_backward_blocks.py): a shared weight's gradient summed over blocks of
BLOCK elements, a mapped input's gradient per element, a remainder block of its own
size, against jax.jit of the same gradient: batches of exactly two blocks, two and a
remainder of one, of five, and one block (the whole-batch kernel), float32 and
float64, NaN and inf in the inputs, an embedding lookup (a gather's scatter-add per
block) and the backward kernels the call asks for."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.backends.c import build as c_build  # noqa: E402
from einfuse.runtime import jit_backward_blocks, jit_compiled  # noqa: E402

from jit_support import close, seed_inputs, x64  # noqa: E402,F401  (x64: autouse)
from test_jit_transposed import chain  # noqa: E402

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="needs a C compiler")
BLOCK = jit_backward_blocks.BLOCK


def inputs(dtype, chains, steps=30, hidden=12, seed=0):
    return seed_inputs(dtype, steps, hidden, chains, seed)


def gradient(f, argnums=0):
    loss = lambda p, n: jax.vmap(f, in_axes=(None, 0))(p, n).sum()  # noqa: E731
    return jax.jit(jax.grad(loss, argnums=argnums))


@pytest.fixture
def asked(monkeypatch):
    """The batch sizes of the vmapped backward kernels compiled while a test runs."""
    sizes = []
    original = jit_compiled.CompiledFunction.vmapped_backward

    def recording(self, size, axes):
        sizes.append(size)
        return original(self, size, axes)
    monkeypatch.setattr(jit_compiled.CompiledFunction, "vmapped_backward", recording)
    return sizes


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("chains", [2 * BLOCK, 2 * BLOCK + 1, 3 * BLOCK + 5])
def test_blocks_and_a_remainder_give_jax_gradients(dtype, chains, asked):
    params, noise = inputs(dtype, chains)
    close(gradient(ef.jit(chain), (0, 1))(params, noise),
          gradient(chain, (0, 1))(params, noise), dtype)
    rest = chains % BLOCK
    assert set(asked) == ({BLOCK, rest} if rest else {BLOCK})


def test_fewer_than_two_blocks_run_the_whole_batch_kernel(asked):
    params, noise = inputs(np.float64, BLOCK + 3)
    close(gradient(ef.jit(chain))(params, noise), gradient(chain)(params, noise))
    assert asked == [BLOCK + 3]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_nan_and_inf_reach_the_gradients_they_reach_in_jax(dtype):
    params, noise = inputs(dtype, 2 * BLOCK + 3)
    noise = noise.at[3, 4, 0].set(np.nan).at[BLOCK + 1, 0, 0].set(np.inf)
    params[1] = params[1].at[2, 3].set(np.inf)
    got = gradient(ef.jit(chain), (0, 1))(params, noise)
    want = gradient(chain, (0, 1))(params, noise)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        g, w = np.asarray(g), np.asarray(w)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_array_equal(np.isposinf(g), np.isposinf(w))
        np.testing.assert_array_equal(np.isneginf(g), np.isneginf(w))
        finite = np.isfinite(w)
        tol = 1e-9 if dtype == np.float64 else 2e-4
        np.testing.assert_allclose(g[finite], w[finite], rtol=tol, atol=tol)


def embedding_scan(w, x):
    """A lookup per step of a scan (residuals per step) into a shared table."""
    def step(h, token):
        h = jnp.tanh(h + w[token])
        return h, None
    return lax.scan(step, jnp.zeros(w.shape[1], w.dtype), x)[0].sum()


def test_a_shared_embedding_table_over_blocks(asked):
    rng = np.random.default_rng(5)
    weight = jnp.asarray(rng.normal(size=(10, 4)))
    tokens = jnp.asarray(rng.integers(-2, 12, size=(2 * BLOCK + 7, 200)))
    close(gradient(ef.jit(embedding_scan))(weight, tokens),
          gradient(embedding_scan)(weight, tokens))
    assert set(asked) == {BLOCK, 7}


def test_a_table_larger_than_a_blocks_residuals_keeps_the_whole_batch_kernel(asked):
    """One table gradient per block would take more memory than the residuals saved."""
    rng = np.random.default_rng(6)
    weight = jnp.asarray(rng.normal(size=(3000, 8)))
    tokens = jnp.asarray(rng.integers(0, 3000, size=(2 * BLOCK + 7, 5)))
    lookup = lambda w, x: jnp.tanh(w[x]).sum()  # noqa: E731
    close(gradient(ef.jit(lookup))(weight, tokens), gradient(lookup)(weight, tokens))
    assert asked[-1] == 2 * BLOCK + 7 and set(asked) <= {BLOCK, 2 * BLOCK + 7}
