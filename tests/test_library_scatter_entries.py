"""The scatter kernels' routes are entries of schedule/library.py's (pattern, backend)
registry: each NumPy entry names the compiled kernel it runs, and kernel_route gives a
call's route from that kernel's declared capability; the C scatters run the route the
registry answered (counted), with values against np.add.at."""

import numpy as np
import pytest

from einfuse.analysis.frameworks import JAX, NUMPY, TORCH
from einfuse.backends.c import build as c_build
from einfuse.backends.c import scatter as c_scatter
from einfuse.backends.c import strided_add as c_strided
from einfuse.schedule import library
from einfuse.schedule.scatter_kernels import ScatterKernel, ScatterRoute, scatter_route
from einfuse.schedule.schedule import Library

needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")


def test_the_entries_name_their_kernels():
    want = {(Library.STRIDED_ADD, NUMPY): ScatterKernel.STRIDED_ADD,
            (Library.SCATTER_ROWS, NUMPY): ScatterKernel.SCATTER_ROWS,
            (Library.SCATTER_ADD, NUMPY): ScatterKernel.SCATTER_FLAT}
    for rule in library.rules():
        assert rule.kernel == want.get((rule.library, rule.backend))
    for key, kernel in want.items():
        assert library.compiled_kernel(*key) is kernel
    for framework in (TORCH, JAX):
        assert library.compiled_kernel(Library.SCATTER_ADD, framework) is None
        assert library.kernel_route(Library.SCATTER_ADD, framework, np.float64, 10) is None
    for (pattern, framework), kernel in want.items():
        for facts in ((np.float64, 1 << 20), (np.float16, 1 << 20), (np.float32, 3)):
            assert library.kernel_route(pattern, framework, *facts) == \
                scatter_route(kernel, *facts)


@pytest.fixture
def answered(monkeypatch):
    seen = []
    real = library.kernel_route

    def counting(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]
    for module in (c_scatter, c_strided):
        monkeypatch.setattr(module, "kernel_route", counting)
    return seen


@needs_c
@pytest.mark.parametrize("n, dtype, route", [(400, np.float64, ScatterRoute.COMPILED),
                                             (3, np.float64, ScatterRoute.NUMPY)])
def test_the_row_scatter_runs_the_registry_answer(n, dtype, route, answered, monkeypatch):
    rng = np.random.default_rng(0)
    target = rng.standard_normal((20, 64)).astype(dtype)
    rows = rng.standard_normal((n, 64)).astype(dtype)
    where = rng.integers(0, 20, n)
    want = target.copy()
    np.add.at(want, where, rows)
    numpy_ran = []
    real = c_scatter._scatter_rows_numpy
    monkeypatch.setattr(c_scatter, "_scatter_rows_numpy",
                        lambda *a: numpy_ran.append(1) or real(*a))
    c_scatter.scatter_rows(target, rows, where)
    assert [d.route for d in answered] == [route]
    assert answered[0].kernel is ScatterKernel.SCATTER_ROWS
    assert bool(numpy_ran) == (route is ScatterRoute.NUMPY)
    np.testing.assert_allclose(target, want, rtol=1e-12, atol=1e-12)


@needs_c
@pytest.mark.parametrize("values_dtype, route", [(np.float64, ScatterRoute.COMPILED),
                                                 (np.float32, ScatterRoute.NUMPY)])
def test_the_flat_scatter_runs_the_registry_answer(values_dtype, route, answered):
    rng = np.random.default_rng(1)
    target = rng.standard_normal((7, 9))
    values = rng.standard_normal(200).astype(values_dtype)
    positions = (rng.integers(0, 7, 200), rng.integers(0, 9, 200))
    want = target.copy()
    np.add.at(want, positions, values)
    done = c_scatter.scatter_flat(target, positions, values)
    assert [d.route for d in answered] == [route]
    assert done == (route is ScatterRoute.COMPILED)
    if done:          # (np.add.at's order: the same bits)
        np.testing.assert_array_equal(target, want)
