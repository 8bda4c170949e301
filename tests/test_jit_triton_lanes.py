"""A vmapped ``ef.jit`` function as ONE Triton kernel spread over programs AND lanes
(issue 36 item 1): several chains per program, the chain axis leading every tile
(backends/triton/jit_lanes.py; the number of lanes by schedule/jit_device.lanes_for),
run by Triton's interpreter against ``jax.jit`` of the ``vmap``: the seed workload, a
while loop whose trip count differs per chain, a cond and a switch with a per-chain
predicate, a nested vmap, an RNN with stacked outputs, scatters and argmax per lane,
gradients, ragged batches (not a multiple of the lanes); one launch per call.  The
lanes are asked for through EINFUSE_JIT_LANES (the rule itself keeps these small
batches at one chain per program, as its own test shows)."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.backends.c import build as c_build  # noqa: E402
from einfuse.backends.triton import backend as triton_backend  # noqa: E402
from jit_support import x64  # noqa: E402,F401  (x64 mode around each test)
from test_jit_triton import (close, in_bounds, launches, rnn, scatter_and_argmax,  # noqa: E402,F401
                             seed_arrays)

pytestmark = [
    pytest.mark.skipif(not triton_backend.available(), reason="triton (and torch) not installed"),
    pytest.mark.skipif(c_build.find_compiler() is None, reason="ef.jit builds its host kernel"),
]


@pytest.fixture
def lanes(monkeypatch):
    def ask(n):
        monkeypatch.setenv("EINFUSE_JIT_LANES", str(n))
    return ask


def spread_of(function, *args, batched, size):
    """How the batch of ``size`` of ``function`` (an ef.jit function) lies over programs
    and lanes, in explain's words."""
    from einfuse.runtime.jit_triton import batched_route_of
    compiled = function.compiled(*args)
    leaves = jax.tree_util.tree_leaves(batched)
    return " ".join(batched_route_of(compiled.batched(size, tuple(leaves))).describe())


@pytest.mark.parametrize("chains, ask, programs", [(3, 2, 2), (5, 4, 2)])
def test_vmapped_seed_runs_several_chains_per_program(lanes, in_bounds, chains, ask, programs):
    from einfuse.bench.jit_cases import seed_function
    lanes(ask)
    params, noise = seed_arrays(4, 5, chains=chains, seed=chains)
    inner = ef.jit(seed_function, backend="triton")
    fn = jax.vmap(inner, in_axes=(None, 0))
    out, seen = launches(lambda: fn(params, noise))
    assert [s.grid for s in seen] == [(programs,)]      # one launch, blocks of chains
    close(out, jax.jit(jax.vmap(seed_function, in_axes=(None, 0)))(params, noise))
    text = spread_of(inner, params, noise[0], batched=([False] * 3, True), size=chains)
    assert f"{ask} chains per program, as lanes" in text
    # explain of the function says it of each vmap made of it
    assert f"vmapped over {chains} (GPU arrays): one Triton kernel: " in \
        str(ef.explain(inner, params, noise[0]))
    assert f"{programs} program(s), 1 warp(s) each; {ask} chains per program, as lanes " \
        f"(EINFUSE_JIT_LANES={ask} asks for {ask} lane(s))" in str(ef.explain(inner, params,
                                                                             noise[0]))


def per_chain_loop(x):
    # the trip count depends on the chain's own data: 0 to several steps
    count, y = jax.lax.while_loop(lambda c: c[1].max() < 30.0,
                                  lambda c: (c[0] + 1, c[1] * 1.5 + 0.25), (0, x))
    z = jax.lax.cond(x.sum() > 0, lambda v: v * 0.5 - 1.0, lambda v: jnp.sin(v) + 2.0, y)
    k = jax.lax.switch(jnp.clip(count, 0, 2), [lambda v: v + 1.0, lambda v: v * v,
                                                lambda v: -v], z)
    return k, count


