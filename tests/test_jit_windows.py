"""ef.jit of JAX's window primitives -- pooling (reduce_window sum/max/min), convolutions
(conv_general_dilated: layouts, strides, padding, both dilations, feature and batch
groups) and max-pooling's gradient (select_and_scatter_add) -- against jax.jit of the
same function, forward and gradient, alone and under vmap."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import einfuse as ef  # noqa: E402

rng = np.random.default_rng(11)


def _f32(array):
    return jnp.asarray(array, jnp.float32)


def _same(got, want, rtol=2e-5, atol=2e-5):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert np.shape(g) == np.shape(w) and np.asarray(g).dtype == np.asarray(w).dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol)


def _forward_and_gradient(fn, *args):
    _same(ef.jit(fn)(*args), jax.jit(fn)(*args))

    def loss(*a):
        return (fn(*a) ** 2).sum()
    wanted = tuple(range(len(args)))
    want = jax.grad(loss, wanted)(*args)
    _same(jax.grad(ef.jit(loss), wanted)(*args), want, rtol=1e-4, atol=1e-4)


X = _f32(rng.standard_normal((2, 3, 9, 8)))


_PADDED = ((1, 0), (0, 2), (1, 1), (2, 0))


@pytest.mark.parametrize("reducer, init, window, strides, padding", [
    (jax.lax.max, -jnp.inf, (1, 1, 2, 2), (1, 1, 2, 2), "VALID"),
    (jax.lax.max, -jnp.inf, (2, 1, 3, 2), (1, 1, 2, 3), _PADDED),
    (jax.lax.add, 0.0, (2, 1, 3, 2), (1, 1, 2, 3), _PADDED),
    (jax.lax.min, jnp.inf, (1, 1, 3, 3), (1, 1, 1, 1), "SAME"),
], ids=["max", "max padded", "sum padded", "min same"])
def test_pooling(reducer, init, window, strides, padding):
    _forward_and_gradient(
        lambda x: jax.lax.reduce_window(x, init, reducer, window, strides, padding), X)


def test_pooling_with_base_and_window_dilation():
    _forward_and_gradient(lambda x: jax.lax.reduce_window(
        x, 0.0, jax.lax.add, (1, 1, 2, 2), (1, 1, 1, 1), "VALID", base_dilation=(1, 1, 2, 1),
        window_dilation=(1, 1, 2, 2)), X)


@pytest.mark.parametrize("options", [
    dict(window_strides=(1, 1), padding="SAME"),
    dict(window_strides=(1, 2), padding=((1, 2), (0, 1)), rhs_dilation=(2, 1)),
    dict(window_strides=(2, 2), padding=((2, 1), (1, 1)), lhs_dilation=(2, 1)),
], ids=["same", "rhs dilation", "lhs dilation"])
def test_convolution(options):
    w = _f32(rng.standard_normal((4, 3, 3, 3)))
    _forward_and_gradient(lambda x, w: jax.lax.conv_general_dilated(x, w, **options), X, w)


def test_grouped_and_channels_last_convolutions():
    w = _f32(rng.standard_normal((6, 1, 3, 3)))
    _forward_and_gradient(lambda x, w: jax.lax.conv_general_dilated(
        x, w, (1, 1), "SAME", feature_group_count=3), X, w)
    x, w = _f32(rng.standard_normal((2, 8, 7, 3))), _f32(rng.standard_normal((3, 2, 3, 5)))
    _forward_and_gradient(lambda x, w: jax.lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")), x, w)


def test_batch_groups():
    x, w = _f32(rng.standard_normal((4, 3, 7, 5))), _f32(rng.standard_normal((4, 3, 2, 2)))
    fn = lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "VALID",  # noqa: E731
                                                  batch_group_count=2)
    _same(ef.jit(fn)(x, w), jax.jit(fn)(x, w))


def test_a_small_cnn_under_vmap_and_grad():
    # conv + relu + 2x2 max pool + linear head, vmapped over examples, and its gradient
    w = _f32(rng.standard_normal((4, 3, 3, 3)) * 0.3)
    head = _f32(rng.standard_normal((4 * 4 * 4,)) * 0.1)
    images = _f32(rng.standard_normal((5, 3, 8, 8)))

    def net(w, head, image):
        h = jax.lax.conv_general_dilated(image[None], w, (1, 1), "SAME")
        h = jax.nn.relu(h)
        h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2),
                                  "VALID")
        return jnp.tanh(h.reshape(-1) @ head)

    batched = jax.vmap(net, in_axes=(None, None, 0))
    _same(jax.vmap(ef.jit(net), in_axes=(None, None, 0))(w, head, images),
          batched(w, head, images))

    def loss(w, head):
        return (batched(w, head, images) ** 2).sum()
    _same(ef.jit(jax.grad(loss, (0, 1)))(w, head), jax.grad(loss, (0, 1))(w, head),
          rtol=1e-4, atol=1e-5)
