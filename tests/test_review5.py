"""Review of this session's changes (ef.jit through XLA's FFI, prepared gathers, the
compiled scatter-add, compile latency): the bugs found, each as the test that failed."""

import gc
import weakref

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends import c_build


@pytest.mark.skipif(c_build.find_compiler() is None, reason="needs a C compiler")
@pytest.mark.parametrize("callback", [False, True])
def test_an_ef_jit_function_lowered_under_jax_jit_is_freed_with_its_constants(
        monkeypatch, callback):
    """The route table held every lowered kernel object (and with it its program and
    constant arrays) for the life of the process, even on the host-callback route;
    before the FFI route, dropping the function and JAX's caches freed them."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from einfuse.runtime import jit_ffi
    if callback:
        monkeypatch.setenv(jit_ffi.FORCE_CALLBACK, "1")
    else:
        monkeypatch.delenv(jit_ffi.FORCE_CALLBACK, raising=False)
    x = np.ones((2, 16), np.float32)
    weights = np.random.default_rng(int(callback)).standard_normal((16, 16)).astype(np.float32)
    freed = []
    with jax.default_device(jax.devices("cpu")[0]):
        fn = ef.jit(lambda x: jnp.tanh(x @ weights))
        np.testing.assert_allclose(np.asarray(jax.jit(fn)(x)), np.tanh(x @ weights), rtol=1e-5)
        compiled = fn.compiled(x)
        freed.append(weakref.ref(compiled))
        jit_ffi.route_for(compiled)
        del fn, compiled
    jax.clear_caches()
    gc.collect()
    assert freed[0]() is None
