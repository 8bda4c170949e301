"""``ef.explain`` of an einops pattern (programs.md section 3): the call it is, the
statement it runs, then that statement's explanation.  The statement shown is checked by
running it: on the input split into its elementary axes it gives what ef.rearrange,
ef.reduce or ef.repeat gives."""

import re

import numpy as np
import pytest

import einfuse as ef

X = np.random.default_rng(0).standard_normal((2, 6, 4, 3)).astype(np.float32)


@pytest.mark.parametrize("pattern, sizes, call", [
    ("b (h h2) w c -> b c h w h2", {"h2": 2},
     lambda x: ef.rearrange(x, "b (h h2) w c -> b c h w h2", h2=2)),
    ("b h w c -> c (b h w)", {}, lambda x: ef.rearrange(x, "b h w c -> c (b h w)")),
    ("b h w c -> b c", {"reduction": "mean"},
     lambda x: ef.reduce(x, "b h w c -> b c", "mean")),
    ("b (h 2) w c -> b h c", {"reduction": "max"},
     lambda x: ef.reduce(x, "b (h 2) w c -> b h c", "max")),
    ("... c -> c ...", {}, lambda x: ef.rearrange(x, "... c -> c ...")),
    ("b h w c -> b h w c r", {"r": 3},
     lambda x: ef.repeat(x, "b h w c -> b h w c r", r=3)),
])
def test_the_statement_shown_is_what_runs(pattern, sizes, call):
    explained = ef.explain(pattern, X, **sizes)
    plan = explained.plan
    got = ef.ein(plan.statement, X=X.reshape(plan.inner_shape),
                 ranges=dict(plan.ranges) or None).reshape(plan.output_shape)
    np.testing.assert_allclose(got, call(X), rtol=1e-6)
    text = str(explained)
    assert plan.statement in text and "What it computes" in text
    # each index of the statement is named by the pattern's axis it stands for
    assert all(f"{index} is {axis}" in text for index, axis in plan.axes)


@pytest.mark.parametrize("shapes", [(2, 6, 4, 3), [(2, 6, 4, 3)], {"x": (2, 6, 4, 3)}])
def test_shapes_alone(shapes):
    explained = ef.explain("b h w c -> b c", shapes=shapes, reduction="sum")
    assert explained.plan.inner_shape == (2, 6, 4, 3)
    assert explained.inner.flops == 2 * 3 * 6 * 4     # (one addition a term)


def test_a_reshape_alone_runs_no_kernel():
    explained = ef.explain("b h w c -> b (h w) c", X)
    assert explained.inner is None and explained.plan.output_shape == (2, 24, 3)
    assert "no kernel runs" in str(explained)


def test_integer_sums_are_explained_as_they_run():
    counts = np.arange(24, dtype=np.uint8).reshape(4, 6)
    explained = ef.explain("a b -> a", counts, reduction="sum")
    assert explained.inner.result_dtype == ef.reduce(counts, "a b -> a", "sum").dtype


@pytest.mark.parametrize("args, kwargs, message", [
    ((X,), {}, "pass reduction="),
    ((X,), {"reduction": len}, "callable"),
    ((X,), {"reduction": "median"}, "reduction is one of"),
    ((X, X), {"reduction": "sum"}, "one input"),
    ((), {"reduction": "sum"}, "needs its input or shapes="),
    ((), {"reduction": "sum", "shapes": (2, "a", 4, 3)}, "tuple of sizes"),
    ((np.ones((2, 3)),), {"reduction": "sum"}, "names 4 axes but the input has 2"),
])
def test_errors_name_the_problem(args, kwargs, message):
    with pytest.raises(ef.EinfuseError, match=re.escape(message)):
        ef.explain("b h w c -> b c", *args, **kwargs)


def test_a_reduction_for_a_pattern_that_drops_nothing_is_refused():
    with pytest.raises(ef.EinfuseError, match="drops none"):
        ef.explain("b h w c -> c b h w", X, reduction="sum")


def test_pseudo_code_never_shows_an_accumulator_named_like_an_index():
    # the statement's indices are a0, a1 (as einops' statements name them): the
    # accumulator is shown primed, not as a second a0
    explained = ef.explain("Y[a0] := sum[a1](X[a0, a1])", X=np.ones((64, 300)))
    lines = explained.compiled_loop_nest
    declared = [line.split("=")[0].strip() for line in lines
                if line.strip().endswith("= 0") or "= 0 " in line]
    assert declared and all(name not in ("a0", "a1", "X", "Y") for name in declared)


def test_a_unit_axis_dropped_is_a_rearrange_not_a_reduction():
    # '1' is no axis of the pattern (as ef.rearrange reads it): nothing is reduced
    x = np.arange(12.0).reshape(3, 1, 4)
    explained = ef.explain("h 1 w -> h w", x)
    assert explained.kind == "rearrange" and explained.plan.output_shape == (3, 4)
