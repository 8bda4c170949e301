"""A right side that only moves bool values (reads, max/min, where's branches) of bool
tensors gives bool, as NumPy's transpose, max and where do (notation.md, dtypes); an
empty max is False and an empty min True.  Arithmetic on bools still counts them as
int64.  Every backend, against NumPy."""

import re

import numpy as np
import pytest

import einfuse as ef

M = np.random.default_rng(0).random((5, 7)) > 0.5
N = np.random.default_rng(1).random((5, 7)) > 0.3


def _used(statement):
    return {name: value for name, value in (("m", M), ("n", N))
            if re.search(rf"\b{name}\[", statement)}


@pytest.mark.parametrize("statement, want", [
    ("t[j,i] := m[i,j]", M.T),
    ("t[i] := max[j](m[i,j])", M.any(1)),
    ("t[i] := min[j](m[i,j])", M.all(1)),
    ("t[i,j] := max(m[i,j], n[i,j])", M | N),
    ("t[i,j] := min(m[i,j], n[i,j])", M & N),
    ("t[i,j] := where(m[i,j], n[i,j], m[i,j])", np.where(M, N, M)),
    ("t[i] := max[j](where(n[i,j], m[i,j], n[i,j]))", np.where(N, M, N).any(1)),
])
def test_moving_bools_gives_bool(statement, want, backend):
    arrays = _used(statement)
    got = ef.ein(statement, backend=backend, **arrays)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, want)


def test_empty_max_and_min_are_the_identities_of_any_and_all(backend):
    empty = np.zeros((3, 0), bool)
    np.testing.assert_array_equal(ef.ein("t[i] := max[j](m[i,j])", m=empty,
                                         backend=backend), empty.any(1))
    np.testing.assert_array_equal(ef.ein("t[i] := min[j](m[i,j])", m=empty,
                                         backend=backend), empty.all(1))


@pytest.mark.parametrize("statement, dtype", [
    ("t[i] := sum[j](m[i,j])", np.int64),         # a count
    ("t[i,j] := m[i,j] + n[i,j]", np.int64),
    ("t[i,j] := where(m[i,j], 1, 0)", np.int64),  # a number of its own
    ("t[i,j] := m[i,j] * 1.5", np.float64),
    ("t[i,j] := m[i,j] > n[i,j]", np.bool_),      # a comparison, as before
])
def test_arithmetic_on_bools_is_unchanged(statement, dtype, backend):
    arrays = _used(statement)
    assert ef.ein(statement, backend=backend, **arrays).dtype == dtype


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.uint8, np.float64])
def test_bool_never_widens_another_dtype_as_in_numpy(dtype, backend):
    x = (np.arange(35).reshape(5, 7) % 3).astype(dtype)
    for statement, want in (("t[i,j] := where(m[i,j], x[i,j], m[i,j])", np.where(M, x, M)),
                            ("t[i,j] := x[i,j] * m[i,j]", x * M)):
        got = ef.ein(statement, m=M, x=x, backend=backend)
        assert got.dtype == want.dtype, statement
        np.testing.assert_array_equal(got, want)


def test_a_scalar_parameter_is_arithmetic():
    assert ef.ein("t[i,j] := max(m[i,j], c)", m=M, c=True).dtype == np.int64


def test_frameworks_keep_bool():
    torch = pytest.importorskip("torch")
    got = ef.ein("t[j,i] := m[i,j]", m=torch.from_numpy(M))
    assert got.dtype == torch.bool and np.array_equal(got.numpy(), M.T)
    jnp = pytest.importorskip("jax.numpy")
    got = ef.ein("t[i] := max[j](m[i,j])", m=jnp.asarray(M))
    assert got.dtype == jnp.bool_ and np.array_equal(np.asarray(got), M.any(1))


def test_dtype_option_still_wins():
    assert ef.ein("t[j,i] := m[i,j]", m=M, dtype="int32").dtype == np.int32


def test_writing_into_a_bool_array_ors_as_numpy_does():
    out = np.zeros((5, 7), bool)
    out[0] = True
    want = out | M
    ef.ein("o[i,j] += m[i,j]", m=M, o=out)
    np.testing.assert_array_equal(out, want)
