"""ef.jit kernels under jax.jit on the CPU as XLA FFI custom calls (runtime/jit_ffi.py,
backends/c/jit_ffi.py): results against jax.jit of the same functions, forward,
gradient and vmapped; the route (the lowered module holds the custom call and no
callback, and the host never runs the kernel); the callback as the fallback; errors
from inside the kernel and from the handler's checks as JAX errors with einfuse's
message."""

import ctypes
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.backends.c import build as c_build  # noqa: E402
from einfuse.backends.c import jit_ffi as c_jit_ffi  # noqa: E402
from einfuse.runtime import jit as jit_module  # noqa: E402
from einfuse.runtime import jit_batch, jit_ffi  # noqa: E402

from jit_support import close, seed_inputs, seed_run, x64  # noqa: E402,F401  (x64: autouse)

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="needs a C compiler")


@pytest.fixture(autouse=True)
def on_the_cpu(monkeypatch):
    """The FFI route is the CPU platform's: where JAX's default device is a GPU, these
    tests place everything on the CPU (and a caller's EINFUSE_JIT_CALLBACK is not
    theirs)."""
    monkeypatch.delenv(jit_ffi.FORCE_CALLBACK, raising=False)
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def loss(f):
    return lambda p, n: (f(p, n) ** 2).sum()


def custom_calls(fn, *args) -> int:
    text = jax.jit(fn).lower(*args).as_text()
    assert "callback" not in text
    return text.count("custom_call @einfuse_jit(")


@pytest.fixture
def host_calls(monkeypatch):
    """How often a kernel ran through the host (an eager call, or the callback)."""
    calls = []
    for cls in (jit_module.CompiledFunction, jit_batch.BatchedFunction):
        original = cls.host
        monkeypatch.setattr(cls, "host", lambda self, *a, _o=original: (calls.append(self),
                                                                        _o(self, *a))[1])
    return calls


def test_jit_grad_value_and_grad_and_vmap_run_inside_xla(host_calls):
    params, noise = seed_inputs(steps=30, hidden=6)
    fast = ef.jit(seed_run)
    assert custom_calls(fast, params, noise) == 1
    close(jax.jit(fast)(params, noise), jax.jit(seed_run)(params, noise))
    # the gradient: the forward kernel and the backward kernel
    assert custom_calls(jax.value_and_grad(loss(fast)), params, noise) == 2
    close(jax.jit(jax.value_and_grad(loss(fast)))(params, noise),
          jax.jit(jax.value_and_grad(loss(seed_run)))(params, noise))
    close(jax.jit(jax.grad(loss(fast), argnums=1))(params, noise),
          jax.jit(jax.grad(loss(seed_run), argnums=1))(params, noise))
    # vmapped: one batched kernel (blocks), and nested: one more level in it
    _, noises = seed_inputs(steps=30, hidden=6, chains=8, seed=1)
    vmapped = lambda f: jax.vmap(f, in_axes=(None, 0))    # noqa: E731
    assert custom_calls(vmapped(fast), params, noises) == 1
    close(jax.jit(vmapped(fast))(params, noises), jax.jit(vmapped(seed_run))(params, noises))
    close(jax.jit(vmapped(jax.grad(loss(fast))))(params, noises),
          jax.jit(vmapped(jax.grad(loss(seed_run))))(params, noises))
    nested = lambda f: jax.vmap(vmapped(f), in_axes=(None, 0))    # noqa: E731
    deeper = noises.reshape(2, 4, 30, 1)
    close(jax.jit(nested(fast))(params, deeper), jax.jit(nested(seed_run))(params, deeper))
    assert host_calls == []      # every kernel above ran inside XLA


