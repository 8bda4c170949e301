"""torchdim's README examples written with ef.dims give torch's results; attention
written with dimensions runs the one online-softmax kernel; a materialised program's
schedule equals the hand-written statement form's; and the compiled program is cached
per expression structure (a rebuilt expression compiles and binds nothing)."""

import math

import numpy as np
import pytest

import einfuse as ef
from einfuse import named_api

torch = pytest.importorskip("torch")
g = torch.Generator().manual_seed(33)


def randn(*shape, dtype=torch.float64):
    return torch.randn(shape, dtype=dtype, generator=g)


# -- torchdim's README, with ef.dims in place of functorch.dim.dims -------------------------

def mm(A, B):
    i, j, k = ef.dims(3)
    r = (A[i, k] * B[k, j]).sum(k)
    return r.order(i, j)


def embedding_bag(input, embedding_weights):
    batch, sequence, features = ef.dims(3)
    r = embedding_weights[input[batch, sequence], features].sum(sequence)
    return r.order(batch, features)


def pixel_shuffle(img, upscale_factor=2):
    h2, w2, c, b, h, w = ef.dims(6)
    h2.size = w2.size = upscale_factor
    return img[b, (c, h2, w2), h, w].order(b, c, (h, h2), (w, w2))


def attention(K, Q, V):
    batch, channel, key, query = ef.dims(4)
    k = K[batch, channel, key]
    q = Q[batch, channel, query]
    v = V[batch, channel, key]
    a = (k * q).sum(channel)
    a = ef.softmax(a * (channel.size ** -0.5), dim=key)
    r = (v * a).sum(key)
    return torch.cat((r.order(batch, channel, query), Q), dim=1)


def multiheadattention(q, k, v, num_attention_heads):
    batch, query_sequence, key_sequence, heads, features = ef.dims(5)
    heads.size = num_attention_heads
    q = q[batch, query_sequence, [heads, features]]
    k = k[batch, key_sequence, [heads, features]]
    v = v[batch, key_sequence, [heads, features]]
    attention_scores = (q * k).sum(features) * (features.size ** -0.5)
    attention_probs = ef.softmax(attention_scores, dim=key_sequence)
    context_layer = (attention_probs * v).sum(key_sequence)
    return context_layer.order(batch, query_sequence, [heads, features])


def test_matrix_product():
    A, B = randn(3, 4), randn(4, 5)
    torch.testing.assert_close(mm(A, B), A @ B)


def test_embedding_bag():
    weights = randn(10, 3)
    tokens = torch.randint(0, 10, (4, 6), generator=g)
    torch.testing.assert_close(embedding_bag(tokens, weights),
                               torch.nn.functional.embedding_bag(
                                   tokens, weights, mode="sum"))


def test_pixel_shuffle():
    img = randn(2, 12, 3, 4)
    torch.testing.assert_close(pixel_shuffle(img), torch.nn.functional.pixel_shuffle(img, 2),
                               rtol=0, atol=0)


def test_attention():
    K, Q, V = randn(2, 4, 5), randn(2, 4, 3), randn(2, 4, 5)
    a = torch.softmax(torch.einsum("bck,bcq->bkq", K, Q) * 4 ** -0.5, dim=1)
    want = torch.cat((torch.einsum("bck,bkq->bcq", V, a), Q), dim=1)
    torch.testing.assert_close(attention(K, Q, V), want)


def test_multihead_attention():
    q, k, v = randn(2, 5, 8), randn(2, 6, 8), randn(2, 6, 8)
    mha = torch.nn.functional.scaled_dot_product_attention
    split = lambda x: x.reshape(2, -1, 2, 4).transpose(1, 2)   # noqa: E731
    want = mha(split(q), split(k), split(v)).transpose(1, 2).reshape(2, 5, 8)
    torch.testing.assert_close(multiheadattention(q, k, v, 2), want)


def test_batched_gather():
    x = randn(3, 7)
    index = torch.randint(0, 7, (3, 4), generator=g)
    b, t = ef.dims(2)
    torch.testing.assert_close(x[b, index[b, t]].order(b, t), torch.gather(x, 1, index))


# -- the kernels a materialised program runs -----------------------------------------------

def seed_attention(Q, K, V, scale):
    """The seed's attention, W_bhtT = einsum('bthr,bThr->bhtT', Q, K), with dimensions."""
    b, t, T, h, r = ef.dims("b t T h r")
    s = (ef.wrap(Q)[b, t, h, r] * ef.wrap(K)[b, T, h, r]).sum(r) * scale
    p = ef.where(T <= t, s, -math.inf).softmax(T)
    return (p * ef.wrap(V)[b, T, h, r]).sum(T), (b, t, h, r)


