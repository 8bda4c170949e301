"""jax.vmap of jax.grad (issue 9, item 15): per-example gradients, where the cotangent
of the loss is not batched but the inputs are.  Each statement transposes to gradient
statements, and vmap batches those like any statement: one more index on the output
and on each batched input, an unbatched one read as it is.  On the host path (CPU
arrays, callbacks) and on the device path (runtime/jax_gpu.py, tested as in
test_jax_gpu.py: with the launch replaced by the interpreted kernel)."""

import numpy as np
import pytest

import einfuse as ef

jax = pytest.importorskip("jax")
jnp = jax.numpy

from jax_cases import r  # noqa: E402

DIST = "D[i,j] := (w[k,i] - x[k,j])**2"


def dist_loss(backend):
    return lambda w, x: ef.ein(DIST, w=w, x=x, backend=backend).sum()


def dist_reference(w, x):
    return ((w[:, :, None] - x[:, None, :]) ** 2).sum()


def close(got, want):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * float(np.abs(w).max() + 1))


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (0, 0)])
def test_per_example_gradients(in_axes, backend):
    """The README's dist loss, batched over w, over x, or over both; with and without
    jit, for one input and for both."""
    w = r(3, 4, 2) if in_axes[0] == 0 else r(4, 2)
    x = r(3, 4, 5) if in_axes[1] == 0 else r(4, 5)
    for argnums in (0, (0, 1)):
        ours = jax.vmap(jax.grad(dist_loss(backend), argnums=argnums), in_axes=in_axes)
        want = jax.vmap(jax.grad(dist_reference, argnums=argnums), in_axes=in_axes)(w, x)
        close(ours(w, x), want)
        close(jax.jit(ours)(w, x), want)


def test_per_example_gradients_with_a_scalar_parameter(backend):
    """The statement also reads a scalar parameter that is not batched; the cotangent
    reaching it is unbatched (a plain sum), or batched (it depends on w)."""
    W, x, alpha = r(3, 6), r(6), jnp.float32(0.7)

    def loss(w, outer, reference=False):
        y = alpha * (w * x) ** 2 if reference else \
            ef.ein("y[i] := alpha * (w[i] * x[i])**2", w=w, x=x, alpha=alpha,
                   backend=backend)
        return jnp.sum(outer(y))
    for outer in (lambda y: y, jnp.sin):
        close(jax.jit(jax.vmap(jax.grad(lambda w: loss(w, outer))))(W),
              jax.vmap(jax.grad(lambda w: loss(w, outer, True)))(W))


def test_per_example_gradients_through_a_gather(backend):
    W, idx = r(5, 3), jnp.array([[1, 4], [0, 0], [3, 1]])
    for outer in (lambda e: e, lambda e: e ** 2):
        def loss(W, idx):
            return jnp.sum(outer(ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=idx,
                                        backend=backend)))
        got = jax.vmap(jax.grad(loss), in_axes=(None, 0))(W, idx)
        want = jax.vmap(jax.grad(lambda W, idx: jnp.sum(outer(W[idx]))),
                        in_axes=(None, 0))(W, idx)
        close(got, want)


def test_an_unbatched_input_is_not_copied_per_example(monkeypatch):
    """vmap with x shared: the batched statement reads x without the batch index."""
    from einfuse.runtime import jax_adapter
    seen = []
    original = jax_adapter._unbatch

    def spy(statement, full, batched):
        text = original(statement, full, batched)
        seen.append(text)
        return text
    monkeypatch.setattr(jax_adapter, "_unbatch", spy)
    w, x = r(3, 4, 2), r(4, 5)
    jax.vmap(jax.grad(dist_loss("numpy")), in_axes=(0, None))(w, x)
    assert "D[vb0, i, j] := (w[vb0, k, i] - x[k, j])**2" in seen


try:   # test_jax_gpu's fixture (that module needs torch)
    from test_jax_gpu import device_path  # noqa: F401
except pytest.skip.Exception:
    device_path = None


def device_tests():
    from einfuse.backends.triton import backend as triton_backend
    return pytest.mark.skipif(device_path is None or not triton_backend.available(),
                              reason="triton (and torch) not installed")


@device_tests()
def test_device_path_per_example_gradients_and_hessian(device_path):
    """The device path batched its gradients already (custom_vmap); its jvp, which
    jax.hessian needs, is new."""
    w, x = r(3, 4, 2), r(4, 5)
    ours = jax.vmap(jax.grad(dist_loss("triton")), in_axes=(0, None))
    want = jax.vmap(jax.grad(dist_reference), in_axes=(0, None))(w, x)
    close(jax.jit(ours)(w, x), want)

    def loss(w, x, reference=False):
        d = ((w[:, :, None] - x[:, None, :]) ** 2).sum(0) if reference else \
            ef.ein(DIST, w=w, x=x, backend="triton")
        return jnp.sum(jnp.sin(d))
    close(jax.jit(jax.hessian(loss))(w[0], x[:, :3]),
          jax.hessian(lambda w, x: loss(w, x, True))(w[0], x[:, :3]))
    assert device_path, "the device path was not taken"
