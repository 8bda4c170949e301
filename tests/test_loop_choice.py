"""The C loop nest's schedule is its compiled kernel's key (schedule/loop_choice.py):
the lowering's inputs and the nest's order are chosen in schedule/, carried by the
Schedule's LoopSchedule, obeyed by plan/lower.plan_for and the C backend, and the
compiled-kernel cache holds one kernel per distinct choice.  Values against
tests/oracle.py throughout."""

import dataclasses

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import backend as c_backend
from einfuse.backends.c import build as c_build
from einfuse.plan import unit_axis
from einfuse.plan.loop_plan import input_buffers
from einfuse.plan.nest_order import NestOrder
from einfuse.runtime.signatures import signature_of
from einfuse.schedule.cache_key import CacheKind, loop_nest_key
from einfuse.schedule.choose import choose
from einfuse.schedule.loop_choice import loop_schedule
from einfuse.schedule.schedule import LoopChoice, Route
from oracle import brute_force

needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
rng = np.random.default_rng(44)

DIST = "E[i,j] := sum[k]((u[k,i] - v[k,j])**2)"   # (its own Kernel: compile caches them)
SUM_ROWS = "y[i] := sum[j](exp(A[i,j]) * B[i,j])"
GATHER = "y[i] := sum[j](W[idx[i], j])"


def oracle(statement, call, arrays):
    ranges = {name: call.bounds.range_map[name] for name in call.spec.all_indices}
    return brute_force(statement, ranges, arrays)


@pytest.fixture
def kernels(monkeypatch):
    """An empty compiled-kernel cache for the test (compiled libraries stay cached)."""
    cache = {}
    monkeypatch.setattr(c_backend, "_kernels", cache)
    return cache


def dist_arrays(k, n, m, dtype=np.float64):
    return {"u": rng.standard_normal((k, n)).astype(dtype),
            "v": rng.standard_normal((k, m)).astype(dtype)}


@needs_c
def test_two_calls_with_equal_schedules_share_one_compiled_kernel(kernels):
    # two kernels of one statement, other shapes (plans are shape-generic; the same
    # indices short of a vector, k): the same loop choice, so one compiled kernel
    first, second = ef.compile(DIST, backend="c"), ef.compile(DIST, backend="c")
    a, b = dist_arrays(3, 9, 10), dist_arrays(5, 12, 17)
    ca, cb = first.bind(**a), second.bind(**b)
    sa, sb = choose(first, ca), choose(second, cb)
    assert sa.route is Route.LOOP_NEST and sa.loops.choice == sb.loops.choice
    np.testing.assert_allclose(first(**a), oracle(DIST, ca, a), rtol=1e-12)
    np.testing.assert_allclose(second(**b), oracle(DIST, cb, b), rtol=1e-12)
    assert list(kernels) == [loop_nest_key(sa.loops.choice)]


@needs_c
def test_unequal_schedules_get_their_own_kernels(kernels):
    kernel = ef.compile(DIST, backend="c")
    plain = dist_arrays(3, 7, 6)
    # u read along its other axis (a transposed view), and float32: other choices
    transposed = {"u": np.asfortranarray(plain["u"]), "v": plain["v"]}
    single = {name: value.astype(np.float32) for name, value in plain.items()}
    choices = []
    for arrays in (plain, transposed, single):
        call = kernel.bind(**arrays)
        choices.append(choose(kernel, call).loops.choice)
        rtol = 1e-5 if arrays is single else 1e-12
        np.testing.assert_allclose(kernel(**arrays), oracle(DIST, call, arrays), rtol=rtol)
    assert len(set(choices)) == 3
    assert choices[0].layouts != choices[1].layouts
    assert choices[0].working == "float64" and choices[2].working == "float32"
    assert set(kernels) == {loop_nest_key(choice) for choice in choices}


