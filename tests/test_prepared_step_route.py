"""A prepared torch backward's gradient steps take the route the schedule decided
(schedule/prepared_steps.prepared_step_route, from the step kernel's schedule, once per
signature): a product BLAS computes runs on BLAS as a torch caller's (counted), any
other step on its own prepared runner; the gradients are torch autograd's either way,
a forced PREPARED decision included."""

import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.runtime import torch_prepared
from einfuse.schedule import prepared_steps
from einfuse.schedule.prepared_steps import StepRoute
from einfuse.schedule.schedule import Route

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")


@pytest.fixture
def steps(monkeypatch):
    """Each step decision made, and each BLAS runner built for a step."""
    from einfuse.backends.c import repeat as c_repeat
    seen = {"decided": [], "blas": []}
    decide, blas = torch_prepared.prepared_step_route, c_repeat.blas_runner

    def deciding(schedule):
        seen["decided"].append(decide(schedule))
        return seen["decided"][-1]

    def building(*args, **kwargs):
        if args[2] is True and kwargs == {}:   # (a step's: _on_torch_blas passes True)
            seen["blas"].append(args[1])
        return blas(*args, **kwargs)
    monkeypatch.setattr(torch_prepared, "prepared_step_route", deciding)
    monkeypatch.setattr(c_repeat, "blas_runner", building)
    return seen


def _backwards(statement, named, formula, calls=3):
    kernel = ef.compile(statement, backend="c")
    for _ in range(calls):
        out = kernel(**named)
        seed = torch.randn_like(out)
        got = torch.autograd.grad((out * seed).sum(), list(named.values()))
        want = torch.autograd.grad((formula(**named) * seed).sum(), list(named.values()))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)


def _leaves(*shapes):
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(s, dtype=torch.float64, generator=gen).requires_grad_()
            for s in shapes]


def test_a_products_steps_run_on_blas(steps):
    A, B = _leaves((6, 5), (5, 4))
    _backwards("C[i,j] := A[i,k] * B[k,j]", {"A": A, "B": B}, lambda A, B: A @ B)
    decided = steps["decided"]
    assert decided and all(d.route is StepRoute.TORCH_BLAS for d in decided)
    # the decided contractions run (the forward, a torch caller's too, builds its own)
    assert [b for b in steps["blas"] if "dC" in (b.left, b.right)] == \
        [d.blas for d in decided]
    assert len(decided) == 2          # dA and dB, decided once for the signature


def test_other_steps_keep_their_runner(steps):
    A, = _leaves((4, 5))
    _backwards("s[i] := sum[j](A[i,j] * A[i,j])", {"A": A}, lambda A: (A * A).sum(1))
    assert steps["decided"]
    assert all(d.route is StepRoute.PREPARED and d.reason for d in steps["decided"])
    assert [b for b in steps["blas"] if "dC" in (b.left, b.right)] == []


def test_a_forced_prepared_route_runs_the_steps_own_runner(steps, monkeypatch):
    forced = prepared_steps.StepDecision(StepRoute.PREPARED, reason="forced")
    monkeypatch.setattr(torch_prepared, "prepared_step_route", lambda schedule: forced)
    A, B = _leaves((6, 5), (5, 4))
    _backwards("C[i,j] := A[i,k] * B[k,j]", {"A": A, "B": B}, lambda A, B: A @ B)
    assert [b for b in steps["blas"] if "dC" in (b.left, b.right)] == []


def test_the_rule():
    from types import SimpleNamespace as S
    for route in prepared_steps.BLAS_ROUTES:
        decided = prepared_steps.prepared_step_route(S(backend="c", route=route, blas="x"))
        assert decided.route is StepRoute.TORCH_BLAS and decided.blas == "x"
    for backend, route in (("numpy", Route.BLAS), ("c", Route.LOOP_NEST),
                           ("c", Route.BLAS_THEN_EPILOGUE), ("c", Route.HOISTED)):
        decided = prepared_steps.prepared_step_route(S(backend=backend, route=route,
                                                       blas="x"))
        assert decided.route is StepRoute.PREPARED and decided.blas is None
