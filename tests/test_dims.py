"""Named dimensions (docs/dims.md): each example equals its hand-written ef.ein statement
form and an independent NumPy formulation; the constructs one by one (affine
subscripts, gathers, integers, slices, splits, reductions, index values, ef.evaluate,
np.asarray, repr)."""

import math

import numpy as np
import pytest

import einfuse as ef

rng = np.random.default_rng(33)


def rand(*shape):
    return rng.standard_normal(shape)


def causal_softmax(S):
    S = np.where(np.tril(np.ones(S.shape[-2:], bool)), S, -np.inf)
    P = np.exp(S - S.max(-1, keepdims=True))
    return P / P.sum(-1, keepdims=True)


def _attention(Q, K, V, scale):
    s = np.einsum("bthr,bThr->bhtT", Q, K) * scale
    return np.einsum("bhtT,bThr->bthr", causal_softmax(s), V)


# name: (build(arrays) -> result via .order, statement form, NumPy formulation, arrays)
EXAMPLES = {
    "dist": (
        lambda a: (lambda i, j, k: ((ef.wrap(a["w"])[k, i] - ef.wrap(a["x"])[k, j]) ** 2)
                   .sum(k).order(i, j))(*ef.dims("i j k")),
        "D[i,j] := sum[k]((w[k,i] - x[k,j])**2)",
        lambda a: ((a["w"][:, :, None] - a["x"][:, None, :]) ** 2).sum(0),
        lambda: {"w": rand(3, 5), "x": rand(3, 4)}),
    "gaussian kernel": (
        lambda a: (lambda i, j, d: (ef.exp(-((ef.wrap(a["x"])[i, d] - ef.wrap(a["y"])[j, d])
                                             ** 2).sum(d) * 0.5) * ef.wrap(a["b"])[j])
                   .sum(j).order(i))(*ef.dims("i j d")),
        "o[i] := sum[j](exp(-sum[d]((x[i,d] - y[j,d])**2) * 0.5) * b[j])",
        lambda a: np.exp(-0.5 * ((a["x"][:, None] - a["y"][None]) ** 2).sum(-1)) @ a["b"],
        lambda: {"x": rand(6, 3), "y": rand(5, 3), "b": rand(5)}),
    "linear relu": (
        lambda a: (lambda b, i, o: ((ef.wrap(a["x"])[b, i] * ef.wrap(a["W"])[i, o]).sum(i)
                                    + ef.wrap(a["bias"])[o]).relu().order(b, o))(
            *ef.dims("b i o")),
        "y[b,o] := relu(sum[i](x[b,i] * W[i,o]) + bias[o])",
        lambda a: np.maximum(a["x"] @ a["W"] + a["bias"], 0),
        lambda: {"x": rand(4, 3), "W": rand(3, 5), "bias": rand(5)}),
    "softmax": (
        lambda a: (lambda i, j: ef.wrap(a["X"])[i, j].softmax(j).order(i, j))(
            *ef.dims("i j")),
        "m[i] := max[j](X[i,j])\ne[i,j] := exp(X[i,j] - m[i])\nP[i,j] := e[i,j] / sum[k](e[i,k])",
        lambda a: np.exp(a["X"]) / np.exp(a["X"]).sum(1, keepdims=True),
        lambda: {"X": rand(4, 7)}),
    "layernorm": (
        lambda a: (lambda i, j: (lambda X: ((X - X.mean(j)) / ef.sqrt(X.var(j) + 1e-5))
                                 .order(i, j))(ef.wrap(a["X"])[i, j]))(*ef.dims("i j")),
        "Y[i,j] := (X[i,j] - mean[k](X[i,k])) / sqrt(var[k](X[i,k]) + 1e-5)",
        lambda a: (a["X"] - a["X"].mean(1, keepdims=True)) /
        np.sqrt(a["X"].var(1, keepdims=True) + 1e-5),
        lambda: {"X": rand(5, 6)}),
    "valid correlation": (
        lambda a: (lambda i, k: (ef.wrap(a["x"])[i + k] * ef.wrap(a["ker"])[k]).sum(k)
                   .order(i))(*ef.dims("i k")),
        "y[i] := x[i+k] * ker[k]",
        lambda a: np.correlate(a["x"], a["ker"], "valid"),
        lambda: {"x": rand(10), "ker": rand(3)}),
    "embedding gather": (
        lambda a: (lambda b, t, d: ef.wrap(a["E"])[ef.wrap(a["tok"])[b, t], d]
                   .order(b, t, d))(*ef.dims("b t d")),
        "h[b,t,d] := E[tok[b,t], d]",
        lambda a: a["E"][a["tok"]],
        lambda: {"E": rand(7, 3), "tok": rng.integers(0, 7, (2, 4))}),
    "causal softmax": (
        lambda a: (lambda t, T: ef.where(T <= t, ef.wrap(a["S"])[t, T], -math.inf)
                   .softmax(T).order(t, T))(*ef.dims("t T")),
        "P[t,T] := exp(where(T <= t, S[t,T], -inf) - max[k](where(k <= t, S[t,k], -inf))) / "
        "sum[l](exp(where(l <= t, S[t,l], -inf) - max[k](where(k <= t, S[t,k], -inf))))",
        lambda a: causal_softmax(a["S"]),
        lambda: {"S": rand(6, 6)}),
    "attention": (
        lambda a: (lambda b, t, T, h, r: (ef.where(
            T <= t, (ef.wrap(a["Q"])[b, t, h, r] * ef.wrap(a["K"])[b, T, h, r]).sum(r) * 0.5,
            -math.inf).softmax(T) * ef.wrap(a["V"])[b, T, h, r]).sum(T).order(b, t, h, r))(
            *ef.dims("b t T h r")),
        "S[b,t,h,T] := where(T <= t, sum[r](Q[b,t,h,r] * K[b,T,h,r]) * 0.5, -inf)\n"
        "m[b,t,h] := max[T](S[b,t,h,T])\nP[b,t,h,T] := exp(S[b,t,h,T] - m[b,t,h])\n"
        "O[b,t,h,r] := sum[T](P[b,t,h,T] * V[b,T,h,r]) / sum[T](P[b,t,h,T])",
        lambda a: _attention(a["Q"], a["K"], a["V"], 0.5),
        lambda: {"Q": rand(2, 5, 3, 4), "K": rand(2, 5, 3, 4), "V": rand(2, 5, 3, 4)}),
}


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_equals_statement_form_and_numpy(name):
    build, statement, reference, make = EXAMPLES[name]
    arrays = make()
    got = build(arrays)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, ef.ein(statement, **arrays), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, reference(arrays), rtol=1e-10, atol=1e-12)


