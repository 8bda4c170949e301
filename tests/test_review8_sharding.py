"""Review 8 of sharding (programs.md section 4, docs/sharding.md, src/einfuse/sharding/):
a hostile outside review of ``ef.explain(..., mesh=, shard=)`` and of sharded runs on
JAX arrays.  Each test pins a bug the review found: the per-device numbers, the error
type and what it names, or that a sharded run equals jax.numpy's unsharded result.

The runs need 8 JAX CPU devices, which XLA_FLAGS gives only before jax is first
imported, so they run in one subprocess (this file run as a script, one JSON line of
check name -> None or what failed), as test_sharding_run.py does."""

import os
import sys

import numpy as np
import pytest

import einfuse as ef
from eight_devices import run_script
from einfuse.errors import ShapeError
from einfuse.sharding import MoveKind

RUNS = {}


def run_check(function):
    RUNS[function.__name__] = function
    return function


# -- explain (no JAX) -----------------------------------------------------------------------
def test_index_read_at_two_axes_of_one_array_is_not_split():
    # A[i, i] with i split would need each device's diagonal block, which no
    # PartitionSpec describes (P('x', 'x') is refused by JAX): run i whole
    for text in ("y[i] := A[i,i]", "y := sum[i](A[i,i])"):
        e = ef.explain(text, shapes={"A": (8, 8)}, mesh={"x": 4}, shard={"i": "x"})
        (statement,) = e.plan.statements
        assert not statement.split.pairs and "two axes" in statement.notes[0]
        assert dict(e.plan.inputs)["A"].layout == ((), ())
        assert e.collectives == ()
        assert e.plan.local_flops == sum(s.flops for s in e.plan.statements)


def test_extent_of_an_index_that_runs_whole_need_not_divide():
    # i is read shifted (x[i+a]), so it runs whole and makes no blocks: its extent 18
    # was refused as "does not divide into 4 equal blocks" all the same
    conv = "y[i] := x[i+a] * k[a]"
    for shard in (None, {"i": "i"}):
        e = ef.explain(conv, shapes={"x": (22,), "k": (5,)}, mesh={"i": 4}, shard=shard)
        (statement,) = e.plan.statements
        assert not statement.split.pairs and statement.notes
        assert e.plan.local_flops == statement.flops == 18 * 5 * 2
    # an index that is split still has to divide
    with pytest.raises(ShapeError, match="index i has extent 18"):
        ef.explain("y[i] := x[i] * 2", shapes={"x": (18,)}, mesh={"i": 4})


