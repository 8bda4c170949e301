"""The CPU route of JAX calls under jit (runtime/jax_ffi.py): C kernels as XLA FFI custom
calls, contractions as XLA dots, the host callback only as a fallback.  Results are
compared with jax.numpy formulations; the route with the lowered module's text."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build

jax = pytest.importorskip("jax")
jnp = jax.numpy

from einfuse.runtime import jax_ffi  # noqa: E402

needs_cc = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
rng = np.random.default_rng(7)
DIST = "D[i,j] := (w[k,i] - x[k,j])**2"


@pytest.fixture(autouse=True)
def on_the_cpu():
    """The FFI route is the CPU platform's (on a GPU einfuse takes its device or callback
    route, and registers its targets for the CPU only): where the default JAX device is
    a GPU, every array and computation of these tests is placed on the CPU."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def rand(*shape, dtype=np.float32):     # (committed to the CPU: so is what reads it)
    return jax.device_put(rng.standard_normal(shape).astype(dtype), jax.devices("cpu")[0])


def dist_ref(w, x):
    return ((w[:, :, None] - x[:, None, :]) ** 2).sum(0)


def lowered(fn, *args) -> str:
    return jax.jit(fn).lower(*args).as_text()


def route_of(statement, shapes_dtypes, **options):
    kernel = ef.compile(statement, **options)
    names = list(shapes_dtypes)
    return jax_ffi.cpu_route(kernel, names, [jax.ShapeDtypeStruct(*shapes_dtypes[n])
                                             for n in names])[0]


@needs_cc
def test_jit_lowers_to_an_einfuse_custom_call_without_callbacks():
    w, x = rand(5, 3), rand(5, 4)
    f = lambda w, x: ef.ein(DIST, w=w, x=x)
    text = lowered(f, w, x)
    assert "custom_call @einfuse_" in text and "callback" not in text
    np.testing.assert_allclose(jax.jit(f)(w, x), dist_ref(w, x), rtol=1e-5, atol=1e-5)
    # the gradient statements run inside XLA too
    g = jax.grad(lambda w, x: jnp.sum(jnp.sin(f(w, x))), argnums=(0, 1))
    text = lowered(g, w, x)
    assert "custom_call @einfuse_" in text and "callback" not in text
    want = jax.grad(lambda w, x: jnp.sum(jnp.sin(dist_ref(w, x))), argnums=(0, 1))(w, x)
    for got, ref in zip(jax.jit(g)(w, x), want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


@needs_cc
def test_route_is_reported_by_cpu_route_and_explain():
    spec = {"w": ((5, 3), np.float32), "x": ((5, 4), np.float32)}
    route = route_of(DIST, spec)
    assert route.kind == jax_ffi.CpuRouteKind.FFI and route.target.startswith("einfuse_")
    assert route_of(DIST, spec, backend="numpy").kind == jax_ffi.CpuRouteKind.CALLBACK
    assert route_of("C[i,j] := A[i,k]*B[k,j]", {"A": ((2, 3), np.float32),
                                                "B": ((3, 4), np.float32)}).kind == \
        jax_ffi.CpuRouteKind.DOT
    text = str(ef.explain(DIST, w=rand(5, 3), x=rand(5, 4)))
    assert "XLA FFI custom call einfuse_" in text


def test_fallback_is_a_host_callback_with_the_same_values():
    w, x = rand(5, 3), rand(5, 4)
    f = lambda w, x: ef.ein(DIST, w=w, x=x, backend="numpy")
    assert "callback" in lowered(f, w, x) and "@einfuse_" not in lowered(f, w, x)
    np.testing.assert_allclose(jax.jit(f)(w, x), dist_ref(w, x), rtol=1e-5, atol=1e-5)


@needs_cc
def test_out_of_range_gather_raises_einfuse_message_from_jit():
    W, idx = rand(3, 4), jnp.asarray([0, 5, 1])
    f = jax.jit(lambda W, idx: ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=idx))
    assert "@einfuse_" in f.lower(W, idx).as_text()
    with pytest.raises(Exception, match=r"idx\[1\] = 5 is outside its valid range 0\.\.2"):
        f(W, idx).block_until_ready()
    good = jnp.asarray([2, 0, 2])
    np.testing.assert_array_equal(f(W, good), W[good])
    clip = jax.jit(lambda W, idx: ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=idx,
                                         bounds="clip"))
    np.testing.assert_array_equal(clip(W, idx), W[jnp.clip(idx, 0, 2)])


