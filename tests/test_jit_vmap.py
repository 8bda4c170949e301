"""jax.vmap of ef.jit functions (one kernel over the batch, elements shared among
threads) against jax.jit(jax.vmap(f)): forward and gradient, batch sizes that do not
divide by the thread count or the vector width, float32 and float64, nested vmap; and
the register-blocked contractions of the loop kernels against NumPy."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.backends.c import build as c_build  # noqa: E402

from jit_support import close, x64  # noqa: E402,F401  (x64: an autouse fixture)

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="needs a C compiler")


def chain(params, noise):
    """The seed MLP iterated over a sequence of noise (one chain)."""
    def body(x, n):
        for w in params:
            x = jax.nn.sigmoid(x @ jax.nn.softplus(w))
        return x + n, x.sum()
    last, trace = lax.scan(body, jnp.zeros(noise.shape[-1], noise.dtype), noise)
    return last, trace


def chain_inputs(dtype, chains, steps, hidden, seed=0):
    rng = np.random.default_rng(seed)
    params = [jnp.asarray(rng.normal(size=s).astype(dtype))
              for s in [(1, hidden), (hidden, hidden), (hidden, 1)]]
    return params, jnp.asarray((rng.normal(size=(chains, steps, 1)) * 0.1).astype(dtype))


# chain counts that divide by neither 2 threads nor 4/8/16 lanes; hidden sizes that
# leave a row of 8 + 4 + 2 + 1, or less than one vector
@pytest.mark.parametrize("dtype, chains, steps, hidden, per_chain_gradient", [
    pytest.param(np.float64, 13, 300, 15, True, marks=pytest.mark.slow),
    (np.float32, 37, 40, 12, False), (np.float64, 1, 50, 5, False),
    pytest.param(np.float32, 37, 120, 12, False, marks=pytest.mark.slow)])
def test_vmapped_chains_forward_and_gradient(dtype, chains, steps, hidden,
                                             per_chain_gradient):
    params, noise = chain_inputs(dtype, chains, steps, hidden)
    fast, slow = ef.jit(chain), chain
    vmapped = lambda f: jax.vmap(f, in_axes=(None, 0))  # noqa: E731
    close(jax.jit(vmapped(fast))(params, noise), jax.jit(vmapped(slow))(params, noise), dtype)
    close(vmapped(fast)(params, noise), jax.jit(vmapped(slow))(params, noise), dtype)

    def loss(f):
        return lambda p, n: (vmapped(f)(p, n)[0] ** 2).sum() + vmapped(f)(p, n)[1].mean()
    close(jax.jit(jax.grad(loss(fast), argnums=(0, 1)))(params, noise),
          jax.jit(jax.grad(loss(slow), argnums=(0, 1)))(params, noise), dtype)
    if not per_chain_gradient:
        return
    per_chain = lambda f: jax.vmap(jax.grad(lambda p, n: f(p, n)[0].sum()),  # noqa: E731
                                   in_axes=(None, 0))
    close(per_chain(fast)(params, noise), jax.jit(per_chain(slow))(params, noise), dtype)


def test_batch_axes_not_leading_batched_parameters_and_nested_vmap():
    params, noise = chain_inputs(np.float64, 6, 40, 9, seed=2)
    moved = jnp.moveaxis(noise, 0, 1)                  # the chains on axis 1
    fast, slow = ef.jit(chain), jax.jit(chain)
    close(jax.vmap(fast, in_axes=(None, 1))(params, moved),
          jax.vmap(slow, in_axes=(None, 1))(params, moved))
    # every parameter batched too: each chain its own network
    stacked = [jnp.stack([w * (1 + 0.1 * k) for k in range(6)]) for w in params]
    close(jax.vmap(fast)(stacked, noise), jax.jit(jax.vmap(chain))(stacked, noise))
    # vmap of vmap: 2 x 3 chains, the first weight batched only over the outer level
    grid = noise.reshape(2, 3, 40, 1)
    outer_w0 = jnp.stack([params[0], params[0] * 0.5])
    nested = lambda f: jax.vmap(  # noqa: E731
        lambda w0, n: jax.vmap(f, in_axes=(None, 0))([w0] + params[1:], n),
        in_axes=(0, 0))
    close(nested(fast)(outer_w0, grid), jax.jit(nested(chain))(outer_w0, grid))


def test_vmap_of_a_while_loop_and_a_cond_per_element():
    def grow(x, limit):
        def step(c):
            value, count = c
            value = lax.cond(value > 3.0, lambda v: v * 1.3, lambda v: v * 1.9 + 0.2, value)
            return value, count + 1
        return lax.while_loop(lambda c: c[0] < limit, step, (x, 0))
    rng = np.random.default_rng(5)
    xs, limits = jnp.asarray(rng.uniform(0.1, 2.0, 41)), jnp.asarray(rng.uniform(1, 500, 41))
    close(jax.vmap(ef.jit(grow))(xs, limits), jax.jit(jax.vmap(grow))(xs, limits))
    close(jax.jit(jax.vmap(ef.jit(grow), in_axes=(0, None)))(xs, 30.0),
          jax.jit(jax.vmap(grow, in_axes=(0, None)))(xs, 30.0))


def test_an_empty_batch_and_an_unbatched_output():
    f = ef.jit(lambda a, b: (a * 2.0, b.sum()))
    a, b = jnp.zeros((0, 3)), jnp.arange(4.0)
    got = jax.vmap(f, in_axes=(0, None))(a, b)
    want = jax.vmap(lambda a, b: (a * 2.0, b.sum()), in_axes=(0, None))(a, b)
    close(got, want)
    got = jax.vmap(f, in_axes=(0, None))(jnp.ones((3, 3)), b)
    close(got, jax.vmap(lambda a, b: (a * 2.0, b.sum()), in_axes=(0, None))(jnp.ones((3, 3)), b))


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int32])
@pytest.mark.parametrize("m, k, n", [(3, 5, 13), (4, 7, 31), (1, 3, 70)])
def test_contractions_in_a_loop_kernel_against_numpy(dtype, m, k, n):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    a = rng.integers(-3, 4, (m, k)).astype(dtype)
    b = rng.integers(-3, 4, (k, n)).astype(dtype)
    if np.issubdtype(dtype, np.floating):
        a, b = a + rng.normal(size=a.shape).astype(dtype), b * rng.normal(size=b.shape).astype(dtype)

    def f(a, b):
        return a @ b, jnp.einsum("ik,kj->ij", a * 2, b)[:, ::-1], jnp.einsum("k,kj->j", a[0], b)
    want = (a.astype(np.float64) @ b, (2 * a.astype(np.float64) @ b)[:, ::-1],
            a[0].astype(np.float64) @ b)
    for got, expected in zip(ef.jit(f)(a, b), want):
        assert got.dtype == dtype
        np.testing.assert_allclose(np.asarray(got, np.float64), expected,
                                   rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-4)
