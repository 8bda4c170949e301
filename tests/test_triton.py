"""The Triton renderer and backend (run on the CPU under TRITON_INTERPRET=1, which
conftest sets).  The backend-parametrised suite also runs on "triton"."""

import json
import re

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.triton import backend as triton_backend

pytestmark = pytest.mark.skipif(not triton_backend.available(),
                                reason="triton (and torch) not installed")


def rendered(statement, **arrays):
    from einfuse.plan.gathers import bounds_mode
    from einfuse.backends.triton.render import render_triton
    from einfuse.plan import plan_for, unit_axis
    call = ef.compile(statement).bind(**arrays)
    layouts = tuple(unit_axis(np.asarray(a)) for a in call.arrays.values()) + (1,)
    plan = plan_for(call.spec, call.dtypes.working.name, False, bounds_mode(call),
                    layouts, 32, triton_backend.TILE, plain=True, blocks=True)
    return render_triton(plan.program)


def test_dist_renders_as_two_dimensional_tiles():
    w, x = np.ones((8, 40)), np.ones((8, 50))
    source, launch = rendered("D[i,j] := (w[k,i] - x[k,j])**2", w=w, x=x)
    assert launch.tiles and launch.row_tile == 32 and launch.lane_tile == 32
    assert "ROWS: tl.constexpr" in source and "tl.full([ROWS, LANES], 0.0" in source
    assert "for p2 in range(0, (n2)):" in source   # the reduction stays a loop


def test_gauss_renders_as_flat_blocks_with_nested_loops():
    x, y, b = np.ones((9, 3)), np.ones((10, 3)), np.ones(10)
    source, launch = rendered("o[i] := sum[j](exp(-sum[d]((x[i,d]-y[j,d])**2)) * b[j])",
                              x=x, y=y, b=b)
    assert not launch.tiles and "BLOCK: tl.constexpr" in source
    assert source.count("for p") == 2


def test_only_generated_names_reach_the_source():
    source, _ = rendered("zz_user[i] := sum[k](my_tensor[i, k] * vec_user[k]) + my_param",
                         my_tensor=np.ones((3, 4)), vec_user=np.ones(4), my_param=2.0)
    kernel = source[source.index("def einfuse_kernel"):]
    for user_name in ("zz_user", "my_tensor", "vec_user", "my_param"):
        assert user_name not in kernel
    assert set(re.findall(r"\bt\d+\b", kernel)) == {"t0", "t1", "t2"}


@pytest.mark.parametrize("statement, arrays", [
    ("s := x[i] * x[i]", {"x": np.arange(5.0)}),
    ("y[i] := x[i]", {"x": np.zeros(0)}),
    ("E[b,d] := W[idx[b], d]", {"W": np.arange(12.0).reshape(6, 2),
                                "idx": np.array([5, 0, 5], dtype=np.int32)}),
])
def test_edge_shapes_match_the_reference(statement, arrays):
    got = ef.ein(statement, backend="triton", **arrays)
    want = ef.ein(statement, backend="numpy", **arrays)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want)


def test_bad_gathers_raise_before_any_launch():
    with pytest.raises(ef.EinfuseError, match="outside its valid range"):
        ef.ein("E[b,d] := W[idx[b], d]", W=np.ones((3, 2)), idx=np.array([3]),
               backend="triton")


def test_integer_statements_fall_back_to_the_reference():
    counts = np.arange(6).reshape(2, 3)
    np.testing.assert_array_equal(ef.ein("t[i] := c[i,j] * 2", c=counts, backend="triton"),
                                  counts.sum(1) * 2)


def test_contractions_use_tl_dot_with_the_epilogue_fused():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((50, 40)).astype(np.float32)
    B = rng.standard_normal((40, 37)).astype(np.float32)
    bias = rng.standard_normal(37).astype(np.float32)
    statement = "C[i,j] := sum[k](A[i,k] * B[k,j]) + bias[j]"
    source, launch = rendered(statement, A=A, B=B, bias=bias)
    assert launch.tiles and "tl.dot(" in source
    got = ef.ein(statement, A=A, B=B, bias=bias, backend="triton")
    np.testing.assert_allclose(got, A @ B + bias, rtol=1e-5, atol=1e-5)
    dist, _ = rendered("D[i,j] := (w[k,i] - x[k,j])**2", w=np.ones((8, 40)),
                       x=np.ones((8, 50)))
    assert "tl.dot(" not in dist   # not a product of two loads