def test_float32_without_x64_outputs_of_several_dtypes_and_constants(host_calls):
    weights = np.linspace(-1.0, 1.0, 12).reshape(3, 4)     # a float64 NumPy constant

    def counted(x, limit):
        def cond(state):
            return state[1] < limit

        def body(state):
            y, k = state
            return jnp.tanh(y @ weights.T.astype(y.dtype) @ weights.astype(y.dtype)) + 0.5, k + 1
        y, steps = lax.while_loop(cond, body, (x, jnp.int32(0)))
        return {"y": y, "steps": steps, "positive": y > 0, "flat": y.reshape(-1)[:0]}
    with jax.enable_x64(False):
        x = jnp.asarray(np.random.default_rng(2).normal(size=(2, 4)).astype(np.float32))
        fast = ef.jit(counted)
        assert custom_calls(fast, x, 5) == 1
        got, want = jax.jit(fast)(x, 5), jax.jit(counted)(x, 5)
        close(got, want, np.float32)
        close(jax.jit(fast)(x, 0), jax.jit(counted)(x, 0), np.float32)
    assert host_calls == []


def test_the_callback_is_the_fallback_and_explain_names_the_route(monkeypatch, host_calls):
    params, noise = seed_inputs(hidden=3, steps=7)
    text = str(ef.explain(ef.jit(seed_run), params, noise))
    assert "XLA FFI custom call einfuse_jit" in text
    monkeypatch.setenv(jit_ffi.FORCE_CALLBACK, "1")
    fallback = ef.jit(seed_run)
    lowered = jax.jit(fallback).lower(params, noise).as_text()
    assert "callback" in lowered and "@einfuse_jit" not in lowered
    close(jax.jit(fallback)(params, noise), jax.jit(seed_run)(params, noise))
    assert host_calls        # the callback ran the kernel on the host
    route = jit_ffi.route_for(fallback.compiled(params, noise))
    assert route.kind is jit_ffi.JitRouteKind.CALLBACK and "EINFUSE_JIT_CALLBACK" in route.reason
    assert "host callback" in str(ef.explain(fallback, params, noise))


def test_the_primitive_batches_itself_when_reached_directly():
    params, noises = seed_inputs(chains=3, steps=5, hidden=3)
    compiled = ef.jit(seed_run).compiled(params, noises[0])

    def direct(noise):
        return jit_ffi.einfuse_jit_p.bind(*params, noise, function=compiled,
                                          vmapped=compiled.batched)[0]
    close(jax.jit(jax.vmap(direct))(noises),
          jax.jit(jax.vmap(seed_run, in_axes=(None, 0)))(params, noises))


def test_independent_kernels_in_one_executable():
    """XLA may run independent custom calls on several threads of its pool: each gets
    its own result (the batched ones take turns with the OpenMP team)."""
    params, noises = seed_inputs(chains=40, steps=50, hidden=8)
    fast = jax.vmap(ef.jit(seed_run), in_axes=(None, 0))
    want = jax.jit(jax.vmap(seed_run, in_axes=(None, 0)))

    @jax.jit
    def several(params, noises):
        return [fast(params, noises * k) for k in range(4)]
    for k, got in enumerate(several(params, noises)):
        close(got, want(params, noises * k))


def _overcommit_refuses_huge_allocations() -> bool:
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            return f.read().strip() in ("0", "2")
    except OSError:
        return False


@pytest.mark.skipif(not _overcommit_refuses_huge_allocations(),
                    reason="needs Linux refusing a 16 TiB malloc (vm.overcommit_memory 0 or 2)")
def test_a_failure_inside_the_kernel_is_a_jax_error_with_einfuse_message():
    def huge(a, b):
        y = jnp.outer(a, b)         # 2^21 x 2^21 float32 (16 TiB), read twice: a buffer
        return (y.sum(0) * y.sum(1)).sum()
    a = jnp.ones(2**21, jnp.float32)
    fast = ef.jit(huge)
    assert custom_calls(fast, a, a) == 1
    with pytest.raises(Exception, match="the kernel of huge could not allocate its "
                                        "intermediates") as caught:
        jax.jit(fast)(a, a).block_until_ready()
    assert not isinstance(caught.value, ef.EinfuseError)   # XLA's error, einfuse's text
    with pytest.raises(ef.EinfuseError, match="could not allocate"):
        fast(a, a)          # eager: einfuse's own exception


