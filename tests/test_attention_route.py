"""Where a recognised attention runs is schedule/attention_route.py's decision: the rule
over its facts, and for each route that the runner the route names is the one that runs
(counted), with values against the statements' NumPy mirror (and torch's attention for
gradients); forced fallbacks (pad=, dtype=, backend='numpy', no C compiler); explain
states the decision's reason."""

import dataclasses

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.backends.triton import backend as triton_backend
from einfuse.runtime import attention as attention_runtime
from einfuse.runtime import attention_run
from einfuse.schedule.attention_route import (AttentionFacts, AttentionRouteKind as Kind,
                                              attention_route)
from test_attention import one_by_one, program, qkv

needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
needs_triton = pytest.mark.skipif(not triton_backend.available() or
                                  not triton_backend.interpreted(),
                                  reason="needs triton under TRITON_INTERPRET=1")


def facts(**given):
    base = dict(framework="numpy", recording=False, triton=None, backend="auto",
                option=None, compiler=True)
    return AttentionFacts(**{**base, **given})


@pytest.mark.parametrize("given, kind, words", [
    ({}, Kind.C, "C kernel"),
    ({"framework": "torch"}, Kind.C, "CPU torch tensors"),
    ({"backend": "numpy"}, Kind.NUMPY, "backend='numpy'"),
    ({"compiler": False}, Kind.NUMPY, "no C compiler"),
    ({"compiler": False, "backend": "c"}, Kind.STATEMENTS, "backend's own error"),
    ({"option": "pad="}, Kind.STATEMENTS, "pad="),
    ({"option": "dtype=", "backend": "numpy"}, Kind.STATEMENTS, "dtype="),
    ({"backend": "triton"}, Kind.STATEMENTS, "backend='triton'"),
    ({"framework": "torch", "views": False}, Kind.STATEMENTS, "on a device"),
    ({"triton": "the GPU", "backend": "triton"}, Kind.TRITON, "on the GPU"),
    ({"framework": "torch", "recording": True, "triton": "the GPU"}, Kind.TRITON_RECORDED,
     "Triton backward"),
    ({"framework": "torch", "recording": True}, Kind.C_RECORDED, "fused C backward"),
    ({"framework": "torch", "recording": True, "backend": "numpy"}, Kind.STATEMENTS,
     "backend='numpy'"),
    ({"framework": "torch", "recording": True, "compiler": False}, Kind.STATEMENTS,
     "no C compiler"),
    ({"framework": "torch", "recording": True, "normalised": False, "triton": "the GPU"},
     Kind.STATEMENTS, "not divided"),
    ({"framework": "torch", "recording": True, "constants_need_grad": True},
     Kind.STATEMENTS, "gradient"),
])
def test_the_rule(given, kind, words):
    route = attention_route(facts(**given))
    assert route.kind is kind and words in route.reason
    assert route.fused == (kind is not Kind.STATEMENTS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        route.kind = Kind.C


@pytest.fixture
def ran(monkeypatch):
    """The routes the runtime was handed, and the runners that ran (by name)."""
    from einfuse.backends.triton import attention as triton_attention
    from einfuse.runtime import attention_autograd
    seen = {"routes": [], "runners": []}
    decide = attention_runtime.route_of

    def deciding(*fields):
        seen["routes"].append(decide(*fields).kind)
        return decide(*fields)
    monkeypatch.setattr(attention_runtime, "route_of", deciding)
    for module, name in ((attention_run, "run_c"), (attention_runtime, "_run_numpy"),
                         (attention_autograd, "run_recorded"),
                         (attention_autograd, "run_recorded_triton"),
                         (triton_attention, "run")):
        def counting(*args, _original=getattr(module, name), _name=name, **kwargs):
            seen["runners"].append(_name)
            return _original(*args, **kwargs)
        monkeypatch.setattr(module, name, counting)
    return seen


def check(got, Q, K, V, rtol=1e-5, atol=1e-6):
    got = got.detach().numpy() if hasattr(got, "detach") else got
    np.testing.assert_allclose(got, one_by_one(Q, K, V, 0.5), rtol=rtol, atol=atol)


@needs_c
def test_numpy_arrays_run_the_c_kernel(ran):
    Q, K, V = qkv(1, 2, 40, 40, 4, 3, np.float64)
    check(ef.ein(program(), Q=Q, K=K, V=V, scale=0.5), Q, K, V, 1e-12, 1e-13)
    assert ran == {"routes": [Kind.C], "runners": ["run_c"]}


def test_backend_numpy_runs_the_key_block_pass(ran):
    Q, K, V = qkv(1, 2, 40, 40, 4, 3, np.float64)
    check(ef.ein(program(), Q=Q, K=K, V=V, scale=0.5, backend="numpy"), Q, K, V,
          1e-12, 1e-13)
    assert ran == {"routes": [Kind.NUMPY], "runners": ["_run_numpy"]}


@pytest.mark.filterwarnings("ignore:einfuse. no C compiler")
def test_no_compiler_runs_the_key_block_pass_or_the_statements(ran, monkeypatch):
    monkeypatch.setattr(c_build, "find_compiler", lambda: None)
    Q, K, V = qkv(1, 1, 20, 20, 4, 3, np.float64)
    check(ef.ein(program(), Q=Q, K=K, V=V, scale=0.5), Q, K, V, 1e-12, 1e-13)
    assert ran == {"routes": [Kind.NUMPY], "runners": ["_run_numpy"]}
    ran["routes"].clear(), ran["runners"].clear()
    try:
        got = ef.ein(program(), Q=Q, K=K, V=V, scale=0.5, backend="c")
    except ef.EinfuseError:
        pass        # the C backend's own error
    else:           # (the statements' C kernels were built earlier in this process)
        check(got, Q, K, V, 1e-12, 1e-13)
    assert ran == {"routes": [Kind.STATEMENTS], "runners": []}


@pytest.mark.parametrize("option", [{"pad": 0.0}, {"dtype": "float64"}])
def test_a_disqualifying_option_runs_the_statements(option, ran):
    Q, K, V = qkv(1, 1, 12, 12, 3, 2, np.float32)
    check(ef.ein(program(), Q=Q, K=K, V=V, scale=0.5, **option), Q, K, V)
    assert ran == {"routes": [Kind.STATEMENTS], "runners": []}


@needs_c
def test_a_value_holding_nan_is_a_value_check_not_a_route(ran):
    Q, K, V = qkv(1, 1, 12, 12, 3, 2, np.float64)
    V[0, 0, 3, 1] = np.nan
    check(ef.ein(program(), Q=Q, K=K, V=V, scale=0.5), Q, K, V, 1e-12, 1e-13)
    # the route was the C kernel's; its finiteness check declined, the statements ran
    assert ran == {"routes": [Kind.C], "runners": ["run_c"]}


def _torch_reference(torch, tensors, out, scale=0.5):
    want = torch.nn.functional.scaled_dot_product_attention(*tensors, is_causal=True,
                                                            scale=scale)
    seed = torch.randn_like(want)
    return (torch.autograd.grad(out, tensors, seed),
            torch.autograd.grad(want, tensors, seed), want)


@needs_c
def test_a_recorded_torch_call_runs_the_c_kernel_with_its_backward(ran):
    torch = pytest.importorskip("torch")
    arrays = qkv(1, 2, 9, 9, 3, 3, np.float64)
    tensors = tuple(torch.tensor(a, requires_grad=True) for a in arrays)
    out = ef.ein(program(), Q=tensors[0], K=tensors[1], V=tensors[2], scale=0.5)
    assert ran == {"routes": [Kind.C_RECORDED], "runners": ["run_recorded", "run_c"]}
    got, want, expected = _torch_reference(torch, tensors, out)
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=1e-9,
                               atol=1e-11)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-9, atol=1e-11)


