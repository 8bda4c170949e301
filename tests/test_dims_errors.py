"""Misuse of named dimensions: each an EinfuseError of the fitting class that names the
dimension and the Python line that built the expression (this file's line)."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.errors import (EinfuseNameError, EinfuseTypeError, IndexRuleError,
                            OutOfBoundsError, RangeError, ShapeError, UnexpectedArgumentError)

w, x = np.ones((3, 5)), np.ones((4, 4))
HERE = "test_dims_errors.py:"


def raised(cls, f, *fragments):
    with pytest.raises(cls) as caught:
        f()
    text = str(caught.value)
    for fragment in (HERE,) + fragments:
        assert fragment in text, text
    return text


def test_a_dimension_bound_to_two_sizes():
    i, j, k = ef.dims("i j k")
    a = ef.wrap(w)[k, i]
    text = raised(ShapeError, lambda: a - ef.wrap(x)[k, j], "dimension k", "3", "4",
                  "a = ef.wrap(w)[k, i]")
    assert "a - ef.wrap(x)[k, j]" in text        # both lines: where each size came from
    raised(ShapeError, lambda: ef.wrap(w)[i, i], "dimension i")
    k.size = 4
    raised(ShapeError, lambda: ef.wrap(w)[k, i], "k.size = 4", "k.size = 4", "3")


def test_order_omits_repeats_or_names_an_absent_dimension():
    i, j, k = ef.dims("i j k")
    e = ef.wrap(w)[k, i]
    raised(IndexRuleError, lambda: e.order(k), "omits dimension i")
    raised(IndexRuleError, lambda: e.order(k, k, i), "dimension k twice")
    raised(IndexRuleError, lambda: e.order(k, i, j), "dimension j")
    raised(IndexRuleError, lambda: np.asarray(e), "order(k, i)")


def test_indexed_with_too_few_or_too_many_dimensions():
    i, j, k = ef.dims("i j k")
    raised(IndexRuleError, lambda: ef.wrap(w)[k], "too few", "[k]")
    raised(IndexRuleError, lambda: ef.wrap(w)[k, i, j], "too many", "[k, i, j]")
    raised(IndexRuleError, lambda: ef.wrap(w)[k, 1:3], "full slices")
    raised(OutOfBoundsError, lambda: ef.wrap(w)[k, 7], "position 7")


def test_two_dimension_objects_with_one_name():
    i, k = ef.dims("i k")
    other_k = ef.Dim("k")
    raised(EinfuseNameError, lambda: ef.wrap(w)[k, i] * ef.wrap(x)[other_k, i], "'k'")
    raised(EinfuseNameError, lambda: ef.dims("a a"), "a twice")
    raised(EinfuseNameError, lambda: ef.Dim("_hidden"), "_hidden")


def test_reducing_a_dimension_not_present():
    i, j, k = ef.dims("i j k")
    e = ef.wrap(w)[k, i].sum(k)
    raised(IndexRuleError, lambda: e.sum(j), ".sum(j)", "dimension j")
    raised(IndexRuleError, lambda: e.max(k), "dimension k", "reduced already")
    raised(IndexRuleError, lambda: ef.wrap(w)[k, i].softmax(), ".softmax()")


def test_mixing_frameworks_and_unnamed_arrays():
    torch = pytest.importorskip("torch")
    i, k = ef.dims("i k")
    raised(EinfuseTypeError, lambda: ef.wrap(w)[k, i] * torch.ones(5)[i], "numpy", "torch")
    raised(EinfuseTypeError, lambda: ef.wrap(w)[k, i] * x, "index it with dimensions")
    raised(EinfuseTypeError, lambda: torch.ones(3, 5) * ef.wrap(w)[k, i], "index it")
    raised(EinfuseTypeError, lambda: torch.nn.functional.dropout(
        torch.ones(3)[k]), "dropout", ".order(")
    raised(EinfuseTypeError, lambda: bool(ef.wrap(w)[k, i] > 0), "truth value")


def test_errors_at_materialisation_point_at_the_expression():
    i, j = ef.dims("i j")
    e = ef.where(i < j, 1.0, 0.0)            # no array gives i or j a size
    raised(RangeError, lambda: e.order(i, j), "index i", "dim.size",
           "e = ef.where(i < j, 1.0, 0.0)")
    b = ef.dims("b")
    idx = np.array([0, 9])
    raised(OutOfBoundsError, lambda: ef.wrap(x)[ef.wrap(idx)[b], 0].order(b), "9")
    raised(UnexpectedArgumentError, lambda: ef.wrap(x)[i, j].order(i, j, ranges={"i": 2}),
           "ranges=", "dim.size")


def test_split_axes_need_sizes_that_divide():
    c, h2, h = ef.dims("c h2 h")
    img = np.ones((6, 3))
    raised(RangeError, lambda: ef.wrap(img)[(c, h2), h], "h2.size")
    h2.size = 4
    raised(ShapeError, lambda: ef.wrap(img)[(c, h2), h], "not a multiple of 4")


def test_an_expression_too_deep_to_compile_is_named_not_a_recursion_error():
    """A thousand operations deep, the program's writer ran out of Python's stack: a raw
    RecursionError.  Now the error names the depth and the line that asked."""
    i = ef.dims(1)
    x = ef.wrap(np.ones(3))[i]
    expression = x
    for _ in range(1000):
        expression = expression + 1.0
    with pytest.raises(ef.EinfuseError, match="nests too deeply") as caught:
        expression.order(i)
    assert "test_dims_errors.py" in str(caught.value)
    assert np.asarray(x.order(i)).tolist() == [1.0, 1.0, 1.0]     # and nothing is broken
