"""The folded backward of a program (autodiff/backward_fold.py, autodiff/algebra.py):
gradient statements substituted into their one reader and rewritten to read the
forward's outputs where a forward right side divides a term.  Gradients are compared
with torch autograd of the same formula written in torch; every case that folding
must not touch (shifted reads, ranges=, mixed dtypes, inf/NaN rows) is checked too."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.autodiff.algebra import Algebra, definition_of
from einfuse.runtime.backward import backward_program
from einfuse.lang.printer import format_expr
from einfuse.analysis.spec import spec_of
from program_texts import LAYERNORM, SOFTMAX

torch = pytest.importorskip("torch")
from torch_checks import close, grads as _grads  # noqa: E402  (needs torch)

TEMPERATURE = """m[i] := max[j](X[i,j])
e[i,j] := exp((X[i,j] - m[i]) * t)
P[i,j] := e[i,j] / sum[k](e[i,k])"""
MASKED = """m[i] := max[j](X[i,j])
e[i,j] := where(M[i,j] > 0, exp(X[i,j] - m[i]), 0)
P[i,j] := e[i,j] / sum[k](e[i,k])"""


def _close(got, want, dtype):
    close(got, want, dtype, equal_nan=True)


def _backward(source, wrt, **options):
    program = ef.compile(source, **options)
    pieces = [s.source.text for s in program.statements]
    specs = [s.kernel.spec for s in program.statements]
    passed = {k: v for k, v in options.items() if k in ("ranges", "pad")}
    return backward_program(pieces, specs, program.outputs, wrt, passed)


def test_softmax_backward_reads_the_output_only():
    backward = _backward(SOFTMAX, ("X",))
    assert backward.folded is not None
    # P * (dP - sum(dP * P)): no exp, no e or m
    assert backward.folded.reads == {"P"}
    # the one-statement softmax runs as its hoisted form, this program
    hoisted = _backward("""h1[i] := max[k](X[i,k])