def test_torch_callers_get_tensors_without_a_host_round_trip():
    torch = pytest.importorskip("torch")
    A = torch.randn(20, 8)
    B = torch.randn(8, 30)
    C = ef.ein("C[i,j] := A[i,k] * B[k,j]", A=A, B=B, backend="triton")
    assert isinstance(C, torch.Tensor) and C.device == A.device
    torch.testing.assert_close(C, A @ B, rtol=1e-5, atol=1e-5)
    out = torch.zeros(20, 30)
    assert ef.ein("C[i,j] += A[i,k] * B[k,j]", A=A, B=B, C=out, backend="triton") is out
    torch.testing.assert_close(out, A @ B, rtol=1e-5, atol=1e-5)


def test_auto_picks_triton_for_cuda_tensors():
    from types import SimpleNamespace
    from einfuse.schedule.route import backend_name
    cuda = SimpleNamespace(framework="torch", sources={"A": SimpleNamespace(is_cuda=True)})
    cpu = SimpleNamespace(framework="torch", sources={"A": SimpleNamespace(is_cuda=False)})
    assert backend_name("auto", cuda) == "triton"
    assert backend_name("auto", cpu) == "auto"
    assert backend_name("c", cuda) == "c"


# -- device residency: nothing of a torch caller's goes through NumPy -----------------------
DEVICE_CASES = [
    ("D[i,j] := (w[k,i] - x[k,j])**2", {"w": (5, 7), "x": (5, 9)}),
    ("E[b,d] := W[idx[b], d]", {"W": (6, 3)}),
    ("o[i,j] := img[i+a, j+b] * ker[a,b]", {"img": (7, 6), "ker": (2, 3)}),
    ("o[i] := sum[j](exp(-sum[d]((x[i,d]-y[j,d])**2)) * b[j])",
     {"x": (4, 3), "y": (5, 3), "b": (5,)}),
    ("y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o]", {"x": (3, 4), "W": (4, 5), "bias": (5,)}),
    ("z[i] := logsumexp[j](X[i,j])", {"X": (3, 6)}),
]


@pytest.mark.parametrize("statement, shapes", DEVICE_CASES, ids=[c[0] for c in DEVICE_CASES])
def test_forward_and_gradients_stay_torch_tensors(statement, shapes, monkeypatch):
    """With Triton, a torch caller's forward and backward run on its tensors where they
    are: converting any tensor to NumPy (a device-to-host copy on a GPU) fails here."""
    torch = pytest.importorskip("torch")
    from einfuse.analysis import binding
    from einfuse.runtime import torch_autograd
    gen = torch.Generator().manual_seed(0)
    inputs = {n: torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_()
              for n, s in shapes.items()}
    if "idx" in statement:
        inputs["idx"] = torch.tensor([5, 0, 5, 2], dtype=torch.int32)
    want = ef.ein(statement, backend="numpy", **inputs)
    want.sum().backward()
    want_grads = {n: t.grad.clone() for n, t in inputs.items() if t.is_floating_point()}
    for t in inputs.values():
        t.grad = None

    def no_host_copy(value):
        if isinstance(value, torch.Tensor):
            raise AssertionError("a tensor was copied to NumPy")
        return np.asarray(value)   # NumPy placeholders (shapes for range inference)
    monkeypatch.setattr(binding, "to_numpy", no_host_copy)
    monkeypatch.setattr(torch_autograd, "to_numpy", no_host_copy)
    got = ef.ein(statement, backend="triton", **inputs)
    torch.testing.assert_close(got, want)
    got.sum().backward()
    for name, grad in want_grads.items():
        torch.testing.assert_close(inputs[name].grad, grad, msg=f"d{name}")


def test_half_precision_inputs_reach_tl_dot_as_stored():
    from einfuse.backends.triton.render import render_triton
    from einfuse.plan import plan_for
    call = ef.compile("C[i,j] := A[i,k] * B[k,j]").bind(A=np.ones((40, 30), np.float16),
                                                       B=np.ones((30, 20), np.float16))
    plan = plan_for(call.spec, "float32", False, "check", (1, 1, 1), 32,
                    triton_backend.TILE, plain=True, blocks=True)
    native, _ = render_triton(plan.program, ("float16",) * 3, native_dot=True)
    converted, _ = render_triton(plan.program, ("float16",) * 3, native_dot=False)
    assert "tl.dot(da_, db_)" in native and "other=0.0).to(tl.float32)" not in native
    assert 'input_precision="ieee"' in converted and ".to(tl.float32)" in converted
    mixed, _ = render_triton(plan.program, ("float16", "float32", "float16"))
    assert 'input_precision="ieee"' in mixed   # operands of two dtypes: both as float32


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_results_are_stored_in_their_dtype(dtype):
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(1)
    A = torch.randn(33, 40, generator=gen).to(getattr(torch, dtype))
    B = torch.randn(40, 17, generator=gen).to(getattr(torch, dtype))
    C = ef.ein("C[i,j] := A[i,k] * B[k,j]", A=A, B=B, backend="triton")
    assert C.dtype == A.dtype
    # float32 accumulation: within one rounding of the 16-bit result
    torch.testing.assert_close(C.float(), (A.float() @ B.float()).to(A.dtype).float(),
                               rtol=1e-2, atol=0.15)