def test_huge_shapes_give_numbers_or_a_shape_error():
    n = 2 ** 32      # an outer product of 2**64 elements: no array, but a plan
    e = ef.explain("y[i,j] := a[i]*b[j]", shapes={"a": (n,), "b": (n,)},
                   mesh={"x": 4}, shard={"i": "x"})
    assert e.plan.local_flops == n * n // 4 and e.plan.outputs[0][1].layout == (("x",), ())
    assert e.plan.input_bytes == (n // 4 + n) * 4
    assert "per device 1073741824x4294967296" in str(e)
    # read by a later statement: refused, naming it (was a raw ValueError from NumPy)
    with pytest.raises(ShapeError, match="t .statement 1. would have the shape"):
        # (t read twice: read once in a sum, it would be computed where it is read)
        ef.explain("t[i,j] := a[i]*b[j]; s := sum[i,j](t[i,j]) + max[i,j](t[i,j])",
                   shapes={"a": (n,), "b": (n,)}, mesh={"x": 4}, shard={"i": "x"})
    # an input of 2**62 float32 elements (2**64 bytes): refused, naming it
    with pytest.raises(ShapeError, match="shapes= gives a the shape"):
        ef.explain("y := sum[i](a[i])", shapes={"a": (2 ** 62,)}, mesh={"x": 4})
    # 2**30 x 2**30 matmul with k split: the all-reduce of 2**62 bytes
    m = 2 ** 30
    e = ef.explain("y[i,j] := sum[k](A[i,k]*B[k,j])", shapes={"A": (m, m), "B": (m, m)},
                   mesh={"x": 4}, shard={"k": "x"})
    (reduce,) = e.collectives
    assert reduce.kind is MoveKind.ALL_REDUCE and reduce.operand_bytes == m * m * 4
    assert reduce.bytes_sent == 2 * 3 * m * m * 4 // 4
    assert e.plan.local_flops == 2 * m ** 3 // 4


def test_dtypes_are_those_of_the_jax_run():
    # a sharded run is JAX's, where x * 2.5 of int32 is float32 and a sum of bools is
    # int32 (x64 off); the plan used NumPy's float64/int64 and doubled the bytes moved
    jax = sys.modules.get("jax")
    if (jax is not None and jax.config.jax_enable_x64) or os.environ.get("JAX_ENABLE_X64"):
        pytest.skip("JAX's x64 mode is on in this process")
    e = ef.explain("y[i] := x[i] * 2.5; s := sum[i](y[i])", x=np.ones(8, np.int32),
                   mesh={"x": 4}, shard={"i": "x"})
    assert e.plan.tensor("y").dtype == "float32"
    (reduce,) = e.collectives
    assert reduce.operand_bytes == 4 and reduce.bytes_sent == 2 * 3 * 4 // 4
    e = ef.explain("m[i,j] := X[i,j] > 0; c[i] := sum[j](m[i,j])", shapes={"X": (8, 16)},
                   mesh={"x": 4}, shard={"j": "x"})
    assert e.collectives[0].operand_bytes == 8 * 4
    assert e.plan.tensor("c").dtype == "int32"


def test_sharding_options_that_would_be_ignored_are_refused():
    from einfuse.errors import OptionError
    from einfuse.sharding import CostModel
    # cost_model= without mesh= was silently ignored
    with pytest.raises(OptionError, match="cost_model= .*needs mesh="):
        ef.explain("y[i] := x[i]*2", shapes={"x": (8,)}, cost_model=CostModel())
    e = ef.explain("y[i] := x[i]*2", shapes={"x": (8,)}, mesh={"x": 2},
                   cost_model=CostModel())
    assert e.plan.local_flops == 8


def test_mesh_with_a_jax_function_is_refused():
    jnp_ = pytest.importorskip("jax.numpy")
    # ef.explain(fn, *args, mesh=...) explained fn unsharded, dropping mesh=
    with pytest.raises(ef.EinfuseError, match="not a JAX function"):
        ef.explain(lambda x: jnp_.sin(x), np.ones(3, np.float32), mesh={"x": 2})


MOVE = "h[i,j] := exp(A[i,j]); y[p,q] := 2*h[p,q]"


def test_finer_or_coarser_split_over_the_same_major_axes():
    mesh = {"x": 4, "y": 2}
    # blocks over x -> blocks over x*y: each device keeps a sub-block of its own block
    # (was an all-gather over x of 3 x 128 bytes, then a slice)
    e = ef.explain(MOVE, shapes={"A": (8, 16)}, mesh=mesh, shard={"i": "x", "p": ("x", "y")})
    assert e.collectives == ()
    (move,) = [s for s in e.plan.steps if isinstance(getattr(s, "kind", None), MoveKind)]
    assert move.kind is MoveKind.SLICE and move.mesh_axes == ("y",)
    assert move.operand_shape == (2, 16) and move.result_shape == (1, 16)
    # blocks over x*y -> blocks over x: an all-gather over y alone, 2 devices
    # (was over x*y, 8 devices: 7 x 64 bytes sent, then a slice)
    e = ef.explain(MOVE, shapes={"A": (8, 16)}, mesh=mesh, shard={"i": ("x", "y"), "p": "x"})
    (gather,) = e.collectives
    assert gather.kind is MoveKind.ALL_GATHER and gather.mesh_axes == ("y",)
    assert gather.group == 2 and gather.operand_shape == (1, 16)
    assert gather.result_shape == (2, 16) and gather.bytes_sent == 1 * 16 * 4
    assert [s for s in e.plan.steps if getattr(s, "kind", None) is MoveKind.SLICE] == []
    # a different major axis still goes through the whole array
    e = ef.explain(MOVE, shapes={"A": (8, 16)}, mesh=mesh, shard={"i": ("x", "y"), "p": ("y", "x")})
    (gather,) = e.collectives
    assert gather.group == 8 and gather.bytes_sent == 7 * 16 * 4


RS = "t[b,o] := sum[f](h[b,f]*W[f,o]); y[b,l] := relu(t[b,l])"
RS_SHAPES = {"h": (8, 32), "W": (32, 16)}


def test_reduce_scatter_over_the_pending_axes_in_another_order_or_then_a_slice():
    mesh = {"x": 4, "y": 2}
    # partial over x*y read split over y*x: a reduce-scatter (was an all-reduce, twice
    # the bytes, then a slice)
    e = ef.explain(RS, shapes=RS_SHAPES, mesh=mesh, shard={"f": ("x", "y"), "l": ("y", "x")})
    (rs,) = e.collectives
    assert rs.kind is MoveKind.REDUCE_SCATTER and rs.mesh_axes == ("y", "x")
    assert rs.result_shape == (8, 2) and rs.bytes_sent == 7 * 8 * 16 * 4 // 8
    # partial over x read split over x*y: reduce-scatter over x, then a local slice
    e = ef.explain(RS, shapes=RS_SHAPES, mesh=mesh, shard={"f": "x", "l": ("x", "y")})
    (rs,) = e.collectives
    assert rs.kind is MoveKind.REDUCE_SCATTER and rs.mesh_axes == ("x",)
    assert rs.result_shape == (8, 4) and rs.bytes_sent == 3 * 8 * 16 * 4 // 4
    assert e.plan.steps[-2].kind is MoveKind.SLICE and e.plan.steps[-2].mesh_axes == ("y",)


def test_mesh_axis_names_that_jax_takes_are_taken():
    # jax.make_mesh((4,), ("data-parallel",)) is a mesh; its axis name was refused
    e = ef.explain("y[i,j] := sum[k](A[i,k]*B[k,j])", shapes={"A": (8, 8), "B": (8, 8)},
                   mesh={"data-parallel": 2, "model": 4}, shard={"k": ("data-parallel",
                                                                      "model")})
    (reduce,) = e.collectives
    assert reduce.group == 8 and reduce.mesh_axes == ("data-parallel", "model")
    assert e.plan.local_flops == 8 * 8 * 8 * 2 // 8
    for bad in ({1: 2}, {"": 2}):
        with pytest.raises(ef.EinfuseError, match="mesh axis names are non-empty strings"):
            ef.explain("y[i] := x[i]", shapes={"x": (8,)}, mesh=bad)


# -- runs on 8 CPU devices (this file as a script) --------------------------------------------
def _setup():
    global jax, jnp
    import jax
    import jax.numpy as jnp


def _rand(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32))