def test_a_while_loop_and_branches_whose_conditions_differ_per_chain(lanes, in_bounds):
    lanes(4)
    rng = np.random.default_rng(1)
    # chains that stop after 0, 1, ... steps; 7 chains: the second block is ragged
    x = jnp.asarray(rng.standard_normal((7, 5)) * np.array([[40.0], [0.1], [3.0], [-1.0],
                                                             [20.0], [0.5], [31.0]]))
    fn = jax.vmap(ef.jit(per_chain_loop, backend="triton"))
    out, seen = launches(lambda: fn(x))
    assert [s.grid for s in seen] == [(2,)]
    want = jax.jit(jax.vmap(per_chain_loop))(x)
    assert len(set(np.asarray(want[1]).tolist())) > 2       # trip counts do differ
    close(out, want)
    np.testing.assert_array_equal(np.asarray(out[1]), np.asarray(want[1]))   # each its own


def test_a_nested_vmap_spreads_its_inner_level_over_lanes(lanes, in_bounds):
    from test_jit_triton import rk4
    lanes(2)
    rng = np.random.default_rng(10)
    As = jnp.asarray(rng.standard_normal((2, 4, 4)))
    ys = jnp.asarray(rng.standard_normal((2, 3, 4)))
    fn = ef.jit(rk4, backend="triton")
    nested = jax.vmap(lambda a, y: jax.vmap(lambda v: fn(a, v, 0.1))(y))
    out, seen = launches(lambda: nested(As, ys))
    assert [s.grid for s in seen] == [(4,)]      # 2 outer x 2 blocks of 2 of 3 chains
    close(out, jax.vmap(lambda a, y: jax.vmap(lambda v: rk4(a, v, 0.1))(y))(As, ys))


@pytest.mark.parametrize("steps", [7, 90])     # stacked outputs in registers; in memory
def test_a_vmapped_rnn_with_stacked_outputs(lanes, in_bounds, steps):
    lanes(4)
    rng = np.random.default_rng(2)
    W = jnp.asarray(rng.standard_normal((6, 6)) * 0.5)
    U = jnp.asarray(rng.standard_normal((6, 3)))
    b = jnp.asarray(rng.standard_normal(6))
    xs = jnp.asarray(rng.standard_normal((5, steps, 3)))
    fn = jax.vmap(ef.jit(rnn, backend="triton"), in_axes=(None, None, None, 0))
    out, seen = launches(lambda: fn(W, U, b, xs))
    assert [s.grid for s in seen] == [(2,)]
    close(out, jax.jit(jax.vmap(rnn, in_axes=(None, None, None, 0)))(W, U, b, xs))


def states(W, xs):
    def step(h, x):
        h = jnp.tanh(W @ h + x)
        return h, h
    return jax.lax.scan(step, jnp.zeros(W.shape[0], xs.dtype), xs)[1]


def test_a_vmapped_output_too_large_for_registers_is_stored_for_the_valid_lanes(lanes,
                                                                                in_bounds):
    from einfuse.backends.triton.jit_memory import MEMORY_ELEMENTS
    from einfuse.runtime.jit_triton import batched_route_of
    lanes(4)
    rng = np.random.default_rng(7)
    W = jnp.asarray(rng.standard_normal((6, 6)) * 0.5)
    xs = jnp.asarray(rng.standard_normal((5, 300, 6)))
    inner = ef.jit(states, backend="triton")
    out, seen = launches(lambda: jax.vmap(inner, in_axes=(None, 0))(W, xs))
    assert [s.grid for s in seen] == [(2,)]
    close(out, jax.jit(jax.vmap(states, in_axes=(None, 0)))(W, xs))
    # (the block's output, 4 x 300 x 6, lives in memory: its stores are masked)
    assert 4 * 512 * 8 > MEMORY_ELEMENTS
    route = batched_route_of(inner.compiled(W, xs[0]).batched(5, (False, True)))
    assert route.choice(False).triton and route.rendered.lanes == 4


def test_scatters_and_argmax_per_lane(lanes, in_bounds):
    lanes(2)
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((3, 6)))
    x = x.at[1, 4].set(np.nan).at[2, 0].set(9.0).at[2, 5].set(9.0)
    i = jnp.asarray([[1, 3, 1, -1], [0, 0, 5, 2], [4, 4, 4, 4]])
    m = jnp.asarray(rng.standard_normal((3, 4, 3))).at[0, 1, 2].set(np.nan)
    fn = jax.vmap(ef.jit(scatter_and_argmax, backend="triton"))
    out, seen = launches(lambda: fn(x, i, m))
    assert [s.grid for s in seen] == [(2,)]
    close(out, jax.jit(jax.vmap(scatter_and_argmax))(x, i, m))