@needs_cc
def test_transposed_and_strided_inputs():
    A = rand(6, 8)
    f = jax.jit(lambda A: ef.ein("y[i] := sum[j](exp(X[i,j]) * X[i,j])", X=A.T[::2]))
    X = A.T[::2]
    np.testing.assert_allclose(f(A), (jnp.exp(X) * X).sum(1), rtol=1e-5, atol=1e-6)
    assert "@einfuse_" in lowered(lambda A: ef.ein("y[i] := sum[j](exp(X[i,j]) * X[i,j])",
                                                   X=A.T[::2]), A)


@needs_cc
@pytest.mark.parametrize("x64", [False, True])
def test_dtypes_with_and_without_x64(x64):
    with jax.enable_x64(x64):
        for dtype in (np.float32, np.float64, np.int32, np.int64, np.uint8):
            A = jnp.asarray((rng.random((3, 5)) * 10).astype(dtype))
            B = jnp.asarray((rng.random((3, 5)) * 10).astype(dtype))
            def f(A, B, backend="auto"):
                return ef.ein("y[i] := sum[j](A[i,j] * B[i,j] + A[i,j])", A=A, B=B,
                              backend=backend)
            got = jax.jit(f)(A, B)
            host = jax.jit(lambda A, B: f(A, B, "numpy"))(A, B)   # the callback route
            assert got.dtype == host.dtype, dtype
            np.testing.assert_allclose(got, host, rtol=1e-6)   # float sums: any order
            if dtype != np.uint8:     # jnp sums uint8 as uint32
                np.testing.assert_allclose(got, (A * B + A).sum(1), rtol=1e-5)
        X = rand(4, 7)
        pos = jax.jit(lambda X: ef.ein("p[i] := argmax[j](X[i,j])", X=X))(X)
        np.testing.assert_array_equal(pos, jnp.argmax(X, axis=1))
        # int32 (or int64) index arrays, widened to the kernel's int64 by the handler
        idx = jnp.asarray([3, 0, 2], dtype=jnp.int32)
        W = rand(4, 2)
        g = jax.jit(lambda W, idx: ef.ein("E[b,d] := W[idx[b], d] * 2", W=W, idx=idx))
        np.testing.assert_allclose(g(W, idx), W[idx] * 2)


@needs_cc
def test_traced_scalar_parameter_is_read_at_run_time():
    f = jax.jit(lambda alpha, x: ef.ein("s[i] := alpha * exp(x[i])", alpha=alpha, x=x))
    x = rand(6)
    assert "@einfuse_" in f.lower(jnp.float32(0.5), x).as_text()
    for alpha in (0.5, -2.0):
        np.testing.assert_allclose(f(jnp.float32(alpha), x), alpha * jnp.exp(x), rtol=1e-6)


@needs_cc
def test_zero_size_arrays():
    f = jax.jit(lambda A: ef.ein("y[i] := sum[j](exp(A[i,j]))", A=A))
    assert f(rand(0, 3)).shape == (0,)
    np.testing.assert_array_equal(f(rand(4, 0)), jnp.zeros(4))


@needs_cc
def test_independent_calls_in_one_executable_and_vmap():
    """XLA may run independent custom calls on several threads: each gets its
    result (no deadlock, no shared state between calls)."""
    ws = [rand(16, 300) for _ in range(4)]

    @jax.jit
    def several(*ws):
        return [ef.ein("y[i] := sum[k](exp(w[k,i]) * w[k,i])", w=w) for w in ws]
    for got, w in zip(several(*ws), ws):
        np.testing.assert_allclose(got, (jnp.exp(w) * w).sum(0), rtol=1e-5)
    batch = jnp.stack(ws)
    f = jax.jit(jax.vmap(lambda w, x: ef.ein(DIST, w=w, x=x), in_axes=(0, None)))
    x = rand(16, 5)
    np.testing.assert_allclose(f(batch, x), jax.vmap(dist_ref, in_axes=(0, None))(batch, x),
                               rtol=1e-4, atol=1e-4)


