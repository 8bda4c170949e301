"""What the ef.jit tests share (test_jit.py, test_jit_vmap.py, test_jit_ffi.py, the
loop rewrites' tests): JAX's x64 mode around each test, a comparison of two pytrees
leaf by leaf (shape, dtype and values), the seed workload (a tiny MLP in a scan) with
its inputs, and the check that a loop rewrite keeps every bit on each build."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from einfuse.analysis import machine as machine_module


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


# -- a loop rewrite keeps every bit, on each build ------------------------------------------
# the builds a rewrite's bits are checked on: the host's, and AVX2 where the host runs it
BUILDS = [pytest.param("avx2", marks=pytest.mark.skipif(
    not {"avx2", "fma", "bmi2"} <= machine_module._cpu_flags(), reason="the host runs no AVX2")),
    "native"]

# the seed's vmapped gradient (test_jit_transposed's chain, inputs and shared_gradient),
# float64 and float32, with and without NaN/inf, with the rewrites and then with the one
# rewrite turned off by %(without)s
_BITS_SCRIPT = """
import sys
import numpy as np, jax
jax.config.update("jax_enable_x64", True)
sys.path.insert(0, TESTS)
import einfuse as ef
from einfuse.backends.c import loops_rewrite
from einfuse.plan.jit_vectors import jit_vectors
from test_jit_transposed import chain, inputs, shared_gradient

def run(dtype, special):
    params, noise = inputs(dtype, special=special%(sizes)s)
    return [np.asarray(g) for g in jax.tree_util.tree_leaves(
        jax.jit(shared_gradient(ef.jit(chain)))(params, noise))]
found = {"bytes": jit_vectors().vector_bytes}
cases = [(d, s) for d in (np.float64, np.float32) for s in (False, True)]
for d, s in cases:
    for k, g in enumerate(run(d, s)):
        found[f"with_{d.__name__}_{s}_{k}"] = g
%(without)s
for d, s in cases:
    for k, g in enumerate(run(d, s)):
        found[f"without_{d.__name__}_{s}_{k}"] = g
np.savez(OUT, **found)
"""


def assert_rewrite_keeps_bits(target, tmp_path, without: str, sizes: str = ""):
    """In a child process built for ``target`` (EINFUSE_CPU), the seed's vmapped gradient
    with the loop rewrites and with one turned off (``without``: the statement that
    replaces it, on ``loops_rewrite``), every leaf equal bit for bit, NaN included;
    ``sizes``: more keyword arguments of the inputs (", chains=37")."""
    out = tmp_path / f"{target}.npz"
    env = dict(os.environ)
    if target != "native":
        env["EINFUSE_CPU"] = target
    tests = os.path.dirname(os.path.abspath(__file__))
    script = _BITS_SCRIPT % {"without": without, "sizes": sizes}
    subprocess.run([sys.executable, "-c", f"TESTS = {tests!r}\nOUT = {str(out)!r}\n" + script],
                   env=env, check=True, timeout=900)
    found = np.load(out)
    if target == "avx2":
        assert int(found["bytes"]) == 32
    names = [k for k in found.files if k.startswith("with_")]
    assert len(names) == 4 * 4
    for name in names:
        np.testing.assert_array_equal(found[name], found["without" + name[4:]])
    assert any(np.isnan(found[n]).any() for n in names if n.endswith(("True_0", "True_1")))