@needs_c
def test_the_schedule_explain_prints_is_the_key_the_run_used(kernels):
    kernel = ef.compile(SUM_ROWS, backend="c")
    arrays = {"A": rng.standard_normal((6, 40)), "B": rng.standard_normal((6, 40))}
    call = kernel.bind(**arrays)
    np.testing.assert_allclose(kernel(**arrays), oracle(SUM_ROWS, call, arrays),
                               rtol=1e-12)
    explained = ef.explain(SUM_ROWS, backend="c", **arrays)
    shown = choose(kernel, call)
    assert explained.schedule == shown.describe()
    # the schedule the kernel keeps for the call's signature is that value, and its
    # loop choice is the one compiled-kernel key
    assert kernel.schedule(call, signature_of(arrays)) == shown
    assert list(kernels) == [loop_nest_key(shown.loops.choice)]
    assert next(iter(kernel._schedules)).kind is CacheKind.SCHEDULE
    assert isinstance(shown.loops.choice, LoopChoice)


@needs_c
def test_the_lowering_and_the_backend_obey_the_schedules_loop_order(kernels):
    statement = "y[i,j] := x[i,j] * 2 + z[j,i]"
    kernel = ef.compile(statement, backend="c")
    arrays = {"x": rng.standard_normal((5, 7)), "z": rng.standard_normal((7, 5))}
    call = kernel.bind(**arrays)
    schedule = choose(kernel, call)
    nest = schedule.loops.choice.nest
    other = NestOrder(tuple(reversed(nest.order)), nest.tiled, nest.rows)
    choice = dataclasses.replace(schedule.loops.choice, nest=other)
    plan = choice.plan()
    outer = plan.program.kernels[0].body[0]
    assert outer.var == f"p{call.spec.all_indices.index(other.order[0])}"
    assert choice.plan().program != schedule.loops.choice.plan().program
    ordered = dataclasses.replace(schedule, loops=dataclasses.replace(
        schedule.loops, choice=choice))
    result = c_backend.CBackend.run(call, ordered)
    np.testing.assert_allclose(result, oracle(statement, call, arrays), rtol=1e-12)
    assert list(kernels) == [loop_nest_key(choice)]


@needs_c
def test_a_converted_input_is_laid_out_as_the_run_holds_it():
    # float32 in Fortran order, computed in float64: the converted copy keeps the
    # axis order (astype's 'K'), so its unit-stride axis is 0, as the run sees it
    statement = "y[i,j] := x[i,j] * z[i,j]"
    kernel = ef.compile(statement, backend="c")
    arrays = {"x": np.asfortranarray(rng.standard_normal((6, 5)).astype(np.float32)),
              "z": np.asfortranarray(rng.standard_normal((6, 5)))}
    call = kernel.bind(**arrays)
    loops = choose(kernel, call).loops
    buffers = input_buffers(call) + [np.empty(call.output_shape, np.float64)]
    assert loops.given == tuple(unit_axis(b) for b in buffers)
    assert loops.given[:2] == (0, 0)
    assert loop_schedule(call, buffers) == loops
    np.testing.assert_allclose(kernel(**arrays), oracle(statement, call, arrays),
                               rtol=1e-12)


@needs_c
@pytest.mark.parametrize("bounds", ["check", "promise"])
def test_a_schedule_chosen_on_in_range_indices_still_checks_later_calls(bounds):
    # the first call's indices are in range ('verified': a kernel without tests); a
    # later call of the same signature with an index out of range gets the kernel
    # that tests each value, and its error, never a read out of bounds
    kernel = ef.compile(GATHER, backend="c", bounds=bounds)
    W = rng.standard_normal((4, 9))
    good = {"W": W, "idx": np.array([0, 3, 1, 2, 3], dtype=np.int64)}
    call = kernel.bind(**good)
    assert choose(kernel, call).loops.choice.bounds == "verified"
    for _ in range(2):
        np.testing.assert_allclose(kernel(**good), oracle(GATHER, call, good), rtol=1e-12)
    bad = {"W": W, "idx": np.array([0, 3, 4, 2, 3], dtype=np.int64)}
    if bounds == "check":
        with pytest.raises(ef.EinfuseError, match="idx"):
            kernel(**bad)
    np.testing.assert_allclose(kernel(**good), oracle(GATHER, call, good), rtol=1e-12)


@needs_c
def test_an_empty_result_has_no_loop_choice_and_runs():
    kernel = ef.compile(DIST, backend="c")
    arrays = dist_arrays(3, 0, 4)
    call = kernel.bind(**arrays)
    assert choose(kernel, call).loops is None
    assert kernel(**arrays).shape == (0, 4)
