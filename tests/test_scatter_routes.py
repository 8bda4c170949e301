"""The compiled scatter kernels' routes are decided by schedule/scatter_kernels.py from
the data's facts, and the kernels run what it decided: the decision for each fact, that
the decided kernel is the one that runs, and values against np.add.at / NumPy adds on
both routes (compiled and the NumPy fallback)."""

import numpy as np
import pytest

from einfuse.backends.c import build as c_build, scatter as c_scatter, strided_add as c_strided
from einfuse.schedule import scatter_kernels
from einfuse.schedule.scatter_kernels import (CAPABILITIES, ScatterDecision, ScatterKernel,
                                              ScatterRoute, scatter_route)

needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
ROWS = ScatterKernel.SCATTER_ROWS
FLAT = ScatterKernel.SCATTER_FLAT
VIEW = ScatterKernel.STRIDED_ADD


@needs_c
@pytest.mark.parametrize("kernel, facts, route, why", [
    (ROWS, dict(dtype=np.float32, elements=1 << 14), ScatterRoute.COMPILED, None),
    (ROWS, dict(dtype=np.float64, elements=(1 << 14) - 1), ScatterRoute.NUMPY, "elements"),
    (ROWS, dict(dtype=np.float16, elements=1 << 20), ScatterRoute.NUMPY, "float16"),
    (ROWS, dict(dtype=np.float32, elements=1 << 20, contiguous=False), ScatterRoute.NUMPY,
     "contiguous"),
    (FLAT, dict(dtype=np.float64, elements=1), ScatterRoute.COMPILED, None),
    (FLAT, dict(dtype=np.float64, elements=0), ScatterRoute.NUMPY, "no values"),
    (FLAT, dict(dtype=np.float64, elements=5, values_dtype=np.float32), ScatterRoute.NUMPY,
     "float32 values"),
    (FLAT, dict(dtype=np.int64, elements=5), ScatterRoute.NUMPY, "int64"),
    (FLAT, dict(dtype=np.float32, elements=5, writeable=False), ScatterRoute.NUMPY,
     "read-only"),
    (VIEW, dict(dtype=np.float32, elements=1 << 14), ScatterRoute.COMPILED, None),
    (VIEW, dict(dtype=np.float32, elements=100), ScatterRoute.NUMPY, "elements"),
])
def test_route_per_fact(kernel, facts, route, why):
    decision = scatter_route(kernel, **facts)
    assert decision == ScatterDecision(kernel, route, decision.reason)
    assert (decision.reason is None) == (why is None)
    if why is not None:
        assert why in decision.reason


def test_no_compiler_is_the_numpy_route(monkeypatch):
    monkeypatch.setattr(scatter_kernels, "can_build", lambda backend: False)
    for kernel in ScatterKernel:
        decision = scatter_route(kernel, np.float64, 1 << 20)
        assert decision.route is ScatterRoute.NUMPY and decision.reason == "no C compiler"


def test_capabilities_are_declared_for_every_kernel():
    assert set(CAPABILITIES) == set(ScatterKernel)
    with pytest.raises(Exception):
        CAPABILITIES[ROWS].min_elements = 0          # frozen


def _rows_case(n, width, dtype, seed=0):
    rng = np.random.default_rng(seed)
    target = rng.standard_normal((17, width)).astype(dtype)
    rows = rng.standard_normal((n, width)).astype(dtype)
    where = rng.integers(0, 17, n).astype(np.int64)
    expected = target.copy()
    np.add.at(expected, where, rows)
    return target, rows, where, expected


@needs_c
@pytest.mark.parametrize("n, width, dtype, route", [
    (300, 64, np.float32, ScatterRoute.COMPILED),
    (300, 64, np.float64, ScatterRoute.COMPILED),
    (5, 8, np.float64, ScatterRoute.NUMPY),             # small: the fallback
    (300, 64, np.float16, ScatterRoute.NUMPY),          # a dtype it does not take
])
def test_scatter_rows_runs_its_route(monkeypatch, n, width, dtype, route):
    target, rows, where, expected = _rows_case(n, width, dtype)
    assert c_scatter.rows_route(target, rows).route is route
    ran = []
    numpy_rows = c_scatter._scatter_rows_numpy
    monkeypatch.setattr(c_scatter, "_scatter_rows_numpy",
                        lambda *a: (ran.append(ScatterRoute.NUMPY), numpy_rows(*a)))
    c_scatter.scatter_rows(target, rows, where)
    assert ran == ([ScatterRoute.NUMPY] if route is ScatterRoute.NUMPY else [])
    tolerance = 1e-2 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(target, expected, rtol=tolerance, atol=tolerance)


@needs_c
def test_scatter_rows_runs_a_route_decided_once():
    # a caller that decided the NUMPY route for a signature gets it, even where the
    # arrays would take the compiled kernel (and the same sums either way)
    target, rows, where, expected = _rows_case(300, 64, np.float64)
    other = target.copy()
    decided = scatter_route(ROWS, np.float64, 1)
    assert decided.route is ScatterRoute.NUMPY
    c_scatter.scatter_rows(target, rows, where, route=decided)
    c_scatter.scatter_rows(other, rows, where)
    np.testing.assert_allclose(target, expected, rtol=1e-12)
    np.testing.assert_allclose(other, expected, rtol=1e-12)


@needs_c
@pytest.mark.parametrize("values_dtype, writeable, compiled", [
    (np.float64, True, True), (np.float32, True, False), (np.float64, False, False)])
def test_scatter_flat_follows_its_route(values_dtype, writeable, compiled):
    rng = np.random.default_rng(1)
    target = rng.standard_normal((6, 7))
    where = (rng.integers(0, 6, 50), rng.integers(0, 7, 50))
    values = rng.standard_normal(50).astype(values_dtype)
    expected = target.copy()
    np.add.at(expected, where, values)
    target.flags.writeable = writeable
    assert scatter_route(FLAT, target.dtype, values.size, writeable=writeable,
                         values_dtype=values.dtype).route is \
        (ScatterRoute.COMPILED if compiled else ScatterRoute.NUMPY)
    before = target.copy()
    assert c_scatter.scatter_flat(target, where, values) is compiled
    if compiled:
        np.testing.assert_array_equal(target, expected)      # np.add.at's bits
    else:
        np.testing.assert_array_equal(target, before)        # nothing done


@needs_c
@pytest.mark.parametrize("size, compiled", [(64, True), (8, False)])
def test_strided_add_follows_its_route(size, compiled):
    # pooling's view: x[c, 2i + a, 2j + b] for a, b in 0..1
    rng = np.random.default_rng(2)
    target = rng.standard_normal((4, 2 * size, 2 * size)).astype(np.float32)
    shape = (4, size, size, 2, 2)
    steps = (4 * size * size, 4 * size, 2, 2 * size, 1)
    values = rng.standard_normal(shape).astype(np.float32)
    expected = target.copy()
    view = np.lib.stride_tricks.as_strided(expected, shape, [s * 4 for s in steps],
                                           writeable=True)
    view += values
    elements = int(np.prod(shape))
    assert scatter_route(VIEW, target.dtype, elements).route is \
        (ScatterRoute.COMPILED if compiled else ScatterRoute.NUMPY)
    assert c_strided.strided_add(target, 0, shape, steps, values) is compiled
    if compiled:
        np.testing.assert_array_equal(target, expected)      # one IEEE add each