def _same(got, want):
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=1e-4, atol=1e-4)


def _run(text, arrays, mesh, shard, want):
    f = ef.compile(text, mesh=mesh, shard=shard)
    _same(f(**arrays), want)
    _same(jax.jit(lambda a: f(**a))(arrays), want)
    return f


@run_check
def diagonal_read_of_a_split_index():
    a = _rand(np.random.default_rng(0), 8, 8)
    _run("y[i] := A[i,i]", dict(A=a), {"x": 4}, {"i": "x"}, jnp.diag(a))
    _run("y := sum[i](A[i,i])", dict(A=a), {"x": 4}, {"i": "x"}, jnp.trace(a))


@run_check
def shifted_read_with_an_extent_that_does_not_divide():
    rng = np.random.default_rng(1)
    x, k = _rand(rng, 22), _rand(rng, 5)
    want = jnp.stack([(x[i:i + 5] * k).sum() for i in range(18)])
    _run("y[i] := x[i+a] * k[a]", dict(x=x, k=k), {"i": 4}, None, want)


@run_check
def planned_bytes_match_the_compiled_collectives():
    from sharding_checks import hlo_collectives, predicted
    rng = np.random.default_rng(2)
    x = _rand(rng, 8, 16)
    for text, arrays, shard in (
            ("m[i,j] := X[i,j] > 0; c[i] := sum[j](m[i,j])", dict(X=x), {"j": "x"}),
            ("y[i,j] := M[i,j] * 2.5; s[i] := sum[j](y[i,j])",
             dict(M=jnp.ones((8, 16), jnp.int32)), {"j": "x"})):
        f = ef.compile(text, mesh={"x": 4}, shard=shard)
        jitted = jax.jit(lambda a: f(**a))
        hlo = hlo_collectives(jitted.lower(arrays).compile().as_text())
        assert hlo == predicted(f.plan(**arrays)), (text, hlo, predicted(f.plan(**arrays)))
        assert f(**arrays).dtype == f.plan(**arrays).tensors[-1].dtype


@run_check
def gather_out_of_range_on_a_device_is_an_einfuse_error():
    # was a raw JaxRuntimeError, raised only when the result was read, naming idx[1]
    # (the position in the device's block) for the offending idx[3]
    from einfuse.errors import OutOfBoundsError
    f = ef.compile("E[b] := W[idx[b]]", mesh={"x": 2}, shard={"b": "x"})
    try:
        f(W=jnp.arange(4.0), idx=jnp.array([0, 1, 2, 9]))
    except OutOfBoundsError as error:
        assert "idx[3] = 9" in str(error), str(error)
    else:
        raise AssertionError("no OutOfBoundsError")
    _same(f(W=jnp.arange(4.0), idx=jnp.array([3, 1, 2, 0])), [3.0, 1.0, 2.0, 0.0])


