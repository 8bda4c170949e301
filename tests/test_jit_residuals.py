"""Stacked residuals recomputed from another stack (backends/c/loops_residuals.py): a
scan's gradient stacks both ``s`` and ``s * (1 - s)`` for each sigmoid; the second is
recomputed from the first at its reads.  The rewrite must fire there, not where the
function is not a few additions and multiplications (tanh of the stacked value), give
a stack the caller receives its values, and keep every bit of the gradient
(NaN and inf included) against the same kernel without it, float32 and float64, on
the default build and the AVX2 one (EINFUSE_CPU=avx2, in a child process)."""

import os
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.analysis import machine as machine_module  # noqa: E402
from einfuse.backends.c import build as c_build  # noqa: E402
from einfuse.backends.c.loops_residuals import recomputed_residuals  # noqa: E402
from einfuse.frontends.jaxpr import convert  # noqa: E402

from jit_support import close, x64  # noqa: E402,F401  (x64: an autouse fixture)
from test_jit_transposed import chain, inputs, shared_gradient  # noqa: E402

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="needs a C compiler")
HOST_FLAGS = machine_module._cpu_flags()
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


SCRIPT = """
import sys
import numpy as np, jax
jax.config.update("jax_enable_x64", True)
sys.path.insert(0, TESTS)
import einfuse as ef
from einfuse.backends.c import loops_rewrite
from einfuse.plan.jit_vectors import jit_vectors
from test_jit_transposed import chain, inputs, shared_gradient

def run(dtype, special):
    params, noise = inputs(dtype, chains=37, steps=2500, special=special)
    return [np.asarray(g) for g in jax.tree_util.tree_leaves(
        jax.jit(shared_gradient(ef.jit(chain)))(params, noise))]
found = {"bytes": jit_vectors().vector_bytes}
cases = [(d, s) for d in (np.float64, np.float32) for s in (False, True)]
for d, s in cases:
    for k, g in enumerate(run(d, s)):
        found[f"with_{d.__name__}_{s}_{k}"] = g
loops_rewrite.recomputed_residuals = lambda program: program
for d, s in cases:
    for k, g in enumerate(run(d, s)):
        found[f"without_{d.__name__}_{s}_{k}"] = g
np.savez(OUT, **found)
"""


@pytest.mark.parametrize("target", [
    pytest.param("avx2", marks=pytest.mark.skipif(not {"avx2", "fma", "bmi2"} <= HOST_FLAGS,
                                                  reason="the host runs no AVX2")),
    "native"])
def test_every_bit_kept_on_each_build(target, tmp_path):
    out = tmp_path / f"{target}.npz"
    env = dict(os.environ)
    if target != "native":
        env["EINFUSE_CPU"] = target
    tests = os.path.dirname(os.path.abspath(__file__))
    subprocess.run([sys.executable, "-c", f"TESTS = {tests!r}\nOUT = {str(out)!r}\n" + SCRIPT],
                   env=env, check=True, timeout=900)
    found = np.load(out)
    if target == "avx2":
        assert int(found["bytes"]) == 32
    names = [k for k in found.files if k.startswith("with_")]
    assert len(names) == 4 * 4
    for name in names:
        np.testing.assert_array_equal(found[name], found["without" + name[4:]])
    assert any(np.isnan(found[n]).any() for n in names if n.endswith(("True_0", "True_1")))