# -- block-size tuning --------------------------------------------------------------------
def test_autotune_searches_once_per_shape_bucket_and_caches_on_disk(tmp_path, monkeypatch):
    from einfuse.backends.triton import tuning as triton_tuning
    monkeypatch.setenv("EINFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EINFUSE_TRITON_AUTOTUNE", "1")
    triton_tuning.forget_memory()
    searched = []
    original = triton_tuning.search

    def counting(configs, launch_with, on_gpu):
        searched.append(1)
        return original(configs, launch_with, on_gpu)
    monkeypatch.setattr(triton_tuning, "search", counting)
    rng = np.random.default_rng(0)
    statement = "D[i,j] := (w[k,i] - x[k,j])**2"
    for n in (20, 24):   # one bucket (16..31)
        w, x = rng.standard_normal((3, n)), rng.standard_normal((3, n + 1))
        np.testing.assert_allclose(ef.ein(statement, w=w, x=x, backend="triton"),
                                   ((w[:, :, None] - x[:, None, :]) ** 2).sum(0))
    assert searched == [1]
    stored = json.loads((tmp_path / "triton_tuning.json").read_text())
    assert len(stored) == 1 and set(next(iter(stored.values()))) >= {"rows", "lanes"}
    triton_tuning.forget_memory()   # a new process: the choice comes from the disk
    ef.ein(statement, w=w, x=x, backend="triton")
    assert searched == [1]
    w, x = rng.standard_normal((3, 70)), rng.standard_normal((3, 70))
    ef.ein(statement, w=w, x=x, backend="triton")   # another bucket: a new search
    assert searched == [1, 1] and len(json.loads(
        (tmp_path / "triton_tuning.json").read_text())) == 2
    triton_tuning.forget_memory()


def test_autotune_skips_candidates_that_fail():
    from einfuse.backends.triton.tuning import Config, search

    def launch(config):
        if config.rows == 16:
            raise RuntimeError("out of resources")
    assert search([Config(16), Config(32)], launch, on_gpu=False) == Config(32)
    with pytest.raises(RuntimeError, match="no Triton launch configuration ran"):
        search([Config(16)], launch, on_gpu=False)


def test_flat_reductions_take_a_block_of_the_reduced_index_per_step():
    source, launch = rendered("z[i] := logsumexp[j](X[i,j])", X=np.ones((3, 5)))
    assert launch.reduce_block and "RB: tl.constexpr" in source
    # a load along the rows only is one column per step, not the whole [BLOCK, RB] tile
    gauss, _ = rendered("o[i] := sum[j](exp(-sum[d]((x[i,d]-y[j,d])**2)) * b[j])",
                        x=np.ones((3, 3)), y=np.ones((4, 3)), b=np.ones(4))
    assert "mask=omask[:, None]" in gauss and "mask=p1_ok" in gauss
    prod, launch = rendered("z[i] := prod[j](X[i,j])", X=np.ones((3, 5)))
    assert not launch.reduce_block   # no tl.reduce for products: the scalar loop


@pytest.mark.parametrize("op", ["sum", "max", "min", "logsumexp"])
def test_blocked_reductions_keep_special_values(op):
    inf, nan = np.inf, np.nan
    X = np.array([[-inf, -inf, -inf, -inf, -inf, -inf, -inf],
                  [1.0, inf, 2.0, -3.0, 0.5, 7.0, -1.0],
                  [1.0, 2.0, nan, 0.0, 3.0, 4.0, 5.0],
                  [inf, inf, 1.0, 2.0, 3.0, 4.0, 5.0],
                  [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]])
    X = np.concatenate([np.zeros((5, 100)) - 1.0, X, np.zeros((5, 50)) - 2.0], axis=1)
    X[0] = -inf   # several steps of RB, the special values in the middle one
    with np.errstate(all="ignore"):
        want = ef.ein(f"z[i] := {op}[j](X[i,j])", X=X, backend="numpy")
        got = ef.ein(f"z[i] := {op}[j](X[i,j])", X=X, backend="triton")
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_small_work_on_a_gpu_takes_the_default_without_a_search(monkeypatch):
    """A search compiles every candidate (about a second each on an H100): only work
    large enough to repay it is tuned; small kernels take the default configuration."""
    from einfuse.backends.triton import backend as triton_backend, tuning as triton_tuning
    from einfuse.backends.triton.render import Launch
    from einfuse.schedule import triton_blocks
    monkeypatch.delenv("EINFUSE_TRITON_AUTOTUNE", raising=False)
    monkeypatch.setattr(triton_tuning, "lookup", lambda key: None)
    monkeypatch.setattr(triton_tuning, "remember", lambda key, config: None)
    searched = []
    monkeypatch.setattr(triton_tuning, "search",
                        lambda configs, launch, on_gpu: searched.append(configs) or configs[0])
    launch = Launch(True, (), None, None, dot=True)
    small = triton_backend.Prepared(None, launch, (), (), {}, "k", 100, work=1000)
    assert triton_backend.choose_config(small, None, on_gpu=True) == \
        triton_blocks.default_config(True, False, False, True) and searched == []
    big = triton_backend.Prepared(None, launch, (), (), {}, "k", 10**6, work=10**9)
    triton_backend.choose_config(big, None, on_gpu=True)
    assert searched == [triton_blocks.candidates(True, False, False, False, True)]


