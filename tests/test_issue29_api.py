"""Issue 29, items 6, 7, 8 and 13: einsum dots that are no ellipsis, unknown keywords
anywhere in the API (named, with a "did you mean"), einops patterns einops refuses (einops
itself the oracle), and a scatter written on the left."""

import re
import warnings

import numpy as np
import pytest

import einfuse as ef
from einfuse.errors import EinfuseSyntaxError, UnexpectedArgumentError

rng = np.random.default_rng(29)


def frameworks():
    yield "numpy", lambda a: a
    try:
        import torch
        yield "torch", lambda a: torch.from_numpy(np.ascontiguousarray(a))
    except ImportError:
        pass
    try:
        import jax.numpy as jnp
        yield "jax", jnp.asarray
    except ImportError:
        pass


FRAMEWORKS = list(frameworks())


# ------------------------------------------------------------------ 6: einsum's dots

@pytest.mark.parametrize("subscripts, shape", [
    (". ..", (2,)), (".. .", (2,)), ("..", (2,)), ("i.j", (2, 3)), ("....", (2,)),
    ("......->", (2,)), ("i. ..->i", (2, 3)), ("ij - > ji", (2, 3)), ("i>j", (2, 3)),
])
@pytest.mark.parametrize("framework", FRAMEWORKS, ids=[f[0] for f in FRAMEWORKS])
def test_dots_that_are_not_an_ellipsis_are_refused(subscripts, shape, framework):
    with pytest.raises(ValueError):            # numpy's own verdict, as the oracle
        np.einsum(subscripts, np.ones(shape))
    with pytest.raises(EinfuseSyntaxError):
        ef.einsum(subscripts, framework[1](np.ones(shape)))


@pytest.mark.parametrize("subscripts, shape", [
    ("i j", (2, 3)), ("... i", (4, 2, 3)), ("ij-> ji", (2, 3)), ("i ... j -> j ... i", (2, 4, 3)),
])
@pytest.mark.parametrize("framework", FRAMEWORKS, ids=[f[0] for f in FRAMEWORKS])
def test_spaced_subscripts_numpy_takes_still_work(subscripts, shape, framework):
    x = rng.standard_normal(shape)
    got = ef.einsum(subscripts, framework[1](x))
    np.testing.assert_allclose(np.asarray(got), np.einsum(subscripts, x))


# ------------------------------------------------------------------ 7: unknown keywords

A, B = rng.standard_normal((2, 3)), rng.standard_normal((3, 4))
STATEMENT = "C[i,k] := A[i,j] * B[j,k]"
PROGRAM = "T[i,k] := A[i,j] * B[j,k]\nC[i] := sum[k](T[i,k])"


@pytest.mark.parametrize("keyword", ["bad_arg", "optimise", "dtyp"])
@pytest.mark.parametrize("call", [
    lambda kw: ef.einsum("ij,jk->ik", A, B, **kw),
    lambda kw: ef.einsum("ij->ji", A, **kw),                   # numpy's view path
    lambda kw: ef.einsum("ij->", A, **kw),
    lambda kw: ef.ein(STATEMENT, A=A, B=B, **kw),
    lambda kw: ef.ein(PROGRAM, A=A, B=B, **kw),
    lambda kw: ef.compile(STATEMENT, **kw),
    lambda kw: ef.compile(PROGRAM, **kw),
    lambda kw: ef.compile(STATEMENT)(A=A, B=B, **kw),
    lambda kw: ef.explain(STATEMENT, A=A, B=B, **kw),
    lambda kw: ef.explain(STATEMENT, **kw),
    lambda kw: ef.explain("ij,jk->ik", A, B, **kw),
    lambda kw: ef.rearrange(A, "a b -> b a", **kw),
    lambda kw: ef.rearrange(A, "a b -> a b", **kw),            # a reshape alone
    lambda kw: ef.reduce(A, "a b -> a", "sum", **kw),
    lambda kw: ef.repeat(A, "a b -> a b c", c=2, **kw),
    lambda kw: ef.derive(STATEMENT, "A", **kw),
    lambda kw: ef.derive(STATEMENT, "A", options=kw),
    lambda kw: ef.jit(lambda x: x, **kw),
], ids=["einsum", "einsum-view", "einsum-sum", "ein", "ein-program", "compile",
        "compile-program", "kernel", "explain", "explain-no-arrays", "explain-einsum",
        "rearrange", "rearrange-reshape", "reduce", "repeat", "derive", "derive-options",
        "jit"])