def test_gradients_through_the_vmapped_seed(lanes, in_bounds):
    from einfuse.bench.jit_cases import seed_function
    lanes(4)
    params, noise = seed_arrays(5, 4, chains=6, seed=4)
    fn = jax.vmap(ef.jit(seed_function, backend="triton"), in_axes=(None, 0))

    def loss(p, f):
        return (f(p, noise) ** 2).sum()
    grads, seen = launches(lambda: jax.grad(loss)(params, fn))
    # the forward kernel over blocks of 4 chains, then the backward kernel: one launch
    # each (the backward comes as one function of the whole batch, a single program)
    assert len(seen) == 2 and seen[0].grid == (2,)
    close(grads, jax.jit(jax.grad(lambda p: loss(p, jax.vmap(seed_function,
                                                             in_axes=(None, 0)))))(params))


def test_per_chain_gradients_run_their_backward_kernel_in_lanes_too(lanes, in_bounds):
    from einfuse.bench.jit_cases import seed_function
    lanes(4)
    params, noise = seed_arrays(5, 4, chains=5, seed=8)

    def loss(p, n):
        return (seed_function(p, n) ** 2).sum()
    fn = jax.vmap(jax.grad(ef.jit(loss, backend="triton")), in_axes=(None, 0))
    grads, seen = launches(lambda: fn(params, noise))
    # the vmapped forward and the vmapped backward kernel: blocks of 4 of the 5 chains
    assert [s.grid for s in seen] == [(2,), (2,)]
    close(grads, jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0)))(params, noise))


def test_where_no_block_program_can_be_made_one_program_per_chain_runs(lanes, monkeypatch):
    from einfuse.bench.jit_cases import seed_function
    from einfuse.frontends.jaxpr_values import JaxprConversionError
    from einfuse.runtime import jit_triton
    lanes(2)

    def refuse(batched, count):
        raise JaxprConversionError("a batched form with no conversion")
    monkeypatch.setattr(jit_triton, "_block_program", refuse)
    params, noise = seed_arrays(3, 4, chains=3, seed=5)
    inner = ef.jit(seed_function, backend="triton")
    out, seen = launches(lambda: jax.vmap(inner, in_axes=(None, 0))(params, noise))
    assert [s.grid for s in seen] == [(3,)]
    close(out, jax.jit(jax.vmap(seed_function, in_axes=(None, 0)))(params, noise))
    text = spread_of(inner, params, noise[0], batched=([False] * 3, True), size=3)
    assert "one program per chain (the block program of 2 chains is not converted" in text


def test_a_kernel_over_lanes_that_fails_to_build_gives_way_to_one_program_per_chain(
        lanes, monkeypatch):
    from einfuse.backends.triton import jit_launch
    from einfuse.bench.jit_cases import seed_function
    lanes(2)
    real = jit_launch.JitKernel.__call__

    def refuse_lanes(self, inputs, outputs):
        if self.rendered.lanes > 1:
            raise RuntimeError("the compiler refused it")
        return real(self, inputs, outputs)
    monkeypatch.setattr(jit_launch.JitKernel, "__call__", refuse_lanes)
    params, noise = seed_arrays(3, 4, chains=3, seed=6)
    inner = ef.jit(seed_function, backend="triton")
    out, seen = launches(lambda: jax.vmap(inner, in_axes=(None, 0))(params, noise))
    assert [s.grid for s in seen] == [(3,)]
    close(out, jax.jit(jax.vmap(seed_function, in_axes=(None, 0)))(params, noise))
    text = spread_of(inner, params, noise[0], batched=([False] * 3, True), size=3)
    assert "one program per chain (its kernel over lanes did not build: RuntimeError" in text