def test_backends_agree(backend):
    i, j, k = ef.dims("i j k")
    w, x = rand(3, 5), rand(3, 4)
    D = ((ef.wrap(w)[k, i] - ef.wrap(x)[k, j]) ** 2).sum(k)
    np.testing.assert_allclose(D.order(i, j, backend=backend),
                               ((w[:, :, None] - x[:, None, :]) ** 2).sum(0), rtol=1e-12)
    np.testing.assert_allclose(D.order(j, i, backend=backend),
                               ((w[:, :, None] - x[:, None, :]) ** 2).sum(0).T, rtol=1e-12)


def test_affine_subscripts():
    x = rand(11)
    i, a = ef.dims("i a")
    X = ef.wrap(x)
    np.testing.assert_allclose((X[i + 1] - X[i]).order(i), np.diff(x))
    np.testing.assert_array_equal(X[2 * i].order(i), x[::2])
    a.size = 2
    np.testing.assert_array_equal(X[2 * i + a].max(a).order(i), x[:10].reshape(5, 2).max(1))
    A = rand(3, 4)
    n = ef.dims("n")
    np.testing.assert_array_equal(ef.wrap(A)[n // 4, n % 4].order(n), A.reshape(-1))


def test_integers_slices_and_ellipsis():
    A, B = rand(3, 4), rand(2, 3, 4)
    r, c = ef.dims("r c")
    np.testing.assert_array_equal(ef.wrap(A)[r, -1].order(r), A[:, -1])
    # a full slice keeps a positional axis, placed after the ordered dimensions
    np.testing.assert_allclose((ef.wrap(A)[:, c] * ef.wrap(A)[0, c]).order(c), (A * A[0]).T)
    np.testing.assert_allclose(ef.wrap(B)[..., c].sum(c).order(), B.sum(-1))
    # positional axes broadcast as NumPy aligns them, from the right
    row = ef.wrap(B[0, 0])[:]
    np.testing.assert_allclose((ef.wrap(B)[r, :, :] * row).order(r), B * B[0, 0])


def test_split_and_flatten_axes():
    img = rand(2, 12, 3, 3)
    h2, w2, c, b, h, w = ef.dims(6)
    h2.size = w2.size = 2
    got = ef.wrap(img)[b, (c, h2, w2), h, w].order(b, c, (h, h2), (w, w2))
    want = img.reshape(2, 3, 2, 2, 3, 3).transpose(0, 1, 4, 2, 5, 3).reshape(2, 3, 6, 6)
    np.testing.assert_array_equal(got, want)


def test_reductions_as_methods():
    A = rand(3, 5)
    r, c = ef.dims("r c")
    X = ef.wrap(A)[r, c]
    expected = {"sum": A.sum(1), "prod": A.prod(1), "max": A.max(1), "min": A.min(1),
                "mean": A.mean(1), "var": A.var(1),
                "logsumexp": np.log(np.exp(A).sum(1)),
                "argmax": A.argmax(1), "argmin": A.argmin(1)}
    for kind, want in expected.items():
        got = getattr(X, kind)(c).order(r)
        np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=kind)
    assert X.argmax(c).order(r).dtype == np.int64
    np.testing.assert_allclose(X.sum().order(), A.sum())              # all dimensions
    np.testing.assert_allclose(X.max(r, c).order(), A.max())
    np.testing.assert_allclose(X.log_softmax(c).order(r, c),
                               A - np.log(np.exp(A).sum(1, keepdims=True)))


def test_broadcasting_by_name_and_functions():
    a, b = rand(3), rand(4)
    i, j = ef.dims("i j")
    outer = ef.wrap(a)[i] * ef.wrap(b)[j]
    assert set(outer.dims) == {i, j}
    np.testing.assert_allclose(outer.order(j, i), np.outer(a, b).T)
    e = ef.tanh(outer) + ef.maximum(ef.wrap(a)[i], 0.25) - abs(ef.wrap(b)[j]) ** 2
    want = np.tanh(np.outer(a, b)) + np.maximum(a, 0.25)[:, None] - np.abs(b)[None] ** 2
    np.testing.assert_allclose(e.order(i, j), want, rtol=1e-12)
    np.testing.assert_allclose(np.exp(ef.wrap(a)[i]).order(i), np.exp(a))   # a NumPy ufunc
    np.testing.assert_allclose(ef.wrap(a)[i].sigmoid().order(i), 1 / (1 + np.exp(-a)))


def test_index_values_and_sizes():
    t, T = ef.dims("t T")
    S = rand(4, 4)
    mask = ef.where(T <= t, ef.wrap(S)[t, T], 0.0)
    np.testing.assert_array_equal(mask.order(t, T), np.tril(S))
    z = ef.dims("z")
    z.size = 5
    np.testing.assert_array_equal(ef.evaluate((z * 2 + 1) * 1), 2 * np.arange(5) + 1)
    i, j = ef.dims("i j")
    v = rand(16)
    products = ef.wrap(v)[i * j]          # a computed position: gathered from an intermediate
    i.size = j.size = 4
    np.testing.assert_array_equal(products.order(i, j), v[np.outer(np.arange(4), np.arange(4))])


def test_gather_of_a_computed_position():
    A, W = rand(3, 5), rand(5, 3)
    r, c = ef.dims("r c")
    picked = ef.wrap(W)[ef.wrap(A)[r, c].argmax(c), r]
    np.testing.assert_array_equal(picked.order(r), W[A.argmax(1), np.arange(3)])
    idx = np.array([0, 4, 2])
    np.testing.assert_array_equal(ef.wrap(A)[r, ef.wrap(idx)[r] + 0].order(r), A[[0, 1, 2], idx])


def test_evaluate_runs_one_program_with_shared_work():
    A = rand(4, 6)
    r, c = ef.dims("r c")
    X = ef.wrap(A)[r, c]
    peak = X.max(c)
    m, e = ef.evaluate((peak, r), ((X - peak).exp(), c, r))
    np.testing.assert_allclose(m, A.max(1))
    np.testing.assert_allclose(e, np.exp(A - A.max(1, keepdims=True)).T)
    # the row maximum is one statement, which the second result reads
    first, second = ef.explain((peak, r), ((X - peak).exp(), c, r)).statements
    assert "max[" in first and "max[" not in second and first.split("[")[0] in second
    alone = ef.explain((X - peak).exp()).statements
    assert len(alone) == 1 and "max[" in alone[0]   # used once: inline (and hoisted)
    same = ef.evaluate((X.sum(c), r), (X.sum(c), r))
    np.testing.assert_allclose(same[0], same[1])


def test_asarray_and_repr():
    x = rand(5)
    i, j = ef.dims("i j")
    e = ef.wrap(x)[i] * 2.0
    np.testing.assert_allclose(np.asarray(e), 2 * x)
    np.testing.assert_allclose(np.asarray(ef.wrap(x)[i].sum(i)), x.sum())
    shown = repr(ef.wrap(x, name="x")[i] * ef.wrap(x)[j])
    assert "i=5" in shown and "j=5" in shown and "x[i] * x[j]" in shown


def test_dimension_names_from_the_assignment():
    p, q = ef.dims()
    assert (p.name, q.name) == ("p", "q")
    u = ef.dims(1)
    assert isinstance(u, ef.Dim) and u.name == "u"
    v, = ef.dims(1)
    assert v.name == "v"
    k = ef.dims("k", sizes=[3])
    assert k.size == 3


def test_reserved_names_are_renamed_in_the_program():
    A = rand(3, 4)
    big, total = ef.dims("max sum")
    e = (ef.wrap(A)[big, total] * 2).sum(total)
    np.testing.assert_allclose(e.order(big), 2 * A.sum(1))
    assert "max_1" in repr(e)


def test_explain_starts_with_the_statements_and_shards_by_dimension_name():
    x, W1, W2 = rand(8, 16), rand(16, 32), rand(32, 4)
    b, i, h, o = ef.dims("b i h o")
    hidden = ef.tanh((ef.wrap(x)[b, i] * ef.wrap(W1)[i, h]).sum(i))
    y = (hidden * ef.wrap(W2)[h, o]).sum(h)
    text = str(ef.explain(y))
    assert text.startswith("out[b, o] := sum[h](tanh(sum[i](A[b, i] * B[i, h])) * C[h, o])")
    assert "A: a numpy float64 array of shape (8, 16)" in text
    by_object = ef.explain(y, mesh={"data": 2, "model": 2}, shard={b: "data", h: "model"})
    by_name = ef.explain(y, mesh={"data": 2, "model": 2}, shard={"b": "data", "h": "model"})
    assert str(by_object) == str(by_name)
    assert "b->data, h->model" in str(by_name) and "all-reduce" in str(by_name)
    with pytest.raises(ef.EinfuseError, match="not a dimension"):
        ef.explain(y, mesh={"data": 2}, shard={"q": "data"})


def test_conversions_and_other_libraries_functions():
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    x = np.arange(4.0)
    i = ef.dims("i")
    e = ef.wrap(x)[i] * 2
    np.testing.assert_array_equal(torch.as_tensor(e).numpy(), 2 * x)     # through DLPack
    np.testing.assert_array_equal(np.asarray(jnp.asarray(e)), 2 * x)
    np.testing.assert_array_equal(np.maximum(e, 3.0).order(i), np.maximum(2 * x, 3))
    assert ef.wrap(x)[i].sum(i).item() == 6.0
    t = torch.arange(4.0, dtype=torch.float64)
    scale = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)   # a 0-d input
    torch.tanh(t[i] * scale).order(i).sum().backward()
    torch.testing.assert_close(scale.grad, (t * (1 - torch.tanh(t * 0.5) ** 2)).sum())
    with pytest.raises(ef.EinfuseError, match="gradient"):
        torch.as_tensor(t.clone().requires_grad_()[i] * 2)


