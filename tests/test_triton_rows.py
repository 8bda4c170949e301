"""Row groups on the Triton backend (schedule/row_groups.py, backends/triton/rows.py):
statements over the same rows run as one Triton kernel, rows held in registers.  Under
TRITON_INTERPRET=1 on CPU tensors (CI has no GPU), compiled on CUDA tensors where a GPU
is there; against the NumPy reference backend (the hypothesis-generated programs too)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import einfuse as ef
from einfuse.backends.triton import backend as triton_backend
from einfuse.schedule import row_groups

from program_texts import LAYERNORM, SOFTMAX, SOFTMAX_STATEMENT
from test_program_fuzz import _inputs, _used, programs

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not triton_backend.available(),
                                reason="Triton is not installed")
DEVICE = torch.device("cpu" if triton_backend.interpreted() else "cuda")


def _host(tensor):
    return tensor.detach().cpu().numpy()


def _tensors(arrays):
    return {n: torch.from_numpy(np.array(v, copy=True)).to(DEVICE)
            if isinstance(v, np.ndarray) else v
            for n, v in arrays.items()}


def _check(source, arrays, row_launches, expect_groups, outputs=None, rtol=None, **options):
    tensors = _tensors(arrays)
    program = ef.compile(source, backend="triton", outputs=outputs, **options)
    reference = ef.compile(source, backend="numpy", outputs=outputs, **options)
    want = reference(**arrays)
    for _ in range(2):      # the first call groups and prepares, the second repeats
        got = program(**tensors)
        pairs = zip(got, want) if isinstance(want, tuple) else [(got, want)]
        for g, w in pairs:
            assert isinstance(g, torch.Tensor) and g.dtype == torch.from_numpy(w).dtype
            tol = rtol or (1e-12 if w.dtype == np.float64 else 2e-6)
            np.testing.assert_allclose(_host(g), w, rtol=tol, atol=tol, err_msg=source)
    assert len(row_launches) == 2 * expect_groups, source


ROWS = np.random.default_rng(7).standard_normal((37, 50))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_program_is_one_kernel(dtype, row_launches):
    _check(SOFTMAX, {"X": ROWS.astype(dtype)}, row_launches, 1)


def test_softmax_statement_runs_its_hoisted_form_as_one_kernel(row_launches):
    _check(SOFTMAX_STATEMENT, {"X": ROWS.astype(np.float32)}, row_launches, 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layernorm_program_is_one_kernel(dtype, row_launches):
    rng = np.random.default_rng(1)
    arrays = {"X": ROWS.astype(dtype), "g": rng.standard_normal(50).astype(dtype),
              "b": rng.standard_normal(50).astype(dtype)}
    _check(LAYERNORM.format(n=50), arrays, row_launches, 1)


@pytest.mark.parametrize("source, arrays", [
    # rmsnorm with a scalar parameter and a 0-d tensor
    ("ms[i] := sum[j](X[i,j] * X[i,j]) / 50\n"
     "y[i,j] := X[i,j] / sqrt(ms[i] + eps) * s[]",
     {"X": ROWS, "eps": 1e-6, "s": np.array(1.5)}),
    # log-softmax, min reduction, a transposed read and a row vector
    ("m[i] := max[j](X[i,j])\n"
     "z[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i]\n"
     "lo[i] := min[j](Y[j,i] * w[j])\n"
     "y[i,j] := X[i,j] - z[i] + lo[i] * Y[j,i]",
     {"X": ROWS, "Y": ROWS.T.copy(), "w": np.linspace(-1, 1, 50)}),
    # index values: a causal mask, and the column counter as a value
    ("y[i,j] := where(j <= i, X[i,j], -1e30)\n"
     "m[i] := max[j](y[i,j] + j * 0.01)",
     {"X": ROWS}),
])
def test_other_row_programs(source, arrays, row_launches):
    _check(source, arrays, row_launches, 1)


def test_grid_statement_with_its_own_row_reduction(row_launches):
    # no hoisted form: the reduction is over k, the output's column is j
    source = "c[i,j] := X[i,j] * 2\nd[i,j] := c[i,j] + sum[k](X[i,k] * g[k])"
    rng = np.random.default_rng(3)
    arrays = {"X": ROWS, "g": rng.standard_normal(50)}
    _check(source, arrays, row_launches, 1)


def test_rows_only_group_and_kept_intermediates(row_launches):
    source = "a[i] := v[i] * 2\nb[i] := a[i] + w[i]\nc[i,j] := X[i,j] * b[i]"
    rng = np.random.default_rng(5)
    arrays = {"X": ROWS, "v": rng.standard_normal(37), "w": rng.standard_normal(37)}
    _check(source, arrays, row_launches, 1, outputs=("a", "c"))


def test_an_intermediate_read_after_the_group_is_stored(row_launches):
    # the last statement reads m along the columns (m[j]): it cannot join, and runs
    # after the group on m written out
    source = "m[i] := max[j](X[i,j])\ne[i,j] := exp(X[i,j] - m[i])\n" \
             "t[i,j] := e[i,j] * m[j]"
    square = np.random.default_rng(4).standard_normal((20, 20))
    _check(source, {"X": square}, row_launches, 1)


def test_non_finite_rows_match_the_reference(row_launches):
    x = ROWS.astype(np.float32)[:6].copy()
    x[0, 3] = np.nan
    x[1, :] = -np.inf
    x[2, 5] = np.inf
    x[3, :] = np.inf
    x[4, 7] = -np.inf
    tensors = _tensors({"X": x})
    got = _host(ef.compile(SOFTMAX, backend="triton")(**tensors))
    want = ef.compile(SOFTMAX, backend="numpy")(X=x)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=0, equal_nan=True)
    low = ef.compile("m[i] := min[j](X[i,j])\nq[i,j] := X[i,j] - m[i]", backend="triton")
    np.testing.assert_array_equal(
        np.isnan(_host(low(**tensors))),
        np.isnan(ef.compile("m[i] := min[j](X[i,j])\nq[i,j] := X[i,j] - m[i]",
                            backend="numpy")(X=x)))
    assert row_launches


def test_long_rows_run_statement_by_statement(monkeypatch, row_launches):
    monkeypatch.setattr(row_groups, "MAX_ROW_BYTES", 256)
    x = ROWS[:, :40].copy()     # (a shape no earlier call prepared a run for)
    want = ef.compile(SOFTMAX, backend="numpy")(X=x)
    got = ef.compile(SOFTMAX, backend="triton")(**_tensors({"X": x}))
    np.testing.assert_allclose(_host(got), want, rtol=1e-12)
    assert not row_launches


def test_half_inputs_are_converted_in_registers(row_launches):
    x = ROWS.astype(np.float16)
    source = "s[i] := sum[j](X[i,j] * 1.0)\ny[i,j] := X[i,j] / s[i]"
    got = ef.compile(source, backend="triton", dtype="float32")(**_tensors({"X": x}))
    want = ef.compile(source, backend="numpy", dtype="float32")(X=x)
    np.testing.assert_allclose(_host(got), want, rtol=1e-5)
    assert row_launches


def test_empty_and_single_row_shapes(row_launches):
    for shape in [(1, 50), (37, 1), (0, 5)]:
        x = np.random.default_rng(0).standard_normal(shape)
        got = ef.compile(SOFTMAX, backend="triton")(**_tensors({"X": x}))
        want = ef.compile(SOFTMAX, backend="numpy")(X=x)
        assert got.shape == want.shape
        np.testing.assert_allclose(_host(got), want, rtol=1e-12)


def test_a_recorded_call_is_one_node_fused_forward_and_backward(row_launches):
    x = torch.from_numpy(ROWS.copy()).to(DEVICE).requires_grad_(True)
    program = ef.compile(SOFTMAX, backend="triton")
    with torch.no_grad():
        fused = program(X=x)            # nothing recorded: one kernel
    assert row_launches == [3]              # (its three statements)
    for repeat in range(2):             # the second call: the prepared node
        row_launches.clear()
        x.grad = None
        y = program(X=x)                # recorded: one node, its forward one kernel
        assert y.requires_grad and row_launches == [3]
        np.testing.assert_allclose(_host(y), _host(fused), rtol=1e-12)
        (y * torch.arange(50.0, dtype=torch.float64, device=DEVICE)).sum().backward()
        assert row_launches == [3, 2]       # the backward P * (dP - sum(dP * P)): one kernel
        want = torch.from_numpy(ROWS.copy()).requires_grad_(True)
        (torch.softmax(want, 1) * torch.arange(50.0, dtype=torch.float64)).sum().backward()
        np.testing.assert_allclose(_host(x.grad), want.grad.numpy(), rtol=1e-9,
                                   atol=1e-12)


def test_layernorm_gradients_of_every_input(row_launches):
    rng = np.random.default_rng(8)
    data = {"X": rng.standard_normal((9, 50)), "g": rng.standard_normal(50),
            "b": rng.standard_normal(50)}
    ins = {n: torch.from_numpy(v.copy()).to(DEVICE).requires_grad_(True)
           for n, v in data.items()}
    y = ef.compile(LAYERNORM.format(n=50), backend="triton")(**ins)
    seed = torch.from_numpy(rng.standard_normal((9, 50))).to(DEVICE)
    (y * seed).sum().backward()
    ref = {n: torch.from_numpy(v.copy()).requires_grad_(True) for n, v in data.items()}
    want = torch.nn.functional.layer_norm(ref["X"], (50,), ref["g"], ref["b"], 1e-5)
    (want * seed.cpu()).sum().backward()
    np.testing.assert_allclose(_host(y), want.detach().numpy(), rtol=1e-10, atol=1e-12)
    for name in data:
        np.testing.assert_allclose(_host(ins[name].grad), ref[name].grad.numpy(),
                                   rtol=1e-9, atol=1e-11, err_msg=name)
    assert row_launches[0] == 3             # the forward: one kernel


@pytest.mark.parametrize("source", [
    SOFTMAX, pytest.param(LAYERNORM.format(n=4), marks=pytest.mark.slow),
    pytest.param("m[i] := max[j](X[i,j])\ny[i,j] := X[i,j] * m[i]", marks=pytest.mark.slow)])
def test_gradcheck_and_gradgradcheck(source):
    rng = np.random.default_rng(9)
    names = [n for n in ("X", "g", "b") if f"{n}[" in source]
    shapes = {"X": (3, 4), "g": (4,), "b": (4,)}
    values = tuple(torch.from_numpy(rng.standard_normal(shapes[n])).to(DEVICE)
                   .requires_grad_(True) for n in names)
    program = ef.compile(source, backend="triton")

    def run(*tensors):
        return program(**dict(zip(names, tensors)))
    # (fast mode: the interpreter runs every kernel of every perturbed call in Python)
    assert torch.autograd.gradcheck(run, values, fast_mode=True)
    assert torch.autograd.gradgradcheck(run, values, fast_mode=True)


def test_partial_requires_grad_and_retained_graph(row_launches):
    rng = np.random.default_rng(10)
    X = torch.from_numpy(rng.standard_normal((5, 50))).to(DEVICE)
    g = torch.from_numpy(rng.standard_normal(50)).to(DEVICE).requires_grad_(True)
    b = torch.from_numpy(rng.standard_normal(50)).to(DEVICE)
    y = ef.compile(LAYERNORM.format(n=50), backend="triton")(X=X, g=g, b=b)
    y.sum().backward(retain_graph=True)
    first = g.grad.clone()
    y.sum().backward()
    np.testing.assert_allclose(_host(g.grad), 2 * _host(first), rtol=1e-12)
    normalised = torch.nn.functional.layer_norm(X.cpu(), (50,), eps=1e-5)
    np.testing.assert_allclose(_host(first), normalised.sum(0).numpy(), rtol=1e-9,
                               atol=1e-11)


def test_a_modified_input_is_refused_by_the_version_check():
    x = torch.from_numpy(ROWS.copy()).to(DEVICE).requires_grad_(True)
    h = x * 1.0
    y = ef.compile(SOFTMAX, backend="triton")(X=h)
    h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.sampled_from([(37, 50), (5, 7), (3, 130)]),
       st.sampled_from([np.float64, np.float32]), st.integers(0, 2**32 - 1))
def test_generated_programs_match_the_reference(program, shape, dtype, seed):
    source, last = program
    rng = np.random.default_rng(seed)
    compiled = ef.compile(source, backend="triton", outputs=[last])
    reference = ef.compile(source, backend="numpy", outputs=[last])
    rtol, atol = (1e-9, 1e-12) if dtype == np.float64 else (2e-4, 1e-5)
    for _ in range(2):
        arrays = _used(source, _inputs(rng, *shape, dtype))
        got, expected = compiled(**_tensors(arrays)), reference(**arrays)
        assert got.dtype == torch.from_numpy(expected).dtype
        np.testing.assert_allclose(_host(got), expected, rtol=rtol, atol=atol,
                                   err_msg=source)


def test_a_gather_in_the_program_scatters_its_gradient_on_the_device():
    source = "E[b,d] := W[idx[b], d]\ns[b] := sum[d](E[b,d] * E[b,d])\n" \
             "y[b,d] := E[b,d] / sqrt(s[b])"
    rng = np.random.default_rng(11)
    W = torch.from_numpy(rng.standard_normal((10, 8))).to(DEVICE).requires_grad_(True)
    idx = torch.tensor([3, 1, 3, 9, 0, 0, 2], device=DEVICE)
    seed = torch.from_numpy(rng.standard_normal((7, 8))).to(DEVICE)
    y = ef.compile(source, backend="triton")(W=W, idx=idx)
    (y * seed).sum().backward()
    reference = W.detach().cpu().clone().requires_grad_(True)
    E = reference[idx.cpu()]
    want = E / torch.sqrt((E * E).sum(1, keepdim=True))
    (want * seed.cpu()).sum().backward()
    np.testing.assert_allclose(_host(y), want.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(_host(W.grad), reference.grad.numpy(), rtol=1e-10,
                               atol=1e-12)


def test_a_read_across_the_unit_stride_runs_alone(row_launches):
    """A block's loads must be contiguous along the columns: Y[j,i] of a row-major Y
    (its unit stride along the rows) does not join; of a column-major Y it does."""
    source = "m[i] := max[j](X[i,j])\nlo[i] := min[j](Y[j,i] * X[i,j]) + m[i]"
    rng = np.random.default_rng(12)
    x, y = rng.standard_normal((37, 50)), rng.standard_normal((50, 37))
    want = ef.compile(source, backend="numpy")(X=x, Y=y)
    for layout, groups in ((y, []), (np.asfortranarray(y), [2])):
        row_launches.clear()
        got = ef.compile(source, backend="triton")(**_tensors({"X": x, "Y": layout}))
        np.testing.assert_allclose(_host(got), want, rtol=1e-12)
        assert row_launches == groups


def test_explain_shows_the_row_group_and_its_source():
    explained = ef.explain(SOFTMAX, backend="triton", source=True,
                           **_tensors({"X": ROWS[:8, :16].astype(np.float32)}))
    assert "statements 1, 2, 3 (fused: one Triton kernel" in str(explained)
    sources = [part.source for part in explained.parts]
    assert "@triton.jit" in sources[0] and sources[1:] == [None, None]
    assert all("kernel 1, one fused kernel of statements 1, 2, 3" in " ".join(p.notes)
               for p in explained.parts)
