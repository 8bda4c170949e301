"""Every construct of the notation on every backend, against NumPy formulations."""

import math

import numpy as np
import pytest

import einfuse as ef

rng = np.random.default_rng(0)


def rand(*shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def close(got, want, dtype=np.float64):
    rtol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-10
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(1.0, np.abs(want).max()
                                                                     if np.size(want) else 1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_and_dist(backend, dtype):
    A, B = rand(7, 5, dtype=dtype), rand(5, 3, dtype=dtype)
    C = ef.ein("C[i,j] := A[i,k] * B[k,j]", A=A, B=B, backend=backend)
    assert C.dtype == dtype and C.shape == (7, 3)
    close(C, A @ B, dtype)
    w, x = rand(6, 9, dtype=dtype), rand(6, 4, dtype=dtype)
    D = ef.ein("D[i,j] := (w[k,i] - x[k,j])**2", w=w, x=x, backend=backend)
    close(D, ((w[:, :, None] - x[:, None, :]) ** 2).sum(0), dtype)


def test_batched_and_outer(backend):
    A, B = rand(4, 5, 3), rand(5, 6, 3)
    close(ef.ein("C[i,j,b] := A[i,k,b]*B[k,j,b]", A=A, B=B, backend=backend),
          np.einsum("ikb,kjb->ijb", A, B))
    u, v = rand(4), rand(5)
    close(ef.ein("O[i,j] := u[i]*v[j]", u=u, v=v, backend=backend), np.outer(u, v))


def test_convolutions(backend):
    x, k = rand(20), rand(5)
    y = ef.ein("y[i] := x[i+a] * ker[a]", x=x, ker=k, backend=backend)
    close(y, np.correlate(x, k, "valid"))
    img, ker = rand(12, 10), rand(3, 4)
    o = ef.ein("o[i,j] := img[i+a,j+b]*ker[a,b]", img=img, ker=ker, backend=backend)
    want = np.array([[np.sum(img[i:i + 3, j:j + 4] * ker) for j in range(7)]
                     for i in range(10)])
    close(o, want)
    strided = ef.ein("y[i] := x[2*i + a] * ker[a]", x=x, ker=k, backend=backend)
    close(strided, np.array([np.dot(x[2 * i:2 * i + 5], k) for i in range(8)]))


def test_same_convolution_with_pad(backend):
    x, k = rand(10), rand(3)
    y = ef.ein("y[i] := x[i+a-1] * ker[a]", x=x, ker=k, pad=0.0, ranges={"i": 10},
               backend=backend)
    close(y, np.correlate(np.pad(x, 1), k, "valid"))
    out = np.zeros(10)
    ef.ein("y[i] = x[i+a-1] * ker[a]", x=x, ker=k, y=out, pad=0.0, backend=backend)
    close(out, y)


def test_gathers_every_bounds_mode(backend):
    W = rand(6, 3)
    idx = np.array([0, 5, 7, -2], dtype=np.int32)
    clip = ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=idx, bounds="clip", backend=backend)
    close(clip, W[np.clip(idx, 0, 5)])
    wrap = ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=idx, bounds="wrap", backend=backend)
    close(wrap, W[idx % 6])
    fill = ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=idx, bounds="fill", fill=-1.5,
                  backend=backend)
    close(fill, np.where(((idx >= 0) & (idx < 6))[:, None], W[np.clip(idx, 0, 5)], -1.5))
    for mode in ("check", "promise"):
        with pytest.raises(ef.EinfuseError, match=r"idx.* 7 .*0\.\.5") as info:
            ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=idx, bounds=mode, backend=backend)
        assert isinstance(info.value, IndexError)
    good = np.array([3, 0, 5], dtype=np.int64)
    close(ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=good, backend=backend), W[good])


