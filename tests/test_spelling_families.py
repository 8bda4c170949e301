"""A corpus of equivalent spellings (issue 31, v3.md section 1; the families of
src/einfuse/bench/spellings.py): every spelling of a family gives the family's values on
every backend; the spellings that are the same computation have the same normal form
(rewrite/canonical.py: inlined, rules applied, printed); and where the C backend has a
fast path for the best spelling (the softmax row kernel, online-softmax attention),
every other spelling of that computation reaches it."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.analysis.spec import spec_of
from einfuse.backends.c import rows as c_rows
from einfuse.bench.spellings import attention_family, layernorm_family, softmax_family
from einfuse.lang.split import split_program
from einfuse.rewrite.canonical import normal_form


def normal(text: str):
    specs = [spec_of(piece.text) for piece in split_program(text)]
    return normal_form([(s.statement, s.rhs) for s in specs], (specs[-1].output,))


def values(family, backend, seed=0):
    arrays = family.inputs(np.random.default_rng(seed))
    results = []
    for name, text in family.spellings:
        given = {k: v.astype(np.float64) for k, v in arrays.items() if f"{k}[" in text}
        results.append((name, np.asarray(ef.ein(text, **given, backend=backend))))
    return results


@pytest.mark.parametrize("make", [lambda: softmax_family(6, 9), lambda: layernorm_family(5, 8),
                                  lambda: attention_family(1, 2, 7, 4)],
                         ids=["softmax", "layernorm", "attention"])
def test_every_spelling_gives_the_familys_values(backend, make):
    family = make()
    results = values(family, backend)
    reference = results[0][1]
    for name, got in results[1:]:
        np.testing.assert_allclose(got, reference, rtol=1e-10, atol=1e-12, err_msg=name)


def test_special_rows_agree_where_the_rules_are_exact(backend):
    # -inf entries (a masked score), a NaN row: every softmax spelling agrees
    family = softmax_family(4, 5)
    X = np.random.default_rng(1).standard_normal((4, 5))
    X[0, 1], X[1, :], X[2, 3] = -np.inf, -np.inf, np.nan
    results = [np.asarray(ef.ein(text, X=X, backend=backend)) for _, text in family.spellings]
    for got in results[1:]:
        np.testing.assert_allclose(got, results[0], rtol=1e-12, equal_nan=True)


# spellings (by name) that are the same computation: the same normal form
SAME = {
    "softmax": (softmax_family, [("three statements", "one statement",
                                  "exp(x - logsumexp(x))")]),
    "layernorm": (layernorm_family, [("mean/var sugar", "mean then centred mean")]),
    "attention": (attention_family, [
        ("mask on the scores", "scale inside the dot", "exp(S - logsumexp(S))",
         "weights normalised first"),
        # the max of the unmasked scores: another shift (it cancels in the ratio)
        ("mask on the weights", "weights times the mask")]),
}


@pytest.mark.parametrize("family", sorted(SAME))
def test_same_computation_same_normal_form(family):
    make, groups = SAME[family]
    texts = dict(make().spellings)
    forms = {name: normal(text) for name, text in texts.items()}
    assert all(form is not None for form in forms.values())
    for group in groups:
        assert len({forms[name] for name in group}) == 1, group
    for first, second in zip(groups, groups[1:]):
        assert forms[first[0]] != forms[second[0]]


def test_the_explicit_layernorm_differs_only_by_its_count():
    # the written divisor 8 is a number; mean's count is a reduction of the shapes
    texts = dict(layernorm_family(5, 8).spellings)
    explicit, sugar = normal(texts["explicit sums"]), normal(texts["mean/var sugar"])
    assert explicit != sugar
    assert explicit == sugar.replace("sum[#2](where(X[@0, #2] == X[@0, #2], 1, 1))", "8") \
        .replace("sum[#5](where(X[@0, #5] == X[@0, #5], 1, 1))", "8") \
        .replace("sum[#6](where(X[@0, #6] == X[@0, #6], 1, 1))", "8") \
        .replace("#3", "#2").replace("#4", "#3")


def test_every_softmax_spelling_runs_the_row_kernel(row_patterns):
    family = softmax_family(63, 1000)
    X = family.inputs(np.random.default_rng(2))["X"]
    for name, text in family.spellings:
        row_patterns.clear()
        ef.compile(text)(X=X)
        assert row_patterns == [c_rows.RowPattern.SOFTMAX], name


def test_every_attention_spelling_runs_online_softmax():
    family = attention_family(1, 2, 16, 8)
    arrays = family.inputs(np.random.default_rng(3))
    for name, text in family.spellings:
        program = ef.compile(text)
        assert program.attention is not None, name
        assert program.attention.mask.value == "j <= i", name
        explained = str(ef.explain(text, **arrays))
        assert "online softmax" in explained.lower() or "attention" in explained.lower()
