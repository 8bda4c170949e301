"""ef.einsum against numpy.einsum: every form of the subscripts, on every backend, with
three or more operands contracted pairwise; PyTorch gradients and JAX transformations."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import einfuse as ef
from einfuse.frontends import plan_einsum

rng = np.random.default_rng(0)

CASES = [
    ("ik,kj->ij", [(2, 3), (3, 4)]),
    ("ik,kj", [(2, 3), (3, 4)]),                     # implicit output
    ("ji", [(2, 3)]),                                # implicit output sorts: a transpose
    ("ii->i", [(3, 3)]),                             # diagonal
    ("ii", [(3, 3)]),                                # trace
    ("iji->j", [(2, 3, 2)]),
    ("ij->", [(2, 3)]),
    ("i,i", [(1,), (3,)]),                           # a length-1 axis stretches
    ("...i,...i", [(1, 3), (4, 3)]),                 # '...' broadcasts
    ("...ij,...jk->...ik", [(5, 2, 3), (3, 4)]),
    ("i...->...", [(2, 3, 4)]),
    ("bthr,bThr->bhtT", [(2, 3, 4, 5), (2, 6, 4, 5)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),      # a path of pairwise contractions
    ("i,j,k", [(2,), (3,), (4,)]),
    ("ijk,jkl,li,i->", [(2, 3, 4), (3, 4, 5), (5, 2), (2,)]),
    ("ab,bc,cd,de,ef->af", [(3, 4), (4, 2), (2, 5), (5, 3), (3, 2)]),
    (",", [(), ()]),
    ("i,->i", [(3,), ()]),
]


@pytest.mark.parametrize("subscripts, shapes", CASES, ids=[c[0] for c in CASES])
def test_einsum_matches_numpy(backend, subscripts, shapes):
    operands = [rng.standard_normal(s) for s in shapes]
    got = ef.einsum(subscripts, *operands, backend=backend)
    want = np.einsum(subscripts, *operands)
    assert np.shape(got) == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("subscripts, shapes", CASES[:14], ids=[c[0] for c in CASES[:14]])
@pytest.mark.parametrize("dtype", [np.bool_, np.int32, np.uint8])
def test_integer_and_bool_operands_keep_numpys_result_dtype(subscripts, shapes, dtype):
    # numpy.einsum of bool operands is bool (an or of ands), of int32 int32; where a
    # label is summed, narrow integers widen as a.sum() does (numpy.einsum would wrap)
    operands = [(rng.integers(0, 3, s) > 1).astype(dtype) for s in shapes]
    got = ef.einsum(subscripts, *operands)
    want = np.einsum(subscripts, *operands)
    inputs, _, output = subscripts.partition("->")
    letters = [c for c in inputs if c.isalpha()]
    if "->" not in subscripts:
        output = "".join(c for c in letters if letters.count(c) == 1)
    if dtype != np.bool_ and set(letters) - set(output):
        want = want.astype(np.zeros(0, dtype).sum().dtype)
    assert np.asarray(got).dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("optimize", [False, "greedy", "optimal", True])
def test_every_optimize_setting_gives_the_same_result(optimize):
    operands = [rng.standard_normal(s) for s in [(2, 3), (3, 4), (4, 5), (5, 2)]]
    got = ef.einsum("ij,jk,kl,li->", *operands, optimize=optimize)
    np.testing.assert_allclose(got, np.einsum("ij,jk,kl,li->", *operands), rtol=1e-10)


def test_three_operands_become_pairwise_statements_and_two_one():
    assert plan_einsum("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]).source.count("\n") == 1
    assert "\n" not in plan_einsum("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)], False).source
    assert plan_einsum("ik,kj->ij", [(2, 3), (3, 4)]).source == \
        "out[i, j] := A[i, k] * B[k, j]"


@st.composite
def equations(draw):
    letters = "abcdef"
    count = draw(st.integers(1, 4))
    extents = {c: draw(st.integers(1, 3)) for c in letters}
    terms = [draw(st.lists(st.sampled_from(letters), min_size=0, max_size=3))
             for _ in range(count)]
    used = sorted({c for t in terms for c in t})
    explicit = draw(st.booleans())
    out = draw(st.permutations(used)).copy()[:draw(st.integers(0, len(used)))] \
        if explicit else None
    subscripts = ",".join("".join(t) for t in terms) + \
        ("->" + "".join(out) if out is not None else "")
    shapes = [tuple(extents[c] for c in t) for t in terms]
    return subscripts, shapes


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(equations())
def test_random_equations_match_numpy(case):
    subscripts, shapes = case
    operands = [rng.standard_normal(s) for s in shapes]
    want = np.einsum(subscripts, *operands)
    got = ef.einsum(subscripts, *operands, backend="numpy")
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("subscripts, shapes, message", [
    ("ij,jk", [(2, 3)], "name 2 operand"),
    ("ij,jk->ij", [(2, 3), (4, 5)], "label 'j' has lengths 3 and 4"),
    ("ij->k", [(2, 3)], "output label 'k' is not a label"),
    ("ij->ii", [(2, 3)], "appears twice"),
    ("i1", [(2, 3)], "letters"),
    ("ijk", [(2, 3)], "operand 0 has 2 axes"),
    ("...i->i", [(4, 3)], "must keep '...'"),
])
def test_bad_subscripts_are_einfuse_errors(subscripts, shapes, message):
    with pytest.raises(ef.EinfuseError, match=message):
        ef.einsum(subscripts, *[np.ones(s) for s in shapes])


def test_explain_shows_the_equivalent_statement_first():
    text = str(ef.explain("bthr,bThr->bhtT", shapes=[(2, 16, 4, 8), (2, 16, 4, 8)]))
    first = text.splitlines()[:2]
    assert first[0].startswith("einsum 'bthr,bThr->bhtT' in index notation")
    assert first[1].strip() == "out[b, h, t, T] := A[b, t, h, r] * B[b, T, h, r]"
    assert "the sum over r of A[b, t, h, r] * B[b, T, h, r]" in text


def test_torch_gradients_through_einsum():
    torch = pytest.importorskip("torch")
    A = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    B = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    C = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda A, B, C: ef.einsum("ij,jk,kl->il", A, B, C), (A, B, C))
    torch.autograd.gradcheck(lambda A: ef.einsum("ii->i", A[:3, :3]), (A,))


def test_jax_jit_grad_and_vmap_through_einsum():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    A, B = jnp.asarray(rng.standard_normal((3, 4)), jnp.float32), \
        jnp.asarray(rng.standard_normal((4, 5)), jnp.float32)
    f = jax.jit(lambda A, B: ef.einsum("ik,kj->ij", A, B))
    np.testing.assert_allclose(f(A, B), A @ B, rtol=1e-5, atol=1e-5)
    grad = jax.grad(lambda A: ef.einsum("ik,kj->", A, B))(A)
    np.testing.assert_allclose(grad, np.broadcast_to(B.sum(1), (3, 4)), rtol=1e-5)
    batched = jax.vmap(lambda a: ef.einsum("k,kj->j", a, B))(A)
    np.testing.assert_allclose(batched, A @ B, rtol=1e-5, atol=1e-5)


def test_the_command_line_explains_an_einsum_string(capsys):
    from einfuse.cli import main
    assert main(["explain", "bthr,bThr->bhtT", "--shape", "A=2x3x4x5",
                 "--shape", "B=2x6x4x5"]) == 0
    out = capsys.readouterr().out
    assert "out[b, h, t, T] := A[b, t, h, r] * B[b, T, h, r]" in out and "Loop nest" in out


def test_numpys_sublist_form():
    a, b, c = rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal((3, 3, 4))
    for arguments in [(a, [0, 1], b, [1, 2]), (a, [0, 1], b, [1, 2], [2, 0]), (c, [0, 0, 1]),
                      (c, [Ellipsis, 1], [Ellipsis]), (a, [30, 2]),
                      (a, [0, 1], b, [1, 51], [51, 0])]:
        got, want = ef.einsum(*arguments), np.einsum(*arguments)
        assert np.shape(got) == np.shape(want)
        np.testing.assert_allclose(got, want, rtol=1e-12)
    for bad, message in [((a, [0, "x"]), "holds 'x'"), ((a, [0, 52]), "holds 52"),
                         ((a, "ab"), "not str"), ((a, [0, True]), "holds True"),
                         ((a,), "sublist form")]:
        with pytest.raises(ef.EinfuseError, match=message):
            ef.einsum(*bad)


def test_numpys_out_casting_and_order():
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((3, 4))
    out = np.zeros((2, 4))
    assert ef.einsum("ij,jk->ik", a, b, out=out) is out
    np.testing.assert_allclose(out, a @ b, rtol=1e-12)
    narrow = np.zeros((2, 4), np.float32)
    with pytest.raises(ef.EinfuseError, match="casting='safe'"):
        ef.einsum("ij,jk->ik", a, b, out=narrow)
    ef.einsum("ij,jk->ik", a, b, out=narrow, casting="same_kind")
    np.testing.assert_allclose(narrow, a @ b, rtol=1e-6)
    with pytest.raises(ef.EinfuseError, match="cannot be cast"):
        ef.einsum("ij,jk->ik", a, b, dtype=np.float32)
    assert ef.einsum("ij,jk->ik", a, b, dtype=np.float32, casting="unsafe").dtype == np.float32
    assert ef.einsum("ij,jk->ik", a, b, order="F").flags.f_contiguous
    with pytest.raises(ef.EinfuseError, match="shape"):
        ef.einsum("ij,jk->ik", a, b, out=np.zeros(3))
    with pytest.raises(ef.EinfuseError, match="order"):
        ef.einsum("ij,jk->ik", a, b, order="X")


@pytest.mark.parametrize("subscripts", ["ijk->kji", "iii->i", "...ii->...i", "ii...->...i",
                                        "ijk", "iij->ji", "jii->ij"])
def test_a_pure_view_is_numpys_view(subscripts):
    # one NumPy operand and every label kept: numpy.einsum returns a (writeable) view
    base = np.arange(27.0).reshape(3, 3, 3).copy()
    got = ef.einsum(subscripts, base)
    np.testing.assert_array_equal(got, np.einsum(subscripts, base))
    assert np.shares_memory(got, base) == np.shares_memory(np.einsum(subscripts, base), base)
    summed = ef.einsum(subscripts.replace("...", "k")[:2] + "->", base[..., 0])
    assert not np.shares_memory(summed, base)