def test_gather_with_affine_part_and_nested(backend):
    x = rand(10)
    idx = np.array([0, 3, 8])
    close(ef.ein("y[i] := x[idx[i] + 1]", x=x, idx=idx, backend=backend), x[idx + 1])
    perm = np.array([2, 0, 1])
    close(ef.ein("y[i] := x[idx[perm[i]]]", x=x, idx=idx, perm=perm, backend=backend),
          x[idx[perm]])
    tok = np.array([[1, 2], [9, 0]])
    W = rand(10, 4)
    close(ef.ein("E[b,t,d] := W[tok[b,t], d]", W=W, tok=tok, backend=backend), W[tok])
    with pytest.raises(ef.EinfuseError, match="10"):  # 9 + 1 leaves x under 'check'
        ef.ein("y[i] := x[idx[i] + 1]", x=x, idx=np.array([9]), backend=backend)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reductions_and_finalisers(backend, dtype):
    X = rand(5, 7, dtype=dtype)
    close(ef.ein("z[i] := logsumexp[j](X[i,j])", X=X, backend=backend),
          np.log(np.exp(X.astype(np.float64)).sum(1)), dtype)
    m = X.max(1)
    close(ef.ein("z[i] := log(sum[j](exp(X[i,j] - m[i])))", X=X, m=m, backend=backend),
          np.log(np.exp(X - m[:, None]).sum(1)), dtype)
    close(ef.ein("n[i] := sqrt(sum[j](X[i,j]**2))", X=X, backend=backend),
          np.linalg.norm(X, axis=1), dtype)
    close(ef.ein("p[i] := prod[j](X[i,j])", X=X, backend=backend), X.prod(1), dtype)
    close(ef.ein("p[j] := max[i](X[i,j])", X=X, backend=backend), X.max(0), dtype)
    close(ef.ein("p := min[i,j](X[i,j])", X=X, backend=backend), X.min(), dtype)
    x, y, b = rand(6, 3), rand(8, 3), rand(8)
    gauss = ef.ein("o[i] := sum[j](exp(-sum[d]((x[i,d]-y[j,d])**2)) * b[j])", x=x, y=y, b=b,
                   backend=backend)
    close(gauss, (np.exp(-((x[:, None] - y[None]) ** 2).sum(-1)) * b).sum(1))


def test_logsumexp_is_stable(backend):
    X = np.array([[1000.0, 1000.0], [-1000.0, -1000.0], [-np.inf, -np.inf], [np.inf, 0.0]])
    got = ef.ein("z[i] := logsumexp[j](X[i,j])", X=X, backend=backend)
    close(got[:2], [1000 + math.log(2), -1000 + math.log(2)])
    assert got[2] == -np.inf and got[3] == np.inf


def test_empty_reductions(backend):
    X = np.zeros((3, 0))
    for op, want in [("sum", 0.0), ("prod", 1.0), ("max", -np.inf), ("min", np.inf),
                     ("logsumexp", -np.inf)]:
        got = ef.ein(f"z[i] := {op}[j](X[i,j])", X=X, backend=backend)
        assert got.shape == (3,) and np.all(got == want), op


def test_functions(backend):
    x = rng.uniform(0.1, 2.0, size=7)
    y = rand(7)
    cases = {
        "exp": np.exp(x), "log": np.log(x), "log1p": np.log1p(x), "expm1": np.expm1(x),
        "sqrt": np.sqrt(x), "abs": np.abs(x), "sin": np.sin(x), "cos": np.cos(x),
        "tanh": np.tanh(x), "sigmoid": 1 / (1 + np.exp(-x)), "relu": np.maximum(x, 0),
        "softplus": np.log1p(np.exp(x)), "floor": np.floor(x), "ceil": np.ceil(x),
        "erf": np.array([math.erf(v) for v in x]),
    }
    for func, want in cases.items():
        close(ef.ein(f"r[i] := {func}(x[i])", x=x, backend=backend), want)
    close(ef.ein("r[i] := min(x[i], y[i]) + max(x[i], y[i])*2 + pow(x[i], 1.5)", x=x, y=y,
                 backend=backend), np.minimum(x, y) + np.maximum(x, y) * 2 + x ** 1.5)
    close(ef.ein("r[i] := where(y[i] > 0, x[i], -x[i])", x=x, y=y, backend=backend),
          np.where(y > 0, x, -x))


