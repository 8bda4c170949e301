"""Programs (programs.md section 1): several statements, intermediates, outputs=; the
result equals running the statements one by one, on every backend, and gradients flow
through PyTorch autograd and JAX."""

import numpy as np
import pytest

import einfuse as ef

rng = np.random.default_rng(0)
X = rng.standard_normal((5, 7))

SOFTMAX = """
    m[i]   := max[j](X[i,j])        # the row maximum
    e[i,j] := exp(X[i,j] - m[i])
    P[i,j] := e[i,j] / sum[k](e[i,k])
"""


def softmax(X):
    e = np.exp(X - X.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def layernorm(x, g, b):
    mu = x.mean(1, keepdims=True)
    var = ((x - mu) ** 2).mean(1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + b


CASES = [
    ("softmax", SOFTMAX, {"X": X}, softmax),
    ("log-softmax + NLL",
     "z[i] := logsumexp[j](X[i,j]); loss := -sum[i](X[i, t[i]] - z[i]) / 5",
     {"X": X, "t": np.array([0, 6, 2, 2, 1])},
     lambda X, t: -(X[np.arange(5), t] - np.log(np.exp(X).sum(1))).sum() / 5),
    ("layernorm",
     """mu[i] := sum[j](x[i,j]) / 7
        v[i] := sum[j]((x[i,j] - mu[i])**2) / 7
        y[i,j] := (x[i,j] - mu[i]) / sqrt(v[i] + 0.00001) * g[j] + b[j]""",
     {"x": X, "g": rng.standard_normal(7), "b": rng.standard_normal(7)}, layernorm),
    ("conv then stride-2 pooling, an intermediate read at affine positions",
     "h[i] := x[i+a] * k[a]; y[i] := max(h[2*i], h[2*i+1])",
     {"x": rng.standard_normal(12), "k": rng.standard_normal(3)},
     lambda x, k: (lambda h: np.maximum(h[0:10:2], h[1:10:2]))(np.convolve(x, k[::-1], "valid"))),
    ("a gathered intermediate",
     "E[b,d] := W[idx[b], d] * 2; s[b] := sum[d](E[b,d] * E[b,d])",
     {"W": rng.standard_normal((6, 3)), "idx": np.array([5, 0, 5])},
     lambda W, idx: ((2 * W[idx]) ** 2).sum(1)),
    ("a scalar intermediate read bare and with []",
     "s := sum[i](x[i]); y[i] := x[i] / s; z[i] := y[i] + s[] * 0",
     {"x": np.arange(1.0, 5.0)}, lambda x: x / x.sum()),
    ("a linear layer with bias and relu",
     "h[b,o] := sum[i](x[b,i] * W[i,o]) + bias[o]; y[b,o] := relu(h[b,o])",
     {"x": rng.standard_normal((4, 6)), "W": rng.standard_normal((6, 3)),
      "bias": rng.standard_normal(3)},
     lambda x, W, bias: np.maximum(x @ W + bias, 0)),
]


@pytest.mark.parametrize("name, source, arrays, reference", CASES, ids=[c[0] for c in CASES])
def test_programs_match_numpy(backend, name, source, arrays, reference):
    got = ef.ein(source, backend=backend, **arrays)
    np.testing.assert_allclose(got, reference(**arrays), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name, source, arrays, reference", CASES, ids=[c[0] for c in CASES])
def test_a_program_equals_its_statements_run_one_by_one(name, source, arrays, reference):
    program = ef.compile(source)
    env = dict(arrays)
    for statement in program.statements:
        env[statement.output] = ef.ein(statement.source.text, arrays={
            n: env[n] for n in statement.reads})
    np.testing.assert_array_equal(program(**arrays), env[program.outputs[-1]])


def test_separators_comments_and_statements_spanning_lines():
    source = "a[i] := x[i] * 2;  # twice\n\n b[i] := (a[i] +\n  x[i]) ; c[i] := sum[j](\n a[j]) - b[i]"
    x = np.arange(4.0)
    np.testing.assert_allclose(ef.ein(source, x=x), (2 * x).sum() - 3 * x)


def test_a_statement_continues_after_an_operator_and_an_incomplete_one_is_an_error():
    x = np.arange(3.0)
    np.testing.assert_allclose(ef.ein("y[i] :=\n  x[i] *\n  2", x=x), 2 * x)
    with pytest.raises(ef.EinfuseError, match="expected ':=', '=' or '\\+='") as info:
        ef.compile("y[i] := x[i]; z")
    assert str(info.value).splitlines()[1].strip() == "z"


def test_outputs_choose_and_order_the_results():
    x = np.arange(1.0, 4.0)
    y, s = ef.ein("s := sum[i](x[i]); y[i] := x[i] / s", x=x, outputs=("y", "s"))
    np.testing.assert_allclose(y, x / 6) and np.testing.assert_allclose(s, 6.0)
    assert ef.compile("a[i] := x[i]; b[i] := a[i]; c[i] := a[i]").outputs == ("b", "c")
    only = ef.ein("a[i] := x[i] + 1", x=x, outputs="a")
    np.testing.assert_allclose(only, x + 1)
    prog = ef.compile(SOFTMAX)
    assert prog.inputs == ("X",) and prog.intermediates == ("m", "e", "P")
    np.testing.assert_allclose(prog(X), softmax(X))   # inputs positionally too


def test_assignments_write_into_arrays_passed_by_name():
    x, out = np.arange(3.0), np.ones(3)
    result = ef.ein("a[i] := 2 * x[i]; out[i] += a[i]", x=x, out=out)
    assert result is out and out.tolist() == [1.0, 3.0, 5.0]


@pytest.mark.parametrize("source, message", [
    ("a[i] := x[i]; a[i] := 2 * x[i]", "a is defined twice"),
    ("y[i] := a[i]; a[i] := x[i]", "defined later, by statement 2"),
    ("a[i] := x[i]; a[i] = x[i]", "intermediate defined by statement 1"),
])
def test_names_are_checked_when_compiling(source, message):
    with pytest.raises(ef.EinfuseError, match=message):
        ef.compile(source)


def test_calls_and_options_are_checked():
    prog = ef.compile("a[i] := x[i] * 2; b[i] := a[i] + 1")
    with pytest.raises(ef.EinfuseError, match="computed by the program"):
        prog(x=np.ones(2), a=np.ones(2))
    with pytest.raises(ef.EinfuseError, match="needs x"):
        prog()
    with pytest.raises(ef.EinfuseError, match="no input z"):
        prog(x=np.ones(2), z=1)
    with pytest.raises(ef.EinfuseError, match="which no statement of the program defines"):
        ef.compile("a[i] := x[i]; b[i] := a[i]", outputs=("x",))
    with pytest.raises(ef.EinfuseError, match="no statement of the program uses"):
        ef.compile("a[i] := x[i]; b[i] := a[i]", ranges={"q": 3})
    with pytest.raises(ef.EinfuseError) as info:   # a statement's own error points into it
        ef.ein("a[i] := x[i]; b[i] := a[i] * y[i, i]", x=np.ones(3), y=np.ones(4))
    assert "b[i] := a[i] * y[i, i]" in str(info.value)


def test_ranges_apply_to_the_statements_that_use_the_index():
    x = np.arange(10.0)
    got = ef.ein("h[i] := x[i] * 2; y[j] := h[j] + 1", x=x, ranges={"i": 4})
    np.testing.assert_allclose(got, 2 * x[:4] + 1)


def test_explain_a_program_shows_materialised_intermediates():
    text = str(ef.explain(SOFTMAX, shapes={"X": (256, 1024)}))
    from einfuse.backends.c import build as c_build
    assert "m  float32 256  1.02 kB  read by statement 2" in text
    if c_build.find_compiler() is not None:     # the C backend fuses the three statements
        assert "kernel 1: statements 1, 2, 3 (fused" in text
        assert "e  float32 256x1024  4.10 kB per thread instead of 1.05 MB" in text
    else:
        assert "3 kernels, in order" in text
        assert "e  float32 256x1024  1.05 MB  read by statement 3" in text
    assert text.count("-- statement") == 3
    assert "pass arrays or shapes=" in str(ef.explain(SOFTMAX))


# -- gradients through programs -------------------------------------------------------------
def test_torch_autograd_through_a_program(backend):
    torch = pytest.importorskip("torch")
    prog = ef.compile("""mu[i] := sum[j](x[i,j]) / 7
        v[i] := sum[j]((x[i,j] - mu[i])**2) / 7
        y[i,j] := (x[i,j] - mu[i]) / sqrt(v[i] + 0.00001) * g[j]""", backend=backend)
    x = torch.tensor(X, requires_grad=True)
    g = torch.tensor(rng.standard_normal(7), requires_grad=True)
    torch.autograd.gradcheck(lambda x, g: prog(x=x, g=g), (x, g))


def test_jax_grad_jit_and_vmap_through_a_program():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    prog = ef.compile(SOFTMAX)
    Xj = jnp.asarray(X, jnp.float32)
    np.testing.assert_allclose(jax.jit(prog)(Xj), jax.nn.softmax(Xj, axis=1), rtol=1e-5)
    w = jnp.arange(7.0)
    got = jax.grad(lambda X: (prog(X=X) * w).sum())(Xj)
    want = jax.grad(lambda X: (jax.nn.softmax(X, axis=1) * w).sum())(Xj)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    batched = jax.vmap(prog)(jnp.stack([Xj, 2 * Xj]))
    np.testing.assert_allclose(batched[1], jax.nn.softmax(2 * Xj, axis=1), rtol=1e-5)


def test_the_readme_program_example_runs():
    import os
    import re
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    section = readme.split("## Programs", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope = {"ef": ef, "X": X, "x": X}
    exec(code, scope)
    np.testing.assert_allclose(scope["P"], softmax(X))
    np.testing.assert_allclose(scope["mu"], X.mean(1))
    np.testing.assert_allclose(scope["y"], X - X.mean(1, keepdims=True))


def test_derive_of_a_program_is_a_program():
    grad = ef.derive("a[i] := x[i] * 2; b[i] := a[i]**2", "x")
    x = np.arange(3.0)
    np.testing.assert_allclose(grad.run({"x": x, "db": np.ones(3)}), 8 * x)


def test_explain_of_a_program_on_torch_tensors():
    """(a torch tensor's ``size`` is a method: the fusion planner sized arrays by it)"""
    torch = pytest.importorskip("torch")
    text = ("S[i,j] := X[i,j] - max[k](X[i,k])\nE[i,j] := exp(S[i,j])\n"
            "P[i,j] := E[i,j] / sum[k](E[i,k])")
    shown = str(ef.explain(text, X=torch.randn(300, 200)))
    assert "P[i,j] := E[i,j] / sum[k](E[i,k])" in shown and "kernel" in shown


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_explain_of_a_program_whose_statement_reads_an_input_and_an_intermediate(
        framework, backend):
    """Statement 2 reads the input X and the intermediate m: m's placeholder is of X's
    framework (it was a NumPy array beside a torch X: a mixed-frameworks error)."""
    module = pytest.importorskip(framework)
    X = np.random.default_rng(0).standard_normal((40, 30)).astype(np.float32)
    X = torch_from(X) if framework == "torch" else module.numpy.asarray(X)
    shown = str(ef.explain(SOFTMAX, X=X, backend=backend))
    # (on the Triton backend the whole softmax is one kernel: nothing is materialised)
    assert "e[i,j] := exp(X[i,j] - m[i])" in shown and (
        "materialised" in shown or "kept as one row per thread" in shown)
    gradients = str(ef.explain(SOFTMAX, X=X, backend=backend, gradients=True))
    assert "dX" in gradients


def torch_from(array):
    import torch
    return torch.from_numpy(array)


def test_explain_of_a_program_takes_the_names_a_call_takes():
    """A missing or unknown input is the call's error (a missing one was a KeyError)."""
    layernorm = ("mu[i] := sum[j](X[i,j]) / 5\nv[i] := sum[j]((X[i,j] - mu[i])**2) / 5\n"
                 "y[i,j] := (X[i,j] - mu[i]) / sqrt(v[i] + 0.00001) * g[j] + b[j]")
    from einfuse import errors
    X = np.ones((4, 5), np.float32)
    for given, error in (({"X": X}, errors.MissingArgumentError),
                         ({"X": X, "g": X[0], "b": X[0], "Y": X}, errors.UnexpectedArgumentError)):
        with pytest.raises(error) as explained:
            ef.explain(layernorm, **given)
        with pytest.raises(error) as called:
            ef.ein(layernorm, **given)
        assert str(explained.value).splitlines()[0] == str(called.value).splitlines()[0]
    assert "y[i,j]" in str(ef.explain(layernorm, X=X, shapes={"g": (5,), "b": (5,)}))


def test_explain_with_an_empty_axis():
    """No bytes move: the arithmetic intensity is undefined, not a crash in str()."""
    empty = np.zeros((0, 5), np.float32)
    assert "no bytes moved" in str(ef.explain("y[i] := x[i] * 2", x=np.zeros(0)))
    text = str(ef.explain(SOFTMAX, X=empty))
    assert "no bytes moved" in text and "P[i,j]" in text
    assert ef.ein(SOFTMAX, X=empty).shape == (0, 5)


def test_explain_of_attention_for_a_jax_caller_says_what_the_call_runs():
    """The fused attention runs for NumPy and torch callers; a JAX caller's program runs
    statement by statement, and explain says so (it showed the fused kernel)."""
    jnp = pytest.importorskip("jax.numpy")
    text = ("S[b,i,j] := sum[d](Q[b,i,d]*K[b,j,d]) * 0.25\nm[b,i] := max[j](S[b,i,j])\n"
            "P[b,i,j] := exp(S[b,i,j] - m[b,i])\n"
            "O[b,i,d] := sum[j](P[b,i,j]*V[b,j,d]) / sum[j](P[b,i,j])")
    Q = np.random.default_rng(0).standard_normal((2, 6, 4)).astype(np.float32)
    assert "fused as attention" in str(ef.explain(text, Q=Q, K=Q, V=Q))
    shown = str(ef.explain(text, Q=jnp.asarray(Q), K=jnp.asarray(Q), V=jnp.asarray(Q)))
    assert "fused as attention" not in shown and "4 kernels" in shown


def test_explain_of_attention_for_a_torch_caller_names_the_fused_kernel_it_runs(monkeypatch):
    """CPU torch tensors run the fused attention (on NumPy views of themselves); explain
    said "4 kernels" for them (it asked for NumPy arrays)."""
    torch = pytest.importorskip("torch")
    from einfuse.runtime import attention_run
    text = ("S[b,i,j] := sum[d](Q[b,i,d]*K[b,j,d]) * 0.25\nm[b,i] := max[j](S[b,i,j])\n"
            "P[b,i,j] := exp(S[b,i,j] - m[b,i])\n"
            "O[b,i,d] := sum[j](P[b,i,j]*V[b,j,d]) / sum[j](P[b,i,j])")
    Q = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 6, 4)).astype(np.float32))
    assert "fused as attention" in str(ef.explain(text, Q=Q, K=Q, V=Q, backend="c"))
    ran = []
    run_c = attention_run.run_c
    monkeypatch.setattr(attention_run, "run_c", lambda *a, **k: ran.append(1) or run_c(*a, **k))
    ef.ein(text, Q=Q, K=Q, V=Q, backend="c")
    assert ran
    half = Q.to(torch.bfloat16)      # (no fused kernel for bfloat16: nor does explain say one)
    assert "fused as attention" not in str(ef.explain(text, Q=half, K=half, V=half,
                                                      backend="c"))


def test_explain_of_an_intermediate_larger_than_an_array_names_it():
    """A 2**31 x 2**31 outer product cannot be an array: explain names it (it was a raw
    NumPy ValueError from planning the fused group)."""
    from einfuse import errors
    with pytest.raises(errors.ShapeError, match="t would have shape"):
        # (t read twice: a t read once inside the sum is computed there, no array at
        # all; `t * t` is read once, as the canonical `t**2`)
        ef.explain("t[i,j] := a[i]*b[j]\ns := sum[i,j](t[i,j] * exp(t[i,j]))",
                   shapes={"a": (2**31,), "b": (2**31,)})