HAND_WRITTEN_ATTENTION = (
    "S[b,t,h,T] := where(T <= t, sum[r](Q[b,t,h,r] * K[b,T,h,r]) * scale, -inf)\n"
    "m[b,t,h] := max[T](S[b,t,h,T])\n"
    "P[b,t,h,T] := exp(S[b,t,h,T] - m[b,t,h])\n"
    "O[b,t,h,r] := sum[T](P[b,t,h,T] * V[b,T,h,r]) / sum[T](P[b,t,h,T])")


def test_attention_with_dims_runs_the_online_softmax_kernel(fused_calls):
    rng = np.random.default_rng(1)
    Q, K, V = (rng.standard_normal((2, 40, 2, 8)).astype(np.float32) for _ in range(3))
    out, order = seed_attention(Q, K, V, 8 ** -0.5)
    explained = ef.explain(out)
    assert explained.attention is not None            # recognised: no N x N intermediate
    got = out.order(*order)
    assert fused_calls == [True]
    want = ef.ein(HAND_WRITTEN_ATTENTION, Q=Q, K=K, V=V, scale=8 ** -0.5)
    assert fused_calls == [True, True]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    hand = ef.explain(HAND_WRITTEN_ATTENTION, Q=Q, K=K, V=V, scale=8 ** -0.5)
    assert schedule(explained) == schedule(hand)


def schedule(explanation):
    """The kernels an explanation says run: the fused attention, a program's fusion
    groups (members and row kernel), or a statement's strategy."""
    explanation = getattr(explanation, "explanation", explanation)
    if getattr(explanation, "attention", None) is not None:
        return ("attention",)
    groups = getattr(explanation, "groups", None)
    if groups is not None:
        return tuple((g.row_kernel or ("fused" if len(g.statements) > 1 else "alone"))
                     for g in groups)
    return (explanation.strategy, len(explanation.hoisted or ()))


X32 = np.random.default_rng(2).standard_normal((64, 128)).astype(np.float32)


@pytest.mark.parametrize("build, statement, arrays", [
    (lambda i, j, k, w, x: ((ef.wrap(w, "w")[k, i] - ef.wrap(x, "x")[k, j]) ** 2).sum(k),
     "D[i,j] := sum[k]((w[k,i] - x[k,j])**2)", {"w": X32[:16], "x": X32[16:32, :96]}),
    (lambda i, j, k, w, x: ((ef.wrap(w, "w")[i, k] * ef.wrap(x, "x")[k, j]).sum(k) + 1).relu(),
     "y[i,j] := relu(sum[k](w[i,k] * x[k,j]) + 1)", {"w": X32, "x": X32.T[:, :32]}),
    (lambda i, j, k, w, x: ef.wrap(w, "w")[i, j].softmax(j),
     "m[i] := max[j](w[i,j])\ne[i,j] := exp(w[i,j] - m[i])\nP[i,j] := e[i,j] / sum[k](e[i,k])",
     {"w": X32}),
    (lambda i, j, k, w, x: (lambda v: (v - v.mean(j)) / ef.sqrt(v.var(j) + 1e-5))(
        ef.wrap(w, "w")[i, j]),
     "Y[i,j] := (w[i,j] - mean[k](w[i,k])) / sqrt(var[k](w[i,k]) + 1e-5)", {"w": X32}),
])
def test_schedule_equals_the_statement_form(build, statement, arrays):
    """The arrays keep their names (ef.wrap(w, "w")), which the strategy mentions."""
    i, j, k = ef.dims("i j k")
    expr = build(i, j, k, arrays["w"], arrays.get("x"))
    assert schedule(ef.explain(expr)) == schedule(ef.explain(statement, **arrays))
    np.testing.assert_allclose(expr.order(i, j), ef.ein(statement, **arrays), rtol=1e-5,
                               atol=1e-6)


# -- the structure cache -------------------------------------------------------------------

@pytest.fixture
def translations(monkeypatch):
    """Each spelling of a structure as a program, and each ef.compile of one."""
    counts = {"emit": 0, "compile": 0}
    emit, compile_ = named_api.emit, named_api.compile_statements

    def counted_emit(*args):
        counts["emit"] += 1
        return emit(*args)

    def counted_compile(*args, **kwargs):
        counts["compile"] += 1
        return compile_(*args, **kwargs)
    monkeypatch.setattr(named_api, "emit", counted_emit)
    monkeypatch.setattr(named_api, "compile_statements", counted_compile)
    monkeypatch.setattr(named_api, "_translations", {})
    return counts


