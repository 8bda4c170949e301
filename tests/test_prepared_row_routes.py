"""A prepared backward's row scatter (the embedding backward) runs the route
schedule/scatter_kernels decides, once per layout: a prepared torch call's backward
(runtime/torch_prepared.py) and a program backward's prepared scatter
(runtime/program_scatter.py); gradients against torch's on each route."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.runtime import program_scatter, torch_prepared
from einfuse.schedule.scatter_kernels import ScatterRoute

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")

EMBEDDING = "E[b,d] := W[idx[b], d]"


def _counting(monkeypatch, module, name):
    decided, real = [], getattr(module, name)

    def decide(*args, **kwargs):
        decided.append(real(*args, **kwargs))
        return decided[-1]
    monkeypatch.setattr(module, name, decide)
    return decided


@pytest.mark.parametrize("batch, width, route", [
    (10, 8, ScatterRoute.ADD_AT),          # few elements: np.add.at
    (64, 8, ScatterRoute.NUMPY),           # below the compiled kernel's size: sorted adds
    (512, 64, ScatterRoute.COMPILED),      # the compiled row kernel
])
def test_torch_prepared_rows_run_the_decided_route(monkeypatch, batch, width, route):
    decided = _counting(monkeypatch, torch_prepared, "prepared_rows_route")
    ran, real_rows = [], torch_prepared.scatter_rows

    def rows(target, values, where, route=None):
        ran.append(route.route)
        return real_rows(target, values, where, route=route)
    monkeypatch.setattr(torch_prepared, "scatter_rows", rows)
    rng = np.random.default_rng(3)
    kernel = ef.compile(EMBEDDING, backend="c")
    W = torch.tensor(rng.standard_normal((33, width)), requires_grad=True)
    for call in range(4):
        idx = torch.tensor(rng.integers(0, 33, batch))
        dE = torch.tensor(rng.standard_normal((batch, width)))
        got, = torch.autograd.grad(kernel(W=W, idx=idx), [W], dE)
        want, = torch.autograd.grad(W[idx], [W], dE)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert [d.route for d in decided] == [route]          # once for the layout
    assert ran == ([] if route is ScatterRoute.ADD_AT else [route] * len(ran))
    if route is not ScatterRoute.ADD_AT:
        assert len(ran) >= 3                              # every prepared backward


def test_torch_prepared_out_of_bounds_is_a_value_check():
    kernel = ef.compile(EMBEDDING, backend="c")
    W = torch.zeros((5, 4), dtype=torch.float64, requires_grad=True)
    out = kernel(W=W, idx=torch.tensor([0, 1, 2]))
    out.sum().backward()
    with pytest.raises(ef.EinfuseError, match="idx|outside|bounds"):
        kernel(W=W, idx=torch.tensor([0, 7, 2])).sum().backward()


@pytest.mark.parametrize("batch, width, route", [
    (64, 8, ScatterRoute.NUMPY), (512, 64, ScatterRoute.COMPILED)])
def test_program_rows_run_the_decided_route(monkeypatch, batch, width, route):
    decided = _counting(monkeypatch, program_scatter, "rows_route")
    program = ef.compile(f"{EMBEDDING}\nL := sum[b,d](E[b,d] * E[b,d])")
    rng = np.random.default_rng(4)
    W0 = rng.standard_normal((33, width))
    for call in range(3):
        idx = rng.integers(0, 33, batch)
        W = torch.tensor(W0, requires_grad=True)
        got, = torch.autograd.grad(program(W=W, idx=torch.tensor(idx)), [W])
        Wt = torch.tensor(W0, requires_grad=True)
        want, = torch.autograd.grad((Wt[torch.tensor(idx)] ** 2).sum(), [Wt])
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    if not decided:
        pytest.skip("this program's backward does not take the prepared row scatter")
    assert [d.route for d in decided] == [route]          # once for the signature


def test_program_flat_scatter_decides_once(monkeypatch):
    # dW[d, idx[b]] += ...: colliding positions, the element-by-element compiled add
    decided = _counting(monkeypatch, program_scatter, "flat_route")
    program = ef.compile("y[d, b] := W[d, idx[b]] * s[b]\nL := sum[d, b](y[d, b] * y[d, b])")
    rng = np.random.default_rng(7)
    for call in range(3):
        W0, s0, idx = rng.standard_normal((7, 20)), rng.standard_normal(50), \
            torch.tensor(rng.integers(0, 20, 50))
        W, s = torch.tensor(W0, requires_grad=True), torch.tensor(s0)
        got, = torch.autograd.grad(program(W=W, idx=idx, s=s), [W])
        Wt = torch.tensor(W0, requires_grad=True)
        y = Wt[:, idx] * torch.tensor(s0)
        want, = torch.autograd.grad((y * y).sum(), [Wt])
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert [d.route for d in decided] == [ScatterRoute.COMPILED]    # once, then kept