h2[i] := sum[k](exp(X[i,k] - h1[i]))
P[i,j] := exp(X[i,j] - h1[i]) / h2[i]""", ("X",))
    assert hoisted.folded is not None and hoisted.folded.reads == {"P"}


def test_layernorm_backward_folds_into_one_statement_for_dx():
    backward = _backward(LAYERNORM.format(n=8), ("X", "g", "b"))
    assert backward.folded is not None
    keys = [getattr(step, "key", None) for step in backward.folded.steps]
    assert "dX" in keys and not any(k and k.startswith(("dmu", "dv")) for k in keys)


# each shape and each dtype in the default run, not every pairing (the rest: -m slow)
@pytest.mark.parametrize("shape, dtype", [
    ((1, 1), torch.float32), pytest.param((1, 1), torch.float64, marks=pytest.mark.slow),
    pytest.param((5, 3), torch.float32, marks=pytest.mark.slow),
    pytest.param((5, 3), torch.float64, marks=pytest.mark.slow),
    pytest.param((40, 300), torch.float32, marks=pytest.mark.slow), ((40, 300), torch.float64)])
@pytest.mark.parametrize("case", ["temperature", "masked"])
def test_softmax_variants_equal_torch(case, shape, dtype):
    gen = torch.Generator().manual_seed(sum(shape))
    X = (torch.randn(shape, generator=gen, dtype=dtype) * 3).requires_grad_()
    seed = torch.randn(shape, generator=gen, dtype=dtype)
    if case == "temperature":
        program = ef.compile(TEMPERATURE)
        out, (dX,) = _grads(lambda X: program(X=X, t=0.7), [X], seed)
        want_out, (want,) = _grads(lambda X: torch.softmax(X * 0.7, 1), [X], seed)
    else:
        M = (torch.rand(shape, generator=gen) > 0.4).to(dtype)
        M[:, 0] = 1      # every row keeps one value
        program = ef.compile(MASKED)
        out, (dX,) = _grads(lambda X: program(X=X, M=M), [X], seed)
        want_out, (want,) = _grads(
            lambda X: torch.softmax(X.masked_fill(M == 0, -float("inf")), 1), [X], seed)
    _close(out, want_out, dtype)
    _close(dX, want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_inf_and_nan_rows_as_torch(dtype):
    X = torch.randn(4, 6, dtype=dtype)
    X[1, 2] = float("inf")          # P's row is NaN: so is its gradient
    X[2, :3] = -float("inf")        # those positions have P = 0 and gradient 0
    X[3, 4] = float("nan")
    X.requires_grad_()
    seed = torch.randn(4, 6, dtype=dtype)
    program = ef.compile(SOFTMAX)
    out, (dX,) = _grads(lambda X: program(X=X), [X], seed)
    want_out, (want,) = _grads(lambda X: torch.softmax(X, 1), [X], seed)
    _close(out, want_out, dtype)
    _close(dX, want, dtype)


def _folded_inputs():
    gen = torch.Generator().manual_seed(2)
    X = torch.randn(3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    M = (torch.rand(3, 5, generator=gen) > 0.3).double()
    M[:, 0] = 1
    return gen, X, M


def test_gradcheck_of_folded_programs():
    gen, X, M = _folded_inputs()
    for source, extra in [(TEMPERATURE, {"t": 1.3}), (MASKED, {"M": M})]:
        program = ef.compile(source)
        assert torch.autograd.gradcheck(lambda X: program(X=X, **extra), (X,))
    # the second derivative of a folded softmax; the masked one's in the slow run
    temperature = ef.compile(TEMPERATURE)
    assert torch.autograd.gradgradcheck(lambda X: temperature(X=X, t=1.3), (X,))
    g = torch.randn(5, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, generator=gen, dtype=torch.float64, requires_grad=True)
    layernorm = ef.compile(LAYERNORM.format(n=5))
    assert torch.autograd.gradcheck(lambda X, g, b: layernorm(X=X, g=g, b=b), (X, g, b))


@pytest.mark.slow
def test_gradgradcheck_of_the_masked_folded_softmax():
    _, X, M = _folded_inputs()
    masked = ef.compile(MASKED)
    assert torch.autograd.gradgradcheck(lambda X: masked(X=X, M=M), (X,))


def test_where_folding_is_not_exact_the_backward_runs_as_derived():
    gen = torch.Generator().manual_seed(4)
    # a shifted read: the gradient of X is not read at plain subscripts
    strided = ef.compile("""e[i,j] := exp(X[i,2*j])
