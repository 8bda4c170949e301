"""ef.jit against jax.jit of the same function: forward and gradient, loops included."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.backends.c import build as c_build  # noqa: E402

from jit_support import close, seed_inputs, seed_run, x64  # noqa: E402,F401  (x64: autouse)

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="needs a C compiler")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_seed_mlp_scan_forward_and_gradient(dtype):
    params, noise = seed_inputs(dtype)
    fast = ef.jit(seed_run)
    close(fast(params, noise), jax.jit(seed_run)(params, noise), dtype)

    def loss(f):
        return lambda p, n: (f(p, n) ** 2).sum()
    reference = jax.jit(jax.value_and_grad(loss(seed_run)))(params, noise)
    close(jax.grad(loss(fast))(params, noise), reference[1], dtype)
    if dtype == np.float64:   # under jax.jit too (the same kernels, called by XLA)
        close(jax.jit(jax.value_and_grad(loss(fast)))(params, noise), reference, dtype)


def test_seed_vmapped_chains_and_their_gradient():
    params, _ = seed_inputs(np.float64)
    noises = jnp.asarray(np.random.default_rng(1).normal(size=(3, 20, 1)) * 0.1)
    fast = jax.vmap(ef.jit(seed_run), in_axes=(None, 0))
    close(fast(params, noises), jax.jit(jax.vmap(seed_run, in_axes=(None, 0)))(params, noises))

    def loss(f):
        return lambda p, n: f(p, n).sum()
    close(jax.vmap(jax.grad(loss(ef.jit(seed_run))), in_axes=(None, 0))(params, noises),
          jax.jit(jax.vmap(jax.grad(loss(seed_run)), in_axes=(None, 0)))(params, noises))


def rnn(params, xs):
    w_in, w_h, b = params["w_in"], params["w_h"], params["b"]

    def cell(h, x):
        h = jnp.tanh(x @ w_in + h @ w_h + b)
        return h, h.sum()
    h, ys = lax.scan(cell, jnp.zeros(w_h.shape[0]), xs)
    return {"h": h, "ys": ys}


def test_rnn_over_a_sequence_pytrees_and_stacked_outputs():
    rng = np.random.default_rng(2)
    params = {"w_in": jnp.asarray(rng.normal(size=(3, 5)) * 0.5),
              "w_h": jnp.asarray(rng.normal(size=(5, 5)) * 0.5), "b": jnp.asarray(rng.normal(size=5))}
    xs = jnp.asarray(rng.normal(size=(9, 3)))
    close(ef.jit(rnn)(params, xs), jax.jit(rnn)(params, xs))
    loss = lambda f: lambda p: (f(p, xs)["h"] ** 2).sum() + f(p, xs)["ys"][::2].sum()  # noqa: E731
    close(jax.grad(loss(ef.jit(rnn)))(params), jax.jit(jax.grad(loss(rnn)))(params))


def euler(y0, k, steps):
    def step(t, y):
        return y + 0.01 * (-k * y + jnp.sin(t * 0.01))
    return lax.fori_loop(0, steps, step, y0)


def test_euler_integrator_with_a_static_step_count():
    y0 = jnp.asarray([1.0, 2.0, -0.5])
    fast = ef.jit(euler, static_argnums=2)
    reference = jax.jit(euler, static_argnums=2)
    close(fast(y0, 0.7, 50), reference(y0, 0.7, 50))
    close(fast(y0, 0.7, 7), reference(y0, 0.7, 7))
    close(jax.grad(lambda k: fast(y0, k, 30).sum())(0.7),
          jax.jit(jax.grad(lambda k: euler(y0, k, 30).sum()))(0.7))


def softmax(x):
    e = jnp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_softmax_and_attention_in_jax_numpy():
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.normal(size=(4, 6)))
    close(ef.jit(softmax)(x), jax.jit(softmax)(x))
    close(jax.grad(lambda x: (ef.jit(softmax)(x) ** 3).sum())(x),
          jax.jit(jax.grad(lambda x: (softmax(x) ** 3).sum()))(x))

    def attention(q, k, v):
        return jax.nn.softmax(jnp.einsum("td,sd->ts", q, k) / 2.0, axis=-1) @ v
    q, k, v = (jnp.asarray(rng.normal(size=(5, 4))) for _ in range(3))
    close(ef.jit(attention)(q, k, v), jax.jit(attention)(q, k, v))


def test_vmap_of_an_embedding_lookup_and_its_gradient():
    rng = np.random.default_rng(4)
    weight = jnp.asarray(rng.normal(size=(10, 4)))
    tokens = jnp.asarray([[1, 2, 3, 2], [9, 0, 5, -1]])
    lookup = lambda w, x: w[x]  # noqa: E731
    close(jax.vmap(ef.jit(lookup), in_axes=(None, 0))(weight, tokens),
          jax.jit(jax.vmap(lookup, in_axes=(None, 0)))(weight, tokens))
    loss = lambda f: lambda w: (jax.vmap(f, in_axes=(None, 0))(w, tokens) ** 2).sum()  # noqa: E731
    close(jax.grad(loss(ef.jit(lookup)))(weight), jax.jit(jax.grad(loss(lookup)))(weight))
    close(ef.jit(lambda w, x: jnp.take(w, x, axis=1))(weight, tokens[0]),
          jax.jit(lambda w, x: jnp.take(w, x, axis=1))(weight, tokens[0]))


def test_while_loop_with_a_data_dependent_stop_and_cond():
    def grow(x):
        return lax.while_loop(lambda c: c[0] < 10.0, lambda c: (c[0] * 1.5 + c[1], c[1] + 1),
                              (x, jnp.float64(0.1)))
    for start in (0.3, 20.0):
        close(ef.jit(grow)(jnp.float64(start)), jax.jit(grow)(jnp.float64(start)))

    def branchy(x):
        return lax.fori_loop(0, 7, lambda i, c: lax.cond(i % 2 == 0, lambda c: c * 2,
                                                          lambda c: c - 1, c), x)
    close(ef.jit(branchy)(jnp.arange(3.0)), jax.jit(branchy)(jnp.arange(3.0)))


def test_shape_primitives_integers_and_reductions():
    def mixed(x, i):
        y = jnp.concatenate([x, x[::-1] * 2], axis=0).reshape(4, 6)[:, 1:5].T
        z = jnp.pad(y, ((1, 0), (0, 2)))
        a = lax.dynamic_slice(x, (i, 0), (1, 3))
        b = lax.dynamic_update_slice(x, a * 10, (0, i))
        return (z.max(axis=1), jnp.argmax(y, axis=0), jnp.argmin(x), b, (i // 2) % 3,
                jnp.cumsum(jnp.ones(1)) if False else jnp.prod(x, axis=0),
                x.astype(jnp.int32), jnp.arange(5) * i, (x > 0.5).all(axis=1))
    x = jnp.asarray(np.random.default_rng(5).normal(size=(2, 6)).reshape(4, 3))
    for i in (0, 1, 7, -3):
        close(ef.jit(mixed)(x, i), jax.jit(mixed)(x, i))


def test_an_unsupported_primitive_names_itself_and_the_source_line():
    def uses_sort(x):
        return jnp.sort(x) * 2
    with pytest.raises(ef.EinfuseError) as info:
        ef.jit(uses_sort)(jnp.arange(3.0))
    message = str(info.value)
    assert "'sort'" in message and "test_jit.py" in message
    with pytest.raises(ef.EinfuseError) as info:    # inside a loop body too
        ef.jit(lambda x: lax.scan(lambda c, v: (c + jnp.sort(v).sum(), None), 0.0, x)[0])(
            jnp.ones((3, 2)))
    assert "'sort'" in str(info.value) and "test_jit.py" in str(info.value)


def test_fallback_splits_around_an_unsupported_primitive():
    def model(x, w):
        y = jnp.tanh(x @ w)
        z = jnp.sort(y, axis=-1)
        return (jnp.exp(z) * 2).sum(axis=-1), y
    rng = np.random.default_rng(6)
    x, w = jnp.asarray(rng.normal(size=(4, 3))), jnp.asarray(rng.normal(size=(3, 5)))
    split = ef.jit(model, fallback=True)
    close(split(x, w), jax.jit(model)(x, w))
    close(jax.grad(lambda w: split(x, w)[0].sum())(w),
          jax.jit(jax.grad(lambda w: model(x, w)[0].sum()))(w))
    text = str(ef.explain(split, x, w))
    assert "run by JAX" in text and "'sort'" in text and "einfuse kernel" in text


def test_cache_per_shape_and_static_argument():
    calls = []

    def scaled(x, factor):
        calls.append(1)
        return x * factor
    fast = ef.jit(scaled, static_argnames="factor")
    close(fast(jnp.ones(3), factor=2.0), jnp.full(3, 2.0))
    fast(jnp.zeros(3), factor=2.0)
    assert len(calls) == 1
    close(fast(jnp.ones(4), factor=3.0), jnp.full(4, 3.0))
    assert len(calls) == 2


def test_importing_einfuse_does_not_import_jax():
    import subprocess
    import sys
    code = "import sys, einfuse; assert 'jax' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_gather_and_scatter_modes_with_out_of_range_indices():
    def indexing(w, i):
        return (w[i], w.at[i].add(1.0), w.at[i].add(1.0, mode="clip"),
                w.at[i].get(mode="fill", fill_value=-1.0),
                jax.grad(lambda w: (w[i] ** 2).sum())(w), jnp.take(w, i, axis=0, mode="clip"),
                w[:, i % 3], w.at[i % 4, 1].set(5.0))
    w = jnp.arange(12.0).reshape(4, 3)
    i = jnp.asarray([0, 3, 7, -9, 2])
    for ours, theirs in zip(ef.jit(indexing)(w, i), jax.jit(indexing)(w, i)):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_tile_split_stack_and_cumulative_reductions():
    def shapes(x, i):
        return (jnp.tile(x[:2], (2, 1)), jnp.split(x, [1, 3])[1] * 2, jnp.stack([x, -x], 1),
                jnp.cumsum(x, 0), jnp.cumprod(x, 1), lax.cummax(x, 1, reverse=True),
                lax.cummin(x, 0), jnp.cumsum(i), jnp.roll(x, 2, axis=1), jnp.triu(x),
                jnp.repeat(x[:, :2], 2, axis=1), jnp.outer(x[0], x[1]))
    x = jnp.asarray(np.random.default_rng(7).normal(size=(4, 3)))
    close(ef.jit(shapes)(x, jnp.asarray([3, -1, 7, 0])),
          jax.jit(shapes)(x, jnp.asarray([3, -1, 7, 0])))


def test_explain_shows_the_loop_the_hoisted_work_and_the_equations():
    params, noise = seed_inputs(np.float64)
    text = str(ef.explain(seed_run, params, noise))
    assert "1 kernel" in text and "loop s" in text and "inside the kernel" in text
    assert "Computed once, before the first loop" in text       # softplus(w) of each layer
    assert "= dot_general" in text and "->  t" in text          # equations mapped to buffers
    with pytest.raises(ef.EinfuseError, match="must be a string"):
        ef.explain(ef.compile("C[i] := A[i] * 2"))               # a compiled kernel is not traced


def test_jax_random_in_a_while_loop_the_seeds_original_form():
    def draws(key):
        k1, k2 = jax.random.split(key)
        return jax.random.bits(k1, (4,)), jax.random.uniform(k2, (2, 3)), \
            jax.random.normal(k2, (3,)), jax.random.fold_in(k1, 5)
    key = jax.random.PRNGKey(7)
    ours, theirs = ef.jit(draws)(key), jax.jit(draws)(key)
    for k in (0, 1, 3):      # bits, uniform floats and keys: bit for bit
        np.testing.assert_array_equal(np.asarray(ours[k]), np.asarray(theirs[k]))
    np.testing.assert_allclose(ours[2], theirs[2], rtol=1e-5, atol=1e-6)   # erf_inv

    def original(params, key, steps):   # JAX issue #7024 as first written
        def body(state):
            i, x, key = state
            key, sub = jax.random.split(key)
            for w in params:
                x = jax.nn.sigmoid(x @ jax.nn.softplus(w))
            return i + 1, x + 0.1 * jax.random.normal(sub, (1,)), key
        return lax.while_loop(lambda s: s[0] < steps, body, (0, jnp.zeros(1), key))[1]
    params, _ = seed_inputs(np.float32)
    close(ef.jit(original, static_argnums=2)(params, key, 60),
          jax.jit(original, static_argnums=2)(params, key, 60), np.float32)


def test_static_arguments_equal_but_of_other_types_are_cached_apart():
    def typed(x, n):
        return x * 3 if isinstance(n, bool) else x + n
    fast, reference = ef.jit(typed, static_argnums=1), jax.jit(typed, static_argnums=1)
    for n in (1, True, 1.0):
        close(fast(jnp.ones(2), n), reference(jnp.ones(2), n))


def test_gradient_of_a_gradient():
    x = jnp.asarray(np.random.default_rng(8).normal(size=(3, 4)))

    def cubic(b):
        return (jnp.sin(b) ** 3).sum()
    close(jax.grad(lambda a: jax.grad(ef.jit(cubic))(a).sum())(x),
          jax.jit(jax.grad(lambda a: jax.grad(cubic)(a).sum()))(x))


def test_vmap_of_a_while_loop_with_a_batched_stop():
    def grow(x, limit):
        return lax.while_loop(lambda c: c[0] < limit, lambda c: (c[0] * 1.7 + 0.1, c[1] + 1),
                              (x, 0))
    xs, limits = jnp.asarray([0.3, 20.0, 5.0, 1.0]), jnp.asarray([10.0, 1.0, 50.0, 2.0])
    close(jax.vmap(ef.jit(grow))(xs, limits), jax.jit(jax.vmap(grow))(xs, limits))
    close(jax.vmap(ef.jit(grow), in_axes=(0, None))(xs, 7.0),
          jax.jit(jax.vmap(grow, in_axes=(0, None)))(xs, 7.0))
    fori = lambda n, x: lax.fori_loop(0, n, lambda i, c: c * 2 + i, x)  # noqa: E731
    n = jnp.asarray([0, 3, 1])
    close(jax.vmap(ef.jit(fori))(n, jnp.ones((3, 2))), jax.jit(jax.vmap(fori))(n, jnp.ones((3, 2))))


def test_fallback_outputs_are_jax_arrays_of_the_traced_dtypes():
    def model(x, y):
        return jnp.sort(y), 3.0, x, jnp.int32(2)
    x, y = np.arange(3.0), jnp.asarray([2.0, 1.0])
    ours, theirs = ef.jit(model, fallback=True)(x, y), jax.jit(model)(x, y)
    for got, want in zip(ours, theirs):
        assert isinstance(got, jax.Array)
    close(ours, theirs)


def test_an_output_larger_than_memory_is_an_einfuse_error():
    with pytest.raises(ef.EinfuseError, match="do not fit in memory"):
        ef.jit(lambda a: jnp.zeros((2**22, 2**22)) + a)(1.0)


def test_the_cache_follows_jax_enable_x64():
    def widened(a):
        return a + jnp.arange(3) * 2**20 * 2**20 / 3
    fast, a = ef.jit(widened), jnp.asarray([1, 2, 3], jnp.int32)
    for x64 in (False, True):
        jax.config.update("jax_enable_x64", x64)
        close(fast(a), jax.jit(widened)(a), np.float32 if not x64 else np.float64)


def test_bitwise_reductions_of_integers():
    def bits(a):
        return (lax.reduce_and(a, (1,)), jnp.bitwise_and.reduce(a.astype(jnp.uint8), axis=0),
                lax.reduce_or(a, (0,)), jnp.bitwise_and.reduce(a[:, :3], axis=1))
    a = jnp.asarray([[7, 3, 6, 14, 15, 7], [-1, -3, 255, 127, -9, 5]], jnp.int32)
    for ours, theirs in zip(ef.jit(bits)(a), jax.jit(bits)(a)):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_a_static_argument_is_static_by_position_and_by_name():
    def sized(x, n):
        return x + jnp.arange(n).sum()
    by_name = ef.jit(sized, static_argnames="n")
    by_number = ef.jit(sized, static_argnums=1)
    for got in (by_name(1.0, 3), by_name(1.0, n=3), by_number(1.0, 3), by_number(1.0, n=3)):
        close(got, jax.jit(sized, static_argnums=1)(1.0, 3))


def test_elementwise_operands_with_axes_of_length_one_broadcast():
    # lax's binary primitives broadcast a length-1 axis (mul f64[2,3] f64[1,3]); JAX's
    # own gradients emit them: reading such an operand at every row read past its end
    x = jnp.asarray(np.random.default_rng(9).normal(size=(4, 3)))

    def direct(a):
        return (lax.mul(a, jnp.exp(a[:1])), lax.add(a[:, :1] * 2, a),
                lax.select(a > 0, a, lax.sub(a[1:2], a)), lax.max(jnp.tanh(a[:1]), a))
    close(ef.jit(direct)(x), jax.jit(direct)(x))

    def normalised(a):
        return (a / (1 + a.sum(axis=0, keepdims=True) ** 2)).sum()
    close(jax.grad(ef.jit(normalised))(x), jax.jit(jax.grad(normalised))(x))


def test_padding_an_empty_array_and_gradients_of_length_one_axes():
    def padded(a):
        return lax.pad(a[:, :0], 2.5, ((1, 0, 0), (2, 1, 3))), jnp.concatenate([a[1:], a[:1]])
    x = jnp.asarray([[0.5, -1.0, 2.0]])
    close(ef.jit(padded)(x), jax.jit(padded)(x))
    loss = lambda a: (padded(a)[1] ** 2).sum() + padded(a)[0].sum()  # noqa: E731
    close(jax.grad(ef.jit(loss))(x), jax.jit(jax.grad(loss))(x))


def test_platform_dependent_code_takes_the_cpu_branch():
    """jnp.diag and jnp.diagonal choose their code per platform (platform_index and a
    cond); ef.jit runs the CPU's branch."""
    x = jnp.arange(12.0).reshape(3, 4)
    cases = [(jnp.diag, x), (jnp.diag, jnp.arange(5.0)), (lambda m: jnp.diag(m, 1), x),
             (lambda m: jnp.diagonal(m, -1), x), (jnp.trace, x)]
    for fn, arg in cases:
        np.testing.assert_array_equal(np.asarray(ef.jit(fn)(arg)), np.asarray(jax.jit(fn)(arg)))
    grad = jax.grad(lambda m: (ef.jit(jnp.diagonal)(m) ** 2).sum())(x)
    np.testing.assert_allclose(grad, jax.grad(lambda m: (jnp.diagonal(m) ** 2).sum())(x))
