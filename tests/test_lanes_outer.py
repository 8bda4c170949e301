"""The loop order of a register-blocked nest (plan/blocking.lanes_outer, decided in
plan/lower.nest_order and carried by the schedule's NestOrder): lane tiles outside the
row blocks only where a lane tile has an operand of its own (dist's x[k, j]); a
convolution's windows keep the rows outside; a sum of a few terms (one short reduced
index) is not row-blocked at all.  Either order computes every output element's sum in
the same order, so the values are the oracle's either way."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import backend as c_backend
from einfuse.backends.c import build as c_build
from einfuse.plan.expression_facts import lane_panel
from einfuse.lang import parse
from einfuse.schedule.choose import choose
from oracle import brute_force

needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
rng = np.random.default_rng(11)

DIST = "D[i,j] := (w[k,i] - x[k,j])**2"
CONV = "o[i,j] := img[i+a, j+b] * ker[a,b]"
GAUSS = "h[i,j] := do[i] * b[j] * exp(-sum[d]((x[i,d] - y[j,d])**2))"


def _nest(statement, **arrays):
    kernel = ef.compile(statement, backend="c")
    call = kernel.bind(**arrays)
    schedule = choose(kernel, call)
    return kernel, call, schedule


def _check(statement, kernel, call, schedule, arrays):
    want = brute_force(statement, {n: call.bounds.range_map[n]
                                   for n in call.spec.all_indices}, arrays)
    np.testing.assert_allclose(kernel(**arrays), want, rtol=1e-10, atol=1e-10)
    # the other order, dictated, gives the same bits (each sum in the same order)
    nest = schedule.loops.choice.nest
    flipped = dataclasses.replace(schedule.loops.choice, nest=dataclasses.replace(
        nest, lanes_outer=not nest.lanes_outer))
    other = dataclasses.replace(schedule, loops=dataclasses.replace(schedule.loops,
                                                                    choice=flipped))
    assert flipped.plan().program != schedule.loops.choice.plan().program
    np.testing.assert_array_equal(c_backend.CBackend.run(call, other), kernel(**arrays))


def test_a_lane_panel_is_a_load_that_walks_the_lanes_and_not_the_rows():
    rhs = lambda text: parse(text).rhs    # noqa: E731
    assert lane_panel(rhs(DIST), "j", "i")
    assert not lane_panel(rhs(CONV), "j", "i")
    assert lane_panel(rhs("y[i,j] := sum[k](A[i,k] * B[k,j])"), "j", "i")
    assert not lane_panel(rhs("y[i,j] := sum[k](A[i,j,k] * c[k])"), "j", "i")


@needs_c
def test_a_long_reduction_over_a_lane_panel_puts_the_lane_tiles_outside():
    arrays = {"w": rng.standard_normal((40, 37)), "x": rng.standard_normal((40, 45))}
    kernel, call, schedule = _nest(DIST, **arrays)
    nest = schedule.loops.choice.nest
    assert nest.rows == "i" and nest.lanes_outer
    assert schedule.loops.order[:2] == ("j", "i")
    _check(DIST, kernel, call, schedule, arrays)


@needs_c
def test_a_sum_of_a_few_terms_is_not_row_blocked():
    arrays = {"w": rng.standard_normal((3, 37)), "x": rng.standard_normal((3, 45))}
    kernel, call, schedule = _nest(DIST, **arrays)
    nest = schedule.loops.choice.nest
    assert nest.tiled and nest.rows is None and not nest.lanes_outer
    want = brute_force(DIST, {n: call.bounds.range_map[n]
                              for n in call.spec.all_indices}, arrays)
    np.testing.assert_allclose(kernel(**arrays), want, rtol=1e-12)


@needs_c
def test_a_convolutions_windows_keep_the_rows_outside():
    arrays = {"img": rng.standard_normal((40, 53)), "ker": rng.standard_normal((9, 10))}
    kernel, call, schedule = _nest(CONV, **arrays)
    nest = schedule.loops.choice.nest
    assert nest.rows is not None and not nest.lanes_outer
    assert schedule.loops.order[0] == nest.rows
    _check(CONV, kernel, call, schedule, arrays)


@needs_c
def test_a_gaussian_kernels_few_term_sum_runs_in_lane_tiles():
    n, m = 500, 300     # (smaller outputs are not tiled)
    arrays = {"do": rng.standard_normal(n), "b": rng.standard_normal(m),
              "x": rng.standard_normal((n, 3)), "y": rng.standard_normal((m, 3))}
    kernel, call, schedule = _nest(GAUSS, **arrays)
    nest = schedule.loops.choice.nest
    assert nest.tiled and nest.rows is None
    x, y = arrays["x"], arrays["y"]
    want = arrays["do"][:, None] * arrays["b"][None, :] * np.exp(
        -((x[:, None, :] - y[None, :, :]) ** 2).sum(-1))
    np.testing.assert_allclose(kernel(**arrays), want, rtol=1e-12)