@run_check
def finer_or_coarser_split_runs_as_planned():
    from sharding_checks import hlo_collectives, predicted
    a = _rand(np.random.default_rng(3), 8, 16)
    for shard in ({"i": "x", "p": ("x", "y")}, {"i": ("x", "y"), "p": "x"},
                  {"i": ("x", "y"), "p": ("y", "x")}, {"i": "y", "p": ("y", "x")},
                  {"i": ("y", "x"), "q": "x", "p": "y"}):
        f = _run(MOVE, dict(A=a), {"x": 4, "y": 2}, shard, 2 * jnp.exp(a))
        hlo = hlo_collectives(jax.jit(lambda a: f(A=a)).lower(a).compile().as_text())
        assert hlo == predicted(f.plan(A=a)), (shard, hlo, predicted(f.plan(A=a)))


@run_check
def reduce_scatter_variants_run_as_planned():
    from sharding_checks import hlo_collectives, predicted
    rng = np.random.default_rng(4)
    arrays = dict(h=_rand(rng, 8, 32), W=_rand(rng, 32, 16))
    want = jnp.maximum(arrays["h"] @ arrays["W"], 0)
    for shard in ({"f": ("x", "y"), "l": ("y", "x")}, {"f": "x", "l": ("x", "y")},
                  {"f": "y", "l": ("y", "x")}):
        f = _run(RS, arrays, {"x": 4, "y": 2}, shard, want)
        hlo = hlo_collectives(jax.jit(lambda a: f(**a)).lower(arrays).compile().as_text())
        assert hlo == predicted(f.plan(**arrays)), (shard, hlo)
        assert [k for k, _ in hlo] == ["reduce-scatter"], (shard, hlo)


@run_check
def jax_mesh_with_a_hyphenated_axis_name():
    mesh = jax.make_mesh((4,), ("data-parallel",))
    x = jnp.arange(8.0)
    _run("y[i] := x[i]*2", dict(x=x), mesh, {"i": "data-parallel"}, 2 * x)


@run_check
def compiled_functions_for_python_numbers_are_bounded():
    from einfuse.sharding.computation import CACHED_FUNCTIONS
    f = ef.compile("y[i] := alpha*x[i]", mesh={"x": 4}, shard={"i": "x"})
    x = jnp.arange(8.0)
    for k in range(CACHED_FUNCTIONS + 3):
        _same(f(x=x, alpha=float(k)), k * x)
    assert len(f._functions) == CACHED_FUNCTIONS
    _same(f(x=x, alpha=float(CACHED_FUNCTIONS + 2)), (CACHED_FUNCTIONS + 2) * x)
    assert len(f._functions) == CACHED_FUNCTIONS


@run_check
def inputs_with_no_elements():
    # all operands empty: XLA failed to compile the shard_map (a raw JaxRuntimeError)
    dist = "D[i,j] := sum[k]((w[k,i] - x[k,j])**2)"
    w, x = jnp.ones((0, 8)), jnp.ones((0, 12))
    for shard in ({"k": "x"}, {"i": "x"}, {}):
        f = _run(dist, dict(w=w, x=x), {"x": 4}, shard, np.zeros((8, 12)))
        got = f(w=w, x=x)
        assert got.shape == (8, 12) and len(got.sharding.device_set) == 4
    f = _run("C[i,j] := A[i,k]*B[k,j]; E[i,j] := 2*C[i,j]",
             dict(A=jnp.ones((8, 0)), B=jnp.ones((0, 12))), {"x": 4, "y": 2},
             {"i": "x", "j": "y"}, np.zeros((8, 12)))
    got = f(A=jnp.ones((8, 0)), B=jnp.ones((0, 12)))
    assert got.sharding.shard_shape(got.shape) == (2, 6)


@pytest.fixture(scope="module")
def run_results():
    pytest.importorskip("jax")
    return run_script(__file__)


@pytest.mark.parametrize("name", list(RUNS))
def test_sharded_run(run_results, name):
    assert name in run_results, f"{name} did not report"
    assert run_results[name] is None, run_results[name]


if __name__ == "__main__":
    from eight_devices import report
    report(RUNS, _setup)