def test_an_unknown_keyword_is_an_error_naming_it(call, keyword):
    with pytest.raises(UnexpectedArgumentError) as info:   # (a TypeError too, as numpy's)
        call({keyword: 0})
    assert isinstance(info.value, TypeError)
    assert f"{keyword}=" in str(info.value).splitlines()[0]


@pytest.mark.parametrize("call, suggestion", [
    (lambda: ef.einsum("ij,jk->ik", A, B, optimise=False), "optimize"),
    (lambda: ef.einsum("ij,jk->ik", A, B, dtyp="float32"), "dtype"),
    (lambda: ef.ein(STATEMENT, A=A, B=B, dtyp="float32"), "dtype"),
    (lambda: ef.ein(STATEMENT, A=A, B=B, bakend="c"), "backend"),
    (lambda: ef.ein("C[i,k] := A[i,j] * Bb[j,k]", A=A, B=B), "Bb"),
    (lambda: ef.ein(PROGRAM.replace("B[", "Bb["), A=A, B=B), "Bb"),
    (lambda: ef.compile(PROGRAM.replace("B[", "Bb["))(A=A, B=B), "Bb"),
    (lambda: ef.compile("C[i,k] := A[i,j] * Bb[j,k]")(A=A, B=B), "Bb"),
    (lambda: ef.compile(STATEMENT, rangse={"i": 2}), "ranges"),
    (lambda: ef.explain(STATEMENT, A=A, B=B, gradient=True), "gradients"),
    (lambda: ef.explain(STATEMENT, shape={"A": (2, 3), "B": (3, 4)}), "shapes"),
    (lambda: ef.explain("ij,jk->ik", A, B, shape=[(2, 3), (3, 4)]), "shapes"),
    (lambda: ef.rearrange(A, "a b -> b a", backed="numpy"), "backend"),
    (lambda: ef.reduce(A, "(h h2) w -> h w", "sum", h22=2), "h2"),
    (lambda: ef.derive(STATEMENT, "A", output_grad=None), "output_grad_name"),
    (lambda: ef.derive(STATEMENT, "A", options={"pads": 0}), "pad"),
    (lambda: ef.jit(lambda x: x, static_argnum=0), "static_argnums"),
])
def test_a_misspelt_keyword_gets_a_did_you_mean(call, suggestion):
    with pytest.raises(UnexpectedArgumentError, match=re.escape(f"did you mean "
                                                                 f"{suggestion}=?")):
        call()


def test_explain_of_an_einsum_string_takes_its_optimize():
    C = rng.standard_normal((4, 5))
    text = str(ef.explain("ij,jk,kl->il", A, B, C, optimize=False))
    assert "out[i, l] := A[i, j] * B[j, k] * C[k, l]" in text


def test_the_keywords_that_exist_still_work():
    np.testing.assert_allclose(ef.einsum("ij,jk->ik", A, B, optimize=False, backend="numpy",
                                         dtype="float64"), A @ B)
    np.testing.assert_allclose(ef.ein(STATEMENT, A=A, B=B, backend="numpy"), A @ B)
    np.testing.assert_allclose(ef.ein(PROGRAM, A=A, B=B), (A @ B).sum(1))
    np.testing.assert_allclose(ef.rearrange(A, "a b -> b a", backend="numpy"), A.T)
    assert ef.derive(STATEMENT, "A", options={"pad": 0})


# ------------------------------------------------------------------ 8: einops' own rules