def test_index_values_and_comparisons(backend):
    S = rand(4, 4)
    masked = ef.ein("M[i,j] := where(j <= i, S[i,j], -inf)", S=S, backend=backend)
    close(np.where(np.isinf(masked), 0, masked), np.tril(S))
    assert np.all(np.isinf(masked[np.triu_indices(4, 1)]))
    A = rand(5)
    close(ef.ein("r[i,j] := A[i] / (j + 1)", A=A, ranges={"j": 3}, backend=backend),
          A[:, None] / np.arange(1, 4))
    mask = ef.ein("m[i,j] := (i < j) & (S[i,j] > 0)", S=S, backend=backend)
    assert mask.dtype == bool
    np.testing.assert_array_equal(mask, np.triu(np.ones((4, 4), bool), 1) & (S > 0))
    counted = ef.ein("c[i] := (A[i] > 0) + (A[i] > 0)", A=A, backend=backend)
    np.testing.assert_array_equal(counted, 2 * (A > 0))  # 0/1 arithmetic, not logical or


def test_scalars_params_and_positionals(backend):
    x = rand(6)
    s = ef.ein("s := alpha * x[i]**2", 0.5, x, backend=backend)  # first appearance order
    assert isinstance(s, np.ndarray) and s.shape == ()
    close(s, 0.5 * (x ** 2).sum())
    t = ef.ein("t := s0[] * 2", s0=np.array(3.0), backend=backend)
    assert float(t) == 6.0
    kernel = ef.compile("C[i,j] := A[i,k] * B[k,j]", backend=backend)
    A, B = rand(3, 4), rand(4, 2)
    close(kernel(A, B), A @ B)
    close(kernel(B=B, A=A), A @ B)


def test_assign_and_accumulate(backend):
    A, B = rand(3, 4), rand(4, 2)
    out = np.zeros((3, 2))
    returned = ef.ein("C[i,j] = A[i,k] * B[k,j]", A=A, B=B, C=out, backend=backend)
    assert returned is out
    close(out, A @ B)
    ef.ein("C[i,j] += A[i,k] * B[k,j]", A=A, B=B, C=out, backend=backend)
    close(out, 2 * (A @ B))
    ef.ein("C[i,j] = C[i,j] + 50", C=out, backend=backend)
    close(out, 2 * (A @ B) + 50)
    acc = np.zeros(())
    ef.ein("s += x[i]", x=np.arange(4.0), s=acc, backend=backend)
    assert float(acc) == 6.0


def test_explicit_ranges_offset_axis(backend):
    x = np.arange(20.0)
    y = ef.ein("y[i] := x[i]", x=x, ranges={"i": range(5, 9)}, backend=backend)
    np.testing.assert_array_equal(y, [5, 6, 7, 8])
    shifted = ef.ein("y[i] := x[i+1]", x=np.arange(5.0), backend=backend)
    np.testing.assert_array_equal(shifted, np.arange(5.0))  # i runs over -1..3
    diff = ef.ein("y[i] := x[i+1] - x[i]", x=x ** 2, backend=backend)
    close(diff, np.diff(x ** 2))


def test_non_contiguous_and_negative_strides(backend):
    A = rand(8, 6)[::2, ::-1]
    B = np.asfortranarray(rand(6, 5))
    close(ef.ein("C[i,j] := A[i,k] * B[k,j]", A=A, B=B, backend=backend), A @ B)
    x, k = rand(30)[::-3], rand(6)[::-2]
    close(ef.ein("y[i] := x[i+a] * ker[a]", x=x, ker=k, backend=backend),
          np.correlate(np.ascontiguousarray(x), np.ascontiguousarray(k), "valid"))


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_integer_tensors_and_index_dtypes(backend, index_dtype):
    counts = np.arange(6, dtype=index_dtype).reshape(2, 3)
    total = ef.ein("t[i] := counts[i,j] * 2", counts=counts, backend=backend)
    assert total.dtype.kind == "i"
    np.testing.assert_array_equal(total, counts.sum(1) * 2)
    W = rand(4, 2)
    idx = np.array([3, 1], dtype=index_dtype)
    close(ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=idx, backend=backend), W[idx])


def test_float32_stays_float32_with_python_scalars(backend):
    x = rand(5, dtype=np.float32)
    y = ef.ein("y[i] := 2.5 * x[i] + alpha", x=x, alpha=1.0, backend=backend)
    assert y.dtype == np.float32
    z = ef.ein("y[i] := x[i] * 2", x=x, dtype="float64", backend=backend)
    assert z.dtype == np.float64
