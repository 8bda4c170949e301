"""The col2im scatter's route is the schedule's (schedule/window_scatter.py): a frozen
decision from the subscripts, ranges and the arrays' signature, which
runtime/window_scatter.add_by_offsets only runs.  Each route against np.add.at (the
scatter's general path, the values' order: the same bits) and, for the torch views,
against the NumPy result.  The col2im add is the registry's WINDOW_ADD entry
(schedule/library.py): a gradient's scatter asks the registry and runs that entry with
the decision."""

from __future__ import annotations

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.runtime import gradients, window_scatter
from einfuse.runtime.gradient_reference import resolve_options
from einfuse.schedule import window_scatter as schedule_window
from einfuse.schedule.window_scatter import WindowScatterRoute

needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
rng = np.random.default_rng(7)
CONV = ("y[b,o,i,j] := x[b,c,2*i+p-1,2*j+q-1] * w[o,c,p,q]",
        {"pad": 0, "ranges": {"i": 16, "j": 16}}, (2, 3, 32, 32), (4, 3, 3, 3))
SMALL = ("y[b,o,i,j] := x[b,c,2*i+p-1,2*j+q-1] * w[o,c,p,q]",
         {"pad": 0, "ranges": {"i": 4, "j": 4}}, (1, 2, 8, 8), (4, 2, 3, 3))


def _scatter_of(statement, options, xshape, wshape):
    kernel = ef.compile(statement, **options)
    key = gradients.options_key(kernel.options)
    scatter, = [g for g in gradients.gradient_statements(kernel.statement, "x", key)
                if g.kind == "scatter"]
    x, w = rng.standard_normal(xshape), rng.standard_normal(wshape)
    y = kernel(x=x, w=w)
    values = {"x": x, "w": w, scatter.output_grad: rng.standard_normal(y.shape)}
    ranges = resolve_options(scatter, values)["ranges"]
    return scatter, {n: ranges[n] for n in scatter.spec.output_indices}


def _add_at(base, scatter, values, ranges):
    indices = scatter.spec.output_indices
    grid = dict(zip(indices, np.meshgrid(*[np.arange(ranges[n].start, ranges[n].stop)
                                           for n in indices], indexing="ij")))
    keep = np.ones(values.shape, bool)
    positions = []
    for axis, sub in enumerate(scatter.scatter):
        where = np.broadcast_to(sub.constant + sum(c * grid[n] for n, c in sub.terms),
                                values.shape)
        keep &= (where >= 0) & (where < base.shape[axis])
        positions.append(where)
    want = base.copy()
    np.add.at(want, tuple(p[keep] for p in positions), values[keep])
    return want


@pytest.fixture
def ran(monkeypatch):
    """Which adds ran: the one C walk, the per-offset views."""
    seen = []
    one, views = window_scatter._add_in_one_pass, window_scatter._add_by_views
    monkeypatch.setattr(window_scatter, "_add_in_one_pass",
                        lambda *a: seen.append("one pass") or one(*a))
    monkeypatch.setattr(window_scatter, "_add_by_views",
                        lambda *a: seen.append("views") or views(*a))
    return seen


@needs_c
def test_numpy_arrays_take_the_one_pass(ran):
    scatter, ranges = _scatter_of(*CONV)
    values = rng.standard_normal(tuple(len(ranges[n]) for n in scatter.spec.output_indices))
    base = rng.standard_normal(CONV[2])
    decision = window_scatter.scatter_decision(base, scatter, values, ranges)
    assert decision.route is WindowScatterRoute.ONE_PASS and decision.reason is None
    assert set(decision.plan.looped) == {"p", "q"} and len(decision.plan.offsets) == 9
    got = base.copy()
    assert window_scatter.add_by_offsets(got, scatter, values, ranges)
    assert ran == ["one pass"]
    np.testing.assert_array_equal(got, _add_at(base, scatter, values, ranges))


def test_the_decided_route_is_the_one_run(ran, monkeypatch):
    scatter, ranges = _scatter_of(*CONV)
    values = rng.standard_normal(tuple(len(ranges[n]) for n in scatter.spec.output_indices))
    base = rng.standard_normal(CONV[2])
    decided = window_scatter.scatter_decision(base, scatter, values, ranges)
    views = schedule_window.WindowScatterDecision(WindowScatterRoute.VIEW_ADDS,
                                                  decided.plan)
    got = base.copy()
    assert window_scatter.add_by_offsets(got, scatter, values, ranges, views)
    assert ran == ["views"]
    np.testing.assert_array_equal(got, _add_at(base, scatter, values, ranges))
    ran.clear()
    monkeypatch.setattr(window_scatter, "window_scatter_decision",
                        lambda *a: schedule_window.WindowScatterDecision(
                            WindowScatterRoute.NOT_THIS_FORM, reason="forced"))
    untouched = base.copy()
    assert not window_scatter.add_by_offsets(untouched, scatter, values, ranges)
    assert ran == [] and np.array_equal(untouched, base)