PATTERNS = [
    "_a b -> b _a", "a_ b -> b a_", "_ b -> b _", "a__b b -> b a__b", "a b_c -> b_c a",
    "...pre b -> b ...pre", "pre... b -> b pre...", "a ...b -> ...b a", "... b -> b ...",
    "a... -> a...", "a ... -> ... a", "(...) -> (...)", "a .. b -> a b", ". a b -> a b",
    "a\tb -> b a", "a,b -> b a", "1a b -> b 1a", "a1 b -> b a1", "a b -> (a b)",
    "é b -> b é", "a b -> b a ()", "(a) b -> b a", "a b -> b (a 1)", "a b->b a",
    "a b -> b a...", "a b -> (b a ...)", "(a b) -> a b", "a b -> a", "a 3 -> 3 a",
]


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("kind", ["rearrange", "reduce", "repeat"])
def test_einops_patterns_follow_einops(pattern, kind):
    einops = pytest.importorskip("einops")
    x = np.arange(6.0).reshape(2, 3)
    args = (x, pattern, "sum") if kind == "reduce" else (x, pattern)
    sizes = {"a": 2} if pattern == "(a b) -> a b" else {}
    if pattern == "(a b) -> a b":
        x = np.arange(6.0)
        args = (x,) + args[1:]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # (einops warns of some names)
            want = getattr(einops, kind)(*args, **sizes)
    except einops.EinopsError:
        want = None
    if want is None:
        with pytest.raises(ef.EinfuseError):
            getattr(ef, kind)(*args, **sizes)
    else:
        got = getattr(ef, kind)(*args, **sizes)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want)


@pytest.mark.parametrize("pattern, offender", [
    ("_a b -> b _a", "_a"), ("a_ b -> b a_", "a_"), ("...pre b -> b ...pre", "...pre"),
    ("pre... b -> b pre...", "pre..."),
])
def test_the_refusal_names_the_offender(pattern, offender):
    with pytest.raises(EinfuseSyntaxError) as info:
        ef.rearrange(np.ones((2, 3)), pattern)
    assert offender in str(info.value).splitlines()[0]


# ------------------------------------------------------------------ 13: scatters on the left

SEG = np.array([0, 2, 1, 2, 0, 2])
V = rng.standard_normal((6, 3))


def segment_sum(seg, v, count):
    out = np.zeros((count,) + v.shape[1:])
    np.add.at(out, seg, v)
    return out


@pytest.mark.parametrize("statement, assign", [
    ("S[seg[n], d] += v[n, d]", "+="),
    ("S[seg[n], d] = v[n, d]", "="),
    ("S[seg[n], d] := v[n, d] * 1.0", ":="),
])
def test_a_scatter_on_the_left_is_refused_with_a_statement_that_does_it(backend, statement,
                                                                           assign):
    with pytest.raises(EinfuseSyntaxError) as info:
        ef.compile(statement)
    message = str(info.value).splitlines()[0]
    assert "scatter" in message and "one-hot" in message
    assert "ef.jit" in message and "segment_sum" in message
    assert "expected ']'" not in message
    # the statement the message proposes computes the segment sum
    proposed = re.search(r"`([^`]*)`", message).group(1)
    want = segment_sum(SEG, V, 3)
    if assign == ":=":
        got = ef.ein(proposed, seg=SEG, v=V, ranges={"s": 3}, backend=backend)
    else:
        S = np.zeros((3, 3))
        got = ef.ein(proposed, S=S, seg=SEG, v=V, backend=backend)
    np.testing.assert_allclose(got, want)


def test_a_scatter_in_a_program_or_a_broken_statement_is_still_named():
    for text in ["t[i] := x[i]\nS[seg[n]] += t[n]", "S[seg[n], d] += v[n, d", "S[seg["]:
        with pytest.raises(EinfuseSyntaxError, match="scatter"):
            ef.compile(text)


def test_jit_segment_sum_is_the_other_way():
    jax = pytest.importorskip("jax")
    f = ef.jit(lambda v, seg: jax.ops.segment_sum(v, seg, num_segments=3))
    np.testing.assert_allclose(np.asarray(f(jax.numpy.asarray(V), jax.numpy.asarray(SEG))),
                               segment_sum(SEG, V, 3), rtol=1e-6)
