"""Messages for the mistakes users actually make (issue 9, item 16): each says what is
wrong in the user's own terms and what to write instead, and points into the
statement; the command line names its flags where the Python API names keywords."""

import re

import numpy as np
import pytest

import einfuse as ef
from carets import caret_text
from einfuse import errors
from einfuse.cli import main
from einfuse.lang.ast import FUNCTIONS

x5 = np.arange(5.0)


@pytest.mark.parametrize("source, opener", [
    ("C[i,j] := A[i,k * B[k,j]", "A["),          # used to blame 'k * B[k,j]'
    ("y[i] := x[i * w[i]", "x["),
    ("y[i] := x[i, j + 1 * z[j]", "x["),
    ("y[i] := x[i", "x["),
])
def test_a_missing_closing_bracket_is_named(source, opener):
    with pytest.raises(errors.EinfuseSyntaxError) as info:
        ef.compile(source)
    assert f"a ']' is missing: {opener} is never closed" in str(info.value)
    assert caret_text(info.value, source) == opener


@pytest.mark.parametrize("name", ["any", "all", "std", "median"])
def test_reductions_that_are_not_in_the_notation_yet(name):
    source = f"y[i] := {name}[j](x[i,j])"
    with pytest.raises(errors.EinfuseNameError) as info:
        ef.compile(source)
    text = str(info.value)
    assert "not part of the notation yet" in text
    assert "the reductions are sum, prod, max, min, logsumexp, mean, var, argmax and argmin" \
        in text
    assert caret_text(info.value, source) == f"{name}[j]"
    with pytest.raises(errors.EinfuseNameError, match="not part of the notation yet"):
        ef.compile(f"y[i] := {name}(x[i])")


@pytest.mark.parametrize("name", ["mean", "var"])
def test_a_reduction_called_as_a_function_says_how_to_write_it(name):
    with pytest.raises(errors.EinfuseNameError, match=rf"'{name}' is a reduction: write "
                                                      rf"{name}\[k\]\(\.\.\.\)"):
        ef.compile(f"y[i] := {name}(x[i])")


def test_a_planned_reduction_lists_the_reductions():
    with pytest.raises(errors.EinfuseNameError, match=r"median\[j\]\(\.\.\.\) is not part "
                                                      r"of the notation yet; the reductions "
                                                      r"are sum, prod, max, min, logsumexp"):
        ef.compile("m[i] := median[j](X[i,j])")


def test_an_unknown_reduction_suggests_a_known_one():
    with pytest.raises(errors.EinfuseNameError, match=r"'summ' is not one \(did you mean "
                                                      r"sum\?\)"):
        ef.compile("y[i] := summ[j](x[i,j])")


def test_a_bracket_then_a_parenthesis_is_not_unexpected_text():
    source = "y[i] := x[i](z[i] + 1)"
    with pytest.raises(errors.EinfuseSyntaxError, match="a product needs '\\*'") as info:
        ef.compile(source)
    assert caret_text(info.value, source) == "x[i]"


@pytest.mark.parametrize("text, statement, operands", [
    ("ik,kj->ij", "out[i, j] := A[i, k] * B[k, j]", 2),
    ("bij,bjk->bik", "out[b, i, k] := A[b, i, j] * B[b, j, k]", 2),
    ("i,i->", "out := A[i] * B[i]", 2),
    ("ij->ji", "out[j, i] := A[i, j]", 1),
    ("ij,jk", "out[i, k] := A[i, j] * B[j, k]", 2),      # einsum's implicit output
    (" ab , bc -> ac ", "out[a, c] := A[a, b] * B[b, c]", 2),
    ("AB,BC->AC", "out[A, C] := D[A, B] * E[B, C]", 2),      # names the letters leave
])
def test_an_einsum_string_gets_the_equivalent_statement(backend, text, statement,
                                                        operands):
    with pytest.raises(errors.EinfuseSyntaxError) as info:
        ef.ein(text, backend=backend)
    message = str(info.value)
    assert "is einsum syntax" in message and statement in message
    # the statement offered computes what np.einsum computes
    rng = np.random.default_rng(0)
    spec = text.replace(" ", "")
    inputs = [rng.standard_normal([3] * len(part)) for part in
              spec.split("->")[0].split(",")]
    names = re.findall(r"(\w+)\[", statement.split(":=")[1])
    got = ef.ein(statement, **dict(zip(names, inputs)), backend=backend)
    np.testing.assert_allclose(got, np.einsum(spec, *inputs), rtol=1e-12, atol=1e-12)
    assert len(inputs) == operands


def test_einsum_ellipsis_has_no_equivalent_but_is_recognised():
    with pytest.raises(errors.EinfuseSyntaxError, match="einsum syntax.*name every axis"):
        ef.compile("...ij,...jk->...ik")


def test_a_scalar_passed_for_a_subscript_offset(backend):
    source = "y[i] := x[i+n]"
    with pytest.raises(errors.UnexpectedArgumentError) as info:
        ef.ein(source, x=x5, n=2, backend=backend)
    text = str(info.value)
    assert "offsets inside subscripts are integer literals or indices" in text
    assert "ranges={'n': range(2, 3)}" in text
    assert caret_text(info.value, source) == "x[i+n]"
    # the advice works: n becomes an index with the single value 2
    for ranges in ({}, {"i": 3}):
        np.testing.assert_array_equal(
            ef.ein(source, x=x5, ranges={"n": range(2, 3), **ranges}, backend=backend),
            ef.ein("y[i] := x[i+2]", x=x5, ranges=ranges, backend=backend))
    with pytest.raises(errors.UnexpectedArgumentError, match="indices are not passed"):
        ef.ein("r[i] := i", ranges={"i": 3}, i=3, backend=backend)


