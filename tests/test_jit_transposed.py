"""Contractions stored transposed where every reader reads them across their rows
(backends/c/loops_transposed.py): the weight gradient of a layer in a scan's backward.
The rewrite must fire there, nowhere a reader reads the value along its rows, and
keep every bit of the result (NaN and inf included) against the same kernel without
it, float32 and float64, on the default build and on the AVX2 one (EINFUSE_CPU=avx2,
in a child process); and the gradient must be jax.jit's."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.backends.c import build as c_build, loops_rewrite  # noqa: E402
from einfuse.frontends.jaxpr import convert  # noqa: E402
from einfuse.ir import Assign, Loop  # noqa: E402

from jit_support import (BUILDS, assert_rewrite_keeps_bits, close,  # noqa: E402,F401
                         x64)  # (x64: an autouse fixture)

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="needs a C compiler")


def chain(params, noise):
    def body(x, n):
        for w in params:
            x = jax.nn.sigmoid(x @ jax.nn.softplus(w))
        return x + n, x.sum()
    last, trace = lax.scan(body, jnp.zeros(noise.shape[-1], noise.dtype), noise)
    return last.sum() + trace.mean()


def inputs(dtype, chains=5, steps=20, hidden=16, special=False):
    rng = np.random.default_rng(3)
    params = [rng.normal(size=s).astype(dtype) for s in [(1, hidden), (hidden, hidden), (hidden, 1)]]
    noise = (rng.normal(size=(chains, steps, 1)) * 0.1).astype(dtype)
    if special:
        noise[1, 4, 0], noise[3, 0, 0] = np.nan, np.inf
        params[1][2, 5] = -np.inf
    return [jnp.asarray(p) for p in params], jnp.asarray(noise)


def shared_gradient(f):
    return jax.grad(lambda p, n: jax.vmap(f, in_axes=(None, 0))(p, n).sum(), argnums=(0, 1))


def _assigns(steps):
    for step in steps:
        if isinstance(step, Assign):
            yield step
        elif isinstance(step, Loop):
            yield from _assigns(step.body)


def reshaped(program_before, program_after):
    """The buffers the rewrites now write with their indices in another order."""
    after = {s.buffer: [n for n, _ in s.indices] for s in _assigns(program_after.steps)}
    return [s.buffer for s in _assigns(program_before.steps)
            if s.buffer in after and after[s.buffer] != [n for n, _ in s.indices]]


def test_it_fires_on_a_scan_gradients_weight_gradient_and_not_on_the_forward():
    params, noise = inputs(np.float64)
    backward = convert(jax.make_jaxpr(shared_gradient(chain))(params, noise))
    assert reshaped(backward, loops_transposed_only(backward))
    forward = convert(jax.make_jaxpr(jax.vmap(chain, in_axes=(None, 0)))(params, noise))
    assert not reshaped(forward, loops_transposed_only(forward))


def read_both_ways(w, xs):
    """A contraction one reader reads across its rows and another along them."""
    def step(h, x):
        g = jnp.outer(x, h) @ w            # g[i, j]
        return jnp.tanh(h + (g.T * w).sum(0) + (g * w).sum(1)), g.sum()
    return lax.scan(step, jnp.zeros(w.shape[0], xs.dtype), xs)


def test_a_value_also_read_along_its_rows_keeps_its_layout():
    rng = np.random.default_rng(4)
    w = jnp.asarray(rng.normal(size=(16, 16)) * 0.3)
    xs = jnp.asarray(rng.normal(size=(12, 16)))
    program = convert(jax.make_jaxpr(read_both_ways)(w, xs))
    assert not reshaped(program, loops_transposed_only(program))
    close(ef.jit(read_both_ways)(w, xs), jax.jit(read_both_ways)(w, xs))


def loops_transposed_only(program):
    from einfuse.backends.c.loops_transposed import stored_transposed
    return stored_transposed(program, loops_rewrite.MIN_ROW)


@pytest.mark.parametrize("target", BUILDS)
def test_every_bit_kept_on_each_build(target, tmp_path):
    assert_rewrite_keeps_bits(target, tmp_path,
                              "loops_rewrite.stored_transposed = lambda program, min_row: program")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_gradient_is_jaxs(dtype):
    params, noise = inputs(dtype, chains=37)
    close(jax.jit(shared_gradient(ef.jit(chain)))(params, noise),
          jax.jit(shared_gradient(chain))(params, noise), dtype)
