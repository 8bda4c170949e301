"""The Triton renderer and backend (run on the CPU under TRITON_INTERPRET=1, which
conftest sets).  The backend-parametrised suite also runs on "triton"."""

import re

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends import triton_backend

pytestmark = pytest.mark.skipif(not triton_backend.available(),
                                reason="triton (and torch) not installed")


def rendered(statement, **arrays):
    from einfuse.plan.gathers import bounds_mode
    from einfuse.backends.triton_render import render_triton
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
    from einfuse.runtime.kernel import _backend_name
    cuda = SimpleNamespace(framework="torch", sources={"A": SimpleNamespace(is_cuda=True)})
    cpu = SimpleNamespace(framework="torch", sources={"A": SimpleNamespace(is_cuda=False)})
    assert _backend_name("auto", cuda) == "triton"
    assert _backend_name("auto", cpu) == "auto"
    assert _backend_name("c", cuda) == "c"