def test_a_recorded_call_on_backend_numpy_runs_the_statements(ran):
    torch = pytest.importorskip("torch")
    arrays = qkv(1, 1, 7, 7, 3, 3, np.float64)
    tensors = tuple(torch.tensor(a, requires_grad=True) for a in arrays)
    out = ef.ein(program(), Q=tensors[0], K=tensors[1], V=tensors[2], scale=0.5,
                 backend="numpy")
    assert ran == {"routes": [Kind.STATEMENTS], "runners": []}
    got, want, _ = _torch_reference(torch, tensors, out)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-9, atol=1e-11)


@needs_triton
def test_backend_triton_runs_the_triton_kernel(ran):
    Q, K, V = qkv(1, 2, 37, 37, 8, 8, np.float32)
    check(ef.ein(program(), Q=Q, K=K, V=V, scale=0.5, backend="triton"), Q, K, V,
          2e-5, 2e-6)
    assert ran == {"routes": [Kind.TRITON], "runners": ["run"]}


@needs_triton
def test_a_recorded_call_on_triton_runs_the_triton_kernels(ran):
    torch = pytest.importorskip("torch")
    arrays = qkv(1, 2, 37, 37, 8, 8, np.float32)
    tensors = tuple(torch.tensor(a, requires_grad=True) for a in arrays)
    out = ef.ein(program(), Q=tensors[0], K=tensors[1], V=tensors[2], scale=0.5,
                 backend="triton")
    assert ran["routes"] == [Kind.TRITON_RECORDED]
    assert ran["runners"] == ["run_recorded_triton", "run"]     # (its forward: the kernel)
    got, want, expected = _torch_reference(torch, tensors, out)
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=2e-5,
                               atol=2e-6)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-5)


def _explained(**options):
    shape = (1, 2, 50, 8)
    return str(ef.explain(program(), shapes={"Q": shape, "K": shape, "V": shape},
                          scale=0.5, **options))


@pytest.mark.filterwarnings("ignore:einfuse. no C compiler")     # (the patched-out one)
def test_explain_states_the_routes_reason(monkeypatch):
    for options, kind in (({}, Kind.C if c_build.find_compiler() else Kind.NUMPY),
                          ({"backend": "numpy"}, Kind.NUMPY)):
        text = _explained(**options)
        reason = attention_route(facts(backend=options.get("backend", "auto"),
                                       compiler=c_build.find_compiler() is not None))
        assert reason.kind is kind
        assert f"route (schedule/attention_route.py): {reason.reason}" in text
        assert "online softmax" in text
    assert "online softmax" not in _explained(dtype="float64")
    monkeypatch.setattr(c_build, "find_compiler", lambda: None)
    text = _explained()
    assert "attention_route.py): the NumPy key-block pass: no C compiler is found" in text
    assert "online softmax" not in _explained(backend="c")


def test_the_cached_route_is_the_rules():
    for given in ({}, {"backend": "numpy"}, {"framework": "torch", "recording": True}):
        found = facts(**given)
        from einfuse.schedule.attention_route import route_of
        assert route_of(*dataclasses.astuple(found)) == attention_route(found)


@needs_triton
def test_explain_states_the_triton_route():
    Q, K, V = qkv(1, 2, 37, 37, 8, 8, np.float32)
    text = str(ef.explain(program(), Q=Q, K=K, V=V, scale=0.5, backend="triton"))
    assert "route (schedule/attention_route.py): the fused Triton kernel, on the CPU" in text
