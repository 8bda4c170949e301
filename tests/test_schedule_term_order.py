"""A computation's schedule does not depend on the order its terms are written in
(issue 31: "the same schedule for spellings that are the same computation"): the terms
of a window subscript (``x[c, i+a]`` / ``x[c, a+i]``, ``2*i+p-1`` in any order) and the
factors of a product, permuted by hypothesis, give the schedule the first order gets
(its route, the BLAS way and panel form chosen) and the same values.  A weight
gradient's form and a forward's read the same subscript with the roles swapped, so
term order once decided between them (plan/windowed_panels.panel_form)."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.schedule.choose import choose

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
rng = np.random.default_rng(31)

# (output, first factor with {0}, {1}... for its window subscripts, second factor,
#  the terms of each window subscript, shapes)
CASES = [
    ("y[b,o,i,j]", "x[b,c,{0},{1}]", "w[o,c,p,q]", (("i", "p"), ("j", "q")),
     {"x": (2, 16, 20, 20), "w": (32, 16, 3, 3)}),
    ("y[b,o,i,j]", "x[b,c,{0},{1}]", "w[o,c,p,q]", (("2*i", "p"), ("2*j", "q")),
     {"x": (2, 16, 21, 21), "w": (32, 16, 3, 3)}),
    ("y[b,o,i]", "x[b,c,{0}]", "w[o,c,p]", (("i", "p"),),
     {"x": (2, 64, 700), "w": (64, 64, 3)}),
    ("y[b,o,i]", "x[b,c,{0}]", "w[o,c,p]", (("i", "p"),),
     {"x": (2, 32, 900), "w": (32, 32, 5)}),
    ("y[b,o,i]", "x[b,c,{0}]", "w[o,c,p]", (("2*i", "p"),),
     {"x": (64, 64, 300), "w": (64, 64, 5)}),
    ("y[b,o,i]", "x[b,c,{0}]", "w[o,c,p]", (("i", "2*p"),),
     {"x": (2, 64, 700), "w": (64, 64, 3)}),
    ("dw[o,c,p]", "dy[b,o,i]", "x[b,c,{0}]", (("i", "p"),),
     {"dy": (4, 64, 600), "x": (4, 64, 602)}),
    ("dw[o,c,p,q]", "dy[b,o,i,j]", "x[b,c,{0},{1}]", (("i", "p"), ("j", "q")),
     {"dy": (2, 32, 18, 18), "x": (2, 16, 20, 20)}),
]


def _statement(case, orders, swapped: bool) -> str:
    out, first, second, terms, _ = case
    subscripts = ["+".join(terms[n][k] for k in order) for n, order in enumerate(orders)]
    if "{" in first:
        first = first.format(*subscripts)
    else:
        second = second.format(*subscripts)
    left, right = (second, first) if swapped else (first, second)
    return f"{out} := {left} * {right}"


def _decision(kernel, arrays):
    schedule = choose(kernel, kernel.bind(**arrays))
    blas = schedule.blas
    if blas is None:
        return schedule.route, None, None
    panels = getattr(blas, "panels", None)
    if panels is not None:      # (which operand is windowed: by name, not position)
        panels = (blas.operands[panels.windowed].tensor, replace(panels, windowed=-1))
    return schedule.route, getattr(blas, "method", None), panels


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(range(len(CASES))), st.data())
def test_term_and_factor_order_leave_the_schedule_and_values(number, data):
    case = CASES[number]
    terms = case[3]
    arrays = {name: rng.standard_normal(shape).astype(np.float32)
              for name, shape in case[4].items()}
    written = _statement(case, [tuple(range(len(t))) for t in terms], False)
    orders = [tuple(data.draw(st.permutations(range(len(t))))) for t in terms]
    rewritten = _statement(case, orders, data.draw(st.booleans()))
    kernels = [ef.compile(s, backend="c") for s in (written, rewritten)]
    assert _decision(kernels[0], arrays) == _decision(kernels[1], arrays), \
        (written, rewritten)
    first, second = (k(**arrays) for k in kernels)
    np.testing.assert_allclose(second, first, rtol=2e-5, atol=2e-4)


def test_the_cases_cover_the_panel_form_and_its_absence():
    """The corpus meets both ways of a windowed product (else the test above could not
    see term order decide between them)."""
    panelled = set()
    for case in CASES:
        arrays = {name: np.zeros(shape, np.float32) for name, shape in case[4].items()}
        kernel = ef.compile(_statement(case, [tuple(range(len(t))) for t in case[3]],
                                       False), backend="c")
        panelled.add(_decision(kernel, arrays)[2] is not None)
    assert panelled == {True, False}
