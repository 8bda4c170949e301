"""Second derivatives and forward mode through einfuse (issue 9, item 3; item 15,
jax.vmap of jax.grad, is in test_jax_vmap_grad.py).

PyTorch: with ``create_graph=True`` the backward's gradient statements run through
einfuse on the tensors themselves, so torch records them: gradgradcheck in float64.
JAX: every transformation of a statement is again a statement (a tangent statement for
jvp, gradient statements for its transpose), so grad of grad, ``jax.hessian`` (forward
over reverse) and ``jax.jvp`` match jax.numpy formulations."""

import numpy as np
import pytest

import einfuse as ef

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy

from conftest import BACKENDS  # noqa: E402
from jax_cases import CASES as JAX_CASES, IDS as JAX_IDS, loss_of  # noqa: E402
from test_torch import CASES as TORCH_CASES, t  # noqa: E402

# The second-order machinery is the same on every backend (only the kernels differ), and
# each new statement is a compile on C: there, and on interpreted Triton (hundreds of
# times slower than C), a few cases that between them cover contractions (BLAS),
# shifted reads, scatters, nested reductions and functions; every case on NumPy.
TORCH_ON = {
    "c": {"C[i,j] := A[i,k] * B[k,j]", "D[i,j] := (w[k,i] - x[k,j])**2",
          "y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o]", "y[i] := x[i+a] * ker[a]",
          "y[i] := x[2*i + a] * ker[a]", "z[i] := logsumexp[j](X[i,j])",
          "r[i] := tanh(x[i]) * sigmoid(y[i]) + softplus(x[i]) - erf(y[i]) "
          "+ sin(x[i])*cos(y[i])"},
    "triton": {"C[i,j] := A[i,k] * B[k,j]", "y[i] := x[2*i + a] * ker[a]",
               "z[i] := prod[j](X[i,j])", "s := alpha * x[i]**2"},
}
JAX_ON = {
    "c": {"C[i,j] := A[i,k] * B[k,j]", "D[i,j] := (w[k,i] - x[k,j])**2",
          "y[i] := x[i+a] * ker[a]", "z[i] := logsumexp[j](X[i,j])"},
    "triton": {"C[i,j] := A[i,k] * B[k,j]", "s := alpha * x[i]**2"},
}


def some_backends(cases, chosen, ids):
    """``cases`` x BACKENDS as parameters (backend last), keeping on a compiled backend
    only the statements ``chosen`` names for it: combinations left out are not
    generated, rather than generated and skipped."""
    return [pytest.param(*case, backend, id=f"{backend}-{name}")
            for backend in BACKENDS for case, name in zip(cases, ids)
            if case[0] in chosen.get(backend, {case[0]})]


def checked_twice(run, inputs):
    return torch.autograd.gradgradcheck(run, inputs, eps=1e-6, atol=1e-5)


# -- PyTorch -------------------------------------------------------------------------------
TORCH_IDS = [c[0] for c in TORCH_CASES]


@pytest.mark.slow_on("triton")
@pytest.mark.parametrize("statement, make, backend",
                         some_backends(TORCH_CASES, TORCH_ON, TORCH_IDS))
def test_gradgradcheck(statement, make, backend):
    named = make()
    names = list(named)

    def run(*values):
        return ef.ein(statement, backend=backend, **dict(zip(names, values)))
    assert checked_twice(run, tuple(named.values()))


@pytest.mark.slow_on("triton")
@pytest.mark.parametrize("bounds", ["check", "clip", "wrap", "fill"])
def test_gathers_twice(bounds, backend):
    if backend != "numpy" and bounds in ("check", "wrap"):
        pytest.skip("compiled: clip and fill (moved and dropped positions) only")
    idx = torch.tensor([1, 1, 3, 0] if bounds == "check" else [1, 5, 3, -2, 1])
    W, v = t(4, 3), t(3)

    def run(W, v):   # a gather read under a power: its second derivative is not 0
        return ef.ein("E[b] := W[idx[b], d]**3 * v[d]", W=W, v=v, idx=idx, bounds=bounds,
                      backend=backend)
    assert checked_twice(run, (W, v))


