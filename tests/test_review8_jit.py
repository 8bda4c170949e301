"""Review 8 of ef.jit, as an outside test suite would do it: many small JAX functions
(elementwise math, reductions, contractions, shape moves, indexing, loops and
branches, pytrees, dtypes, small models) run through ``ef.jit`` and compared with
``jax.jit`` of the same function, forward, under ``jax.grad`` and under ``jax.vmap``.
Each test here failed before the fix it comes with."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.backends.c import build as c_build  # noqa: E402

from jit_support import close, x64  # noqa: E402,F401  (x64: autouse)

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="needs a C compiler")


def _branchy(p, a):
    return lax.cond(p > 0, lambda a: a * 2, jnp.sin, a)


@pytest.mark.parametrize("p", [1.0, -1.0])
def test_gradient_of_cond_converts_jaxs_empty_residuals(p):
    """JAX 0.10's gradient of ``lax.cond`` fills the residuals a branch does not write
    with ``empty2``, which was refused: ``jax.grad`` of any function with a cond failed."""
    a = jnp.asarray([0.3, -1.2, 2.0])

    def loss(f):
        return lambda p, a: (f(p, a) ** 2).sum()
    close(jax.grad(loss(ef.jit(_branchy)), argnums=1)(p, a),
          jax.jit(jax.grad(loss(_branchy), argnums=1))(p, a))


def test_gradient_of_jnp_diag():
    """``jnp.diag``'s gradient goes through a platform-dependent cond whose other branch
    holds ``empty2``."""
    a = jnp.asarray(np.random.default_rng(0).normal(size=(4, 4)))
    loss = lambda f: lambda a: (f(a) ** 2).sum()  # noqa: E731
    close(jax.grad(loss(ef.jit(jnp.diag)))(a), jax.jit(jax.grad(loss(jnp.diag)))(a))


def test_lax_empty_is_zeros_as_on_xla_cpu():
    f = lambda a: a + lax.empty((2, 3), jnp.float64)  # noqa: E731
    a = jnp.ones((2, 3))
    close(ef.jit(f)(a), jax.jit(f)(a))


def _mlp(params, x):
    for w, b in params:
        x = jax.nn.relu(x @ w + b)
    return x


def test_gradient_of_a_relu_mlp_with_biases():
    """The backward of ``relu(h @ w + b)`` has ``where(h @ w + b > 0, g, 0)`` over a
    5 x 3 buffer: rendered as ``c ? g[k] : 0``, GCC 12.2 made it a masked load with the
    mask of the wrong vector and some selected elements came out 0 (every gradient
    wrong by O(1)).  The arms are now read before choosing."""
    rng = np.random.default_rng(0)
    params = [(jnp.asarray(rng.normal(size=(4, 8))), jnp.asarray(rng.normal(size=8))),
              (jnp.asarray(rng.normal(size=(8, 3))), jnp.asarray(rng.normal(size=3)))]
    x = jnp.asarray(rng.normal(size=(5, 4)))
    loss = lambda f: lambda p, x: (f(p, x) ** 2).sum()  # noqa: E731
    close(jax.grad(loss(ef.jit(_mlp)), argnums=(0, 1))(params, x),
          jax.jit(jax.grad(loss(_mlp), argnums=(0, 1)))(params, x))


@pytest.mark.parametrize("shape", [(5, 3), (16, 9), (2, 8)])
def test_where_with_a_broadcast_condition_into_a_buffer(shape):
    rng = np.random.default_rng(1)
    a, b = (jnp.asarray(rng.normal(size=shape)) for _ in range(2))
    v = jnp.asarray(rng.normal(size=shape[1]))

    def f(a, b, v):
        t = jnp.where(a + v > 0, b, 0.0)
        return t, t.sum(0)
    close(ef.jit(f)(a, b, v), jax.jit(f)(a, b, v))


def test_fallback_runs_equations_on_typed_keys_in_jax():
    """With ``fallback=True`` an equation making a typed key (``random_wrap`` inside
    ``jax.random.randint``) converted on its own, so it became a kernel whose output
    was a key array: a raw ``TypeError: Cannot interpret 'key<fry>' as a data type``."""
    def f(k):
        return jax.random.randint(k, (5,), 0, 10), jax.random.normal(k, (3,)) * 2

    key = jax.random.PRNGKey(3)
    fast = ef.jit(f, fallback=True)
    close(fast(key), jax.jit(f)(key))
    keys = jnp.stack([key, jax.random.PRNGKey(4)])
    close(jax.vmap(fast)(keys), jax.jit(jax.vmap(f))(keys))
    assert "key<fry>" in ef.explain(fast, key)


def test_an_ef_jit_function_calling_another():
    """``ef.jit(g)`` where ``g`` calls an ``ef.jit`` function (and ``ef.explain`` of a
    ``jax.grad`` of one) was refused: 'cannot convert custom_vmap_call', located in
    einfuse's own runtime/jit.py.  The inner kernel's jaxpr is now inlined."""
    inner = ef.jit(lambda a: jnp.tanh(a) * 2)

    def g(a):
        return inner(a).sum() + inner(a * 2)

    def plain(a):
        return (jnp.tanh(a) * 2).sum() + jnp.tanh(a * 2) * 2
    x = jnp.arange(4.0) / 3
    close(ef.jit(g)(x), jax.jit(plain)(x))
    close(jax.grad(lambda a: ef.jit(g)(a).sum())(x), jax.jit(jax.grad(lambda a: plain(a).sum()))(x))
    assert "tanh" in ef.explain(lambda a: jax.grad(lambda b: inner(b).sum())(a), x)


def test_unconvertible_primitive_names_the_users_line_not_einfuses():
    with pytest.raises(ef.EinfuseError) as caught:
        jax.grad(lambda a: ef.jit(lambda b: lax.cumlogsumexp(b).sum())(a))(jnp.ones(3))
    assert "cumlogsumexp" in str(caught.value) and "runtime/jit.py" not in str(caught.value)
    with pytest.raises(ef.EinfuseError) as caught:
        ef.explain(jnp.sort, jnp.ones(3))
    assert "'sort'" in str(caught.value) and "runtime/jit.py" not in str(caught.value)