SIZES = {"i": 3, "j": 4, "k": 2}


def _random_case(seed):
    """A random DAG over i, j, k (shared nodes, reductions nested over a dimension that
    is free again outside) and its value by NumPy broadcasting, axes always (i, j, k)
    with size 1 where a dimension is absent: an oracle independent of the program."""
    gen = np.random.default_rng(seed)
    dims = dict(zip("ijk", ef.dims("i j k")))
    pool = []
    for _ in range(3):
        names = [n for n in "ijk" if gen.random() < 0.7] or ["i"]
        gen.shuffle(names)
        data = gen.standard_normal([SIZES[n] for n in names])
        expr = ef.wrap(data)[tuple(dims[n] for n in names)]
        value = np.transpose(data, [names.index(n) for n in "ijk" if n in names])
        value = value.reshape([SIZES[n] if n in names else 1 for n in "ijk"])
        pool.append((expr, value))
    for _ in range(6):
        (a, va), (b, vb) = (pool[n] for n in gen.integers(0, len(pool), 2))
        choice = gen.integers(0, 6)
        if choice == 0:
            node = (a + b, va + vb)
        elif choice == 1:
            node = (a * b - 0.5, va * vb - 0.5)
        elif choice == 2:
            node = (ef.maximum(a, b), np.maximum(va, vb))
        elif choice == 3:
            node = (ef.tanh(a).exp(), np.exp(np.tanh(va)))
        else:
            present = [n for n in "ijk" if dims[n] in a.dims]
            if not present:
                continue
            n = present[gen.integers(0, len(present))]
            kind = ("sum", "max", "mean")[gen.integers(0, 3)]
            node = (getattr(a, kind)(dims[n]),
                    getattr(np, kind)(va, axis="ijk".index(n), keepdims=True))
        pool.append(node)
    expr, value = pool[-1]
    order = [n for n in "ijk" if dims[n] in expr.dims]
    want = np.broadcast_to(value, [SIZES[n] if n in order else 1 for n in "ijk"])
    return expr, tuple(dims[n] for n in order), want.reshape([SIZES[n] for n in order])


@pytest.mark.parametrize("seed", range(12))
def test_random_expressions_equal_numpy_broadcasting(seed):
    expr, order, want = _random_case(seed)
    np.testing.assert_allclose(expr.order(*order), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("steps", [5, 260])
def test_deep_expressions_materialise_by_either_walk(steps):
    """The structural walk recurses for shallow DAGs and takes an explicit stack past
    named_program._RECURSIVE_DEPTH; both number shared nodes alike."""
    x = np.arange(4.0)
    i = ef.dims("i")
    a = ef.wrap(x)[i]
    e = a * a
    for n in range(steps):
        e = e + (a if n % 2 else 1)
    expected = x * x + (steps // 2) * x + (steps - steps // 2)
    np.testing.assert_allclose(e.order(i, backend="numpy"), expected)
