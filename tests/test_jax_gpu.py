"""The JAX device path (runtime/jax_gpu.py) without a GPU: everything but the one
``jax_triton.triton_call`` line runs -- the kernel, its argument order, scalars, grid and
block sizes built from shapes alone, custom_vjp, custom_vmap, gradients with .at[].add
scatters, under jit -- with that line replaced by a host callback that launches the same
prepared kernel under the Triton interpreter."""

import numpy as np
import pytest

import einfuse as ef

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
jnp = jax.numpy
from einfuse.backends.triton import backend as triton_backend  # noqa: E402
from einfuse.runtime import jax_gpu  # noqa: E402
from einfuse.schedule import triton_blocks  # noqa: E402

pytestmark = pytest.mark.skipif(not triton_backend.available(),
                                reason="triton (and torch) not installed")
launched = []


def interpreted_launch(device, inputs):
    """What triton_call does, from a host callback: the same kernel, scalars, grid and
    constexprs, launched on torch tensors -- interpreted on the CPU, or compiled on the
    GPU of a machine without jax_triton (TRITON_INTERPRET=0 there)."""
    prepared = device.prepared
    interpreted = triton_backend.interpreted()
    config = triton_blocks.default_config(prepared.launch.tiles, interpreted=interpreted,
                                          reduce_block=prepared.launch.reduce_block,
                                          dot=prepared.launch.dot)
    where = "cpu" if interpreted else "cuda"
    compiled = {} if interpreted else {"num_warps": config.num_warps,
                                       "num_stages": config.num_stages}

    def host(*arrays):
        launched.append(device)   # counted when it runs, not when it is traced
        tensors = [torch.from_numpy(np.array(a)).to(where) for a in arrays]
        out = torch.empty(device.out_shape, dtype=getattr(torch, device.out_dtype),
                          device=where)
        prepared.kernel[prepared.grid(config)](*tensors, *prepared.scalars, out,
                                               **prepared.constexprs(config), **compiled)
        return out.cpu().numpy()
    return jax.pure_callback(host, jax.ShapeDtypeStruct(device.out_shape, device.out_dtype),
                             *inputs, vmap_method="sequential")


def real_gpu() -> bool:
    """A GPU machine with jax_triton: the real triton_call runs (counted when traced)."""
    return not triton_backend.interpreted() and jax_gpu.jax_triton_installed() and \
        jax.default_backend() == "gpu"


@pytest.fixture
def device_path(monkeypatch):
    launched.clear()
    if real_gpu():
        real = jax_gpu.launch_kernel

        def counted(device, inputs):
            launched.append(device)
            return real(device, inputs)
        monkeypatch.setattr(jax_gpu, "launch_kernel", counted)
        return launched
    monkeypatch.setattr(jax_gpu, "jax_triton_installed", lambda: True)
    monkeypatch.setattr(jax_gpu, "on_gpu", lambda values: True)
    monkeypatch.setattr(jax_gpu, "launch_kernel", interpreted_launch)
    # the interpreted launch is a host callback: the CPU platform lowers it
    monkeypatch.setattr(jax_gpu, "launches_in_cpu_lowering", lambda: True)
    return launched


from jax_cases import CASES, loss_of, r  # noqa: E402

# beyond the shared cases: a contraction large enough for several tl.dot steps, and a
# scalar parameter next to an output index
DEVICE_CASES = CASES + [
    ("y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o]", lambda x, W, bias: x @ W + bias,
     {"x": r(5, 40), "W": r(40, 33), "bias": r(33)}),
    ("s[i] := alpha * x[i,j]**2", lambda alpha, x: alpha * (x ** 2).sum(1),
     {"alpha": jnp.float32(0.7), "x": r(3, 6)}),
]


@pytest.mark.parametrize("statement, reference, arrays", DEVICE_CASES,
                         ids=[c[0] for c in DEVICE_CASES])
