"""Named expressions run on 8 CPU devices with ``mesh=``/``shard=`` by dimension,
checked against the unsharded materialisation (and jax.numpy).  As sharding_checks.py,
run in a subprocess by test_dims_sharding.py (XLA_FLAGS must be set before jax is first
imported); prints one JSON object: check name -> null when it passed, else what failed.
Importing this module imports neither jax nor einfuse (test collection reads CHECKS)."""

from __future__ import annotations

import math

import numpy as np

CHECKS = {}


def check(function):
    CHECKS[function.__name__] = function
    return function


def _setup():
    global jax, jnp, ef
    import jax
    import jax.numpy as jnp

    import einfuse as ef


def _rand(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32))


def _close(got, want):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)


def _devices(array) -> int:
    return len(array.sharding.device_set)


def _dist(w, x, **options):
    i, j, k = ef.dims("i j k")
    D = ((ef.wrap(w)[k, i] - ef.wrap(x)[k, j]) ** 2).sum(k)
    return D.order(i, j, **options), (i, j, k)


@check
def dist_sharded_by_dimension_objects_and_names():
    rng = np.random.default_rng(1)
    w, x = _rand(rng, 16, 8), _rand(rng, 16, 12)
    want, _ = _dist(w, x)
    mesh = {"x": 4, "y": 2}
    i, j, k = ef.dims("i j k")
    D = ((ef.wrap(w)[k, i] - ef.wrap(x)[k, j]) ** 2).sum(k)
    split = D.order(i, j, mesh=mesh, shard={i: "x", j: "y"})
    _close(split, want)
    assert _devices(split) == 8, split.sharding        # laid out on the mesh
    _close(D.order(i, j, mesh=mesh, shard={"k": "x"}), want)     # a reduction split
    _close(D.order(j, i, mesh=mesh, shard={k: ("x", "y")}), np.asarray(want).T)
    _close(D.order(i, j, mesh=mesh, shard="auto"), want)
    jitted = jax.jit(lambda w, x: _dist(w, x, mesh=mesh, shard={"k": "x", "i": "y"})[0])
    _close(jitted(w, x), want)


@check
def attention_on_a_jax_mesh_by_dimension():
    rng = np.random.default_rng(2)
    q, k, v = (_rand(rng, 2, 6, 4, 8) for _ in range(3))

    def attention(**options):
        b, t, T, h, r = ef.dims("b t T h r")
        s = (ef.wrap(q)[b, t, h, r] * ef.wrap(k)[b, T, h, r]).sum(r) * (r.size ** -0.5)
        p = ef.where(T <= t, s, -math.inf).softmax(T)
        return (p * ef.wrap(v)[b, T, h, r]).sum(T).order(b, t, h, r, **options), (b, h, T)

    want, _ = attention()
    mesh = jax.make_mesh((4, 2), ("heads", "batch"))
    b, h, T = attention()[1]
    got, _ = attention(mesh=mesh, shard={"h": "heads", "b": "batch"})
    _close(got, want)
    # T is also the softmax's renamed reduction index (T_1): split with it
    got, _ = attention(mesh={"x": 2}, shard={"T": "x"})
    _close(got, want)


@check
def evaluate_several_results_on_a_mesh():
    rng = np.random.default_rng(3)
    x, W = _rand(rng, 8, 6), _rand(rng, 6, 4)
    b, d, o = ef.dims("b d o")
    y = (ef.wrap(x)[b, d] * ef.wrap(W)[d, o]).sum(d)
    z = ef.relu(y).sum(o)
    want = ef.evaluate((y, b, o), (z, b))
    got = ef.evaluate((y, b, o), (z, b), mesh={"data": 4, "model": 2},
                      shard={b: "data", o: "model"})
    for g, w in zip(got, want):
        _close(g, w)
    _close(want[0], np.asarray(x) @ np.asarray(W))


@check
def gradients_through_a_sharded_named_expression():
    rng = np.random.default_rng(4)
    w, x = _rand(rng, 16, 8), _rand(rng, 16, 12)
    mesh = {"x": 4, "y": 2}
    sharded = jax.grad(lambda w: jnp.sum(jnp.sin(_dist(w, x, mesh=mesh,
                                                       shard={"k": "x", "j": "y"})[0])))(w)
    plain = jax.grad(lambda w: jnp.sum(jnp.sin(((w[:, :, None] - x[:, None, :]) ** 2)
                                               .sum(0))))(w)
    np.testing.assert_allclose(np.asarray(sharded), np.asarray(plain), rtol=1e-4, atol=1e-4)


@check
def sharding_errors_name_the_dimension_and_line():
    rng = np.random.default_rng(5)
    w, x = _rand(rng, 16, 8), _rand(rng, 16, 12)
    i, j, k = ef.dims("i j k")
    D = ((ef.wrap(w)[k, i] - ef.wrap(x)[k, j]) ** 2).sum(k)
    try:
        D.order(i, j, mesh={"x": 4}, shard={"q": "x"})
    except ef.EinfuseError as problem:
        assert "'q'" in str(problem) and "dims_sharding_checks.py" in str(problem), problem
    else:
        raise AssertionError("a foreign dimension in shard= was accepted")
    try:
        D.order(i, j, shard={i: "x"})
    except ef.EinfuseError as problem:
        assert "mesh=" in str(problem), problem
    else:
        raise AssertionError("shard= without mesh= was accepted")
    nw, nx = np.asarray(w), np.asarray(x)
    E = ((ef.wrap(nw)[k, i] - ef.wrap(nx)[k, j]) ** 2).sum(k)
    try:
        E.order(i, j, mesh={"x": 4}, shard={i: "x"})
    except ef.EinfuseError as problem:
        assert "JAX arrays" in str(problem), problem
    else:
        raise AssertionError("NumPy arrays on a mesh were accepted")


if __name__ == "__main__":
    from eight_devices import report
    report(CHECKS, _setup)
