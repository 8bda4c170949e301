"""The jit kernel renderer's program rewrites (backends/c/loops_rewrite.py) against
jax.jit of the same function: transposed copies of loop-invariant weights for
``dY @ W.T`` in a loop, carries updated in place, the vector math of a sum's operand
as its own statement, and the per-thread arena of a vmapped call's blocks.  Where a
rewrite must NOT apply (the weight changes in the loop, the carry is read after its
new value is computed, or at another position) the result must still be JAX's."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.backends.c import build as c_build, loops_rewrite as c_loops_rewrite  # noqa: E402
from einfuse.frontends.jaxpr import convert  # noqa: E402
from einfuse.ir import Assign, Loop  # noqa: E402

from jit_support import close, x64  # noqa: E402,F401  (x64: an autouse fixture)

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="needs a C compiler")


def rnn_transposed(w, xs):
    """An RNN whose step multiplies by W.T (the shape of a layer's gradient)."""
    def step(h, x):
        h = jnp.tanh(h @ w.T + x)
        return h, h.sum()
    return lax.scan(step, jnp.zeros(w.shape[0], xs.dtype), xs)


def rnn_changing_weight(w, xs):
    """W.T in the loop, but W itself changes every step (no copy may be hoisted)."""
    def step(carry, x):
        h, w = carry
        h = jnp.tanh(h @ w.T + x)
        return (h, w * 0.99 + 0.001 * jnp.outer(h, h)), h.sum()
    (h, w), trace = lax.scan(step, (jnp.zeros(w.shape[0], xs.dtype), w), xs)
    return h, w, trace


def nested_transposed(w, xs):
    """W.T in an inner fori_loop; W changes in the outer scan only (the copy goes before
    the inner loop, made again at each outer step)."""
    def outer(carry, x):
        h, w = carry
        h = lax.fori_loop(0, 3, lambda i, h: jnp.sin(h @ w.T + x * i), h)
        return (h, w + 0.01 * jnp.outer(x, h)), h[0]
    return lax.scan(outer, (jnp.zeros(w.shape[0], xs.dtype), w), xs)


def program_of(fn, *args):
    return convert(jax.make_jaxpr(fn)(*args))


def _steps(steps):
    for step in steps:
        yield step
        if isinstance(step, Loop):
            yield from _steps(step.body)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_transposed_weights_in_a_scan_forward_gradient_and_vmap(dtype):
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(19, 19)).astype(dtype) * 0.3)
    xs = jnp.asarray(rng.normal(size=(6, 40, 19)).astype(dtype))
    # the rewrite applies: one copy of w, made before the loop
    program = c_loops_rewrite.optimise(program_of(rnn_transposed, w, xs[0]))
    copies = [s for s in program.steps if isinstance(s, Assign) and s.buffer.startswith("ef_wt")]
    assert len(copies) == 1
    fast = ef.jit(rnn_transposed)
    close(fast(w, xs[0]), jax.jit(rnn_transposed)(w, xs[0]), dtype)
    vmapped = lambda f: jax.vmap(f, in_axes=(None, 0))  # noqa: E731
    close(jax.jit(vmapped(fast))(w, xs), jax.jit(vmapped(rnn_transposed))(w, xs), dtype)

    def loss(f):
        return lambda w, xs: (vmapped(f)(w, xs)[0] ** 2).sum() + vmapped(f)(w, xs)[1].sum()
    close(jax.jit(jax.grad(loss(fast), argnums=(0, 1)))(w, xs),
          jax.jit(jax.grad(loss(rnn_transposed), argnums=(0, 1)))(w, xs), dtype)


def test_a_weight_written_in_the_loop_is_not_copied_before_it():
    rng = np.random.default_rng(1)
    w = jnp.asarray(rng.normal(size=(12, 12)) * 0.3)
    xs = jnp.asarray(rng.normal(size=(30, 12)))
    program = c_loops_rewrite.optimise(program_of(rnn_changing_weight, w, xs))
    assert not any(isinstance(s, Assign) and s.buffer.startswith("ef_wt")
                   for s in _steps(program.steps))
    close(ef.jit(rnn_changing_weight)(w, xs), jax.jit(rnn_changing_weight)(w, xs))
    close(jax.vmap(ef.jit(rnn_changing_weight), in_axes=(None, 0))(w, jnp.stack([xs, -xs])),
          jax.jit(jax.vmap(rnn_changing_weight, in_axes=(None, 0)))(w, jnp.stack([xs, -xs])))


