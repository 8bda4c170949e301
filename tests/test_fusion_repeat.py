"""The prepared run of a program (schedule/fusion.py): a repeated call with the same
signature goes straight to the fused kernels.  Results must stay those of the full
path whatever changes between calls: the data, the layouts, scalar values, the
statement's dtype."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.runtime.signatures import signature_of
from program_texts import SOFTMAX

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="fusion runs C kernels")

LAYERNORM = """mu[i] := sum[j](X[i,j]) / N
v[i] := sum[j]((X[i,j] - mu[i])**2) / N
y[i,j] := (X[i,j] - mu[i]) / sqrt(v[i] + eps) * g[j] + b[j]"""


def softmax(X):
    e = np.exp(X - X.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def layernorm(X, g, b, eps):
    mu = X.mean(1, keepdims=True)
    return (X - mu) / np.sqrt(((X - mu) ** 2).mean(1, keepdims=True) + eps) * g + b


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_repeated_calls_with_new_data(full_runs, dtype):
    program = ef.compile(SOFTMAX)
    rng = np.random.default_rng(1)
    for _ in range(4):
        X = rng.standard_normal((80, 70)).astype(dtype)
        np.testing.assert_allclose(program(X=X), softmax(X), rtol=1e-5 if dtype == np.float32
                                   else 1e-12, atol=1e-7)
    assert full_runs == [4]       # grouped once, then prepared


def test_results_are_fresh_arrays():
    program = ef.compile(SOFTMAX)
    X = np.random.default_rng(2).standard_normal((64, 90))
    first = program(X=X)
    kept = first.copy()
    second = program(X=X[::-1].copy())
    assert second is not first and not np.shares_memory(first, second)
    np.testing.assert_array_equal(first, kept)
    np.testing.assert_allclose(second, softmax(X[::-1]), rtol=1e-12)


def test_new_layouts_take_the_full_path_again(full_runs):
    program = ef.compile(SOFTMAX)
    wide = np.random.default_rng(3).standard_normal((61, 130))  # shapes no other test uses
    view = wide[:, :90]       # rows 130 apart
    for X in (view.copy(), view, view.copy(), view, wide[:, 20:110]):
        np.testing.assert_allclose(program(X=X), softmax(X), rtol=1e-12)
    # contiguous rows and rows 130 apart: two signatures, each grouped once (softmax and
    # its hoisted row sum: four members)
    assert full_runs == [4, 4]


def test_a_step_refuses_arrays_of_another_layout():
    program = ef.compile(SOFTMAX)
    X = np.random.default_rng(4).standard_normal((64, 90))
    program(X=X)
    # prepared runs are kept by (call signature, names kept)
    prepared = next(run for (signature, _), run in program._runs.items()
                    if signature == signature_of({"X": X}))
    env = {"X": np.asfortranarray(X)}
    assert prepared.steps[0].run(env) is False and set(env) == {"X"}
    env = {"X": X.copy()}
    assert prepared.steps[0].run(env) is True
    np.testing.assert_allclose(env["P"], softmax(X), rtol=1e-12)


def test_scalar_parameters_change_between_calls():
    program = ef.compile(LAYERNORM)
    rng = np.random.default_rng(5)
    X, g, b = rng.standard_normal((64, 90)), rng.standard_normal(90), rng.standard_normal(90)
    for eps in (1e-5, 0.5, 3.0):
        np.testing.assert_allclose(program(X=X, g=g, b=b, N=90.0, eps=eps),
                                   layernorm(X, g, b, eps), rtol=1e-10)
    np.testing.assert_allclose(program(X=X, g=g, b=b, N=45.0, eps=0.5),
                               _layernorm_with_count(X, g, b, 0.5, 45.0), rtol=1e-10)


def _layernorm_with_count(X, g, b, eps, N):
    mu = X.sum(1, keepdims=True) / N
    v = ((X - mu) ** 2).sum(1, keepdims=True) / N
    return (X - mu) / np.sqrt(v + eps) * g + b


def test_inputs_converted_to_the_working_dtype():
    program = ef.compile(SOFTMAX, dtype="float32")
    X = np.random.default_rng(6).standard_normal((64, 90))
    for _ in range(3):
        out = program(X=X)
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, softmax(X.astype(np.float32)), rtol=2e-6)


def test_statement_in_hoisted_form_repeats():
    statement = ef.compile("P[i,j] := exp(X[i,j] - max[k](X[i,k])) / "
                           "sum[k](exp(X[i,k] - max[l](X[i,l])))")
    rng = np.random.default_rng(7)
    for _ in range(3):
        X = rng.standard_normal((100, 80))
        np.testing.assert_allclose(statement(X=X), softmax(X), rtol=1e-12)


def test_program_writing_into_a_given_array_repeats():
    program = ef.compile("""m[i] := max[j](X[i,j])
e[i,j] := exp(X[i,j] - m[i])
S[i] += sum[j](e[i,j])""")
    rng = np.random.default_rng(8)
    X = rng.standard_normal((70, 90))
    S = np.ones(70)
    for _ in range(3):
        program(X=X, S=S)
    expected = 1 + 3 * np.exp(X - X.max(1, keepdims=True)).sum(1)
    np.testing.assert_allclose(S, expected, rtol=1e-12)


def test_statement_softmax_computes_its_exponential_once():
    """The single-statement softmax's hoisted form reads one row of exp(X - max) in the
    row sum and the result (runtime/hoisted.py, autodiff/cse.py): same results."""
    statement = ef.compile("P[i,j] := exp(X[i,j] - max[k](X[i,k])) / "
                           "sum[k](exp(X[i,k] - max[l](X[i,l])))")
    rng = np.random.default_rng(9)
    for dtype in (np.float64, np.float32):
        X = (rng.standard_normal((130, 70)) * 5).astype(dtype)
        for _ in range(2):
            np.testing.assert_allclose(statement(X=X), softmax(X.astype(np.float64)),
                                       rtol=1e-12 if dtype == np.float64 else 2e-6,
                                       atol=1e-30)
    form = statement.hoisted_form
    assert any("cse_" in k.statement for kernels in form._chosen.values() for k in kernels)


def test_shared_row_is_not_used_where_the_ranges_differ():
    text = ("P[i,j] := exp(X[i,j] - max[k](X[i,k])) / "
            "sum[k](exp(X[i,k] - max[l](X[i,l])))")
    rng = np.random.default_rng(10)
    X = rng.standard_normal((90, 60))
    statement = ef.compile(text, ranges={"j": range(3, 17)})
    e = np.exp(X - X.max(1, keepdims=True))
    expected = (e / e.sum(1, keepdims=True))[:, 3:17]
    for _ in range(2):
        np.testing.assert_allclose(statement(X=X), expected, rtol=1e-12)
    form = statement.hoisted_form
    assert any(found is not None for found in form._shared.values())   # built, then
    assert not any("cse_" in k.statement for kernels in form._chosen.values()  # refused
                   for k in kernels)