P[i,j] := e[i,j] / sum[k](e[i,k])""")
    X = torch.randn(6, 10, generator=gen, dtype=torch.float64, requires_grad=True)
    seed = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    out, (dX,) = _grads(lambda X: strided(X=X), [X], seed)
    _, (want,) = _grads(lambda X: torch.softmax(X[:, ::2], 1), [X], seed)
    _close(dX, want, torch.float64)
    # float32 rows, a float64 weight: one statement would mix dtypes
    weighted = ef.compile(SOFTMAX.replace("P[i,j] :=", "Q[i,j] :=") +
                          "\nP[i,j] := Q[i,j] * w[j]")
    X32 = torch.randn(5, 7, generator=gen, dtype=torch.float32, requires_grad=True)
    w = torch.randn(7, generator=gen, dtype=torch.float64, requires_grad=True)
    seed = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    _, got = _grads(lambda X, w: weighted(X=X, w=w), [X32, w], seed)
    _, want = _grads(lambda X, w: torch.softmax(X.double(), 1) * w, [X32, w], seed)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-4, atol=1e-5)
    # ranges= on the program: not folded at all
    assert _backward(SOFTMAX, ("X",), ranges={"j": range(0, 3)}).folded is None


# each shape and each dtype in the default run, not every pairing (the rest: -m slow)
@pytest.mark.parametrize("shape, dtype", [
    ((1, 4), torch.float32), pytest.param((1, 4), torch.float64, marks=pytest.mark.slow),
    ((9, 2), torch.float64), pytest.param((9, 2), torch.float32, marks=pytest.mark.slow),
    ((64, 130), torch.float32), pytest.param((64, 130), torch.float64, marks=pytest.mark.slow)])
def test_layernorm_equals_torch(shape, dtype):
    rows, cols = shape
    gen = torch.Generator().manual_seed(rows + cols)
    X = torch.randn(shape, generator=gen, dtype=dtype).requires_grad_()
    g = torch.randn(cols, generator=gen, dtype=dtype).requires_grad_()
    b = torch.randn(cols, generator=gen, dtype=dtype).requires_grad_()
    seed = torch.randn(shape, generator=gen, dtype=dtype)
    program = ef.compile(LAYERNORM.format(n=cols))
    _, got = _grads(lambda X, g, b: program(X=X, g=g, b=b), [X, g, b], seed)
    # torch in float64 (torch's own float32 gradient is further off than ours at 2 columns)
    _, want = _grads(lambda X, g, b: torch.nn.functional.layer_norm(
        X, (cols,), g, b, eps=1e-5), [t.double() for t in (X, g, b)], seed.double())
    for a, w in zip(got, want):
        _close(a, w.to(dtype), dtype)


def test_row_products_are_loop_nests_not_blas():
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((50, 70)), rng.standard_normal((50, 70))
    w = rng.standard_normal(70)
    np.testing.assert_allclose(ef.ein("s[i] := A[i,k] * B[i,k]", A=A, B=B, backend="c"),
                               (A * B).sum(1), rtol=1e-12)
    np.testing.assert_allclose(ef.ein("s[i] := A[i,k] * w[k]", A=A, w=w, backend="c"),
                               A @ w, rtol=1e-12)
    text = str(ef.explain("s[i] := A[i,k] * B[i,k]", A=A, B=B, backend="c"))
    assert "BLAS" not in text


def _evaluate(expr, arrays):
    """An expression's value by NumPy broadcasting over named 2-d/1-d arrays (an
    oracle independent of einfuse's kernels): indices i, j only, sums over j2."""
    kernel = ef.compile(f"out[i, j] := {format_expr(expr)}", backend="numpy")
    return kernel(**{name: arrays[name] for name in kernel.spec.arg_order})


def test_dividing_out_keeps_the_value():
    """The algebra's rewrite of softmax's gradient reads P where e / sum(e) was, and the
    value is the same (P computed from its definition)."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((4, 6))
    m = X.max(1)
    e = np.exp(X - m[:, None])
    P = e / e.sum(1, keepdims=True)
    dP = rng.standard_normal((4, 6))
    algebra = Algebra(frozenset({"dP"}))
    definitions = [definition_of(algebra, s.output, tuple(s.output_indices), s.rhs)
                   for s in (spec_of("e[i,j] := exp(X[i,j] - m[i])"),
                             spec_of("P[i,j] := e[i,j] / sum[k](e[i,k])"))]
    gradient = spec_of("d[i,j] := (dP[i,j] / sum[k](e[i,k]) + sum[j2](-(dP[i,j2] * "
                         "e[i,j2] / sum[k](e[i,k])**2))) * exp(X[i,j] - m[i])").rhs
    rewritten = algebra.expr(algebra.divide_out(algebra.poly(gradient), definitions))
    names = {a.tensor for a in rewritten.walk() if hasattr(a, "tensor")}
    assert names == {"P", "dP"}
    arrays = dict(X=X, m=m, e=e, P=P, dP=dP)
    np.testing.assert_allclose(_evaluate(rewritten, arrays), _evaluate(gradient, arrays),
                               rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(_evaluate(rewritten, arrays),
                               P * (dP - (dP * P).sum(1, keepdims=True)), rtol=1e-12,
                               atol=1e-14)


def test_elementwise_product_is_a_loop_nest():
    rng = np.random.default_rng(2)
    A, B = rng.standard_normal((30, 40)), rng.standard_normal((30, 40))
    np.testing.assert_array_equal(ef.ein("C[i,j] := A[i,j] * B[i,j]", A=A, B=B, backend="c"),
                                  A * B)
    assert "BLAS" not in str(ef.explain("C[i,j] := A[i,j] * B[i,j]", A=A, B=B, backend="c"))
