"""ef.derive of a program is a program (programs.md section 1): its result equals
torch autograd through the program run statement by statement, and torch's own
operators, on every backend."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.program.gradient import ProgramGradient
from einfuse.errors import NoGradientError
from program_texts import SOFTMAX

torch = pytest.importorskip("torch")


LAYERNORM = """mu[i] := mean[j](X[i,j])
v[i] := var[j](X[i,j])
Y[i,j] := (X[i,j] - mu[i]) / sqrt(v[i] + 1e-5) * g[j] + b[j]"""

MLP = """h[b,f] := relu(x[b,d] * W1[d,f] + c[f])
y[b,o] := h[b,f] * W2[f,o]
l := sum[b,o]((y[b,o] - t[b,o])**2) + 0.1 * sum[f,o](W2[f,o]**2)"""

EMBED = """E[b,d] := W[idx[b], d]
n[b] := sqrt(sum[d](E[b,d]**2))
s[b,d] := E[b,d] / n[b]"""


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def autograd(program, arrays, wrt, seeds, outputs=None):
    """The oracle: torch autograd through the program's statements."""
    tensors = {k: torch.tensor(v, requires_grad=(k == wrt)) if v.dtype.kind == "f"
               else torch.tensor(v) for k, v in arrays.items()}
    results = ef.compile(program, outputs=outputs, backend="numpy")(**tensors)
    results = results if isinstance(results, tuple) else (results,)
    total = sum((r * torch.tensor(s)).sum() for r, s in zip(results, seeds))
    total.backward()
    return tensors[wrt].grad.numpy()


CASES = [
    (SOFTMAX, {"X": rand(4, 6)}, "X", None),
    (LAYERNORM, {"X": rand(3, 7), "g": rand(7, seed=1), "b": rand(7, seed=2)}, "X", None),
    (LAYERNORM, {"X": rand(3, 7), "g": rand(7, seed=1), "b": rand(7, seed=2)}, "g", None),
    (MLP, {"x": rand(5, 3), "W1": rand(3, 4, seed=1), "c": rand(4, seed=2),
           "W2": rand(4, 2, seed=3), "t": rand(5, 2, seed=4)}, "W2", None),
    (MLP, {"x": rand(5, 3), "W1": rand(3, 4, seed=1), "c": rand(4, seed=2),
           "W2": rand(4, 2, seed=3), "t": rand(5, 2, seed=4)}, "W1", ("l", "h")),
    (EMBED, {"W": rand(6, 3), "idx": np.array([1, 4, 1, 0])}, "W", None),
    (SOFTMAX, {"X": rand(4, 6)}, "X", ("P", "m", "e")),
]


@pytest.mark.parametrize("program,arrays,wrt,outputs", CASES,
                         ids=[f"{c[0].split()[0]}-{c[2]}-{c[3]}" for c in CASES])
def test_equals_autograd_through_the_statements(backend, program, arrays, wrt, outputs):
    grad = ef.derive(program, wrt, outputs=outputs)
    assert isinstance(grad, ProgramGradient)
    forward = ef.compile(program, outputs=outputs, backend="numpy")(**arrays)
    forward = forward if isinstance(forward, tuple) else (forward,)
    seeds = [rand(*np.shape(f), seed=10 + n) for n, f in enumerate(forward)]
    named = dict(arrays, **{name: s for name, s in zip(grad.seeds, seeds)})
    got = ef.run_reference(grad, named, backend=backend)[grad.result]
    np.testing.assert_allclose(np.asarray(got), autograd(program, arrays, wrt, seeds, outputs),
                               rtol=1e-9, atol=1e-12)


def test_softmax_and_layernorm_equal_torch():
    X = rand(5, 8)
    dP = rand(5, 8, seed=3)
    got = ef.derive(SOFTMAX, "X").run({"X": X, "dP": dP})
    t = torch.tensor(X, requires_grad=True)
    (torch.softmax(t, 1) * torch.tensor(dP)).sum().backward()
    np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-10, atol=1e-14)
    g, b = np.ones(8), np.zeros(8)
    got = ef.derive(LAYERNORM, "X").run({"X": X, "g": g, "b": b, "dY": dP}, backend="c")
    t = torch.tensor(X, requires_grad=True)
    (torch.nn.functional.layer_norm(t, (8,), eps=1e-5) * torch.tensor(dP)).sum().backward()
    np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-7, atol=1e-9)


def test_the_gradient_program_reads_as_a_program():
    text = str(ef.derive(SOFTMAX, "X"))
    assert "dX[i, j] :=" in text and "de[i, j] :=" in text and "m[i] := max[j]" in text


def test_gradient_names_avoid_the_programs_names():
    program = "dX[i] := X[i] * 2\ny[i] := dX[i] + X[i]"
    grad = ef.derive(program, "X")
    assert grad.result == "ddX" and grad.seeds == ("ddy",)
    got = grad.run({"X": rand(4), "ddy": np.ones(4)})
    np.testing.assert_allclose(got, np.full(4, 3.0))


@pytest.mark.parametrize("program,wrt,message", [
    ("a[i] := Y[i] * 2\nb[i] := a[i] + 1", "X", "no output"),
    ("a[i] := X[i] * 2\nb[i] := a[i] + 1", "a", "computed by the program"),
    ("a[i] := X[i] * 2\nb[i] = a[i] + 1", "X", "':='"),
])
def test_errors(program, wrt, message):
    with pytest.raises(NoGradientError, match=message):
        ef.derive(program, wrt)


@pytest.mark.parametrize("source", ["C[i,j] := A[i,k] * B[k,j]", SOFTMAX])
@pytest.mark.parametrize("wrt", [["A"], ("X", "A"), None, 3])
def test_wrt_must_be_one_name(source, wrt):
    from einfuse.errors import EinfuseTypeError
    with pytest.raises(EinfuseTypeError, match="one input's name"):
        ef.derive(source, wrt)


def test_scalar_parameter_gradient():
    x = rand(5)
    got = ef.derive("a[i] := x[i] * s\nb := sum[i](a[i] * s)", "s").run(
        {"x": x, "s": 1.5, "db": np.array(1.0)})
    np.testing.assert_allclose(got, 2 * 1.5 * x.sum())


def test_missing_output_gradient_is_named():
    with pytest.raises(NoGradientError, match="dP"):
        ef.derive(SOFTMAX, "X").run({"X": rand(2, 3)})


def test_forward_recomputed_with_the_programs_pad_and_ranges():
    # the recomputed forward must take the program's options: without pad= and ranges=
    # T[i] := X[i+1] has one element fewer and every later gradient reads the wrong row
    program = "T[i] := X[i+1]\nY[i] := W[i] * exp(T[i])"
    X, W, dY = rand(6, seed=1), rand(6, seed=2), rand(6, seed=3)
    options = {"pad": 0.0, "ranges": {"i": range(6)}}
    shifted = np.append(X[1:], 0.0)
    got_w = ef.derive(program, "W", options=options).run({"X": X, "W": W, "dY": dY})
    np.testing.assert_allclose(got_w, dY * np.exp(shifted), rtol=1e-12)
    got_x = ef.derive(program, "X", options=options).run({"X": X, "W": W, "dY": dY})
    want_x = np.zeros(6)
    want_x[1:] = (dY * W * np.exp(shifted))[:5]
    np.testing.assert_allclose(got_x, want_x, rtol=1e-12, atol=1e-15)