def test_a_weight_written_in_an_outer_loop_is_copied_before_the_inner_loop():
    rng = np.random.default_rng(2)
    w = jnp.asarray(rng.normal(size=(10, 10)) * 0.3)
    xs = jnp.asarray(rng.normal(size=(15, 10)))
    program = c_loops_rewrite.optimise(program_of(nested_transposed, w, xs))
    outer = [s for s in program.steps if isinstance(s, Loop)]
    assert not any(isinstance(s, Assign) and s.buffer.startswith("ef_wt")
                   for s in program.steps)
    assert any(isinstance(s, Assign) and s.buffer.startswith("ef_wt")
               for loop in outer for s in loop.body)
    close(ef.jit(nested_transposed)(w, xs), jax.jit(nested_transposed)(w, xs))
    grad = lambda f: jax.grad(lambda w, xs: f(w, xs)[0][0].sum() + f(w, xs)[1].sum())  # noqa
    close(jax.jit(grad(ef.jit(nested_transposed)))(w, xs), jax.jit(grad(nested_transposed))(w, xs))


def carries(a, b, c, xs):
    """Carries that may and may not be updated in place: ``a`` reads ``b`` (old),
    ``b`` reads the old ``a`` after ``a``'s new value exists, ``c`` is shifted (read at
    another position), ``s`` accumulates (in place)."""
    def step(carry, x):
        a, b, c, s = carry
        a2 = a * 0.5 + b * x
        b2 = jnp.cos(b) * a + x          # the old a: a may not be overwritten first
        c2 = jnp.roll(c, 1) * 0.9 + x    # c read at another position
        s2 = s + a2 * b2                 # elementwise accumulation
        return (a2, b2, c2, s2), (a2 - b2).sum()
    return lax.scan(step, (a, b, c, jnp.zeros_like(a)), xs)


def swap(a, b, n):
    return lax.fori_loop(0, n, lambda i, ab: (ab[1] * 1.5, ab[0] + i), (a, b))


def test_carries_updated_in_place_only_where_nothing_reads_the_old_value_later():
    rng = np.random.default_rng(3)
    a, b, c = (jnp.asarray(rng.normal(size=9)) for _ in range(3))
    xs = jnp.asarray(rng.normal(size=(25, 9)))
    close(ef.jit(carries)(a, b, c, xs), jax.jit(carries)(a, b, c, xs))
    close(jax.vmap(ef.jit(carries), in_axes=(0, None, None, None))(jnp.stack([a, b, c]), b, c, xs),
          jax.jit(jax.vmap(carries, in_axes=(0, None, None, None)))(jnp.stack([a, b, c]), b, c, xs))
    close(jax.jit(jax.grad(lambda *v: ef.jit(carries)(*v)[0][3].sum(), argnums=(0, 1, 2, 3)))(a, b, c, xs),
          jax.jit(jax.grad(lambda *v: carries(*v)[0][3].sum(), argnums=(0, 1, 2, 3)))(a, b, c, xs))
    close(ef.jit(swap, static_argnums=2)(a, b, 7), jax.jit(swap, static_argnums=2)(a, b, 7))


def last_layer(h, w, v):
    """A sum whose operand holds vector math (the seed's last layer), rows of odd size."""
    return jnp.sum(jax.nn.sigmoid(h) * w, axis=-1) + jnp.tanh(h) @ v


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_vector_math_of_a_sums_operand(dtype):
    rng = np.random.default_rng(4)
    h = jnp.asarray(rng.normal(size=(11, 37)).astype(dtype) * 3)
    h = h.at[0, 0].set(jnp.inf).at[1, 1].set(-jnp.inf).at[2, 2].set(jnp.nan)
    w, v = (jnp.asarray(rng.normal(size=37).astype(dtype)) for _ in range(2))
    got, want = ef.jit(last_layer)(h, w, v), jax.jit(last_layer)(h, w, v)
    assert bool(jnp.isnan(got[2])) and bool(jnp.isnan(want[2]))
    close(got[3:], want[3:], dtype)
    close(got[:2], want[:2], dtype)
    close(jax.vmap(ef.jit(last_layer), in_axes=(0, None, None))(h[None].repeat(3, 0), w, v)[:, 3:],
          jax.vmap(last_layer, in_axes=(0, None, None))(h[None].repeat(3, 0), w, v)[:, 3:], dtype)


def test_a_vmapped_gradient_with_large_residuals_and_a_remainder_block():
    """Residuals past the stack (in each thread's arena), 2 full blocks and a remainder
    of 5 (its own program, sharing the arena), float32."""
    from test_jit_vmap import chain, chain_inputs
    params, noise = chain_inputs(np.float32, 21, 400, 33, seed=7)

    def loss(f):
        return lambda p, n: (jax.vmap(f, in_axes=(None, 0))(p, n)[0] ** 2).sum()
    close(jax.jit(jax.grad(loss(ef.jit(chain)), argnums=(0, 1)))(params, noise),
          jax.jit(jax.grad(loss(chain), argnums=(0, 1)))(params, noise), np.float32)
