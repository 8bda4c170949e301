"""Stacked residuals recomputed from another stack (backends/c/loops_residuals.py): a
scan's gradient stacks both ``s`` and ``s * (1 - s)`` for each sigmoid; the second is
recomputed from the first at its reads.  The rewrite must fire there, not where the
function is not a few additions and multiplications (tanh of the stacked value), give
a stack the caller receives its values, and keep every bit of the gradient
(NaN and inf included) against the same kernel without it, float32 and float64, on
the default build and the AVX2 one (EINFUSE_CPU=avx2, in a child process)."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.backends.c import build as c_build  # noqa: E402
from einfuse.backends.c.loops_residuals import recomputed_residuals  # noqa: E402
from einfuse.frontends.jaxpr import convert  # noqa: E402

from jit_support import (BUILDS, assert_rewrite_keeps_bits, close,  # noqa: E402,F401
                         x64)  # (x64: an autouse fixture)
from test_jit_transposed import chain, inputs, shared_gradient  # noqa: E402

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="needs a C compiler")
BLOCK = 16
# steps that make a block's stack of one hidden layer (16 chains x 16 hidden) larger than
# any L2 (float32: 2.5 MB), so that the rewrite applies
STEPS = 2500


def removed(program):
    after = {b.name for b in recomputed_residuals(program).buffers}
    return [b.name for b in program.buffers if b.name not in after]


def test_it_fires_on_a_scan_gradients_sigmoid_residuals():
    params, noise = inputs(np.float64, chains=BLOCK, steps=STEPS)
    backward = convert(jax.make_jaxpr(shared_gradient(chain))(params, noise))
    # the two hidden layers' s * (1 - s); the last layer's s is not stacked itself
    # (the carry, s + noise, is), so its s * (1 - s) stays stored
    assert len(removed(backward)) == 2
    # a stack the core's L2 holds is left stored
    params, noise = inputs(np.float64, chains=BLOCK, steps=20)
    assert not removed(convert(jax.make_jaxpr(shared_gradient(chain))(params, noise)))


def tanh_stacks(x, xs):
    """Stacks of h and of tanh(h): tanh is not recomputed at its reads."""
    def step(h, x):
        h = jnp.sin(h * 0.9 + x)
        return h, (h, jnp.tanh(h))
    _, (hs, ts) = lax.scan(step, x, xs)
    return (hs[::-1] * ts).sum()


def returned_stacks(x, xs):
    """Stacks of s and s * (1 - s) that the caller receives: the second recomputed from
    the first where the output is written."""
    def step(h, x):
        s = jax.nn.sigmoid(h + x)
        return s, (s, s * (1 - s))
    return lax.scan(step, x, xs)[1]


def test_not_for_a_costly_function_and_a_returned_stack_keeps_its_values():
    rng = np.random.default_rng(7)
    x, xs = jnp.asarray(rng.normal(size=8)), jnp.asarray(rng.normal(size=(30, 8)))
    assert not removed(convert(jax.make_jaxpr(tanh_stacks)(x, xs)))
    close(ef.jit(tanh_stacks)(x, xs), jax.jit(tanh_stacks)(x, xs))
    close(ef.jit(returned_stacks)(x, xs), jax.jit(returned_stacks)(x, xs))
    grad = jax.grad(lambda x, xs: tanh_stacks(x, xs) + returned_stacks(x, xs)[1].sum())
    fast = jax.grad(lambda x, xs: ef.jit(tanh_stacks)(x, xs)
                    + ef.jit(returned_stacks)(x, xs)[1].sum())
    close(jax.jit(fast)(x, xs), jax.jit(grad)(x, xs))


@pytest.mark.parametrize("target", BUILDS)
def test_every_bit_kept_on_each_build(target, tmp_path):
    assert_rewrite_keeps_bits(target, tmp_path,
                              "loops_rewrite.recomputed_residuals = lambda program: program",
                              ", chains=37, steps=2500")
