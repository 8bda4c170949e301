"""The schedule as a value (schedule/schedule.py, chosen by schedule/choose.py): frozen,
hashable, printable; equal statements get equal schedules; each statement shape gets
its route; and a statement computes the oracle's values on every route and backend."""

import dataclasses

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.schedule.choose import choose
from einfuse.schedule.library import rules
from einfuse.schedule.schedule import Library, Reason, Route
from oracle import brute_force

rng = np.random.default_rng(30)
needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")

MATMUL = "C[i,j] := A[i,k] * B[k,j]"
ADDEND = "y[b,o] := sum[i](x[b,i] * W[i,o]) + bias[o]"
DIST = "D[i,j] := sum[k]((w[k,i] - x[k,j])**2)"
SOFTMAX = "P[i,j] := exp(X[i,j] - max[k](X[i,k]))"
# one statement of causal attention (the online-softmax rewrite recognises it)
ATTENTION = ("O[b,h,i,e] := sum[j](exp(where(j <= i, sum[d](Q[b,h,i,d]*K[b,h,j,d]), -inf) - "
             "max[k](where(k <= i, sum[c](Q[b,h,i,c]*K[b,h,k,c]), -inf))) * V[b,h,j,e]) / "
             "sum[l](exp(where(l <= i, sum[d](Q[b,h,i,d]*K[b,h,l,d]), -inf) - "
             "max[k](where(k <= i, sum[c](Q[b,h,i,c]*K[b,h,k,c]), -inf))))")


def arrays_for(statement):
    if statement.replace(" ", "") == MATMUL.replace(" ", ""):
        return {"A": rng.standard_normal((5, 4)), "B": rng.standard_normal((4, 6))}
    if statement == ADDEND:
        return {"x": rng.standard_normal((3, 4)), "W": rng.standard_normal((4, 5)),
                "bias": rng.standard_normal(5)}
    if statement == DIST:
        return {"w": rng.standard_normal((3, 7)), "x": rng.standard_normal((3, 6))}
    if statement == SOFTMAX:
        return {"X": rng.standard_normal((4, 5))}
    return {"Q": rng.standard_normal((1, 2, 5, 3)), "K": rng.standard_normal((1, 2, 5, 3)),
            "V": rng.standard_normal((1, 2, 5, 2))}


def schedule_of(statement, backend="c", **options):
    kernel = ef.compile(statement, backend=backend, **options)
    return choose(kernel, kernel.bind(**arrays_for(statement)))


@needs_c
def test_a_schedule_is_frozen_hashable_and_printable():
    schedule = schedule_of(DIST)
    with pytest.raises(dataclasses.FrozenInstanceError):
        schedule.route = Route.BLAS
    assert {schedule: 1}[schedule] == 1
    text = str(schedule)
    assert "loop nest" in text and "backend c" in text and "threads" in text
    detailed = choose(ef.compile(DIST, backend="c"),
                      ef.compile(DIST, backend="c").bind(**arrays_for(DIST)))
    assert detailed.loops is not None and set(detailed.loops.order) == {"i", "j", "k"}
    assert hash(detailed) == hash(detailed)


@needs_c
def test_equal_statements_get_equal_schedules():
    spaced = MATMUL.replace(" ", "")
    one, two = schedule_of(MATMUL), schedule_of(spaced)
    assert one == two and hash(one) == hash(two)
    assert schedule_of(DIST) == schedule_of(DIST)
    assert schedule_of(DIST) != schedule_of(MATMUL)


@needs_c
def test_routes_of_statement_shapes():
    assert schedule_of(MATMUL).route is Route.BLAS
    assert schedule_of(MATMUL).blas is not None
    assert schedule_of(ADDEND).route is Route.BLAS_THEN_ADDEND
    assert schedule_of(DIST).route is Route.LOOP_NEST
    # padded reads: the arrays padded by the margins the ranges leave, then BLAS
    assert schedule_of(MATMUL, pad=0.0).route is Route.BLAS_WINDOWED
    kernel = ef.compile(MATMUL, backend="c")
    integers = kernel.bind(A=np.ones((3, 2), np.int64), B=np.ones((2, 4), np.int64))
    assert choose(kernel, integers).route is Route.LOOP_NEST
    assert schedule_of(MATMUL, backend="numpy").route is Route.HOST
    hoisted = schedule_of(SOFTMAX)
    assert hoisted.route is Route.HOISTED and len(hoisted.statements) == 2
    assert [m.reason for m in hoisted.materialised] == [Reason.HOISTED]
    assert hoisted.as_written().route is Route.LOOP_NEST


def test_attention_is_a_library_kernel_with_its_fallback():
    schedule = schedule_of(ATTENTION, backend="numpy")
    assert schedule.route is Route.LIBRARY and schedule.library is Library.ATTENTION
    assert schedule.fallback is not None and schedule.fallback.route is not Route.LIBRARY
    assert schedule.as_written().route is Route.HOST
    assert {(rule.library, rule.backend) for rule in rules()} >= {
        (Library.ATTENTION, "c"), (Library.ATTENTION, "numpy")}


@needs_c
def test_a_kernel_chooses_once_per_signature():
    kernel = ef.compile(DIST, backend="c")
    arrays = arrays_for(DIST)
    kernel(**arrays)
    kernel(**arrays)
    assert len(kernel._schedules) == 1
    (schedule,) = kernel._schedules.values()
    assert schedule is kernel.schedule(kernel.bind(**arrays),
                                       next(iter(kernel._schedules)).value)


@pytest.mark.slow_on("triton")
@pytest.mark.parametrize("statement", [MATMUL, ADDEND, DIST, SOFTMAX, ATTENTION])
def test_values_match_the_oracle_on_every_route(statement, backend):
    arrays = arrays_for(statement)
    kernel = ef.compile(statement, backend=backend)
    call = kernel.bind(**arrays)
    route = choose(kernel, call).route
    expected_routes = {"numpy": {Route.HOST, Route.HOISTED, Route.LIBRARY},
                       "c": {Route.BLAS, Route.BLAS_THEN_ADDEND, Route.LOOP_NEST,
                             Route.HOISTED, Route.LIBRARY},
                       "triton": {Route.TRITON, Route.HOISTED, Route.LIBRARY}}[backend]
    assert route in expected_routes
    ranges = {name: call.bounds.range_map[name] for name in call.spec.all_indices}
    expected = brute_force(statement, ranges, arrays)
    for _ in range(2):    # the first call and the prepared repeat
        np.testing.assert_allclose(np.asarray(kernel(**arrays)), expected, rtol=1e-9,
                                   atol=1e-12)


@needs_c
def test_compiled_c_kernels_are_cached_by_one_frozen_key():
    from einfuse.backends.c import backend as c_backend
    from einfuse.schedule.cache_key import CacheKey, CacheKind
    from einfuse.schedule.schedule import LoopChoice
    kernel = ef.compile(DIST, backend="c")
    arrays = arrays_for(DIST)
    kernel(**arrays)
    call = kernel.bind(**arrays)
    key = c_backend.kernel_key(call, (1, 1, 1))
    assert key == c_backend.kernel_key(ef.compile(DIST, backend="c").bind(**arrays),
                                       (1, 1, 1))
    assert key.plan().mode == choose(kernel, call).loops.mode
    assert c_backend._kernels and all(isinstance(k, CacheKey) and k.kind is CacheKind.LOOP_NEST
                                      and isinstance(k.value, LoopChoice)
                                      for k in c_backend._kernels)
