"""Edge cases of the public API found in review: each once crashed or misled."""


import numpy as np
import pytest

import einfuse as ef
from einfuse.errors import EinfuseNameError, EinfuseSyntaxError


@pytest.mark.parametrize("statement", [5, None, ["y[i] := x[i]"]])
def test_non_string_statement(statement):
    with pytest.raises(EinfuseSyntaxError, match="must be a string") as info:
        ef.compile(statement)
    assert "must be a string" in str(info.value)


def test_pad_applies_to_plain_subscripts_too():
    np.testing.assert_array_equal(
        ef.ein("y[i] = x[i]", x=np.ones(3), y=np.zeros(4), pad=0), [1, 1, 1, 0])
    np.testing.assert_array_equal(
        ef.ein("y[i] := x[i]", x=np.ones(3), ranges={"i": range(-1, 5)}, pad=7),
        [7, 1, 1, 1, 7, 7])
    with pytest.raises(ef.EinfuseError, match=r"x\[i\]"):
        ef.ein("y[i] = x[i]", x=np.ones(3), y=np.zeros(4))


def test_implicit_sum_hint_keeps_signs():
    with pytest.warns(ef.EinfuseWarning, match=r"sum\[i\]\(x\[b, i\] \* W\[i, o\]\) - bias"):
        ef.compile("y[b,o] := x[b,i]*W[i,o] - bias[o]")


def test_multiline_statement_caret_sits_on_its_line():
    with pytest.raises(EinfuseSyntaxError) as info:
        ef.compile("y[i] :=\n    x[i] $ 1")
    lines = str(info.value).split("\n")
    assert lines[1] == "        x[i] $ 1"
    assert lines[2].index("^") == lines[1].index("$")


@pytest.mark.parametrize("statement", ["y[i] := pi[i]", "y[i] := inf(x[i])"])
def test_constants_are_reserved(statement):
    with pytest.raises(EinfuseNameError, match="reserved constant"):
        ef.compile(statement)


def test_deep_nesting_is_an_error_not_a_crash():
    with pytest.raises(EinfuseSyntaxError, match="nests too deeply"):
        ef.compile("y := " + "(" * 5000 + "x[i]" + ")" * 5000)


def test_range_error_explains_missing_plain_use_with_pad():
    with pytest.raises(ef.EinfuseError, match="with pad= shifted subscripts do not limit"):
        ef.ein("y[i] := x[i + a - 1] * k[a]", x=np.ones(3), k=np.ones(2), pad=0)


def test_warning_is_repeated_for_each_compile():
    for _ in range(2):
        with pytest.warns(ef.EinfuseWarning):
            ef.compile("y[b,o] := x[b,i]*W[i,o] + bias[o]")


@pytest.mark.parametrize("backend", ["numpy", "c"])
def test_signed_zero_pad_and_fill_are_not_one_cache_entry(backend):
    # 0.0 == -0.0, so caches keyed by options gave the second call the first's kernel
    x, w = np.arange(1.0, 6.0), np.ones(5)
    idx = np.array([0, 9])
    for first, second in ((0.0, -0.0), (-0.0, 0.0)):
        for value in (first, second):
            y = ef.ein("y[i] := w[i] / x[i+1]", x=x, w=w, pad=value,
                       ranges={"i": range(5)}, backend=backend)
            assert y[-1] == np.inf * np.copysign(1.0, value)
            z = ef.ein("z[b] := 1 / x[idx[b]]", x=x, idx=idx, bounds="fill", fill=value,
                       backend=backend)
            assert z[-1] == np.inf * np.copysign(1.0, value)