def test_the_handler_checks_what_xla_passes_and_unknown_tokens():
    params, noise = seed_inputs(hidden=3, steps=4)
    route = jit_ffi.route_for(ef.jit(seed_run).compiled(params, noise))
    assert route.kind is jit_ffi.JitRouteKind.FFI
    out = jax.ShapeDtypeStruct((1,), np.float64)
    call = jax.ffi.ffi_call(jit_ffi.TARGET, out)
    good = jax.jit(lambda *a: call(*a, token=np.int64(route.token)))(*params, noise)
    close(good, jax.jit(seed_run)(params, noise))
    with pytest.raises(Exception, match="operand 3 passed by XLA does not have the dtype"):
        jax.jit(lambda *a: call(*a, token=np.int64(route.token)))(
            *params, noise[:3]).block_until_ready()
    with pytest.raises(Exception, match="takes 4 arrays and gives 1; XLA passed 3"):
        jax.jit(lambda *a: call(*a, token=np.int64(route.token)))(
            *params).block_until_ready()
    unknown = route.token ^ 1
    with pytest.raises(Exception, match="is not registered in this process"):
        jax.jit(lambda *a: call(*a, token=np.int64(unknown)))(*params, noise).block_until_ready()
    with pytest.raises(Exception, match="lacks its int64 token"):
        jax.jit(lambda *a: call(*a))(*params, noise).block_until_ready()


def test_tokens_are_the_same_for_the_same_kernel_and_differ_with_constants():
    x = jnp.arange(4.0)
    one = ef.jit(lambda x: x * np.array([1.0, 2.0, 3.0, 4.0])).compiled(x)
    same = ef.jit(lambda x: x * np.array([1.0, 2.0, 3.0, 4.0])).compiled(x)
    other = ef.jit(lambda x: x * np.array([4.0, 3.0, 2.0, 1.0])).compiled(x)
    tokens = [jit_ffi.route_for(f).token for f in (one, same, other)]
    assert tokens[0] == tokens[1] != tokens[2]
    close(jax.jit(lambda x: other.run([x])[0])(x), x * np.array([4.0, 3.0, 2.0, 1.0]))
    close(jax.jit(lambda x: one.run([x])[0])(x), x * np.array([1.0, 2.0, 3.0, 4.0]))
    # the token follows the library file, which every process loads from the cache
    library, _ = c_jit_ffi.library_location(ctypes.cast(one.entry, ctypes.c_void_p).value)
    assert library.endswith(".so") and os.path.isfile(library)


@pytest.mark.parametrize("outer_jit", [False, True])
def test_vmap_outputs_that_do_not_depend_on_the_batch_are_unbatched(outer_jit):
    """vmap(out_axes=None) for an output the batched argument does not reach, as plain
    JAX accepts; the others stay batched (they were all marked batched: JAX's raw
    ValueError)."""
    def f(x, W):
        return jnp.tanh(x @ W), W.sum() * 2.0, x.sum()
    rng = np.random.default_rng(0)
    x, W = jnp.asarray(rng.standard_normal((5, 3))), jnp.asarray(rng.standard_normal((3, 4)))
    axes = dict(in_axes=(0, None), out_axes=(0, None, 0))
    ours = jax.vmap(ef.jit(f), **axes)
    ours = jax.jit(ours) if outer_jit else ours
    for got, want in zip(ours(x, W), jax.vmap(f, **axes)(x, W)):
        assert got.shape == want.shape
        close(got, want)
    with pytest.raises(ValueError):    # batched output, out_axes None: JAX's own refusal
        jax.vmap(ef.jit(f), in_axes=(0, None), out_axes=(None, None, 0))(x, W)