def test_the_capability_is_the_kernels():
    from einfuse.backends.c import window_pack
    assert schedule_window.ONE_PASS.min_elements == window_pack.MIN_ELEMENTS
    assert schedule_window.ONE_PASS.max_axes == window_pack.MAX_AXES
    assert set(schedule_window.ONE_PASS.dtypes) == \
        {d.name for d in window_pack._KINDS}


@pytest.mark.parametrize("conv, dtype, reason", [
    (SMALL, np.float64, "below"), (CONV, np.float16, "float16")])
def test_what_the_walk_does_not_take_takes_the_views(conv, dtype, reason, ran):
    scatter, ranges = _scatter_of(*conv)
    shape = tuple(len(ranges[n]) for n in scatter.spec.output_indices)
    values = rng.standard_normal(shape).astype(dtype)
    base = rng.standard_normal(conv[2]).astype(dtype)
    decision = window_scatter.scatter_decision(base, scatter, values, ranges)
    assert decision.route is WindowScatterRoute.VIEW_ADDS and reason in decision.reason
    got = base.copy()
    assert window_scatter.add_by_offsets(got, scatter, values, ranges)
    assert ran == ["views"]
    np.testing.assert_array_equal(got, _add_at(base, scatter, values, ranges))


def test_the_fallbacks_and_their_reasons():
    scatter, ranges = _scatter_of(*CONV)
    shape = tuple(len(ranges[n]) for n in scatter.spec.output_indices)
    values = rng.standard_normal(shape)
    fortran = np.asfortranarray(rng.standard_normal(CONV[2]))
    for target, vals, reason in (
            (fortran, values, "C-contiguous"),
            (np.zeros(CONV[2]), values[:1], "shape")):
        decision = window_scatter.scatter_decision(target, scatter, vals, ranges)
        assert decision.route is WindowScatterRoute.NOT_THIS_FORM
        assert reason in decision.reason
        assert not window_scatter.add_by_offsets(target.copy(order="K"), scatter, vals, ranges)


def test_torch_targets_take_the_views(ran):
    torch = pytest.importorskip("torch")
    scatter, ranges = _scatter_of(*CONV)
    values = rng.standard_normal(tuple(len(ranges[n]) for n in scatter.spec.output_indices))
    base = rng.standard_normal(CONV[2])
    target = torch.from_numpy(base.copy())
    decision = window_scatter.scatter_decision(target, scatter, torch.from_numpy(values),
                                               ranges)
    assert decision.route is WindowScatterRoute.VIEW_ADDS
    assert window_scatter.add_by_offsets(target, scatter, torch.from_numpy(values), ranges)
    assert ran == ["views"]
    np.testing.assert_allclose(target.numpy(), _add_at(base, scatter, values, ranges),
                               rtol=1e-12, atol=1e-12)
    # a falling subscript: torch's views take no negative steps
    falling = ("y[b,o,i] := x[b,c,2*i-p+4] * w[o,c,p]", {"pad": 0, "ranges": {"i": 30}},
               (2, 3, 60), (4, 3, 5))
    scatter, ranges = _scatter_of(*falling)
    values = torch.randn(*(len(ranges[n]) for n in scatter.spec.output_indices),
                         dtype=torch.float64)
    decision = window_scatter.scatter_decision(torch.zeros(falling[2], dtype=torch.float64),
                                               scatter, values, ranges)
    assert decision.route is WindowScatterRoute.NOT_THIS_FORM and "negative" in \
        decision.reason


# -- the col2im add is an entry of schedule/library.py's registry --------------------------

