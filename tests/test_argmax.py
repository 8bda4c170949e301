"""argmax / argmin (programs.md section 5): the position of the first extremum, as
np.argmax / np.argmin of the flattened reduced axes (row-major in the order the
reduction lists its indices), NaN first as in NumPy; int64 results; no gradient."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.errors import EinfuseError, NoGradientError


def tied(*shape, seed=0):
    return np.random.default_rng(seed).integers(-2, 3, size=shape).astype(np.float64)


def flat_pick(op, values, axes):
    """NumPy's answer: the reduced axes moved last (in the listed order) and flattened."""
    moved = np.moveaxis(values, axes, list(range(-len(axes), 0)))
    flat = moved.reshape(moved.shape[:values.ndim - len(axes)] + (-1,))
    return (np.argmax if op == "argmax" else np.argmin)(flat, axis=-1)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("statement,axes", [
    ("y[i] := {op}[j](X[i,j,0])", [1]),
    ("y[k] := {op}[i,j](X[i,j,k])", [0, 1]),
    ("y[k] := {op}[j,i](X[i,j,k])", [1, 0]),
    ("y := {op}[i,j,k](X[i,j,k])", [0, 1, 2]),
])
def test_equals_numpy_with_ties_and_nan(backend, op, statement, axes):
    X = tied(5, 6, 4)
    X[1, 2, 0] = X[3, 1, 2] = np.nan
    values = X[:, :, 0] if "X[i,j,0]" in statement else X
    got = ef.ein(statement.format(op=op), X=X, backend=backend)
    assert np.asarray(got).dtype == np.int64
    np.testing.assert_array_equal(got, flat_pick(op, values, axes))


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8, np.int64])
def test_dtypes(backend, dtype):
    X = (tied(4, 9, seed=2) + 2).astype(dtype)
    got = ef.ein("y[i] := argmin[j](X[i,j])", X=X, backend=backend)
    assert np.asarray(got).dtype == np.int64
    np.testing.assert_array_equal(got, np.argmin(X, axis=1))


def test_blocks_of_two_indices_merge_in_row_major_order():
    """A small memory_limit splits the reduction into blocks that interleave in
    row-major order; the first extremum still wins."""
    X = tied(3, 40, 50, seed=4)
    got = ef.ein("y[i] := argmax[j,k](X[i,j,k])", X=X, backend="numpy", memory_limit=4096)
    np.testing.assert_array_equal(got, flat_pick("argmax", X, [1, 2]))


def test_positions_count_from_the_start_of_the_range(backend):
    x = np.array([5.0, 1.0, 9.0, 9.0, 2.0, 7.0])
    got = ef.ein("y := argmax[j](x[j])", x=x, ranges={"j": range(3, 6)}, backend=backend)
    assert int(got) == 0          # x[3] is the first maximum of x[3:6]
    conv = ef.ein("y[i] := argmax[a](x[i+a])", x=x, ranges={"a": 2}, backend=backend)
    np.testing.assert_array_equal(conv, [np.argmax(x[i:i + 2]) for i in range(5)])


def test_inside_arithmetic_and_as_a_gather_in_a_program(backend):
    X = np.random.default_rng(5).standard_normal((4, 7))
    got = ef.ein("y[i] := argmax[j](X[i,j]) * 2 + 0.5", X=X, backend=backend)
    np.testing.assert_allclose(got, np.argmax(X, 1) * 2 + 0.5)
    program = ef.compile("m[i] := argmax[j](X[i,j])\ny[i] := X[i, m[i]]", backend=backend)
    np.testing.assert_array_equal(program(X=X), X.max(1))


def test_empty_range_has_no_position(backend):
    with pytest.raises(EinfuseError, match="argmax"):
        ef.ein("y[i] := argmax[j](X[i,j])", X=np.zeros((3, 0)), backend=backend)


def test_names_stay_usable_as_tensors_and_calls_are_explained():
    v = np.arange(3.0)
    np.testing.assert_array_equal(ef.ein("y[i] := argmax[i] + 1", argmax=v), v + 1)
    with pytest.raises(EinfuseError, match=r"'argmin' is a reduction: write argmin\[k\]"):
        ef.ein("y[i] := argmin(x[i])", x=v)


def test_torch_gives_int64_and_no_gradient():
    torch = pytest.importorskip("torch")
    X = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    got = ef.ein("y[i] := argmax[j](X[i,j])", X=X)
    assert got.dtype == torch.int64 and not got.requires_grad
    assert torch.equal(got, X.detach().argmax(1))
    # a gradient through other parts flows; through argmax alone it is an error
    ef.ein("y[i] := X[i,0] * argmax[j](X[i,j])", X=X).sum().backward()
    expected = torch.zeros(3, 5, dtype=torch.float64)
    expected[:, 0] = X.detach().argmax(1).double()
    assert torch.equal(X.grad, expected)
    with pytest.raises(NoGradientError, match="argmax"):
        ef.ein("y[i] := argmax[j](X[i,j]) * 1.0", X=X).sum().backward()


def test_jax_matches_jnp_argmax():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    X = jnp.asarray(np.random.default_rng(6).standard_normal((4, 6)))
    got = jax.jit(lambda x: ef.ein("y[i] := argmax[j](X[i,j])", X=x))(X)
    np.testing.assert_array_equal(got, jnp.argmax(X, axis=1))
    batched = jax.vmap(lambda x: ef.ein("y := argmin[j](X[j])", X=x))(X)
    np.testing.assert_array_equal(batched, jnp.argmin(X, axis=1))


@pytest.mark.parametrize("statement", [
    "y[i] := argmax[j,k](X[i,j] * W[k,j])",
    "y[i] := argmin[k](X[i,k] - mean[j](X[i,j])) + var[j](X[i,j])",
    "y[i] := max[j](X[i,j]) - X[i, 0] * argmax[j](X[i,j])",
])
def test_every_backend_equals_the_oracle(backend, statement):
    """(var's expansion brings the copy j2 of j: the oracle is given its range too)"""
    from oracle import brute_force
    X, W = tied(4, 5, seed=7), tied(3, 5, seed=8)
    arrays = {"X": X, "W": W} if "W[" in statement else {"X": X}
    ranges = {"i": (0, 4), "j": (0, 5), "j2": (0, 5), "k": (0, 3 if "W[" in statement else 5)}
    expected = brute_force(statement, ranges, arrays)
    got = ef.ein(statement, backend=backend, **arrays)
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), expected, rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("statement,reference", [
    ("y[j] := {op}[i](X[i,j])", lambda pick, X, W: pick(X, axis=0)),
    ("y[a,b] := {op}[k](W[k,a] * X[k,b])",
     lambda pick, X, W: pick(W[:, :, None] * X[:, None, :], axis=0)),
])
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_output_tiled_across_lanes(backend, op, statement, reference):
    """Output indices long enough for the C planner to spread them over SIMD lanes (and
    register blocks): each lane keeps its own position."""
    X, W = tied(40, 300, seed=9), tied(40, 70, seed=10)
    pick = np.argmax if op == "argmax" else np.argmin
    got = ef.ein(statement.format(op=op), X=X, W=W, backend=backend) if "W[" in statement \
        else ef.ein(statement.format(op=op), X=X, backend=backend)
    np.testing.assert_array_equal(got, reference(pick, X, W))