# -- the prepared runner of a repeated call (backends/triton/repeat.py) ---------------------
def _triton_device():
    return "cpu" if triton_backend.interpreted() else "cuda"


@pytest.mark.parametrize("statement, shapes, reference", [
    ("y[i] := x[i] * s + 1", {"x": (37,)}, lambda t, s: t["x"] * s + 1),
    ("C[i,j] := A[i,k] * B[k,j]", {"A": (20, 8), "B": (8, 30)},
     lambda t, s: t["A"] @ t["B"]),
    ("z[i] := logsumexp[j](X[i,j] * s)", {"X": (5, 70)},
     lambda t, s: (t["X"] * s).logsumexp(1)),
])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_repeated_calls_take_the_prepared_runner_and_stay_right(statement, shapes, reference,
                                                                dtype):
    """On a GPU this is the compiled kernel's own launcher; under the interpreter the
    same runner launches through Triton's usual path: both must give what the full path
    gives, for new parameter values, new data, unaligned views and other dtypes."""
    torch = pytest.importorskip("torch")
    device = _triton_device()
    kernel = ef.compile(statement, backend="triton")
    takes_s = "s" in kernel.spec.params
    for call in range(4):
        s = [2.0, 0.5, 2.0, -1.5][call]
        tensors = {n: torch.randn(shape, device=device).to(getattr(torch, dtype))
                   for n, shape in shapes.items()}
        if call == 3:    # an unaligned view of the same shape and strides
            tensors = {n: torch.randn(t.numel() + 1, device=device, dtype=t.dtype)[1:]
                       .view(t.shape) for n, t in tensors.items()}
        got = kernel(**tensors, **({"s": s} if takes_s else {}))
        want = reference({n: t.double() for n, t in tensors.items()}, s)
        first = next(iter(tensors.values()))
        assert got.dtype == getattr(torch, dtype) and got.device == first.device
        tolerance = 1e-4 if dtype == "float32" else 2e-2
        torch.testing.assert_close(got.double(), want, rtol=tolerance, atol=tolerance)
    assert any(runner is not None for runner in kernel._repeat.values())


def test_prepared_runner_keeps_a_parameter_array_per_value_bits():
    """-0.0 == 0.0 in Python: a cache keyed by the values would hand -0.0's call the
    array of +0.0 (1 / s must keep the sign)."""
    torch = pytest.importorskip("torch")
    x = torch.ones(5, device=_triton_device())
    kernel = ef.compile("y[i] := x[i] / s", backend="triton")
    for s in (0.0, 0.0, -0.0, -0.0, 0.0, float("nan"), 2.0):
        got = kernel(x=x, s=s)
        want = torch.full((5,), 1.0) / s
        torch.testing.assert_close(got.cpu(), want, equal_nan=True)
        assert torch.equal(torch.signbit(got.cpu()), torch.signbit(want))


@pytest.mark.parametrize("statement", [
    "y[i] := where(x[i] > 0, 0.1, 0.3)",          # float32 constants in float64 before
    "y[i] := x[i] + 1.25 / 0.0",                  # Python's ZeroDivisionError before
    "y[i] := x[i] + (0.5 <= -1.25)",              # a Python bool without .to before
    "y[i] := 1 / (x[i] * 0.0) + x[i] * 0.1",
])
def test_constants_are_scalars_of_the_working_dtype(statement):
    torch = pytest.importorskip("torch")
    x = np.array([1.0, -1.0, 2.0, 0.5])
    got = ef.ein(statement, x=torch.from_numpy(x), backend="triton")
    want = ef.ein(statement, x=x, backend="numpy")
    np.testing.assert_array_equal(got.numpy(), want)
