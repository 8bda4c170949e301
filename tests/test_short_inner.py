"""An elementwise nest's innermost loop (plan/lower.nest_order): not an index of a few
elements (the store's and the loop invariants' votes for it assume a long loop) where a
long index is walked by a load -- the lanes then have work.  The values are the same in
either order (each element is computed alone)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import backend as c_backend
from einfuse.backends.c import build as c_build
from einfuse.schedule.choose import choose

needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
rng = np.random.default_rng(5)


def _run_both_orders(statement, arrays, ranges):
    kernel = ef.compile(statement, backend="c", ranges=ranges)
    call = kernel.bind(**arrays)
    schedule = choose(kernel, call)
    nest = schedule.loops.choice.nest
    got = kernel(**arrays)
    # the order the votes alone gave (the short index innermost), dictated
    short = [n for n in nest.order if n in ranges][-1]
    voted = tuple(n for n in nest.order if n != short) + (short,)
    other = dataclasses.replace(schedule.loops.choice,
                                nest=dataclasses.replace(nest, order=voted))
    forced = dataclasses.replace(schedule, loops=dataclasses.replace(schedule.loops,
                                                                     choice=other))
    np.testing.assert_array_equal(c_backend.CBackend.run(call, forced), got)
    return nest, got


@needs_c
def test_a_one_hot_spread_over_a_short_axis_walks_the_long_one_innermost():
    x = rng.standard_normal((5, 300))
    h = rng.integers(0, 4, (5, 300)).astype(np.float64)
    nest, got = _run_both_orders("y[c,i,a] := x[c,i] * (a == h[c,i])", {"x": x, "h": h},
                                 {"a": range(4)})
    assert nest.order[-1] == "i"
    want = x[:, :, None] * (np.arange(4)[None, None, :] == h[:, :, None])
    np.testing.assert_array_equal(got, want)


@needs_c
def test_a_max_pool_gradients_spread_walks_the_pooled_columns_innermost():
    # the where(..) of max-pool's gradient (autodiff of max[a,b] over 2x2 windows)
    h2 = rng.integers(0, 2, (3, 6, 40)).astype(np.float32)
    h3 = rng.integers(0, 2, (3, 6, 40, 2)).astype(np.float32)
    do = rng.standard_normal((3, 6, 40)).astype(np.float32)
    statement = ("dx[c, i, j, a, b] := where((a == h2[c, i, j]) & (b == h3[c, i, j, a]), "
                 "do[c, i, j], 0)")
    nest, got = _run_both_orders(statement, {"h2": h2, "h3": h3, "do": do},
                                 {"a": range(2), "b": range(2)})
    assert nest.order[-1] == "j"
    a = np.arange(2)[None, None, None, :, None]
    b = np.arange(2)[None, None, None, None, :]
    want = np.where((a == h2[..., None, None]) & (b == h3[..., :, None]),
                    do[..., None, None], 0).astype(np.float32)
    np.testing.assert_array_equal(got, want)


@needs_c
def test_a_short_axis_no_long_load_walks_stays_innermost():
    # x[i, a] walks i at a stride of 3: nothing to gain, the votes' order stays
    x = rng.standard_normal((400, 3))
    w = rng.standard_normal(3)
    kernel = ef.compile("y[i,a] := x[i,a] * w[a]", backend="c")
    call = kernel.bind(x=x, w=w)
    assert choose(kernel, call).loops.choice.nest.order[-1] == "a"
    np.testing.assert_array_equal(kernel(x=x, w=w), x * w)
