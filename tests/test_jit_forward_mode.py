"""Forward mode (jax.jvp, jacfwd, hessian) through an ef.jit function: the compiled
forward-mode kernel (runtime/jit_forward.py); reverse mode and vmap keep the fused
kernels.  Results against jax.jit of the same function (tests/test_issue29_grads.py has
linearize and the control-flow forms)."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import einfuse as ef  # noqa: E402


def _scan_rnn(w, x, seen):
    seen.append(type(w).__name__)

    def body(c, xi):
        c = jnp.tanh(c @ w + xi)
        return c, c.sum()
    c, ys = jax.lax.scan(body, jnp.zeros(w.shape[0], w.dtype), x)
    return ys.sum() + (c ** 2).sum()


@pytest.fixture
def case():
    rng = np.random.default_rng(3)
    w = jnp.asarray(rng.standard_normal((4, 4)) * 0.3, jnp.float32)
    x = jnp.asarray(rng.standard_normal((7, 4)), jnp.float32)
    return w, x


@pytest.mark.parametrize("transform", ["jvp", "jacfwd", "hessian", "jit jvp"])
def test_forward_mode_equals_jax_jit(case, transform):
    w, x = case
    seen = []
    fused = ef.jit(lambda w, x: _scan_rnn(w, x, seen))
    plain = jax.jit(lambda w, x: _scan_rnn(w, x, []))
    run = {"jvp": lambda f: jax.jvp(lambda w: f(w, x), (w,), (jnp.ones_like(w),)),
           "jacfwd": lambda f: jax.jacfwd(f)(w, x),
           "hessian": lambda f: jax.hessian(f)(w, x),
           "jit jvp": lambda f: jax.jit(lambda w: jax.jvp(lambda w: f(w, x), (w,),
                                                          (jnp.ones_like(w),)))(w)}
    got, want = run[transform](fused), run[transform](plain)
    for g, v in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(v), rtol=2e-4, atol=1e-4)


def test_reverse_mode_keeps_the_fused_backward(case, monkeypatch):
    from einfuse.runtime import jit as jit_module
    w, x = case
    fused = ef.jit(lambda w, x: _scan_rnn(w, x, []))
    want = jax.grad(lambda w, x: _scan_rnn(w, x, []))(w, x)
    compiled_backwards = []
    original = jit_module.CompiledFunction.backward

    def counted(self):
        compiled_backwards.append(self)
        return original(self)
    monkeypatch.setattr(jit_module.CompiledFunction, "backward", counted)
    np.testing.assert_allclose(jax.grad(fused)(w, x), want, rtol=2e-4, atol=1e-5)
    np.testing.assert_allclose(jax.jit(jax.grad(fused))(w, x), want, rtol=2e-4, atol=1e-5)
    # reverse mode traced as JVP + partial evaluation (JAX without direct linearize)
    previous = jax.config.jax_use_direct_linearize
    jax.config.update("jax_use_direct_linearize", False)
    try:
        np.testing.assert_allclose(jax.grad(fused)(w, x), want, rtol=2e-4, atol=1e-5)
    finally:
        jax.config.update("jax_use_direct_linearize", previous)
    assert len(compiled_backwards) == 3