def test_the_registry_names_the_window_entry():
    from einfuse.analysis.frameworks import JAX, NUMPY, TORCH
    from einfuse.schedule.library import ScatterCall, compiled_kernel, scatter_library
    from einfuse.schedule.schedule import Library
    for framework in (NUMPY, TORCH):
        assert scatter_library(ScatterCall(False, False, window=True), framework) is \
            Library.WINDOW_ADD
        # (one strided view is tried first; whole rows after the window form)
        assert scatter_library(ScatterCall(True, False, window=True), framework) is \
            Library.STRIDED_ADD
        assert scatter_library(ScatterCall(False, True, True, window=True), framework) is \
            Library.WINDOW_ADD
        assert scatter_library(ScatterCall(False, False), framework) is Library.SCATTER_ADD
        assert compiled_kernel(Library.WINDOW_ADD, framework) is None   # (its own route)
    assert scatter_library(ScatterCall(False, False, window=True), JAX) is \
        Library.SCATTER_ADD       # (JAX's arrays are immutable: no window add)


def _numpy_add(target, scatter, values, options_ranges):
    from einfuse.runtime import gradient_reference
    options = {"ranges": options_ranges}
    return gradient_reference.numpy_scatter_add(gradient_reference.NumpyOps(), target,
                                                scatter, values, options, {})


@pytest.mark.parametrize("conv", [CONV, SMALL])
def test_a_strided_convolutions_input_gradient_takes_the_window_entry(conv, ran):
    from einfuse.analysis.frameworks import NUMPY
    from einfuse.runtime import gradient_reference
    from einfuse.schedule.schedule import Library
    scatter, ranges = _scatter_of(*conv)
    values = rng.standard_normal(tuple(len(ranges[n]) for n in scatter.spec.output_indices))
    base = rng.standard_normal(conv[2])
    library, view, window = gradient_reference.scatter_entry(base, scatter, values,
                                                             {"ranges": ranges}, NUMPY)
    assert library is Library.WINDOW_ADD and view is None
    assert window == window_scatter.scatter_decision(base, scatter, values, ranges)
    got = _numpy_add(base.copy(), scatter, values, ranges)
    # the route the entry's decision named ran (CONV: one C walk; SMALL: too few values)
    assert ran == (["one pass"] if window.route is WindowScatterRoute.ONE_PASS else
                   ["views"])
    np.testing.assert_array_equal(got, _add_at(base, scatter, values, ranges))


def test_a_scatter_not_of_the_window_form_does_not_take_it(ran):
    from einfuse.analysis.frameworks import NUMPY, TORCH
    from einfuse.runtime import gradient_reference
    from einfuse.schedule.schedule import Library
    # a window no wider than its stride: its points never collide, one strided view
    disjoint = ("y[b,o,i] := x[b,c,2*i+p] * w[o,c,p]", {"ranges": {"i": 10}},
                (2, 3, 20), (4, 3, 2))
    scatter, ranges = _scatter_of(*disjoint)
    values = rng.standard_normal(tuple(len(ranges[n]) for n in scatter.spec.output_indices))
    base = rng.standard_normal(disjoint[2])
    library = gradient_reference.scatter_entry(base, scatter, values, {"ranges": ranges},
                                               NUMPY)[0]
    assert library is Library.STRIDED_ADD
    np.testing.assert_allclose(_numpy_add(base.copy(), scatter, values, ranges),
                               _add_at(base, scatter, values, ranges), rtol=1e-13)
    # a falling subscript into a torch target: not the window form, element by element
    torch = pytest.importorskip("torch")
    falling = ("y[b,o,i] := x[b,c,2*i-p+4] * w[o,c,p]", {"pad": 0, "ranges": {"i": 30}},
               (2, 3, 60), (4, 3, 5))
    scatter, ranges = _scatter_of(*falling)
    shape = tuple(len(ranges[n]) for n in scatter.spec.output_indices)
    values = rng.standard_normal(shape)
    base = rng.standard_normal(falling[2])
    library, _, window = gradient_reference.scatter_entry(
        torch.from_numpy(base.copy()), scatter, torch.from_numpy(values),
        {"ranges": ranges}, TORCH)
    assert library is Library.SCATTER_ADD
    assert window.route is WindowScatterRoute.NOT_THIS_FORM
    # (on NumPy arrays the same scatter is of the window form)
    assert gradient_reference.scatter_entry(base, scatter, values, {"ranges": ranges},
                                            NUMPY)[0] is Library.WINDOW_ADD
    ran.clear()
    target = torch.from_numpy(base.copy())
    got = gradient_reference.numpy_scatter_add(
        gradient_reference._ops_for(target), target, scatter, torch.from_numpy(values),
        {"ranges": ranges}, {})
    assert ran == []
    np.testing.assert_allclose(got.numpy(), _add_at(base, scatter, values, ranges),
                               rtol=1e-12, atol=1e-12)
