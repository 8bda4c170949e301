"""Named dimensions under autodiff: torch autograd (gradcheck in float64, and the same
gradients as the torch formulation), jax.grad/jit/vmap against jax.numpy, ef.jit, and a
layer written with named dimensions trained in a torch nn.Module next to its pure-torch
twin."""

import math

import numpy as np
import pytest

import einfuse as ef

torch = pytest.importorskip("torch")


def leaf(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, dtype=torch.float64, generator=g).requires_grad_()


def dist(w, x):
    i, j, k = ef.dims("i j k")
    return ((w[k, i] - x[k, j]) ** 2).sum(k).order(i, j)       # torch tensors, as torchdim


def kernel_regression(x, y, b):
    i, j, d = ef.dims("i j d")
    K = ef.exp(-((x[i, d] - y[j, d]) ** 2).sum(d) * 0.5)
    return (K * b[j]).sum(j).order(i)


def layernorm(X, g):
    i, j = ef.dims("i j")
    x = X[i, j]
    return ((x - x.mean(j)) / ef.sqrt(x.var(j) + 1e-5) * g[j]).order(i, j)


def attention(Q, K, V):
    b, t, T, h, r = ef.dims("b t T h r")
    s = (Q[b, t, h, r] * K[b, T, h, r]).sum(r) * (r.size ** -0.5)
    p = ef.where(T <= t, s, -math.inf).softmax(T)
    return (p * V[b, T, h, r]).sum(T).order(b, t, h, r)


def torch_attention(Q, K, V):
    s = torch.einsum("bthr,bThr->bhtT", Q, K) * Q.shape[-1] ** -0.5
    n = Q.shape[1]
    s = s.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool)), -math.inf)
    return torch.einsum("bhtT,bThr->bthr", torch.softmax(s, -1), V)


