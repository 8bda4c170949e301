"""The gradient of a vmapped ``ef.jit`` call with ``jax.grad`` outside (issue 36 item 1):
the jaxpr arrives as one function of the whole batch (batched primitives over the chain
axis, no vmap left); runtime/jit_chains.py recovers the one-chain function, which runs
spread over programs (and lanes) as a vmapped call, the shared weights' gradients as
per-chain terms summed over the chains in chain order by the kernel's last program to
finish (one launch; a kernel of its own past one block of columns).  Run by Triton's interpreter against
``jax.jit(jax.grad(...))`` of the same function; launches and grids asserted; the bounds
fixture watches the jit kernels' loads and stores."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.backends.c import build as c_build  # noqa: E402
from einfuse.backends.triton import backend as triton_backend  # noqa: E402
from jit_support import x64  # noqa: E402,F401  (x64 mode around each test)
from test_jit_triton import close, in_bounds, launches, rnn, seed_arrays  # noqa: E402,F401

pytestmark = [
    pytest.mark.skipif(not triton_backend.available(), reason="triton (and torch) not installed"),
    pytest.mark.skipif(c_build.find_compiler() is None, reason="ef.jit builds its host kernel"),
]


def seed_gradient(params, noise):
    from einfuse.bench.jit_cases import seed_function
    return jax.grad(lambda p: jax.vmap(seed_function, in_axes=(None, 0))(p, noise).sum())(
        params)


def explained(fn, *args):
    return str(ef.explain(fn, *args))


def test_the_seed_gradient_over_chains_runs_per_chain_then_one_sum(in_bounds, monkeypatch):
    monkeypatch.delenv("EINFUSE_JIT_CHAINS", raising=False)
    monkeypatch.delenv("EINFUSE_JIT_LANES", raising=False)
    params, noise = seed_arrays(3, 4, chains=5, seed=3)
    fn = ef.jit(seed_gradient, backend="triton")
    out, seen = launches(lambda: fn(params, noise))
    # one program per chain, the last to finish summing the three weights' gradients
    # over the chains: one launch
    assert [(s.kernel, s.grid) for s in seen] == [("ef_jit_kernel", (5,))]
    close(out, jax.jit(seed_gradient)(params, noise))
    text = explained(fn, params, noise)
    assert "its one-chain program over 5 chains, its last program summing the chains " \
        "in chain order (one launch)" in text
    assert "outputs: a sum over the chains, a sum over the chains, a sum over the chains" \
        in text


def test_the_seed_gradient_over_chains_in_lanes_with_a_ragged_block(in_bounds, monkeypatch):
    monkeypatch.setenv("EINFUSE_JIT_CHAINS", "1")
    monkeypatch.setenv("EINFUSE_JIT_LANES", "2")
    params, noise = seed_arrays(2, 3, chains=3, seed=4)
    fn = ef.jit(seed_gradient, backend="triton")
    out, seen = launches(lambda: fn(params, noise))
    assert [s.grid for s in seen] == [(2,)]      # blocks of 2 of the 3 chains
    close(out, jax.jit(seed_gradient)(params, noise))
    assert "2 chains per program, as lanes" in explained(fn, params, noise)


def rnn_gradient(W, U, b, xs):
    def loss(W, U, b):
        hs, sq = jax.vmap(rnn, in_axes=(None, None, None, 0))(W, U, b, xs)
        return jnp.sum(hs ** 2) + jnp.sum(jnp.tanh(sq))
    return jax.grad(loss, argnums=(0, 1, 2))(W, U, b)


def test_an_rnn_gradient_over_chains(in_bounds, monkeypatch):
    monkeypatch.setenv("EINFUSE_JIT_CHAINS", "1")
    rng = np.random.default_rng(5)
    W = jnp.asarray(rng.standard_normal((4, 4)) * 0.5)
    U = jnp.asarray(rng.standard_normal((4, 3)))
    b = jnp.asarray(rng.standard_normal(4))
    xs = jnp.asarray(rng.standard_normal((3, 5, 3)))
    fn = ef.jit(rnn_gradient, backend="triton")
    out, seen = launches(lambda: fn(W, U, b, xs))
    assert [s.grid for s in seen] == [(3,)]
    close(out, jax.jit(rnn_gradient)(W, U, b, xs))


def chained_outputs(W, xs):
    # per-chain outputs (stacked, the chain axis not leading) beside a shared gradient
    def f(W, x):
        return jnp.tanh(x @ W)
    g = jax.grad(lambda W: jax.vmap(f, in_axes=(None, 0))(W, xs).sum())(W)
    ys = jax.vmap(f, in_axes=(None, 0))(W, xs)
    return g, jnp.swapaxes(ys, 0, 1), W * 2.0


def test_chained_and_shared_outputs_come_back_in_place(in_bounds, monkeypatch):
    monkeypatch.setenv("EINFUSE_JIT_CHAINS", "1")
    rng = np.random.default_rng(6)
    W = jnp.asarray(rng.standard_normal((3, 4)))
    xs = jnp.asarray(rng.standard_normal((5, 2, 3)))
    fn = ef.jit(chained_outputs, backend="triton")
    out, seen = launches(lambda: fn(W, xs))
    assert [s.grid for s in seen] == [(5,)]
    close(out, jax.jit(chained_outputs)(W, xs))


def seed_gradient_chains_last(params, noise):
    from einfuse.bench.jit_cases import seed_function
    return jax.grad(lambda p: jax.vmap(seed_function, in_axes=(None, noise.ndim - 1))(
        p, noise).sum())(params)


def test_a_chain_axis_that_is_not_leading_is_spread_too(in_bounds, monkeypatch):
    monkeypatch.delenv("EINFUSE_JIT_CHAINS", raising=False)
    monkeypatch.delenv("EINFUSE_JIT_LANES", raising=False)
    params, noise = seed_arrays(3, 4, chains=5, seed=3)
    noise = jnp.moveaxis(noise, 0, -1)           # the chains last: vmap's in_axes=2
    fn = ef.jit(seed_gradient_chains_last, backend="triton")
    out, seen = launches(lambda: fn(params, noise))
    assert [(s.kernel, s.grid) for s in seen] == [("ef_jit_kernel", (5,))]
    close(out, jax.jit(seed_gradient_chains_last)(params, noise))
    assert "chained at axis 2" in explained(fn, params, noise)


def chained_outputs_middle(W, xs):
    def f(W, x):
        return jnp.tanh(x @ W)
    g = jax.grad(lambda W: jax.vmap(f, in_axes=(None, 1))(W, xs).sum())(W)
    ys = jax.vmap(f, in_axes=(None, 1), out_axes=1)(W, xs)
    return g, ys, W * 2.0


def test_an_input_chained_in_the_middle_and_its_outputs_come_back_in_place(
        in_bounds, monkeypatch):
    monkeypatch.setenv("EINFUSE_JIT_CHAINS", "1")
    rng = np.random.default_rng(8)
    W = jnp.asarray(rng.standard_normal((3, 4)))
    xs = jnp.asarray(rng.standard_normal((2, 5, 3)))       # 5 chains at axis 1
    fn = ef.jit(chained_outputs_middle, backend="triton")
    out, seen = launches(lambda: fn(W, xs))
    assert [s.grid for s in seen] == [(5,)]
    close(out, jax.jit(chained_outputs_middle)(W, xs))
    assert "chained at axis 1" in explained(fn, W, xs)


def across_chains(W, xs):
    # the largest chain's value is read by every chain: not a per-chain computation
    ys = jnp.tanh(xs @ W)
    return jax.grad(lambda W: jnp.sum(jnp.tanh(xs @ W) * jnp.max(ys, axis=0)))(W)


def test_a_value_across_the_chains_declines_with_its_reason(in_bounds, monkeypatch):
    monkeypatch.setenv("EINFUSE_JIT_CHAINS", "1")
    rng = np.random.default_rng(7)
    W = jnp.asarray(rng.standard_normal((3, 4)))
    xs = jnp.asarray(rng.standard_normal((5, 3)))
    fn = ef.jit(across_chains, backend="triton")
    out, seen = launches(lambda: fn(W, xs))
    assert [s.grid for s in seen] == [(1,)]          # the whole batch as one program
    close(out, jax.jit(across_chains)(W, xs))
    text = explained(fn, W, xs)
    assert "not spread over chains: " in text
    assert "reduce_max across the chain axis" in text


def per_chain_trip_counts(W, xs):
    def f(W, x):
        count, _ = jax.lax.while_loop(lambda c: c[1].max() < 8.0,
                                      lambda c: (c[0] + 1, c[1] * 2.0 + 0.5),
                                      (0, jnp.abs(x)))
        return jnp.sum(jnp.tanh(x @ W)) * count
    return jax.grad(lambda W: jax.vmap(f, in_axes=(None, 0))(W, xs).sum())(W)


def test_a_while_loop_with_per_chain_trip_counts(in_bounds, monkeypatch):
    monkeypatch.setenv("EINFUSE_JIT_CHAINS", "1")
    monkeypatch.setenv("EINFUSE_JIT_LANES", "2")
    rng = np.random.default_rng(8)
    W = jnp.asarray(rng.standard_normal((3, 4)))
    xs = jnp.asarray(rng.standard_normal((5, 3)) * np.array([[9.0], [0.1], [1.0], [3.0],
                                                              [0.01]]))
    fn = ef.jit(per_chain_trip_counts, backend="triton")
    out, seen = launches(lambda: fn(W, xs))
    close(out, jax.jit(per_chain_trip_counts)(W, xs))
    # each chain runs its own loop (0 to several trips), two chains per program, the
    # last block ragged
    assert [s.grid for s in seen] == [(3,)]
    assert "5 chains (inputs: shared, chained at axis 0; outputs: a sum over the chains)" \
        in explained(fn, W, xs)


def test_the_sum_over_chains_is_in_chain_order():
    import torch
    from einfuse.backends.triton.jit_chain_sum import ChainSum
    rng = np.random.default_rng(9)
    sizes, chains = (3, 1, 700), 6
    terms = [rng.standard_normal((chains, n)) * 10.0 ** rng.integers(-8, 8, (chains, 1))
             for n in sizes]
    flat = torch.from_numpy(np.concatenate([t.ravel() for t in terms]))
    result = torch.empty(sum(sizes), dtype=torch.float64)
    ChainSum(chains, sizes)(flat, result)
    want = []
    for t in terms:
        acc = t[0].copy()
        for b in range(1, chains):
            acc = acc + t[b]              # chain 0, 1, ... in order, as the kernel
        want.append(acc)
    np.testing.assert_array_equal(result.numpy(), np.concatenate(want))


def test_the_spread_rule(monkeypatch):
    from einfuse.schedule.jit_device import DeviceChoice, spread_over_chains
    monkeypatch.delenv("EINFUSE_JIT_CHAINS", raising=False)
    yes, no = DeviceChoice(True, "runs"), DeviceChoice(False, "declines")
    # 256 chains of 12: one program's tiles of 3072 against 256 programs of 16
    assert spread_over_chains(yes, 3072, 100, yes, 256, 16, 1)[0]
    # a few chains of tiny tiles: the sum's launch costs more than the rounds it saves
    assert not spread_over_chains(yes, 20, 100, yes, 5, 4, 1)[0]
    assert spread_over_chains(no, 0, 100, yes, 5, 4, 1)[0]
    assert not spread_over_chains(yes, 3072, 100, no, 256, 16, 1)[0]
    monkeypatch.setenv("EINFUSE_JIT_CHAINS", "0")
    assert not spread_over_chains(yes, 3072, 100, yes, 256, 16, 1)[0]


@pytest.mark.slow
def test_the_seed_gradient_over_256_chains(in_bounds, monkeypatch):
    monkeypatch.delenv("EINFUSE_JIT_CHAINS", raising=False)
    monkeypatch.setenv("EINFUSE_JIT_LANES", "8")
    params, noise = seed_arrays(2, 3, chains=256, seed=10)
    fn = ef.jit(seed_gradient, backend="triton")
    out, seen = launches(lambda: fn(params, noise))
    assert [s.grid for s in seen] == [(32,)]
    close(out, jax.jit(seed_gradient)(params, noise))


def test_the_sums_in_the_launch_have_the_bits_of_the_separate_kernel(monkeypatch):
    from einfuse.backends.triton import jit_chain_sum
    monkeypatch.setenv("EINFUSE_JIT_CHAINS", "1")
    monkeypatch.setenv("EINFUSE_JIT_LANES", "2")
    params, noise = seed_arrays(3, 5, chains=7, seed=11)
    fn = ef.jit(seed_gradient, backend="triton")
    inside, seen = launches(lambda: fn(params, noise))
    assert [s.kernel for s in seen] == ["ef_jit_kernel"]
    monkeypatch.setattr(jit_chain_sum, "IN_KERNEL_COLUMNS", 0)
    separate_fn = ef.jit(seed_gradient, backend="triton")
    separate, seen = launches(lambda: separate_fn(params, noise))
    assert [s.kernel for s in seen] == ["ef_jit_kernel", "ef_chain_sum"]
    for a, b in zip(jax.tree.leaves(inside), jax.tree.leaves(separate)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    close(inside, jax.jit(seed_gradient)(params, noise))
    # and again: the ticket starts from zero on every call
    again, _ = launches(lambda: fn(params, noise))
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(inside)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def wide_gradient(W, xs):
    def f(W, x):
        return jnp.sum(jnp.tanh(x @ W))
    return jax.grad(lambda W: jax.vmap(f, in_axes=(None, 0))(W, xs).sum())(W)


def test_sums_past_one_block_of_columns_take_their_own_kernel(in_bounds, monkeypatch):
    monkeypatch.setenv("EINFUSE_JIT_CHAINS", "1")
    rng = np.random.default_rng(12)
    W = jnp.asarray(rng.standard_normal((8, 160)) * 0.1)      # 1280 columns to sum
    xs = jnp.asarray(rng.standard_normal((3, 8)))
    fn = ef.jit(wide_gradient, backend="triton")
    out, seen = launches(lambda: fn(W, xs))
    # (the one-chain kernel's grid is the lanes rule's; the sum's: 1280 columns in
    # blocks of 1024)
    assert [s.kernel for s in seen] == ["ef_jit_kernel", "ef_chain_sum"]
    assert seen[1].grid == (2,)
    close(out, jax.jit(wide_gradient)(W, xs))
    assert "then 1 fixed-order sum kernel(s)" in explained(fn, W, xs)