def test_second_derivative_through_torch_ops(backend):
    """The issue's example: the einfuse part of d2/dx2 of sum(x**3) + sum(x**2) was
    silently dropped ([2, 2, 2])."""
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    loss = ef.ein("s := x[i]**3", x=x, backend=backend) + (x ** 2).sum()
    (g,) = torch.autograd.grad(loss, x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close(h, torch.tensor([8.0, 14.0, 20.0], dtype=torch.float64))


def test_hessian_where_the_output_gradient_is_zero(backend):
    """log(z[i]) is 0 at z = 1, so there y = 0 and dy = -sin(y) = 0 exactly.  The
    gradient statement of x (shifted reads, a log of another read) is gated on the
    position, not on dy != 0, so the Hessian keeps the terms through dy there."""
    x = t(7)
    z = torch.tensor([1.0, 1.5, 1.0, 0.7, 1.2], dtype=torch.float64, requires_grad=True)
    k = t(3).detach()

    def ours(x, z):
        return torch.cos(ef.ein("y[i] := x[i+a] * log(z[i]) * k[a]", x=x, z=z, k=k,
                                backend=backend)).sum()

    def reference(x, z):
        y = torch.stack([(x[i:i + 3] * k).sum() * torch.log(z[i]) for i in range(5)])
        return torch.cos(y).sum()
    got = torch.autograd.functional.hessian(ours, (x, z))
    want = torch.autograd.functional.hessian(reference, (x, z))
    for row, row_want in zip(got, want):
        for block, block_want in zip(row, row_want):
            torch.testing.assert_close(block, block_want)


def test_third_derivative():
    x = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
    y = ef.ein("y[i] := sin(x[i]) * x[j]", x=x)
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x, create_graph=True)
    (third,) = torch.autograd.grad(h.sum(), x)
    want_x = x.detach().clone().requires_grad_()
    want = torch.sin(want_x)[:, None] * want_x[None, :]
    (g,) = torch.autograd.grad(want.sum(), want_x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), want_x, create_graph=True)
    (want_third,) = torch.autograd.grad(h.sum(), want_x)
    torch.testing.assert_close(third, want_third)


def test_an_index_only_compared_is_summed_explicitly():
    """Deriving a gated gradient again leaves its extent index only in a comparison;
    summed implicitly, the statement would read it as a scalar parameter (so did
    ``dx[i] := where(j < i, dy[i], 0)``, the gradient of this statement)."""
    from einfuse import derive, run_reference
    grads = derive("y[i] := sum[j](where(j < i, x[i], 0))", "x", options={"ranges": {"j": 3}})
    found = run_reference(grads, {"x": np.arange(4.0), "dy": np.ones(4)})["dx"]
    np.testing.assert_allclose(found, [0.0, 1.0, 2.0, 3.0])   # min(i, 3)


# -- forward mode, as statements --------------------------------------------------------
@pytest.mark.parametrize("statement, make, backend",
                         some_backends(TORCH_CASES, TORCH_ON, TORCH_IDS))
def test_tangent_statements(statement, make, backend):
    """The tangent statement (autodiff.forward) of every construct against a central
    difference of the forward along the same direction, in float64."""
    from einfuse.autodiff import tangent
    named = {n: v.detach().numpy() for n, v in make().items()}
    rng = np.random.default_rng(0)
    direction = {n: rng.standard_normal(np.shape(v)) for n, v in named.items()}
    found = tangent(statement, list(named))
    arrays = dict(named, **{found.tangents[n]: d for n, d in direction.items()})
    kernel = ef.compile(found.text, backend=backend, **found.options)
    got = kernel(**{n: arrays[n] for n in kernel.inputs})   # bias is not read: linear

    def moved(h):
        return ef.ein(statement, backend="numpy",
                      **{n: v + h * direction[n] for n, v in named.items()})
    h = 1e-6
    np.testing.assert_allclose(got, (moved(h) - moved(-h)) / (2 * h), rtol=1e-5, atol=1e-6)


# -- JAX -----------------------------------------------------------------------------------
def jax_statement(statement, arrays, backend):
    names = list(arrays)

    def ours(*values):
        return ef.ein(statement, backend=backend, **dict(zip(names, values)))
    return ours, tuple(arrays.values()), tuple(range(len(arrays)))


def assert_trees_close(got, want, rtol=2e-4):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        # float32 sums in another order: relative to the block's scale
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * float(np.abs(w).max() + 1))


# jax.hessian is jvp over grad: on C, the contraction and the shifted read by default;
# the other two C statements' tangents and gradients run in test_jax_jvp and
# test_jax_grad_of_grad, their hessians in the slow run
HESSIAN_SLOW_ON_C = {"D[i,j] := (w[k,i] - x[k,j])**2", "z[i] := logsumexp[j](X[i,j])"}


