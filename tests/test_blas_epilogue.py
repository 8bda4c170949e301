"""A contraction under elementwise work (plan/contraction_epilogue.py): the schedule
chooses Route.BLAS_THEN_EPILOGUE on the C backend, BLAS computes the product (with a
broadcast term added: addmm) and one compiled pass the epilogue; values against the
oracle and torch, gradients against torch autograd (gradcheck in float64), equal
spellings get equal schedules, explain names the route, and the gradient's products
reach BLAS too."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.analysis.spec import spec_of
from einfuse.backends.c import blas as c_blas, build as c_build
from einfuse.plan.contraction_epilogue import epilogue_program, split_epilogue
from einfuse.schedule.choose import choose
from einfuse.schedule.schedule import Reason, Route
from oracle import brute_force

torch = pytest.importorskip("torch")
needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
rng = np.random.default_rng(32)

C_OI = "sum[i](x[b,i]*W[o,i])"          # a Linear layer's weight as torch keeps it
GELU = "0.5*({z})*(1+erf(({z})*0.7071067811865476))"

# (statement, its torch twin on (x, W as (o, i), bias as (o,)), the weight's shape)
CASES = [
    (f"y[b,o] := max({C_OI} + bias[o], 0)",
     lambda x, W, bias: torch.relu(torch.addmm(bias, x, W.T))),
    (f"y[b,o] := relu(bias[o] + {C_OI})",
     lambda x, W, bias: torch.relu(x @ W.T + bias)),
    (f"y[b,o] := where({C_OI} + bias[o] > 0, {C_OI} + bias[o], 0)",
     lambda x, W, bias: torch.relu(x @ W.T + bias)),
    ("y[b,o] := " + GELU.format(z=f"{C_OI} + bias[o]"),
     lambda x, W, bias: torch.nn.functional.gelu(x @ W.T + bias)),
    ("y[b,o] := tanh(sum[i](W[o,i]*x[b,i])) * bias[o]",     # operands swapped
     lambda x, W, bias: torch.tanh(x @ W.T) * bias),
    (f"y[b,o] := sigmoid({C_OI} - bias[o])",
     lambda x, W, bias: torch.sigmoid(x @ W.T - bias)),
    (f"y[b,o] := 0.125 * {C_OI}",                            # a scale (attention's)
     lambda x, W, bias: 0.125 * (x @ W.T)),
]


def _inputs(dtype, b=5, i=7, o=6):
    return {"x": rng.standard_normal((b, i)).astype(dtype),
            "W": rng.standard_normal((o, i)).astype(dtype),
            "bias": rng.standard_normal(o).astype(dtype)}


def _route(kernel, **arrays):
    return choose(kernel, kernel.bind(**arrays))


@needs_c
@pytest.mark.parametrize("dtype", [pytest.param(np.float32, marks=pytest.mark.slow),
                                   np.float64])
@pytest.mark.parametrize("statement, twin", CASES)
def test_values_match_the_oracle_and_torch(statement, twin, dtype):
    arrays = _inputs(dtype)
    if "bias" not in statement:
        arrays.pop("bias")
    kernel = ef.compile(statement, backend="c")
    schedule = _route(kernel, **arrays)
    assert schedule.route is Route.BLAS_THEN_EPILOGUE
    assert Reason.PRODUCT in [m.reason for m in schedule.materialised]
    call = kernel.bind(**arrays)
    expected = brute_force(statement, {n: call.bounds.range_map[n]
                                       for n in call.spec.all_indices}, arrays)
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-12)
    tensors = {n: torch.from_numpy(a) for n, a in arrays.items()}
    for _ in range(2):     # the first call and the prepared repeat, NumPy and torch
        got = kernel(**arrays)
        assert got.dtype == dtype
        np.testing.assert_allclose(got, expected, **tol)
        np.testing.assert_allclose(kernel(**tensors).numpy(), expected, **tol)
    full = dict(tensors, bias=tensors.get("bias", torch.zeros(6, dtype=tensors["x"].dtype)))
    np.testing.assert_allclose(kernel(**tensors).numpy(), twin(**full).numpy(), **tol)


@needs_c
def test_transposed_weight_and_bias_along_the_batch():
    arrays = {"x": rng.standard_normal((4, 6)), "W": rng.standard_normal((6, 3)),
              "c": rng.standard_normal(4)}
    statement = "y[b,o] := exp(-abs(sum[i](x[b,i]*W[i,o]) + c[b]))"
    kernel = ef.compile(statement, backend="c")
    assert _route(kernel, **arrays).route is Route.BLAS_THEN_EPILOGUE
    expected = np.exp(-np.abs(arrays["x"] @ arrays["W"] + arrays["c"][:, None]))
    np.testing.assert_allclose(kernel(**arrays), expected, rtol=1e-12)
    # the output transposed: the product's grid is (b, o), the result's (o, b)
    flipped = ef.compile("y[o,b] := max(sum[i](x[b,i]*W[i,o]) + c[b], 0)", backend="c")
    assert _route(flipped, **arrays).route is Route.BLAS_THEN_EPILOGUE
    np.testing.assert_allclose(flipped(**arrays),
                               np.maximum(arrays["x"] @ arrays["W"] + arrays["c"][:, None],
                                          0).T, rtol=1e-12)


@needs_c
def test_a_program_of_two_keeps_the_blas_route():
    """The contraction written into an intermediate, consumed elementwise: the program's
    fusion leaves the product on BLAS; the same values as the one-statement spelling."""
    arrays = _inputs(np.float64)
    program = ef.compile(f"h[b,o] := {C_OI} + bias[o]\ny[b,o] := max(h[b,o], 0)",
                         outputs=("y",), backend="c")
    statement = ef.compile(f"y[b,o] := max({C_OI} + bias[o], 0)", backend="c")
    np.testing.assert_allclose(program(**arrays), statement(**arrays), rtol=1e-13)
    first = program.statements[0].kernel
    bound = first.bind(**arrays)
    assert choose(first, bound).route is Route.BLAS_THEN_ADDEND


@needs_c
def test_an_epilogue_statement_inside_a_program_runs_its_product_on_blas(monkeypatch):
    products = []
    original = c_blas.addend_runner

    def counting(found, call, route=c_blas.NUMPY_BLAS):
        products.append(call.spec.output)
        return original(found, call, route)
    from einfuse.backends.c import repeat as c_repeat
    monkeypatch.setattr(c_repeat, "addend_runner", counting)
    arrays = dict(_inputs(np.float64), V=rng.standard_normal((3, 6)))
    program = ef.compile(f"h[b,o] := max({C_OI} + bias[o], 0)\n"
                         "y[b,p] := sum[o](h[b,o]*V[p,o])", outputs=("y",), backend="c")
    expected = np.maximum(arrays["x"] @ arrays["W"].T + arrays["bias"], 0) @ arrays["V"].T
    np.testing.assert_allclose(program(**arrays), expected, rtol=1e-12)
    assert products == ["p1"]


@needs_c
def test_equal_spellings_get_equal_schedules():
    arrays = _inputs(np.float64)
    one, spaced = (_route(ef.compile(s, backend="c"), **arrays) for s in (
        f"y[b,o] := max({C_OI} + bias[o], 0)", f"y[b,o]:=max({C_OI}+bias[o],0)"))
    assert one == spaced and hash(one) == hash(spaced)
    # the reduced index renamed, the term on the other side: the same products
    for other in ("y[b,o] := max(sum[k](x[b,k]*W[o,k]) + bias[o], 0)",
                  f"y[b,o] := max(bias[o] + {C_OI}, 0)"):
        schedule = _route(ef.compile(other, backend="c"), **arrays)
        assert schedule.route is Route.BLAS_THEN_EPILOGUE
        (mine,), (theirs,) = one.blas.contractions, schedule.blas.contractions
        assert (theirs.addend, theirs.contraction.left, theirs.contraction.m,
                theirs.contraction.n) == (mine.addend, mine.contraction.left,
                                          mine.contraction.m, mine.contraction.n)
        assert schedule.blas.epilogue == one.blas.epilogue


def test_the_split_is_a_rule_on_the_syntax():
    def split(text):
        spec = spec_of(text)
        return split_epilogue(spec.statement, spec.rhs)
    # GELU reads the product twice: one temporary
    gelu = split("y[b,o] := " + GELU.format(z=f"{C_OI} + bias[o]"))
    assert len(gelu.temporaries) == 1
    for whole in ("y[b,o] := sum[i](x[b,i]*W[o,i])",            # BLAS as written
                  "y[b,o] := sum[i](x[b,i]*W[o,i]) + bias[o]",   # BLAS, then the term
                  "y[i] := relu(sum[j](A[i,j]*v[j]))",            # a matrix-vector row
                  "y[b,o] := relu(sum[i](x[b,i+1]*W[o,i]))",      # not plain
                  "y[b,o] := relu(max[i](x[b,i]*W[o,i]))"):       # not a sum
        assert split(whole) is None, whole
    spec = spec_of(f"y[b,o] := relu({C_OI} / sum[k](x[b,k]))")
    hoisted, found = epilogue_program(spec.statement, spec.rhs)
    assert len(hoisted.temporaries) == 2 and len(found.temporaries) == 1
    assert epilogue_program(spec.statement, spec.rhs, pad=True) is None


@needs_c
def test_other_routes_where_blas_does_not_apply():
    statement = f"y[b,o] := max({C_OI} + bias[o], 0)"
    ints = {n: (a * 10).astype(np.int64) for n, a in _inputs(np.float64).items()}
    kernel = ef.compile(statement, backend="c")
    assert _route(kernel, **ints).route is Route.LOOP_NEST
    np.testing.assert_array_equal(
        kernel(**ints), np.maximum(ints["x"] @ ints["W"].T + ints["bias"], 0))
    arrays = _inputs(np.float64)
    assert _route(ef.compile(statement, backend="numpy"), **arrays).route is Route.HOST
    assert _route(ef.compile(statement, backend="c", pad=0.0), **arrays).route is \
        Route.LOOP_NEST


@needs_c
def test_explain_names_the_route():
    arrays = _inputs(np.float32)
    text = str(ef.explain(f"y[b,o] := max({C_OI} + bias[o], 0)", backend="c", **arrays))
    assert "BLAS, then the elementwise epilogue" in text
    assert "p1[b, o] := sum[i](x[b, i] * W[o, i]) + bias[o]" in text


@needs_c
@pytest.mark.parametrize("statement, twin", [CASES[0], pytest.param(*CASES[3],
                                             marks=pytest.mark.slow), CASES[4]])
def test_gradients_match_torch_autograd(statement, twin):
    kernel = ef.compile(statement, backend="c")
    arrays = _inputs(np.float32, 6, 9, 5)
    ours = {n: torch.from_numpy(a).requires_grad_() for n, a in arrays.items()}
    theirs = {n: torch.from_numpy(a).requires_grad_() for n, a in arrays.items()}
    weight = torch.randn(6, 5)
    for _ in range(2):      # the first call and the prepared repeat
        for t in (*ours.values(), *theirs.values()):
            t.grad = None
        (kernel(**ours) * weight).sum().backward()
        (twin(**theirs) * weight).sum().backward()
        for name in ("x", "W", "bias"):
            np.testing.assert_allclose(ours[name].grad.numpy(), theirs[name].grad.numpy(),
                                       rtol=1e-4, atol=1e-5)


@needs_c
def test_gradcheck_float64():
    kernel = ef.compile("y[b,o] := " + GELU.format(z=f"{C_OI} + bias[o]"), backend="c")
    tensors = tuple(torch.from_numpy(a).requires_grad_()
                    for a in _inputs(np.float64, 3, 4, 2).values())
    assert torch.autograd.gradcheck(lambda x, W, bias: kernel(x=x, W=W, bias=bias), tensors)


@needs_c
def test_the_backward_products_run_on_blas(monkeypatch):
    """dx = dp W and dW = dp^T x are contractions of the split form's gradient: BLAS
    computes them (a product inside the epilogue's derivative would be a loop nest)."""
    products = []
    original = c_blas.contraction_runner

    def counting(contraction, call, route=c_blas.NUMPY_BLAS):
        products.append(call.spec.output)
        return original(contraction, call, route)
    from einfuse.backends.c import repeat as c_repeat
    monkeypatch.setattr(c_repeat, "contraction_runner", counting)
    kernel = ef.compile(f"y[b,o] := max({C_OI} + bias[o], 0)", backend="c")
    tensors = {n: torch.from_numpy(a).requires_grad_()
               for n, a in _inputs(np.float32, 7, 11, 5).items()}
    kernel(**tensors).sum().backward()
    assert {"dx", "dW"} <= {name.split("_")[0] for name in products}, products
