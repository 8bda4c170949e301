"""Contractions stored transposed where every reader reads them across their rows
(backends/c/loops_transposed.py): the weight gradient of a layer in a scan's backward.
The rewrite must fire there, nowhere a reader reads the value along its rows, and
keep every bit of the result (NaN and inf included) against the same kernel without
it, float32 and float64, on the default build and on the AVX2 one (EINFUSE_CPU=avx2,
in a child process); and the gradient must be jax.jit's."""

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
from einfuse.backends.c import build as c_build, loops_rewrite  # noqa: E402
from einfuse.frontends.jaxpr import convert  # noqa: E402
from einfuse.ir import Assign, Loop  # noqa: E402

from jit_support import close, x64  # noqa: E402,F401  (x64: an autouse fixture)

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="needs a C compiler")
HOST_FLAGS = machine_module._cpu_flags()


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
    params, noise = inputs(dtype, special=special)
    return [np.asarray(g) for g in jax.tree_util.tree_leaves(
        jax.jit(shared_gradient(ef.jit(chain)))(params, noise))]
found = {"bytes": jit_vectors().vector_bytes}
cases = [(d, s) for d in (np.float64, np.float32) for s in (False, True)]
for d, s in cases:
    for k, g in enumerate(run(d, s)):
        found[f"with_{d.__name__}_{s}_{k}"] = g
loops_rewrite.stored_transposed = lambda program, min_row: program
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


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_gradient_is_jaxs(dtype):
    params, noise = inputs(dtype, chains=37)
    close(jax.jit(shared_gradient(ef.jit(chain)))(params, noise),
          jax.jit(shared_gradient(chain))(params, noise), dtype)
