"""Every loop nest the library lowers is named by a schedule/ choice: the C loop nest by
its LoopChoice, a Triton kernel by its TritonChoice (schedule/loop_choice.py), a fusion
member by the LoopChoice it carries (schedule/fusion.Member.choice), and the
lane-packing search weighs each packing by the plan of the choice it makes
(LoopChoice.relaid).  Values against tests/oracle.py."""

import ast
import dataclasses
import pathlib

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import backend as c_backend, build as c_build, fused as c_fused
from einfuse.backends.triton import backend as triton_backend
from einfuse.plan import unit_axis
from einfuse.plan.nest_order import NestOrder
from einfuse.schedule import loop_choice as loop_choices
from einfuse.schedule.cache_key import CacheKind
from einfuse.schedule.schedule import LoopChoice, TritonChoice
from oracle import brute_force

needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
needs_triton = pytest.mark.skipif(not triton_backend.available(), reason="no Triton")
SRC = pathlib.Path(__file__).resolve().parent.parent / "src" / "einfuse"
rng = np.random.default_rng(46)


def oracle(statement, call, arrays):
    ranges = {name: call.bounds.range_map[name] for name in call.spec.all_indices}
    return brute_force(statement, ranges, arrays)


def test_every_lowering_in_the_package_is_handed_its_nest():
    # plan/lower.plan_for works a nest out itself only where none is passed (a test
    # probing the lowering): every call in the package passes the schedule's
    calls = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        imported = any(isinstance(node, ast.ImportFrom) and node.module is not None and
                       node.module.lstrip(".") in ("plan", "plan.lower", "lower") and
                       any(alias.name == "plan_for" for alias in node.names)
                       for node in ast.walk(tree))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id == "plan_for" and imported:
                calls.append((path.name, {k.arg for k in node.keywords}))
    assert calls, "plan_for is called somewhere"
    assert all("nest" in keywords for _, keywords in calls), calls


@needs_triton
def test_the_triton_backend_lowers_the_nest_its_choice_names(monkeypatch):
    statement = "y[i,j] := x[i,j] * 2 + z[j,i]"
    arrays = {"x": rng.standard_normal((5, 7)).astype(np.float32),
              "z": rng.standard_normal((7, 5)).astype(np.float32)}
    chosen = loop_choices.triton_choice
    compiled = triton_backend._compiled
    dictated, seen = [], []

    def reversed_choice(call, layouts, bounds):
        choice = chosen(call, layouts, bounds)
        nest = NestOrder(tuple(reversed(choice.nest.order)), choice.nest.tiled,
                         choice.nest.rows)
        dictated.append(dataclasses.replace(choice, nest=nest))
        return dictated[-1]

    def spy(choice, dtypes, native_dot):
        seen.append(choice)
        return compiled(choice, dtypes, native_dot)
    monkeypatch.setattr(triton_backend, "triton_choice", reversed_choice)
    monkeypatch.setattr(triton_backend, "_compiled", spy)
    kernel = ef.compile(statement, backend="triton")
    call = kernel.bind(**arrays)
    got = np.asarray(kernel(**arrays))
    assert dictated and seen and seen[-1] == dictated[-1]
    assert isinstance(seen[-1], TritonChoice)
    default = chosen(call, dictated[-1].layouts, dictated[-1].bounds)
    assert default.nest != dictated[-1].nest
    assert dictated[-1].plan().program != default.plan().program
    np.testing.assert_allclose(got, oracle(statement, call, arrays), rtol=1e-6)


@needs_c
def test_fusion_members_carry_the_choice_their_plan_lowers(monkeypatch):
    program = """a[i,j] := X[i,j] * 2 + G[j]
                 b[i,j] := exp(a[i,j]) - X[i,j]"""
    X, G = rng.standard_normal((70, 90)), rng.standard_normal(90)
    groups = []
    run = c_fused.run

    def spy(members, thread_rows=frozenset()):
        groups.append(list(members))
        return run(members, thread_rows)
    monkeypatch.setattr(c_fused, "run", spy)
    monkeypatch.setattr(c_fused, "_fused", {})
    out = ef.compile(program, backend="c")(X=X, G=G)
    result = out["b"] if isinstance(out, dict) else out
    np.testing.assert_allclose(result, np.exp(X * 2 + G) - X, rtol=1e-12)
    assert groups and len(groups[0]) == 2
    for member in groups[0]:
        layouts = [unit_axis(b) for b in member.buffers]
        assert isinstance(member.choice, LoopChoice)
        assert member.choice == loop_choices.loop_choice(member.call, layouts)
        assert member.plan is member.choice.plan()
    keys = [key for key in c_fused._fused if key.kind is CacheKind.FUSED_GROUP]
    assert len(keys) == 1
    assert keys[0].value[:2] == tuple(member.choice for member in groups[0])


@needs_c
def test_the_lane_packing_search_weighs_the_schedules_choices(monkeypatch):
    # cdist: y[j, d] read along j keeps a lane tile off j unless y is packed
    # (plan/lane_layout.py): the search asks the schedule's choice for each layout
    statement = "D[i,j] := sum[d]((x[i,d] - y[j,d])**2)"
    # (work enough for a packing to pay, plan/lane_layout.MIN_WORK)
    arrays = {"x": rng.standard_normal((1024, 3)), "y": rng.standard_normal((128, 3))}
    asked = []
    relaid = LoopChoice.relaid

    def spy(self, layouts):
        asked.append(tuple(layouts))
        return relaid(self, layouts)
    monkeypatch.setattr(LoopChoice, "relaid", spy)
    monkeypatch.setattr(c_backend, "_kernels", {})
    kernel = ef.compile(statement, backend="c")
    call = kernel.bind(**arrays)
    loops = loop_choices.loop_schedule(call)
    assert asked and loops.choice.layouts in asked
    assert loops.packs and loops.choice.layouts != loops.given
    x, y = arrays["x"], arrays["y"]
    np.testing.assert_allclose(kernel(**arrays), ((x[:, None] - y[None]) ** 2).sum(-1),
                               rtol=1e-12)