CASES = {
    "dist": (dist, lambda w, x: ((w[:, :, None] - x[:, None, :]) ** 2).sum(0),
             lambda: (leaf(3, 4, seed=1), leaf(3, 5, seed=2))),
    "kernel regression": (
        kernel_regression,
        lambda x, y, b: torch.exp(-0.5 * ((x[:, None] - y[None]) ** 2).sum(-1)) @ b,
        lambda: (leaf(4, 2, seed=3), leaf(5, 2, seed=4), leaf(5, seed=5))),
    "layernorm": (
        layernorm,
        lambda X, g: torch.nn.functional.layer_norm(X, X.shape[-1:], eps=1e-5) * g,
        lambda: (leaf(3, 6, seed=6), leaf(6, seed=7))),
    "attention": (attention, torch_attention,
                  lambda: (leaf(1, 4, 2, 3, seed=8), leaf(1, 4, 2, 3, seed=9),
                           leaf(1, 4, 2, 3, seed=10))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_torch_gradients(name):
    named, formulation, make = CASES[name]
    inputs = make()
    out = named(*inputs)
    assert isinstance(out, torch.Tensor) and out.requires_grad
    torch.testing.assert_close(out, formulation(*inputs))
    weights = torch.randn(out.shape, dtype=torch.float64,
                          generator=torch.Generator().manual_seed(0))
    ours = torch.autograd.grad((out * weights).sum(), inputs)
    theirs = torch.autograd.grad((formulation(*inputs) * weights).sum(), inputs)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)
    assert torch.autograd.gradcheck(named, inputs, eps=1e-6, atol=1e-5)


def test_gather_gradient_scatters():
    E = leaf(6, 3, seed=11)
    idx = torch.tensor([[0, 5, 5], [2, 2, 0]])

    def bag(E):
        b, s, d = ef.dims("b s d")
        return E[idx[b, s], d].sum(s).order(b, d)
    torch.testing.assert_close(bag(E), E[idx].sum(1))
    assert torch.autograd.gradcheck(bag, (E,))


jax = pytest.importorskip("jax")
jnp = jax.numpy


def jax_dist(w, x):
    i, j, k = ef.dims("i j k")
    return ((ef.wrap(w)[k, i] - ef.wrap(x)[k, j]) ** 2).sum(k).order(i, j)


def jnp_dist(w, x):
    return ((w[:, :, None] - x[:, None, :]) ** 2).sum(0)


def jax_layernorm(X):
    i, j = ef.dims("i j")
    x = ef.named(X, i, j)
    return ((x - x.mean(j)) / ef.sqrt(x.var(j) + 1e-5)).order(i, j)


def jnp_layernorm(X):
    return (X - X.mean(1, keepdims=True)) / jnp.sqrt(X.var(1, keepdims=True) + 1e-5)


@pytest.mark.parametrize("ours, theirs, shapes", [
    (jax_dist, jnp_dist, [(3, 4), (3, 5)]),
    (jax_layernorm, jnp_layernorm, [(3, 6)]),
])
def test_jax_grad_jit_vmap(x64, ours, theirs, shapes):
    rng = np.random.default_rng(5)
    args = [jnp.asarray(rng.standard_normal(s)) for s in shapes]
    np.testing.assert_allclose(ours(*args), theirs(*args), rtol=1e-12)

    def loss(f):
        return lambda *a: jnp.sum(jnp.sin(f(*a)))
    argnums = tuple(range(len(args)))
    for g, h in zip(jax.grad(loss(ours), argnums)(*args),
                    jax.grad(loss(theirs), argnums)(*args)):
        np.testing.assert_allclose(g, h, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(jax.jit(ours)(*args), theirs(*args), rtol=1e-12)
    batched = [jnp.stack([a, 2 * a]) for a in args]
    np.testing.assert_allclose(jax.vmap(ours)(*batched), jax.vmap(theirs)(*batched),
                               rtol=1e-12)


def test_ef_jit_converts_named_expressions_with_or_without_fallback(x64):
    rng = np.random.default_rng(6)
    w, x = jnp.asarray(rng.standard_normal((3, 4))), jnp.asarray(rng.standard_normal((3, 5)))
    for fallback in (False, True):
        f = ef.jit(lambda w, x: jnp.tanh(jax_dist(w, x)), fallback=fallback)
        np.testing.assert_allclose(f(w, x), jnp.tanh(jnp_dist(w, x)), rtol=1e-12)
        np.testing.assert_allclose(jax.grad(lambda w: f(w, x).sum())(w),
                                   jax.grad(lambda w: jnp.tanh(jnp_dist(w, x)).sum())(w),
                                   rtol=1e-10)


class NamedMLP(torch.nn.Module):
    """A layer written with named dimensions: y[b, o] = sum_i gelu-ish(x W1) W2 + b."""

    def __init__(self, n_in, n_hidden, n_out):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.W1 = torch.nn.Parameter(torch.randn(n_in, n_hidden, generator=g) / n_in ** 0.5)
        self.W2 = torch.nn.Parameter(torch.randn(n_hidden, n_out, generator=g) / n_hidden ** 0.5)
        self.bias = torch.nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        b, i, h, o = ef.dims("b i h o")
        hidden = ef.tanh((x[b, i] * self.W1[i, h]).sum(i))
        return ((hidden * self.W2[h, o]).sum(h) + self.bias[o]).order(b, o)


class TorchMLP(torch.nn.Module):
    def __init__(self, twin):
        super().__init__()
        self.W1 = torch.nn.Parameter(twin.W1.detach().clone())
        self.W2 = torch.nn.Parameter(twin.W2.detach().clone())
        self.bias = torch.nn.Parameter(twin.bias.detach().clone())

    def forward(self, x):
        return torch.tanh(x @ self.W1) @ self.W2 + self.bias


def test_nn_module_trains_as_its_torch_twin(bind_count):
    named = NamedMLP(5, 7, 3)
    twin = TorchMLP(named)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 5, generator=g), torch.randn(8, 3, generator=g)) for _ in range(4)]
    optimisers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (named, twin)]
    for step in range(4):
        x, y = data[step]
        for model, opt in zip((named, twin), optimisers):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
        if step == 1:
            binds = len(bind_count)
    assert len(bind_count) == binds          # later steps rebuild, and bind nothing anew
    for a, b in zip(named.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def named_mlp(params, x):
    """The JAX counterpart of NamedMLP: a plain function of a parameter pytree."""
    b, i, h, o = ef.dims("b i h o")
    hidden = ef.tanh((ef.named(x, b, i) * ef.named(params["W1"], i, h)).sum(i))
    return ((hidden * ef.named(params["W2"], h, o)).sum(h) + ef.named(params["b"], o)) \
        .order(b, o)


def jnp_mlp(params, x):
    return jnp.tanh(x @ params["W1"]) @ params["W2"] + params["b"]


def test_jax_training_steps_equal_the_jax_numpy_twin():
    rng = np.random.default_rng(7)
    params = {"W1": jnp.asarray(rng.standard_normal((5, 7)), jnp.float32) / 3,
              "W2": jnp.asarray(rng.standard_normal((7, 3)), jnp.float32) / 3,
              "b": jnp.zeros(3, jnp.float32)}
    twin = dict(params)

    def step(model):
        def loss(p, x, y):
            return jnp.mean((model(p, x) - y) ** 2)

        @jax.jit
        def update(p, x, y):
            return jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p,
                                          jax.grad(loss)(p, x, y))
        return update
    ours, theirs = step(named_mlp), step(jnp_mlp)
    for _ in range(3):
        x = jnp.asarray(rng.standard_normal((8, 5)), jnp.float32)
        y = jnp.asarray(rng.standard_normal((8, 3)), jnp.float32)
        params, twin = ours(params, x, y), theirs(twin, x, y)
    for name in params:
        np.testing.assert_allclose(params[name], twin[name], rtol=1e-5, atol=1e-6)
