"""The reductions mean and var (programs.md section 5): NumPy's np.mean and np.var
(population variance) on every backend, stable in float32, differentiable, and linear
in the reduced length once hoisted."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.errors import EinfuseError


def rand(*shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("statement,reference", [
    ("y[i] := mean[j](X[i,j])", lambda X: X.mean(1)),
    ("y[i] := var[j](X[i,j])", lambda X: X.var(1)),
    ("y := mean[i,j](X[i,j])", lambda X: X.mean()),
    ("y := var[i,j](X[i,j])", lambda X: X.var()),
    ("y[j] := var[i](X[i,j] * 2 + 1)", lambda X: (X * 2 + 1).var(0)),
    ("y[i] := X[i,0] - mean[j](X[i,j]) / sqrt(var[j](X[i,j]) + 1e-5)",
     lambda X: X[:, 0] - X.mean(1) / np.sqrt(X.var(1) + 1e-5)),
    ("y[i,j] := (X[i,j] - mean[k](X[i,k])) / sqrt(var[k](X[i,k]) + 1e-5)",
     lambda X: (X - X.mean(1, keepdims=True)) / np.sqrt(X.var(1, keepdims=True) + 1e-5)),
    ("y[i] := mean[a](X[i+a, 1])", lambda X: np.array([X[i:i + 1, 1].mean()
                                                      for i in range(X.shape[0])])),
])
def test_equals_numpy(backend, statement, reference):
    X = rand(6, 9)
    got = ef.ein(statement, X=X, backend=backend, **({"ranges": {"a": 1}}
                                                      if "a]" in statement else {}))
    np.testing.assert_allclose(np.asarray(got), reference(X), rtol=1e-10, atol=1e-12)


def test_integer_input_gives_float64(backend):
    X = np.arange(12, dtype=np.int32).reshape(3, 4) ** 2
    for name, reference in (("mean", X.mean(1)), ("var", X.var(1))):
        got = np.asarray(ef.ein(f"y[i] := {name}[j](X[i,j])", X=X, backend=backend))
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, reference, rtol=1e-12)


def test_float32_variance_is_stable(backend):
    """Two passes: a large offset does not swamp the spread (the one-pass
    E[x^2] - E[x]^2 gives garbage or negatives here)."""
    X = (1e4 + rand(4, 1000, seed=3)).astype(np.float32)
    got = np.asarray(ef.ein("y[i] := var[j](X[i,j])", X=X, backend=backend))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, X.astype(np.float64).var(1), rtol=1e-3)


def test_nan_and_inf_as_numpy(backend):
    X = rand(3, 4)
    X[0, 1] = np.nan
    X[1, 2] = np.inf
    for name, reference in (("mean", np.mean), ("var", np.var)):
        got = np.asarray(ef.ein(f"y[i] := {name}[j](X[i,j])", X=X, backend=backend))
        with np.errstate(invalid="ignore"):
            np.testing.assert_array_equal(np.isnan(got), np.isnan(reference(X, axis=1)))
            np.testing.assert_allclose(got[2], reference(X[2]))


def test_mean_and_var_remain_usable_as_tensor_names():
    mean = np.arange(4.0)
    np.testing.assert_array_equal(ef.ein("y[i] := mean[i] * 2", mean=mean), mean * 2)
    np.testing.assert_array_equal(ef.ein("y[i] := var[i] + 1", var=mean), mean + 1)


def test_errors_point_at_the_reduction_as_written():
    with pytest.raises(EinfuseError) as info:
        ef.ein("y[i] := mean[j](X[i,j] * W[j])", X=rand(3, 4), W=rand(5))
    assert "mean[j]" in str(info.value) or "W" in str(info.value)


def test_explain_shows_the_statement_as_written_and_linear_cost():
    small = ef.explain("y[i] := var[j](X[i,j])", shapes={"X": (8, 100)})
    large = ef.explain("y[i] := var[j](X[i,j])", shapes={"X": (8, 1000)})
    assert str(small).startswith("y[i] := var[j](X[i,j])")
    assert large.flops < 12 * small.flops


def test_gradients_with_torch(backend):
    torch = pytest.importorskip("torch")
    X = torch.tensor(rand(3, 5), requires_grad=True)
    for statement in ("y[i] := mean[j](X[i,j])", "y[i] := var[j](X[i,j])",
                      "y[i,j] := (X[i,j] - mean[k](X[i,k])) / sqrt(var[k](X[i,k]) + 1e-5)"):
        assert torch.autograd.gradcheck(
            lambda x: ef.ein(statement, X=x, backend=backend), (X,), eps=1e-6, atol=1e-6)


def test_jax_grad_equals_jnp():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    X = jnp.asarray(rand(3, 5))

    def ours(x):
        return ef.ein("y[i] := var[j](x[i,j])", x=x).sum()
    np.testing.assert_allclose(jax.jit(jax.grad(ours))(X),
                               jax.grad(lambda x: jnp.var(x, axis=1).sum())(X), rtol=1e-10)
