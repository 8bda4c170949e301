"""``ef.jit`` as ONE Triton kernel (v3.md section 5, issue 36 item 1), run by Triton's
interpreter (conftest sets TRITON_INTERPRET=1) on CPU arrays with ``backend="triton"``,
against ``jax.jit`` of the same function: the seed workload (a hidden-to-hidden layer
stepped in a scan) and its vmap over chains, an RNN, an RK4 integrator, a fori loop
with a cond and a while loop, gradients; one launch per call; a program the renderer
declines runs the host C kernel, says why, and launches nothing.  Sizes are small:
the interpreter is slow."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.backends.c import build as c_build  # noqa: E402
from einfuse.backends.triton import backend as triton_backend  # noqa: E402
from einfuse.errors import OptionError  # noqa: E402
from jit_support import x64  # noqa: E402,F401  (x64 mode around each test)

pytestmark = [
    pytest.mark.skipif(not triton_backend.available(), reason="triton (and torch) not installed"),
    pytest.mark.skipif(c_build.find_compiler() is None, reason="ef.jit builds its host kernel"),
]


@pytest.fixture
def in_bounds(monkeypatch):
    """Checks that every load, store and atomic add of the jit kernels launched stays
    inside the arrays passed to them (the interpreter reads and writes wherever a
    pointer points; a GPU may fault); checked after the test, the lanes of a ragged
    block included (their reads clamped to the last chain, their stores masked)."""
    from triton.runtime import interpreter
    from einfuse.backends.triton import jit_launch
    ranges, outside = [], []
    real_call = jit_launch.JitKernel.__call__

    def call(self, inputs, outputs):
        ranges[:] = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
                     for t in list(inputs) + list(outputs)]
        try:
            return real_call(self, inputs, outputs)
        finally:
            ranges.clear()
    monkeypatch.setattr(jit_launch.JitKernel, "__call__", call)

    def check(what, ptrs, mask):
        if not ranges:
            return
        size = np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize
        addresses = np.asarray(ptrs.data, dtype=np.uint64)
        taken = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
        addresses = addresses[taken]
        inside = np.zeros(addresses.shape, dtype=bool)
        for low, high in ranges:
            inside |= (addresses >= low) & (addresses + size <= high)
        if not inside.all():
            outside.append((what, int((~inside).sum())))
    builder = interpreter.interpreter_builder
    load, store, atomic = (builder.create_masked_load, builder.create_masked_store,
                           builder.create_atomic_rmw)

    def checked_load(ptrs, mask, *rest):
        check("load", ptrs, mask)
        return load(ptrs, mask, *rest)

    def checked_store(ptrs, value, mask, *rest):
        check("store", ptrs, mask)
        return store(ptrs, value, mask, *rest)

    def checked_atomic(op, ptr, value, mask, *rest):
        check("atomic add", ptr, mask)
        return atomic(op, ptr, value, mask, *rest)
    monkeypatch.setattr(builder, "create_masked_load", checked_load)
    monkeypatch.setattr(builder, "create_masked_store", checked_store)
    monkeypatch.setattr(builder, "create_atomic_rmw", checked_atomic)
    yield outside
    assert outside == [], "accesses outside the kernel's arrays (kind, elements)"


@pytest.fixture(autouse=True)
def every_access_in_bounds(in_bounds):
    yield


def launches(call):
    from einfuse.backends.triton import launch
    with launch.observed() as seen:
        result = call()
    return result, seen


def close(got, want, tol=1e-12):
    got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        assert np.asarray(g).shape == np.asarray(w).shape
        assert np.asarray(g).dtype == np.asarray(w).dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tol, atol=tol)


def seed_arrays(steps, hidden, chains=0, seed=0):
    from einfuse.bench.jit_cases import seed_inputs
    arrays = seed_inputs(steps, hidden, chains)(np.random.default_rng(seed))
    return [jnp.asarray(arrays[k]) for k in ("w0", "w1", "w2")], jnp.asarray(arrays["noise"])


def test_seed_workload_is_one_triton_kernel():
    from einfuse.bench.jit_cases import seed_function
    params, noise = seed_arrays(6, 5)
    fn = ef.jit(seed_function, backend="triton")
    out, seen = launches(lambda: fn(params, noise))
    assert [(s.kernel, s.grid) for s in seen] == [("ef_jit_kernel", (1,))]
    close(out, jax.jit(seed_function)(params, noise))


def test_vmapped_chains_spread_over_programs():
    from einfuse.bench.jit_cases import seed_function
    params, noise = seed_arrays(4, 5, chains=3, seed=1)
    fn = jax.vmap(ef.jit(seed_function, backend="triton"), in_axes=(None, 0))
    out, seen = launches(lambda: fn(params, noise))
    assert [s.grid for s in seen] == [(3,)]      # one launch, one program per chain
    close(out, jax.jit(jax.vmap(seed_function, in_axes=(None, 0)))(params, noise))


def rnn(W, U, b, xs):
    def step(h, x):
        h = jnp.tanh(W @ h + U @ x + b)
        return h, (h * h).sum()
    return jax.lax.scan(step, jnp.zeros(W.shape[0], xs.dtype), xs)


def test_rnn_cell_with_stacked_outputs():
    rng = np.random.default_rng(2)
    W = jnp.asarray(rng.standard_normal((6, 6)) * 0.5)
    U = jnp.asarray(rng.standard_normal((6, 3)))
    b = jnp.asarray(rng.standard_normal(6))
    xs = jnp.asarray(rng.standard_normal((7, 3)))
    out, seen = launches(lambda: ef.jit(rnn, backend="triton")(W, U, b, xs))
    assert len(seen) == 1
    close(out, jax.jit(rnn)(W, U, b, xs))


def rk4(A, y0, dt):
    def f(y):
        return jnp.tanh(A @ y) - 0.1 * y

    def step(y, _):
        k1 = f(y)
        k2 = f(y + 0.5 * dt * k1)
        k3 = f(y + 0.5 * dt * k2)
        k4 = f(y + dt * k3)
        return y + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4), None
    return jax.lax.scan(step, y0, None, length=5)[0]


def test_rk4_integrator_in_float32_and_its_gradient():
    rng = np.random.default_rng(3)
    A = jnp.asarray(rng.standard_normal((4, 4)), jnp.float32)
    y0 = jnp.asarray(rng.standard_normal(4), jnp.float32)
    out, seen = launches(lambda: ef.jit(rk4, backend="triton")(A, y0, 0.1))
    assert len(seen) == 1
    close(out, jax.jit(rk4)(A, y0, 0.1), tol=1e-5)

    def loss(A, y0):
        return rk4(A, y0, 0.1).sum()
    grads, seen = launches(lambda: jax.grad(ef.jit(loss, backend="triton"), (0, 1))(A, y0))
    # the forward kernel and the backward kernel (the jaxpr of jax.vjp), both Triton
    assert len(seen) == 2
    close(grads, jax.jit(jax.grad(loss, (0, 1)))(A, y0), tol=1e-5)


def cond_and_while(x, n):
    def body(i, x):
        return jax.lax.cond(x.sum() > 0, lambda y: y * 0.5 - 1.0,
                            lambda y: jnp.sin(y) + 2.0 + i, x)
    x = jax.lax.fori_loop(0, n, body, x)
    count, y = jax.lax.while_loop(lambda c: c[1].max() < 30.0,
                                  lambda c: (c[0] + 1, c[1] * 1.5 + 0.25), (0, x))
    return y, count


def test_loop_with_cond_and_while_inside_the_kernel():
    x = jnp.asarray(np.random.default_rng(4).standard_normal(5))
    fn = ef.jit(cond_and_while, backend="triton", static_argnums=1)
    out, seen = launches(lambda: fn(x, 6))
    assert len(seen) == 1
    want = jax.jit(cond_and_while, static_argnums=1)(x, 6)
    close(out[0], want[0])
    assert int(out[1]) == int(want[1])


def integers(x, k):
    # saturating float -> int conversion (NaN to 0), integer arithmetic, floor division
    big = (x * 1e10).astype(jnp.int32)
    small = jnp.floor(x * 3.0).astype(jnp.int64)
    return big, (small * k + 7) // 3, jnp.where(small % 2 == 0, x, -x)


def test_casts_and_integer_arithmetic_follow_xla():
    x = jnp.asarray([0.5, -2.25, np.nan, np.inf, -np.inf, 1e-3, -0.7])
    k = jnp.asarray(5, jnp.int64)
    out, seen = launches(lambda: ef.jit(integers, backend="triton")(x, k))
    assert len(seen) == 1
    close(out, jax.jit(integers)(x, k))


def scatter_and_argmax(x, i, m):
    # (a repeated index: .add sums, .set keeps the last write, as the C kernel does)
    return (x.at[i].add(1.0) * jnp.argmax(x), jnp.argmax(m, axis=1),
            jnp.argmin(m.astype(jnp.int32), axis=0), jnp.argmax(m),
            x.at[i].set(x[:4] * 3.0), m.at[i[:3], 1].set(7.0))


def test_scatters_and_argmax_with_nans_ties_and_infinities():
    x = jnp.asarray([0.3, 2.0, -1.0, 2.0, np.nan, 5.0])
    i = jnp.asarray([1, 3, 1, -1])
    m = jnp.asarray([[1.0, 3.0, 3.0], [np.nan, 0.0, np.nan], [-np.inf, -np.inf, -np.inf],
                     [2.0, 9.0, 1.0]])
    out, seen = launches(lambda: ef.jit(scatter_and_argmax, backend="triton")(x, i, m))
    assert len(seen) == 1
    close(out, jax.jit(scatter_and_argmax)(x, i, m))


@pytest.mark.parametrize("rows", [5, 300])    # a register tile; memory (atomic adds)
def test_embedding_gradient_scatters_inside_the_backward_kernel(rows):
    def loss(E, ids):
        return (jnp.tanh(E[ids]) ** 2).sum()
    rng = np.random.default_rng(8)
    E = jnp.asarray(rng.standard_normal((rows, 3)))
    ids = jnp.asarray(np.r_[0, 2, 2, rows - 1, 0, 1, rng.integers(0, rows, 20)])
    grads, seen = launches(lambda: jax.grad(ef.jit(loss, backend="triton"))(E, ids))
    assert len(seen) == 2
    close(grads, jax.jit(jax.grad(loss))(E, ids))


def cube_roots(x):
    return jax.lax.cbrt(x) + 1.0


def test_a_program_the_renderer_declines_runs_the_host_kernel_and_says_why():
    from einfuse.runtime.jit_triton import route_of
    x = jnp.asarray(np.random.default_rng(5).standard_normal(6))
    fn = ef.jit(cube_roots, backend="triton")
    out, seen = launches(lambda: fn(x))
    assert seen == []
    close(out, jax.jit(cube_roots)(x))
    lines = route_of(fn.compiled(x)).describe()
    assert any("the host C kernel: the Triton renderer declines: the operation cbrt" in line
               for line in lines)
    assert "the Triton renderer declines" in str(ef.explain(fn, x))


def test_auto_keeps_host_arrays_on_the_host_kernel():
    from einfuse.bench.jit_cases import seed_function
    from einfuse.runtime.jit_triton import route_of
    params, noise = seed_arrays(3, 4)
    fn = ef.jit(seed_function)
    out, seen = launches(lambda: fn(params, noise))
    assert seen == []
    close(out, jax.jit(seed_function)(params, noise))
    lines = route_of(fn.compiled(params, noise)).describe()
    assert "eager call on host arrays: the host C kernel: the arrays are on the host" in lines[0]


def test_the_cost_rule_keeps_one_tiny_chain_on_the_host_and_sends_many_to_the_gpu():
    from einfuse.bench.jit_cases import seed_function
    from einfuse.frontends.jaxpr import convert
    from einfuse.runtime.jit_support import without_dead_code
    from einfuse.schedule.jit_device import choose
    params, noise = seed_arrays(8000, 12)
    program = convert(without_dead_code(jax.make_jaxpr(seed_function)(params, noise)))
    one = choose(program, 1, "auto", True, True, None, 256, 900)
    many = choose(program, 256, "auto", True, True, None, 256, 900)
    assert not one.triton and "the host is faster" in one.reason
    assert many.triton and "the device is faster" in many.reason
    assert not choose(program, 256, "auto", False, True, None, 256, 900).triton
    big = choose(program, 256, "triton", True, True, None, 1 << 20, 1 << 20)
    assert not big.triton and "registers" in big.reason


def test_backend_is_checked():
    with pytest.raises(OptionError, match="backend"):
        ef.jit(lambda x: x, backend="cuda")


def test_seed_gradient_keeps_its_residuals_in_scratch_memory():
    from einfuse.backends.triton.jit_render import render_jit
    from einfuse.bench.jit_cases import seed_function
    params, noise = seed_arrays(60, 5, seed=6)

    def loss(p, n):
        return seed_function(p, n).sum()
    fn = ef.jit(loss, backend="triton")
    grads, seen = launches(lambda: jax.grad(fn)(params, noise))
    assert len(seen) == 2
    close(grads, jax.jit(jax.grad(loss))(params, noise))
    # the reversed scan reads residuals stacked by the forward scan: a row per step,
    # kept in a scratch array per program, not in a register tile rewritten per step
    backward = fn.compiled(params, noise).backward().program
    assert render_jit(backward).scratch


def test_a_long_stacked_scan_output_is_written_in_place():
    def states(W, xs):
        def step(h, x):
            h = jnp.tanh(W @ h + x)
            return h, (h, h.sum())         # rows of a matrix, and scalars
        return jax.lax.scan(step, jnp.zeros(W.shape[0], xs.dtype), xs)[1]
    rng = np.random.default_rng(7)
    W = jnp.asarray(rng.standard_normal((6, 6)) * 0.5)
    xs = jnp.asarray(rng.standard_normal((300, 6)))
    out, seen = launches(lambda: ef.jit(states, backend="triton")(W, xs))
    assert len(seen) == 1
    close(out, jax.jit(states)(W, xs))


def _jax_gpu():
    from einfuse.analysis.triton_facts import interpreted
    try:
        return not interpreted() and jax.devices()[0].platform == "gpu"
    except RuntimeError:
        return False


@pytest.mark.skipif(not _jax_gpu(), reason="needs JAX on a GPU and TRITON_INTERPRET=0")
def test_on_gpu_arrays_the_cost_rule_sends_many_chains_to_one_triton_kernel():
    from einfuse.bench.jit_cases import seed_function
    params, noise = seed_arrays(200, 12, chains=256, seed=9)
    fn = jax.vmap(ef.jit(seed_function), in_axes=(None, 0))
    out, seen = launches(lambda: fn(params, noise))
    assert [s.grid for s in seen] == [(256,)]
    assert next(iter(out.devices())).platform == "gpu"      # no copy to the host
    close(out, jax.jit(jax.vmap(seed_function, in_axes=(None, 0)))(params, noise), tol=1e-10)
    # one chain: the host kernel (the rule's estimate), still the right result
    single, seen = launches(lambda: ef.jit(seed_function)(params, noise[0]))
    assert seen == []
    close(single, jax.jit(seed_function)(params, noise[0]), tol=1e-10)


def test_forward_mode_and_a_nested_vmap(monkeypatch):
    # one program per chain here (test_jit_triton_lanes spreads a nested vmap over lanes)
    monkeypatch.setenv("EINFUSE_JIT_LANES", "1")
    rng = np.random.default_rng(10)
    A = jnp.asarray(rng.standard_normal((4, 4)))
    y0 = jnp.asarray(rng.standard_normal(4))
    fn = ef.jit(rk4, backend="triton")
    # jax.jvp: the primal kernel and the forward-mode kernel, both Triton
    (primal, tangent), seen = launches(lambda: jax.jvp(lambda a: fn(a, y0, 0.1), (A,), (A,)))
    assert len(seen) == 2
    close((primal, tangent), jax.jvp(lambda a: rk4(a, y0, 0.1), (A,), (A,)))
    # two batch levels, the matrix batched over the outer one only: one program per
    # element of both
    As = jnp.asarray(rng.standard_normal((2, 4, 4)))
    ys = jnp.asarray(rng.standard_normal((2, 3, 4)))
    nested = jax.vmap(lambda a, y: jax.vmap(lambda v: fn(a, v, 0.1))(y))
    out, seen = launches(lambda: nested(As, ys))
    assert [s.grid for s in seen] == [(6,)]
    close(out, jax.vmap(lambda a, y: jax.vmap(lambda v: rk4(a, v, 0.1))(y))(As, ys))


def trigonometry(x, y):
    return jnp.fmod(x, y), jnp.arctan2(x, y), jnp.tan(x), jax.scipy.special.erf(x)


def test_remainder_atan2_tan_and_erf_follow_xla():
    rng = np.random.default_rng(11)
    x = jnp.asarray(np.r_[rng.standard_normal(6) * 3, 0.0, -0.0, np.inf])
    y = jnp.asarray(np.r_[rng.standard_normal(6), -1.5, 2.0, 1.0])
    out, seen = launches(lambda: ef.jit(trigonometry, backend="triton")(x, y))
    assert len(seen) == 1
    close(out, jax.jit(trigonometry)(x, y))


def test_a_kernel_triton_fails_to_build_falls_back_to_the_host_and_says_so(monkeypatch):
    from einfuse.backends.triton import jit_launch
    from einfuse.runtime.jit_triton import route_of

    def refuse(self, inputs, outputs):
        raise RuntimeError("the compiler refused it")
    monkeypatch.setattr(jit_launch.JitKernel, "__call__", refuse)
    rng = np.random.default_rng(12)
    A = jnp.asarray(rng.standard_normal((3, 3)))
    y0 = jnp.asarray(rng.standard_normal(3))
    fn = ef.jit(rk4, backend="triton")
    close(fn(A, y0, 0.1), jax.jit(rk4)(A, y0, 0.1))
    assert "did not build (RuntimeError: the compiler refused it)" in \
        route_of(fn.compiled(A, y0, 0.1)).describe()[0]
    close(fn(A, y0, 0.1), jax.jit(rk4)(A, y0, 0.1))      # the host from then on


def bit_twiddling(a, b):
    signed = a.astype(jnp.int32), b.astype(jnp.int32)
    return (a << b, a >> b, jax.lax.shift_right_logical(*signed),
            jax.lax.shift_right_arithmetic(*signed), a // jnp.uint32(3), a % b,
            jax.lax.bitcast_convert_type(a, jnp.float32))


def test_unsigned_shifts_division_and_bitcasts_follow_xla():
    a = jnp.asarray([1, 2 ** 31 + 5, 7, 0xFFFFFFFF, 12, 9], jnp.uint32)
    b = jnp.asarray([0, 1, 31, 32, 40, 0], jnp.uint32)     # counts past the width, by zero
    out, seen = launches(lambda: ef.jit(bit_twiddling, backend="triton")(a, b))
    assert len(seen) == 1
    for got, want in zip(out, jax.jit(bit_twiddling)(a, b)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def langevin(key, x0):
    def step(x, k):
        return x - 0.01 * x + 0.1 * jax.random.normal(k, x.shape), None
    return jax.lax.scan(step, x0, jax.random.split(key, 5))[0]


def test_vmapped_langevin_chains_draw_their_noise_inside_the_kernel():
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    x0 = jnp.ones(4)
    fn = jax.vmap(ef.jit(langevin, backend="triton"), in_axes=(0, None))
    out, seen = launches(lambda: fn(keys, x0))
    assert [s.grid for s in seen] == [(3,)]
    close(out, jax.jit(jax.vmap(langevin, in_axes=(0, None)))(keys, x0))


@pytest.mark.slow
def test_the_256_chain_vmap_of_the_bench_is_one_launch_of_256_programs():
    # the vmapped case (256 chains, 32 hidden, float64), a few steps: the
    # interpreter runs each program in turn
    from einfuse.bench.jit_cases import seed_function
    params, noise = seed_arrays(3, 32, chains=256, seed=2)
    fn = jax.vmap(ef.jit(seed_function, backend="triton"), in_axes=(None, 0))
    out, seen = launches(lambda: fn(params, noise))
    assert [s.grid for s in seen] == [(256,)]
    close(out, jax.jit(jax.vmap(seed_function, in_axes=(None, 0)))(params, noise))
