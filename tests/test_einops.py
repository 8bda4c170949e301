"""ef.rearrange / ef.reduce / ef.repeat against einops itself, on every backend; torch
gradients and JAX transformations through them; errors for bad patterns."""

import numpy as np
import pytest

import einfuse as ef

einops = pytest.importorskip("einops")
rng = np.random.default_rng(0)
x = rng.standard_normal((2, 6, 4, 3))

CASES = [
    ("rearrange", "b h w c -> b c h w", {}, None),
    ("rearrange", "b h w c -> b (h w) c", {}, None),
    ("rearrange", "b (h h2) w c -> b h h2 w c", {"h2": 2}, None),
    ("rearrange", "b (h h2) w c -> b (h2 h) w c", {"h2": 3}, None),
    ("rearrange", "b h w c -> (b h) w c", {}, None),
    ("rearrange", "b ... c -> b c ...", {}, None),
    ("rearrange", "b ... -> b (...)", {}, None),
    ("rearrange", "b ... -> (...) b", {}, None),
    ("rearrange", "b h w c -> b h w c 1", {}, None),
    ("rearrange", "b h w c -> b h () w c", {}, None),
    ("reduce", "b (h h2) (w w2) c -> b h w c", {"h2": 2, "w2": 2}, "max"),
    ("reduce", "b h w c -> b c", {}, "mean"),
    ("reduce", "b h w c -> ", {}, "sum"),
    ("reduce", "b h w c -> b () () c", {}, "min"),
    ("reduce", "b h w c -> h", {}, "prod"),
    ("reduce", "b ... c -> b c", {}, "sum"),
    ("repeat", "b h w c -> b h w c r", {"r": 3}, None),
    ("repeat", "b h w c -> b (h 2) w c", {}, None),
    ("repeat", "b h w c -> (r b) h w c", {"r": 2}, None),
]


def reference(kind, pattern, sizes, reduction, value):
    if kind == "reduce":
        return einops.reduce(value, pattern, reduction, **sizes)
    return getattr(einops, kind)(value, pattern, **sizes)


def ours(kind, pattern, sizes, reduction, value, **options):
    if kind == "reduce":
        return ef.reduce(value, pattern, reduction, **sizes, **options)
    return getattr(ef, kind)(value, pattern, **sizes, **options)


@pytest.mark.parametrize("kind, pattern, sizes, reduction", CASES,
                         ids=[f"{c[0]} {c[1]}" for c in CASES])
def test_matches_einops(backend, kind, pattern, sizes, reduction):
    got = ours(kind, pattern, sizes, reduction, x, backend=backend)
    want = reference(kind, pattern, sizes, reduction, x)
    assert np.shape(got) == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("reduction", ["any", "all"])
@pytest.mark.parametrize("pattern, sizes", [("b h w c -> b c", {}), ("b (h h2) w c -> h c", {"h2": 2}),
                                            ("b h w c -> ", {}), ("b h w c -> c () b", {})])
@pytest.mark.parametrize("dtype", [bool, np.int32, np.float64])
def test_any_and_all_are_einops(reduction, pattern, sizes, dtype):
    value = (np.round(x) if dtype is not bool else x > 0.5).astype(dtype)
    got = ef.reduce(value, pattern, reduction, **sizes)
    want = einops.reduce(value, pattern, reduction, **sizes)
    assert got.dtype == want.dtype == np.bool_
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("pattern, sizes", [("b h w c -> c w", {}),
                                            ("b (h h2) w c -> (c b) h 1", {"h2": 3}),
                                            ("b h w c -> b h", {})])
def test_a_callable_reduction_as_einops_calls_it(pattern, sizes):
    def logsumexp(t, axes):
        return np.log(np.exp(t).sum(axis=axes))
    got = ef.reduce(x, pattern, logsumexp, **sizes)
    want = einops.reduce(x, pattern, logsumexp, **sizes)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_callable_reduction_that_misbehaves_is_named():
    with pytest.raises(ef.EinfuseError, match="returned shape"):
        ef.reduce(x, "b h w c -> c", lambda t, axes: t.sum())
    with pytest.raises(ef.EinfuseError, match="ZeroDivisionError"):
        ef.reduce(x, "b h w c -> c", lambda t, axes: 1 / 0)


def test_logsumexp_reduction():
    got = ef.reduce(x, "b h w c -> b c", "logsumexp")
    want = np.log(np.exp(x).sum((1, 2)))
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_list_is_stacked_and_a_pure_reshape_is_a_view():
    got = ef.rearrange([x[0], x[1]], "n h w c -> n c h w")
    np.testing.assert_array_equal(got, einops.rearrange(x, "n h w c -> n c h w"))
    view = ef.rearrange(x, "b h w c -> b (h w c)")
    assert np.shares_memory(view, x)


@pytest.mark.parametrize("call, message", [
    (lambda: ef.rearrange(x, "b h w c -> b h w"), "rearrange keeps every axis"),
    (lambda: ef.rearrange(x, "b h w -> b h w"), "names 3 axes but the input has 4"),
    (lambda: ef.rearrange(x, "b (h h2) w c -> b h h2 w c"), "give all but one size"),
    (lambda: ef.rearrange(x, "b (h h2) w c -> b h h2 w c", h2=4), "does not split"),
    (lambda: ef.repeat(x, "b h w c -> b h w c r"), "size of r is not known"),
    (lambda: ef.reduce(x, "b h w c -> b c", "median"), "reduction is one of"),
    (lambda: ef.reduce(x, "b h w c -> b c r", "sum"), "cannot add"),
    (lambda: ef.rearrange(x, "b h w c b2"), "left -> right"),
    (lambda: ef.rearrange(x, "b (h (w)) c -> b h w c"), "do not nest"),
])
def test_bad_patterns_are_einfuse_errors(call, message):
    with pytest.raises(ef.EinfuseError, match=message):
        call()


def test_torch_gradients_through_reduce_and_repeat():
    torch = pytest.importorskip("torch")
    t = torch.tensor(x[:, :4, :2, :2], requires_grad=True)
    torch.autograd.gradcheck(
        lambda t: ef.reduce(t, "b (h h2) w c -> b h w c", "max", h2=2), (t,))
    torch.autograd.gradcheck(lambda t: ef.repeat(t, "b h w c -> b h w (c r)", r=2), (t,))


def test_jax_jit_and_grad_through_reduce():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    xj = jnp.asarray(x, jnp.float32)
    f = jax.jit(lambda v: ef.reduce(v, "b h w c -> b c", "mean"))
    np.testing.assert_allclose(f(xj), x.mean((1, 2)), rtol=1e-5)
    grad = jax.grad(lambda v: ef.reduce(v, "b h w c -> ", "sum"))(xj)
    np.testing.assert_allclose(grad, np.ones_like(x))
