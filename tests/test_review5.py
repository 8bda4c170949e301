"""Review of this session's changes (ef.jit through XLA's FFI, prepared gathers, the
compiled scatter-add, compile latency): the bugs found, each as the test that failed."""

import gc
import time
import weakref

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build


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
    for _ in range(100):   # XLA's threads may still hold the callback a moment after the run
        gc.collect()
        if freed[0]() is None:
            break
        time.sleep(0.02)
    if freed[0]() is not None:
        holders = [type(r).__name__ for r in gc.get_referrers(freed[0]())]
        raise AssertionError(f"the compiled function outlived its function, held by {holders}")


def test_the_compiler_is_awaited_when_the_process_has_more_than_1024_files_open(tmp_path):
    """The pidfd was awaited with select(), which refuses descriptors from 1024 on
    (FD_SETSIZE): a process with many files open (sockets, data loaders) could build
    no kernel ("filedescriptor out of range in select()")."""
    resource = pytest.importorskip("resource")
    import os
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1200
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip("cannot open more than 1024 files here")
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        status, output = c_build.run_compiler(["sh", "-c", "echo built; exit 3"],
                                              str(tmp_path), 30.0)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert (status, output.strip()) == (3, "built")