def test_the_lanes_rule(monkeypatch):
    from einfuse.schedule.jit_device import TILE_LIMIT, lanes_for
    monkeypatch.delenv("EINFUSE_JIT_LANES", raising=False)
    # 16 x 16 tiles, 256 chains: one wave of programs already, lanes only add rounds
    assert lanes_for(256, 1, 256, 900)[0] == 1
    assert "no fewer with lanes" in lanes_for(256, 1, 256, 900)[1]
    # more chains than one wave: lanes take over
    assert lanes_for(4096, 1, 256, 900)[0] == 4
    # tiles smaller than a warp: lanes fill its threads
    assert lanes_for(3, 1, 1, 10)[0] == 4
    assert lanes_for(256, 1, 1, 4)[0] == 32
    # what one program cannot hold is never asked for
    assert lanes_for(64, 1, TILE_LIMIT // 2, 100)[0] <= 2
    monkeypatch.setenv("EINFUSE_JIT_LANES", "6")
    assert lanes_for(100, 1, 16, 16)[0] == 4
    assert lanes_for(3, 1, TILE_LIMIT // 2, 100)[0] == 2


@pytest.mark.slow
def test_the_256_chain_vmap_in_lanes(lanes):
    from einfuse.bench.jit_cases import seed_function
    lanes(8)
    params, noise = seed_arrays(3, 32, chains=256, seed=2)
    fn = jax.vmap(ef.jit(seed_function, backend="triton"), in_axes=(None, 0))
    out, seen = launches(lambda: fn(params, noise))
    assert [s.grid for s in seen] == [(32,)]
    close(out, jax.jit(jax.vmap(seed_function, in_axes=(None, 0)))(params, noise))


COMPILE_SCRIPT = """
import importlib.util, os, sys
sys.path.insert(0, sys.argv[1])
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from einfuse.backends.triton.jit_render import render_jit
from einfuse.bench.jit_cases import seed_function
from einfuse.frontends.jaxpr import convert
from einfuse.runtime.jit_support import without_dead_code
from test_jit_triton import scatter_and_argmax
from test_jit_triton_lanes import per_chain_loop, states

S, f64 = jax.ShapeDtypeStruct, jnp.float64
TYPES = {"float64": "fp64", "int64": "i64", "int32": "i32", "bool": "i1"}


def compile_block(name, fn, examples, axes, lanes, chains):
    lanes_examples = [S(((lanes,) if a == 0 else ()) + e.shape, e.dtype)
                      for e, a in zip(examples, axes)]
    program = convert(without_dead_code(jax.make_jaxpr(jax.vmap(fn, in_axes=axes))(
        *lanes_examples)))
    flags = [(a == 0,) for a in axes] + [(False,)] * len(program.constants)
    rendered = render_jit(program, flags, (chains,), lanes)
    assert rendered.lanes == lanes
    path = os.path.join(sys.argv[2], name + ".py")
    with open(path, "w") as handle:
        handle.write(rendered.source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernel = module.ef_jit_kernel
    buffers = list(program.inputs) + list(program.outputs) + [n for n, _, _ in rendered.scratch]
    signature = {param.name: "*" + TYPES[program.buffer(b).dtype.numpy.name]
                 for param, b in zip(kernel.params, buffers)}
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs={}),
                              target=GPUTarget("cuda", 90, 32), options=dict(num_warps=1))
    assert compiled.asm["cubin"] and ".entry ef_jit_kernel" in compiled.asm["ptx"]
    print("compiled", name)


compile_block("seed", lambda w0, w1, w2, n: seed_function((w0, w1, w2), n),
              [S((1, 12), f64), S((12, 12), f64), S((12, 1), f64), S((4, 1), f64)],
              (None, None, None, 0), 4, 7)
compile_block("loop", per_chain_loop, [S((5,), f64)], (0,), 4, 7)
compile_block("states", states, [S((6, 6), f64), S((300, 6), f64)], (None, 0), 4, 5)
compile_block("scatter", scatter_and_argmax,
              [S((6,), f64), S((4,), jnp.int64), S((4, 3), f64)], (0, 0, 0), 2, 3)
"""


@pytest.mark.slow
def test_block_kernels_compile_for_sm90(tmp_path):
    # Triton's compiler, not the interpreter (which takes constructs the compiler
    # refuses): the block programs of a per-chain while loop and branches, the seed,
    # stacked outputs in memory and scatters/argmax, down to a cubin for sm_90
    import os
    from test_triton_compiles import _compiled_elsewhere, _has_cuda_compiler
    if not _has_cuda_compiler():
        pytest.skip("Triton's CUDA compiler is absent")
    out = _compiled_elsewhere(COMPILE_SCRIPT, (os.path.dirname(__file__), str(tmp_path)),
                              tmp_path)
    assert out.split() == ["compiled", "seed", "compiled", "loop", "compiled", "states",
                           "compiled", "scatter"]