@needs_cc
def test_handler_validates_what_xla_passes():
    """The target called with buffers other than those planned: an XLA error naming
    the mismatch, not a kernel reading out of bounds."""
    kernel = ef.compile(DIST)
    avals = [jax.ShapeDtypeStruct((5, 3), np.float32), jax.ShapeDtypeStruct((5, 4), np.float32)]
    route, plan = jax_ffi.cpu_route(kernel, ["w", "x"], avals)
    assert route.kind == jax_ffi.CpuRouteKind.FFI
    attrs = dict(layout=np.array(plan.layout, np.int64), ints=np.array(plan.ints, np.int64),
                 fills=np.array(plan.fills, np.float64))
    result = jax.ShapeDtypeStruct(plan.result_shape, plan.result_dtype)
    call = jax.ffi.ffi_call(plan.target, result)
    np.testing.assert_allclose(jax.jit(lambda w, x: call(w, x, **attrs))(rand(5, 3), rand(5, 4)).shape,
                               (3, 4))
    with pytest.raises(Exception, match="does not have the dtype and shape"):
        jax.jit(lambda w, x: call(w, x, **attrs))(rand(6, 3), rand(5, 4)).block_until_ready()
    with pytest.raises(Exception, match="takes 2 arrays"):
        jax.jit(lambda w: call(w, **attrs))(rand(5, 3)).block_until_ready()


@needs_cc
def test_jvp_hessian_and_programs_stay_inside_xla():
    w, x = rand(5, 3), rand(5, 4)
    f = lambda w, x: jnp.sum(jnp.sin(ef.ein(DIST, w=w, x=x)))
    ref = lambda w, x: jnp.sum(jnp.sin(dist_ref(w, x)))
    jvp = lambda f: lambda w, x: jax.jvp(f, (w, x), (x[:, :3], w[:, :1] + x))[1]
    for ours, want in ((jvp(f), jvp(ref)), (jax.hessian(f), jax.hessian(ref))):
        assert "callback" not in lowered(ours, w, x)
        for got, exp in zip(jax.tree_util.tree_leaves(jax.jit(ours)(w, x)),
                            jax.tree_util.tree_leaves(want(w, x))):
            np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-4)
    program = lambda w, x: ef.ein(DIST + "\nE[i] := sum[j](exp(-D[i,j]))", w=w, x=x)
    assert lowered(program, w, x).count("custom_call @einfuse_") == 2
    np.testing.assert_allclose(jax.jit(program)(w, x), jnp.exp(-dist_ref(w, x)).sum(1),
                               rtol=1e-5)


@needs_cc
def test_gathers_in_range_and_out_of_range_per_call():
    """One executable, two kinds of index values: in range (the handler may run the
    kernel without per-element tests) and out of range (einfuse's error), for a
    shifted gather, a negative one and uint64 indices beyond int64."""
    W = rand(5, 3)
    f = jax.jit(lambda W, idx: ef.ein("E[b,d] := W[idx[b] + 1, d]", W=W, idx=idx))
    good = jnp.asarray([0, 3, 2])
    np.testing.assert_array_equal(f(W, good), W[good + 1])
    for bad, shown in (([0, 4, 1], r"idx\[1\] = 4"), ([-2, 0, 0], r"idx\[0\] = -2")):
        with pytest.raises(Exception, match=shown):
            f(W, jnp.asarray(bad)).block_until_ready()
    np.testing.assert_array_equal(f(W, good), W[good + 1])   # the same executable again
    with jax.enable_x64(True):
        huge = jnp.asarray(np.array([2**63 + 5, 0], dtype=np.uint64))
        g = jax.jit(lambda W, idx: ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=idx))
        with pytest.raises(Exception, match="is outside its valid range"):
            g(W, huge).block_until_ready()
        ok = jnp.asarray(np.array([4, 0], dtype=np.uint64))
        np.testing.assert_array_equal(g(W, ok), W[np.array([4, 0])])


@needs_cc
def test_a_cpu_placed_jit_on_a_gpu_machine_lowers_to_the_c_kernel(monkeypatch):
    """On a machine with a GPU and jax_triton, a traced call is bound for the device
    (JAX's default backend is the GPU), but a jit placed on the CPU lowers for the CPU
    platform: that lowering must emit the C kernel, never the Triton call (seen on an
    H100: 'MLIR translation rule for primitive triton_kernel_call not found for
    platform cpu')."""
    from einfuse.runtime import jax_gpu
    monkeypatch.setattr(jax_gpu, "jax_triton_installed", lambda: True)
    monkeypatch.setattr(jax_gpu, "on_gpu", lambda values: True)
    launched = []
    monkeypatch.setattr(jax_gpu, "launch_kernel", lambda *a, **k: launched.append(a))
    w, x = rand(5, 3), rand(5, 4)
    f = jax.jit(lambda w, x: ef.ein(DIST, w=w, x=x))
    assert "@einfuse_" in lowered(lambda w, x: ef.ein(DIST, w=w, x=x), w, x)
    np.testing.assert_allclose(f(w, x), dist_ref(np.asarray(w), np.asarray(x)), rtol=1e-5)
    assert launched == []