@pytest.mark.parametrize("name, suggestion", [("foo", None), ("tanhh", "tanh"),
                                              ("sigmoi", "sigmoid")])
def test_an_unknown_function_lists_the_functions(name, suggestion):
    source = f"y[i] := 2 * {name}(x[i])"
    with pytest.raises(errors.EinfuseNameError) as info:
        ef.compile(source)
    text = str(info.value)
    assert "the functions are " + ", ".join(FUNCTIONS) in text
    assert (f"did you mean {suggestion}?" in text) == (suggestion is not None)
    assert caret_text(info.value, source) == name


@pytest.mark.parametrize("source, kwargs, words, marked", [
    ("y[i] := x[idx[i]]", {"idx": np.array([0, 1, 2, 7])},
     ["idx[3] = 7 is outside its valid range 0..4", "axis 0 of x, length 5"], "idx[i]"),
    ("y[i,j] := x[idx[i,j]]", {"idx": np.array([[0, 1], [9, 2]])},
     ["idx[1, 0] = 9 is outside"], "idx[i,j]"),
    ("v[n] := A[r[n], c[n]]", {"A": np.ones((2, 3)), "r": np.array([0, 1]),
                               "c": np.array([2, 3])},
     ["c[1] = 3 is outside its valid range 0..2", "axis 1 of A"], "c[n]"),
    ("y[i] := x[idx[i] + 1]", {"idx": np.array([0, 4])},
     ["reads position 5 at i=1 (idx[1] = 4)"], "idx[i] + 1"),
    ("y[i] := x[p[q[i]]]", {"p": np.array([0, 1, 8]), "q": np.array([0, 2])},
     ["p[2] = 8 is outside"], "p[q[i]]"),
])
def test_an_out_of_bounds_gather_gives_the_position_in_the_index_array(
        backend, source, kwargs, words, marked):
    arrays = dict(kwargs)
    arrays.setdefault("x", x5) if "x[" in source else None
    for bounds in ("check", "promise"):
        with pytest.raises(errors.OutOfBoundsError) as info:
            ef.ein(source, bounds=bounds, backend=backend, **arrays)
        for word in words:
            assert word in str(info.value)
        assert caret_text(info.value, source) == marked
    assert "bounds='promise' was given but the promise does not hold" in str(info.value)


def test_the_cli_names_flags_and_the_api_names_keywords(capsys):
    source = "y[i] := x[i+a-1]*k[a]"
    with pytest.raises(errors.RangeError, match=r"with pad= shifted .* ranges=\{'i'"):
        ef.explain(source, shapes={"x": (10,), "k": (3,)}, pad=0)
    assert main(["explain", source, "--shape", "x=10", "--shape", "k=3", "--pad", "0"]) == 1
    err = capsys.readouterr().err
    assert "with --pad shifted subscripts" in err and "give --range i=N" in err
    assert "ranges=" not in err and "pad=" not in err
    assert main(["explain", source, "--shape", "x=10"]) == 1
    assert "give its shape with --shape k=AxB" in capsys.readouterr().err
    assert main(["explain", "y[i] := x[i]", "--shape", "x=10", "--range", "j=3"]) == 1
    assert "--range names 'j'" in capsys.readouterr().err
    assert main(["explain", "y[i] := x[i]", "--shape", "x=4", "--range", "i=5"]) == 1
    err = capsys.readouterr().err
    assert "(--range)" in err and "give --pad" in err
    assert main(["explain", "y[i] := x[i]"]) == 0
    assert "Note: pass --shape NAME=AxB to see" in capsys.readouterr().out


def test_a_cli_parameter_named_like_an_option(capsys):
    assert main(["explain", "r[i] := i * pad", "--range", "i=3", "--param", "pad=2"]) == 0
    assert main(["explain", "y[i] := x[i] * pad", "--shape", "x=3", "--param",
                 "pad=2"]) == 0
    assert main(["explain", "r[i] := i", "--range", "i=3", "--param", "pad=2"]) == 1
    assert "pad (given by --shape or --param) is not used" in capsys.readouterr().err


# -- the messages docs/notation.md quotes are the ones einfuse prints --------------------

def _docs():
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "notation.md"), encoding="utf-8") as handle:
        return handle.read()


QUOTED = [
    ("C[i,j] := A[i,k] * B[k,j]", {"A": np.ones((3, 50)), "B": np.ones((40, 2))}),
    ("y[i] := a[i] + b[i]", {"a": np.ones(3), "b": np.ones(1)}),
    ("y[i] = x[i + 1] - x[i]", {"x": np.ones(4), "y": np.ones(4)}),
    ("y[i] := x[idx[i]]", {"x": np.ones(5), "idx": np.array([0, 1, 2, 7])}),
    ("C[i,j] = C[j,i] + 1", {"C": np.ones((2, 2))}),
    ("y[i] := sum(x[i])", {}),
    ("y[i] := x[i*j]", {}),
    ("C[i,j] := A[i,k * B[k,j]", {}),
    ("y[i] := median[j](X[i,j])", {}),
    ("ik,kj->ij", {}),
    ("y[i] := x[i] + 99999999999999999999", {}),
]


@pytest.mark.parametrize("source, arrays", QUOTED, ids=[q[0] for q in QUOTED])
def test_the_messages_quoted_in_the_docs_are_current(source, arrays):
    with pytest.raises(ef.EinfuseError) as info:
        ef.ein(source, backend="numpy", **arrays)
    quoted = f"{type(info.value).__name__}: {info.value}"
    assert quoted in _docs(), f"docs/notation.md does not quote:\n{quoted}"
