"""The JAX adapter's CPU route under jit is the schedule's (schedule/jax_route.py): the
rule's answer for each reason, and the route the lowering takes is the decision's
(a forced decision changes what XLA runs), values against jax.numpy."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.schedule import jax_route
from einfuse.schedule.jax_route import CpuRouteKind, FfiCapability, JaxCall
from einfuse.schedule.schedule import Route

jax = pytest.importorskip("jax")
jnp = jax.numpy

from einfuse.runtime import jax_ffi  # noqa: E402

needs_cc = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
CAPABILITY = FfiCapability(frozenset(("float32", "float64", "int64", "int32")), 4)
F32, F64, I64 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)
DIST = "D[i,j] := (w[k,i] - x[k,j])**2"


def facts(**changes):
    base = dict(schedule_backend="c", schedule_route=Route.LOOP_NEST, working=F32, result=F32,
                canonical_working=F32, params=(), inputs=(("w", F32), ("x", F32)),
                slots=(("w", "data"), ("x", "data")))
    base.update(changes)
    return JaxCall(**base)


def test_the_rule():
    route = lambda **c: jax_route.jax_cpu_route(facts(**c), CAPABILITY)
    assert jax_route.host_route("numpy", True).route.kind is CpuRouteKind.CALLBACK
    assert "compiler" in jax_route.host_route("c", False).route.reason
    assert jax_route.host_route("auto", True) is None
    ffi = route()
    assert ffi.route.kind is CpuRouteKind.FFI and ffi.arrival == (F32, F32)
    assert ffi.casts == (None, None) and ffi.checks_result_size
    assert route(schedule_route=Route.BLAS).route.kind is CpuRouteKind.DOT
    # (a working dtype JAX does not hold as it is: the loops, not XLA's dot)
    assert route(schedule_route=Route.BLAS, canonical_working=F64).route.kind is \
        CpuRouteKind.FFI
    half = route(inputs=(("w", np.dtype(np.float16)), ("x", F32)))
    assert half.route.kind is CpuRouteKind.FFI and half.casts == (F32, None)
    for changes, words, checked in (
            (dict(schedule_backend="numpy"), "another backend", False),
            (dict(working=np.dtype(np.int8), result=np.dtype(np.int8)), "int8", False),
            (dict(params=("s",), working=I64, result=I64, canonical_working=I64),
             "integer scalar", False),
            (dict(inputs=(("w", np.dtype(np.int8)), ("x", F32))), "w is int8", False),
            (dict(slots=(("w", "data"),) * 4), "more than 4", True),
            (dict(working=I64, result=I64, canonical_working=I64), "read as int64", True)):
        decided = route(**changes)
        assert decided.route.kind is CpuRouteKind.CALLBACK, changes
        assert words in decided.route.reason and decided.checks_result_size is checked


@pytest.fixture
def forced(monkeypatch):
    def force(decision):
        jax_ffi._route_for.cache_clear()
        monkeypatch.setattr(jax_ffi, "jax_cpu_route", lambda call, capability: decision)
    yield force
    jax_ffi._route_for.cache_clear()


@needs_cc
def test_the_decision_is_the_route_lowered(forced):
    cpu = jax.devices("cpu")[0]
    rng = np.random.default_rng(3)
    w, x = (jax.device_put(rng.standard_normal(s).astype(np.float32), cpu)
            for s in ((5, 3), (5, 4)))
    want = ((w[:, :, None] - x[:, None, :]) ** 2).sum(0)
    f = lambda w, x: ef.ein(DIST, w=w, x=x)
    with jax.default_device(cpu):
        jax_ffi._route_for.cache_clear()
        text = jax.jit(f).lower(w, x).as_text()
        assert "custom_call @einfuse_" in text and "callback" not in text
        forced(jax_route.JaxRouteDecision(jax_route.CpuRoute(CpuRouteKind.CALLBACK,
                                                             "forced")))
        g = lambda w, x: ef.ein(DIST, w=w, x=x)      # (not jit's cached trace of f)
        text = jax.jit(g).lower(w, x).as_text()
        assert "custom_call @einfuse_" not in text and "callback" in text
        kernel = ef.compile(DIST)
        route = jax_ffi.cpu_route(kernel, ["w", "x"], [w, x])[0]
        assert route.kind is CpuRouteKind.CALLBACK and route.reason == "forced"
        np.testing.assert_allclose(jax.jit(g)(w, x), want, rtol=1e-5, atol=1e-5)