def test_a_rebuilt_expression_compiles_and_binds_nothing(translations, bind_count):
    W = torch.randn(6, 4, dtype=torch.float64, generator=g, requires_grad=True)

    def step(x, scale):
        b, i, o = ef.dims("b i o")               # new dimension objects every step
        y = ((x[b, i] * W[i, o]).sum(i) * scale).tanh()
        return (y.softmax(o) * y).sum(o).order(b)
    step(randn(3, 6), 0.5).sum().backward()
    first = (dict(translations), len(bind_count))
    for n in range(3):         # new inputs of the shape, another scale: the same program
        step(randn(3, 6), 0.25 * n).sum().backward()
    assert (dict(translations), len(bind_count)) == first
    assert first[0] == {"emit": 1, "compile": 1}
    step(randn(5, 6), 0.5)     # another batch size: the same translation, a new binding
    assert translations == {"emit": 1, "compile": 1}


def test_cache_is_by_structure_not_identity(translations):
    x = np.arange(6.0)
    i = ef.dims("i")
    a = (ef.wrap(x)[i] * 2).exp().sum(i)
    i2 = ef.dims("i")
    b = (ef.wrap(x + 1)[i2] * 2).exp().sum(i2)     # equal structure, other objects
    c = (ef.wrap(x)[i] * 3).exp().sum(i)            # another integer: another program
    ef.evaluate(a), ef.evaluate(b)
    assert translations["emit"] == 1
    ef.evaluate(c)
    assert translations["emit"] == 2
    n = np.arange(4)
    for count in (100, 200):            # a large int is a parameter: one program
        np.testing.assert_array_equal(ef.evaluate(ef.wrap(n)[i] * count), n * count)
    assert translations["emit"] == 3


# -- torchdim's examples run the kernels of their statement forms --------------------------

def _torchdim_cases():
    """(the named expression before .order, its order, the hand-written statements,
    their arrays, their ranges) for each of torchdim's README examples."""
    A, B = randn(3, 4), randn(4, 5)
    i, j, k = ef.dims(3)
    yield ((A[i, k] * B[k, j]).sum(k), (i, j), "C[i,j] := sum[k](A[i,k] * B[k,j])",
           {"A": A, "B": B}, None)
    weights, tokens = randn(10, 3), torch.randint(0, 10, (4, 6), generator=g)
    batch, sequence, features = ef.dims(3)
    yield (weights[tokens[batch, sequence], features].sum(sequence), (batch, features),
           "E[batch,features] := sum[sequence](B[A[batch,sequence], features])",
           {"A": tokens, "B": weights}, None)
    img = randn(2, 12, 3, 4)
    h2, w2, c, b, h, w = ef.dims(6)
    h2.size = w2.size = 2
    yield (img[b, (c, h2, w2), h, w], (b, c, h, h2, w, w2),
           "P[b,c,h,h2,w,w2] := A[b, 4*c + 2*h2 + w2, h, w]", {"A": img},
           {"h2": 2, "w2": 2, "c": 3})
    # (NumPy arrays: ef.explain names the fused attention for them; torch tensors run it
    # too, test_torchdim_attention_runs_the_online_softmax_kernel)
    rng = np.random.default_rng(5)
    K, Q, V = (rng.standard_normal((2, 8, 40)).astype(np.float32) for _ in range(3))
    batch, channel, key, query = ef.dims(4)
    a = (ef.wrap(K)[batch, channel, key] * ef.wrap(Q)[batch, channel, query]).sum(channel)
    a = ef.softmax(a * (channel.size ** -0.5), dim=key)
    yield ((ef.wrap(V)[batch, channel, key] * a).sum(key), (batch, channel, query),
           "S[b,q,k] := sum[c](K[b,c,k] * Q[b,c,q]) * s\nm[b,q] := max[k](S[b,q,k])\n"
           "P[b,q,k] := exp(S[b,q,k] - m[b,q])\n"
           "R[b,c,q] := sum[k](V[b,c,k] * P[b,q,k]) / sum[k](P[b,q,k])",
           {"K": K, "Q": Q, "V": V, "s": 8 ** -0.5}, None)


@pytest.mark.parametrize("case", range(4), ids=["mm", "embedding_bag", "pixel_shuffle",
                                                "attention"])
def test_torchdim_examples_schedule_equals_the_statement_form(case):
    expr, order, statements, arrays, ranges = list(_torchdim_cases())[case]
    ours = ef.explain((expr, *order))
    theirs = ef.explain(statements, ranges=ranges, **arrays)
    assert schedule(ours) == schedule(theirs)
    got = expr.order(*order)
    want = ef.ein(statements, ranges=ranges, **arrays)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-6, atol=2e-6)


def test_torchdim_attention_runs_the_online_softmax_kernel(fused_calls):
    K, Q, V = (randn(2, 8, 40, dtype=torch.float32) for _ in range(3))
    got = attention(K, Q, V)
    assert fused_calls == [True]
    a = torch.softmax(torch.einsum("bck,bcq->bkq", K, Q) * 8 ** -0.5, dim=1)
    torch.testing.assert_close(got, torch.cat((torch.einsum("bck,bkq->bcq", V, a), Q), dim=1))