def test_forward_and_gradients_under_jit(statement, reference, arrays, device_path):
    names = list(arrays)

    def ours(*values):
        return ef.ein(statement, backend="triton", **dict(zip(names, values)))
    values = tuple(arrays.values())
    np.testing.assert_allclose(jax.jit(ours)(*values), reference(*values), rtol=1e-5,
                               atol=1e-5)
    assert device_path, "the device path was not taken"
    argnums = tuple(range(len(values)))
    got = jax.jit(jax.grad(loss_of(ours), argnums=argnums))(*values)
    want = jax.grad(loss_of(reference), argnums=argnums)(*values)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_scatter_gradients_add_repeated_and_drop_filled_positions(device_path):
    W = r(6, 3)
    idx = jnp.array([1, 1, 5, 0, 9, -1], dtype=jnp.int32)   # 9 and -1: filled with 0

    def ours(W):
        return ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=idx, bounds="fill",
                      backend="triton")
    got = jax.jit(ours)(W)
    want = jnp.where((idx >= 0) & (idx < 6), 1.0, 0.0)[:, None] * W[jnp.clip(idx, 0, 5)]
    np.testing.assert_allclose(got, want)
    grad = jax.jit(jax.grad(lambda W: ours(W).sum()))(W)
    counts = np.bincount(np.asarray(idx)[(np.asarray(idx) >= 0) & (np.asarray(idx) < 6)],
                         minlength=6)
    np.testing.assert_allclose(grad, np.repeat(counts[:, None], 3, 1).astype(np.float32))


def test_checked_gathers_take_the_host_path(device_path):
    W, idx = r(6, 3), jnp.array([1, 2], dtype=jnp.int32)
    got = ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=idx, backend="triton")
    np.testing.assert_allclose(got, W[idx])
    assert not device_path   # index values must be checked on the host, and can raise
    with pytest.raises(ef.EinfuseError, match="outside"):
        ef.ein("E[b,d] := W[idx[b], d]", W=W, idx=jnp.array([6]), backend="triton")


def test_vmap_runs_one_batched_kernel(device_path):
    A, B = r(4, 5, 3), r(3, 2)

    def ours(A):
        return ef.ein("C[i,j] := A[i,k] * B[k,j]", A=A, B=B, backend="triton")
    got = jax.jit(jax.vmap(ours))(A)
    np.testing.assert_allclose(got, A @ B, rtol=1e-5, atol=1e-5)
    # one batched kernel (a real triton_call is counted when traced, and custom_vmap
    # also traces the unbatched function once)
    batched = [d for d in device_path if d.out_shape == (4, 5, 2)]
    assert len(batched) == 1 and (real_gpu() or len(device_path) == 1)
    grad = jax.grad(lambda A: jax.vmap(ours)(A).sum())(A)
    np.testing.assert_allclose(grad, np.broadcast_to(B.sum(1), (4, 5, 3)), rtol=1e-5)


def test_off_the_gpu_the_host_path_runs(monkeypatch):
    monkeypatch.setattr(jax_gpu, "launch_kernel", lambda *a: pytest.fail("launched"))
    cpu = jax.devices("cpu")[0]   # on a GPU machine, arrays placed on its CPU
    A, B = jax.device_put(r(3, 4), cpu), jax.device_put(r(4, 2), cpu)
    np.testing.assert_allclose(ef.ein("C[i,j] := A[i,k] * B[k,j]", A=A, B=B), A @ B,
                               rtol=1e-5, atol=1e-5)
    assert not jax_gpu.on_gpu([A])


def test_importing_jax_triton_leaves_tritons_cache_setting(monkeypatch):
    """jax_triton 0.3 empties TRITON_CACHE_DIR when imported, which breaks every later
    Triton compile in the process; einfuse imports it so that the setting survives."""
    import builtins
    import os
    import sys
    import types
    real_import = builtins.__import__

    def importer(name, *args, **kwargs):
        if name == "jax_triton":   # what jax_triton 0.3 does when imported
            os.environ["TRITON_CACHE_DIR"] = ""
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))   # undone after
            return sys.modules[name]
        return real_import(name, *args, **kwargs)
    for cache in (None, "/tmp/somewhere"):
        monkeypatch.delitem(sys.modules, "jax_triton", raising=False)
        if cache is None:
            monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
        else:
            monkeypatch.setenv("TRITON_CACHE_DIR", cache)
        monkeypatch.setattr(builtins, "__import__", importer)
        jax_gpu.import_jax_triton()
        monkeypatch.setattr(builtins, "__import__", real_import)
        assert os.environ.get("TRITON_CACHE_DIR") == cache