@pytest.mark.parametrize("statement, reference, arrays, backend", [
    pytest.param(*case.values, id=case.id, marks=[pytest.mark.slow] if case.values[-1] == "c"
                 and case.values[0] in HESSIAN_SLOW_ON_C else [])
    for case in some_backends(JAX_CASES, JAX_ON, JAX_IDS)])
def test_jax_hessian(statement, reference, arrays, backend):
    ours, values, argnums = jax_statement(statement, arrays, backend)
    hessian = jax.jit(jax.hessian(loss_of(ours), argnums=argnums))
    want = jax.jit(jax.hessian(loss_of(reference), argnums=argnums))
    assert_trees_close(hessian(*values), want(*values))


@pytest.mark.parametrize("statement, reference, arrays, backend", some_backends(
    [JAX_CASES[1], JAX_CASES[4]], JAX_ON, [JAX_IDS[1], JAX_IDS[4]]))
def test_jax_grad_of_grad(statement, reference, arrays, backend):
    """Reverse over reverse: the README's dist statement, and gauss (nested
    reductions recomputed inside the gradients)."""
    ours, values, argnums = jax_statement(statement, arrays, backend)

    def grad_of_grad(fn):
        return jax.grad(lambda *v: sum(jnp.sum(jnp.cos(g)) for g in
                                       jax.grad(loss_of(fn), argnums=argnums)(*v)),
                        argnums=argnums)
    assert_trees_close(jax.jit(grad_of_grad(ours))(*values),
                       jax.jit(grad_of_grad(reference))(*values))


@pytest.mark.parametrize("statement, reference, arrays, backend",
                         some_backends(JAX_CASES, JAX_ON, JAX_IDS))
def test_jax_jvp(statement, reference, arrays, backend):
    ours, values, _ = jax_statement(statement, arrays, backend)
    tangents = tuple(jnp.cos(v) for v in values)
    value, tangent = jax.jvp(ours, values, tangents)
    want_value, want_tangent = jax.jvp(reference, values, tangents)
    assert_trees_close((value, tangent), (want_value, want_tangent))
    _, tangent = jax.jit(lambda *v: jax.jvp(ours, v, tangents))(*values)
    assert_trees_close(tangent, want_tangent)


def test_jax_forward_mode_of_a_gather(backend):
    W, idx = jnp.arange(12.0).reshape(4, 3) / 7, jnp.array([3, 0, 3, 7])
    for bounds in ("clip", "wrap", "fill") if backend == "numpy" else ("fill",):
        def ours(W):
            return ef.ein("E[b] := sin(W[idx[b], d])", W=W, idx=idx, bounds=bounds,
                          backend=backend)
        rows = {"clip": jnp.clip(idx, 0, 3), "wrap": idx % 4, "fill": jnp.clip(idx, 0, 3)}
        keep = (idx < 4)[:, None] if bounds == "fill" else True

        def reference(W):
            return jnp.where(keep, jnp.sin(W[rows[bounds]]), 0.0).sum(1)
        assert_trees_close(jax.jvp(ours, (W,), (jnp.ones_like(W),)),
                           jax.jvp(reference, (W,), (jnp.ones_like(W),)))
        assert_trees_close(jax.jit(jax.hessian(lambda W: ours(W).sum()))(W),
                           jax.jit(jax.hessian(lambda W: reference(W).sum()))(W))


def test_jax_forward_mode_refuses_a_nonzero_fill():
    """A filled read is the constant fill: its tangent is 0, but the tangent statement
    would read the fill value for it.  Reverse mode still works (ef.derive drops the
    filled positions)."""
    W, idx = jnp.ones((4, 3)), jnp.array([1, 9])

    def ours(W):
        return ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=idx, bounds="fill", fill=2.0)
    with pytest.raises(ef.EinfuseError, match="fill=0 only"):
        jax.jvp(ours, (W,), (jnp.ones_like(W),))
    grad = jax.grad(lambda W: ours(W).sum())(W)
    np.testing.assert_allclose(grad, np.eye(4)[1][:, None] * np.ones((4, 3)))


def test_jax_third_derivative():
    f = lambda x: ef.ein("s := sin(x[i]) * x[i]**2", x=x)
    f_ref = lambda x: jnp.sum(jnp.sin(x) * x ** 2)
    x = jnp.array([0.3, -1.2, 2.0])
    third = jax.jit(jax.jacfwd(jax.hessian(f)))(x)
    assert_trees_close(third, jax.jit(jax.jacfwd(jax.hessian(f_ref)))(x))
