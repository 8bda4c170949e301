"""Issue 29, items 1a, 11 and 12: sums of narrow integers accumulate as NumPy's and
torch's sums do (statements, programs, einsum, einops, every backend); the range rule of
an index with plain and shifted uses (docs/notation.md 6.2); explain's "naive broadcast"
only where eager code really broadcasts."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.errors import ShapeError

NARROW = [np.uint8, np.int8, np.int16, np.uint16, np.int32, np.uint32, np.bool_]


def values(dtype, shape, seed=0):
    """Values that overflow a narrow dtype when summed (kept in range themselves)."""
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -120), min(info.max, 250) + 1, shape).astype(dtype)


def widened(array: np.ndarray) -> np.ndarray:
    """The array in the dtype NumPy's own sum accumulates it in (the oracle's)."""
    return array.astype(np.zeros(0, array.dtype).sum().dtype)


# ------------------------------------------------------------------ 1a: statements

@pytest.mark.parametrize("dtype", NARROW)
def test_sum_of_narrow_integers_is_numpys_sum(backend, dtype):
    x = values(dtype, (1000,))
    got = ef.ein("s := sum[i](x[i])", x=x, backend=backend)
    want = x.sum()
    assert got.dtype == want.dtype and got == want


def test_the_issues_uint8_sum_does_not_wrap(backend):
    got = ef.ein("s := sum[i](a[i])", a=np.arange(1000).astype(np.uint8), backend=backend)
    assert got.dtype == np.uint64 and int(got) == int(np.arange(1000).astype(np.uint8)
                                                     .astype(np.int64).sum())


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32])
@pytest.mark.parametrize("statement, oracle", [
    ("s[j] := x[i, j]", lambda x: x.sum(0)),                        # an implicit sum
    ("s[i] := sum[j](x[i, j] * x[i, j])",
     lambda x: (widened(x) * widened(x)).sum(1)),
    ("s[i] := sum[j](x[i, j]) * x[i, 0]", lambda x: x.sum(1) * x[:, 0]),
    ("s[i] := sum[j](x[i, j]) > 300", lambda x: x.sum(1) > 300),
    ("s[i] := prod[j](x[i, j])", lambda x: x.prod(1)),
])
def test_statements_with_a_sum_compute_in_the_sums_dtype(backend, dtype, statement, oracle):
    x = values(dtype, (6, 40))
    if "prod" in statement:
        x = (np.abs(values(np.int8, (6, 5))) % 9 + 1).astype(dtype)   # 9**5 overflows 16 bits
    got = ef.ein(statement, x=x, backend=backend)
    want = oracle(x)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("statement, oracle", [
    ("y[i] := x[i] * 3", lambda x: x * 3),
    ("m := max[i](x[i])", lambda x: x.max()),
    ("y[j, i] := x[i, j]", lambda x: x.T),
])
def test_without_a_sum_the_narrow_dtype_stays(backend, statement, oracle):
    x = values(np.uint8, (5, 4)) if "j" in statement else values(np.uint8, (20,))
    got = ef.ein(statement, x=x, backend=backend)
    want = oracle(x)
    assert got.dtype == want.dtype == np.uint8
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "int32", "bool"])
def test_torch_sums_widen_to_int64_as_torch_sum_does(backend, dtype):
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(values(getattr(np, dtype if dtype != "bool" else "bool_"), (30, 40)))
    got = ef.ein("s[j] := x[i, j]", x=x, backend=backend)
    want = x.sum(0)
    assert got.dtype == want.dtype == torch.int64
    assert torch.equal(got, want)
    got = ef.ein("s := prod[i](x[i, 0])", x=x[:6], backend=backend)
    assert got.dtype == torch.int64 and int(got) == int(x[:6, 0].prod())


def test_torch_compile_gives_the_eager_dtype():
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(np.arange(1000).astype(np.uint8))
    compiled = torch.compile(lambda v: ef.ein("s := sum[i](x[i])", x=v), backend="eager")
    got = compiled(x)
    assert got.dtype == torch.int64 and int(got) == int(x.sum())


def test_jax_sums_widen_as_jnp_sum_does():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x = jnp.asarray(np.arange(1000).astype(np.uint8))
    want = jnp.sum(x)
    for got in (ef.ein("s := sum[i](x[i])", x=x),
                jax.jit(lambda v: ef.ein("s := sum[i](x[i])", x=v))(x)):
        assert got.dtype == want.dtype and int(got) == int(want)


def test_a_program_widens_each_sum(backend):
    x, y = values(np.int8, (5, 30), 1), values(np.int8, (30, 4), 2)
    got = ef.ein("t[i, k] := x[i, j] * y[j, k]\nz[i] := sum[k](t[i, k]) + x[i, 0]", x=x, y=y,
                 backend=backend)
    want = (widened(x) @ widened(y)).sum(1) + x[:, 0]
    assert got.dtype == want.dtype == np.int64
    np.testing.assert_array_equal(got, want)


def test_explain_reports_the_widened_dtype():
    x = np.arange(1000).astype(np.uint8)
    assert ef.explain("s := sum[i](x[i])", x=x).result_dtype == "uint64"


# ------------------------------------------------------------------ 1a: einsum, einops

@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32])
@pytest.mark.parametrize("subscripts, shapes", [
    ("i->", [(1000,)]), ("ij,jk->ik", [(4, 300), (300, 3)]), ("ij,ij->i", [(3, 400)] * 2),
    ("ij,jk,kl->il", [(3, 50), (50, 40), (40, 2)]),
])
def test_einsum_sums_widen_where_numpy_einsum_wraps(backend, dtype, subscripts, shapes):
    operands = [values(dtype, s, n) for n, s in enumerate(shapes)]
    got = ef.einsum(subscripts, *operands, backend=backend)
    want = np.einsum(subscripts, *[widened(op) for op in operands])
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_einsum_without_a_summed_label_keeps_numpys_dtype(backend):
    a, b = values(np.uint8, (3, 4)), values(np.uint8, (5,))
    for subscripts, operands in [("ij->ji", [a]), ("ij,k->ijk", [a, b])]:
        got = ef.einsum(subscripts, *operands, backend=backend)
        want = np.einsum(subscripts, *operands)
        assert got.dtype == want.dtype == np.uint8
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("reduction", ["sum", "prod", "max"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32, np.bool_])
def test_einops_reduce_matches_einops(backend, reduction, dtype):
    einops = pytest.importorskip("einops")
    x = values(dtype, (4, 6))
    if reduction == "prod" and dtype != np.bool_:
        x = (x % 5 + 1).astype(dtype)
    want = einops.reduce(x, "a b -> a", reduction)
    got = ef.reduce(x, "a b -> a", reduction, backend=backend)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(x)
    want = einops.reduce(t, "a b -> a", reduction)
    got = ef.reduce(t, "a b -> a", reduction, backend=backend)
    assert got.dtype == want.dtype and torch.equal(got, want)


# ------------------------------------------------------------------ 11: plain and shifted

def test_plain_uses_of_other_lengths_are_an_error_beside_a_shifted_one(backend):
    a, b, c = np.arange(3.0), np.arange(5.0) * 10, np.arange(4.0) * 100
    with pytest.raises(ShapeError, match="a gives 3.*b gives 5"):
        ef.ein("y[i] := a[i] + b[i] + c[i+1]", a=a, b=b, c=c, backend=backend)


def test_plain_uses_that_agree_intersect_with_the_shifted_one(backend):
    a, b, c = np.arange(5.0), np.arange(5.0) * 10, np.arange(4.0) * 100
    got = ef.ein("y[i] := a[i] + b[i] + c[i+1]", a=a, b=b, c=c, backend=backend)
    np.testing.assert_array_equal(got, a[:3] + b[:3] + c[1:4])
    # ranges= reads part of an input on purpose
    got = ef.ein("y[i] := a[i] + b[i] + c[i+1]", a=a[:3], b=b, c=c, ranges={"i": 3},
                 backend=backend)
    np.testing.assert_array_equal(got, a[:3] + b[:3] + c[1:4])


# ------------------------------------------------------------------ 12: naive broadcast

@pytest.mark.parametrize("statement, shapes", [
    ("C[i,j] := A[i,k] * B[k,j]", {"A": (512, 256), "B": (256, 128)}),
    ("S[b,h,t,T] := Q[b,t,h,r] * K[b,T,h,r]", {"Q": (4, 64, 3, 16), "K": (4, 64, 3, 16)}),
    ("y[i] := sum[j](exp(x[i,j]))", {"x": (300, 200)}),
    ("o[i,j] := img[i+a, j+b] * ker[a,b]", {"img": (100, 100), "ker": (7, 7)}),
    ("s := sum[i,j](A[i] * B[j])", {"A": (3000,), "B": (3000,)}),
    ("m[i,j] = max[a,b](img[i+a, j+b])", {"img": (100, 100), "m": (94, 94)}),
])
def test_no_broadcast_is_claimed_where_eager_code_builds_none(statement, shapes):
    arrays = {n: np.ones(s, np.float32) for n, s in shapes.items()}
    report = ef.explain(statement, **arrays)
    assert not report.naive_intermediate_bytes
    assert "naive broadcast" not in str(report)


def test_einsums_explanation_claims_no_broadcast():
    Q = np.ones((2, 64, 4, 32), np.float32)
    assert "naive broadcast" not in str(ef.explain("bthr,bThr->bhtT", Q, Q))


@pytest.mark.parametrize("statement, shapes, elements", [
    ("D[i,j] := (w[k,i] - x[k,j])**2", {"w": (64, 30), "x": (64, 20)}, 64 * 30 * 20),
    ("m[i,j] := max[k](A[i,k] * B[k,j])", {"A": (10, 50), "B": (50, 30)}, 10 * 50 * 30),
    ("s := logsumexp[i,j](A[i] * B[j])", {"A": (300,), "B": (200,)}, 300 * 200),
    ("o[i,j] := (img[i+a, j+b] - ker[a,b])**2", {"img": (40, 40), "ker": (3, 3)},
     38 * 38 * 9),
])
def test_a_real_broadcast_is_reported_with_its_size(statement, shapes, elements):
    arrays = {n: np.ones(s, np.float64) for n, s in shapes.items()}
    report = ef.explain(statement, **arrays)
    assert report.naive_intermediate_bytes == elements * 8
    assert "naive broadcast" in str(report)
