"""explain(..., mesh=, shard=) and the planner on dict meshes: no JAX needed.  Byte counts
are checked against the ring-algorithm formulas written out here, FLOPs per device
against explain's own count for the per-device shapes."""

import os
import subprocess
import sys

import pytest

import einfuse as ef
from einfuse.sharding import CostModel, MoveKind

MLP = "h[b,f] := relu(sum[d](x[b,d]*W1[d,f])); y[b,o] := sum[f](h[b,f]*W2[f,o])"
MLP_SHAPES = {"x": (32, 64), "W1": (64, 256), "W2": (256, 48)}
DIST = "D[i,j] := sum[k]((w[k,i] - x[k,j])**2)"
DIST_SHAPES = {"w": (64, 32), "x": (64, 48)}


def test_megatron_mlp_one_all_reduce_with_its_bytes():
    e = ef.explain(MLP, shapes=MLP_SHAPES, mesh={"model": 4}, shard={"f": "model"})
    (reduce,) = e.collectives
    assert reduce.kind is MoveKind.ALL_REDUCE and reduce.tensor == "y"
    assert reduce.operand_shape == (32, 48) and reduce.group == 4
    operand = 32 * 48 * 4
    assert reduce.bytes_sent == 2 * 3 * operand // 4       # ring: 2 (n-1)/n of it
    text = str(e)
    assert "all-reduce (sum) of y over model" in text and "all-gather" not in text
    # per-device FLOPs: explain's count for one device's shapes
    local = ef.explain(MLP, shapes={"x": (32, 64), "W1": (64, 64), "W2": (64, 48)})
    assert e.plan.local_flops == local.flops
    whole = ef.explain(MLP, shapes=MLP_SHAPES)
    assert sum(s.flops for s in e.plan.statements) == whole.flops


def test_dist_split_over_output_indices_needs_nothing():
    e = ef.explain(DIST, shapes=DIST_SHAPES, mesh={"x": 4, "y": 2},
                   shard={"i": "x", "j": "y"})
    assert e.collectives == ()
    assert e.plan.local_flops * 8 == ef.explain(DIST, shapes=DIST_SHAPES).flops
    assert dict(e.plan.inputs)["w"].local_shape((64, 32), e.plan.mesh) == (64, 8)


def test_dist_split_over_k_one_all_reduce_and_cheaper_alternative_named():
    e = ef.explain(DIST, shapes=DIST_SHAPES, mesh={"x": 4, "y": 2}, shard={"k": "x"})
    assert [m.kind for m in e.collectives] == [MoveKind.ALL_REDUCE]
    assert e.collectives[0].operand_shape == (32, 48)
    text = str(e)
    assert "Alternatives" in text and "(this plan)" in text
    assert e.cheapest.collectives == ()
    assert f"Cheapest: {e.cheapest.assignment}" in text


def test_default_puts_indices_named_like_mesh_axes_on_them():
    e = ef.explain(DIST, shapes=DIST_SHAPES, mesh={"i": 2, "j": 4})
    assert e.plan.assignment.as_dict == {"i": ("i",), "j": ("j",)}
    assert "default" in str(e)


def test_auto_exhaustive_and_greedy():
    e = ef.explain(MLP, shapes=MLP_SHAPES, mesh={"a": 4, "b": 2}, shard="auto")
    assert e.choice.search.exhaustive
    assert e.plan is e.cheapest
    ranked = e.choice.search.ranked
    assert all(ranked[0].cost.seconds <= c.cost.seconds for c in ranked)
    text = "Y[a,b,c,d,e,f,g] := X[a,b,c,d,e,f,g] * 2"
    big = ef.explain(text, shapes={"X": (4,) * 7}, mesh={"p": 2, "q": 2}, shard="auto")
    assert not big.choice.search.exhaustive
    assert big.plan.local_flops * 4 == ef.explain(text, shapes={"X": (4,) * 7}).flops


def test_cost_model_changes_the_choice():
    comm_free = CostModel(bytes_per_second=1e30, latency_seconds=0.0)
    e = ef.explain(MLP, shapes=MLP_SHAPES, mesh={"m": 4}, shard="auto",
                   cost_model=comm_free)
    assert e.plan.local_flops * 4 == sum(s.flops for s in e.plan.statements)


def _collective(program, shapes, mesh, shard):
    (move,) = ef.explain(program, shapes=shapes, mesh=mesh, shard=shard).collectives
    return move


def test_reduce_scatter_all_gather_all_to_all_bytes():
    rs = _collective("t[b,o] := sum[f](h[b,f]*W[f,o]); y[b,l] := relu(t[b,l])",
                     {"h": (8, 32), "W": (32, 16)}, {"x": 4}, {"f": "x", "l": "x"})
    assert rs.kind is MoveKind.REDUCE_SCATTER and rs.operand_shape == (8, 16)
    assert rs.result_shape == (8, 4) and rs.bytes_sent == 3 * 8 * 16 * 4 // 4
    ag = _collective("h[b,f] := relu(A[b,f]); s[b] := log(sum[f](exp(h[b,f])))",
                     {"A": (8, 16)}, {"x": 4}, {"f": "x"})
    assert ag.kind is MoveKind.ALL_GATHER and ag.operand_shape == (8, 4)
    assert ag.bytes_sent == 3 * 8 * 4 * 4                   # (n-1) shards
    a2a = _collective("h[i,j] := exp(A[i,j]); y[p,q] := 2*h[p,q]", {"A": (8, 16)},
                      {"x": 4}, {"i": "x", "q": "x"})
    assert a2a.kind is MoveKind.ALL_TO_ALL and a2a.operand_shape == (2, 16)
    assert a2a.result_shape == (8, 4) and a2a.bytes_sent == 3 * 2 * 16 * 4 // 4


def test_partial_sum_moves_only_past_linear_statements():
    shapes = {"h": (8, 32), "W": (32, 16)}
    first = "t[b,o] := sum[f](h[b,f]*W[f,o]); "
    for second, reduced in (("y[b,o] := relu(t[b,o])", "t"),
                            ("y[b,o] := 3*t[b,o] - t[b,o]", "y"),
                            ("y[b,o] := t[b,o] + 1", "t"),
                            ("y[b,o] := t[b,o] * t[b,o]", "t"),
                            ("y[b] := sum[o](t[b,o]) / 16", "y"),
                            ("y[b] := max[o](t[b,o])", "t")):
        e = ef.explain(first + second, shapes=shapes, mesh={"x": 4}, shard={"f": "x"})
        assert [m.tensor for m in e.collectives] == [reduced], second


def test_unsplittable_uses_run_whole_with_a_note():
    e = ef.explain("y[i] := x[i+a] * k[a]", shapes={"x": (20,), "k": (5,)},
                   mesh={"x": 4}, shard={"i": "x"})
    (statement,) = e.plan.statements
    assert not statement.split.pairs and "x[i + a]" in statement.notes[0]
    e = ef.explain("r[i] := sum[k](w[k,i]) / sum[k](w[k,i]**2)", shapes={"w": (8, 4)},
                   mesh={"x": 4}, shard={"k": "x"})
    assert not e.plan.statements[0].split.pairs and e.collectives == ()


@pytest.mark.parametrize("kwargs, words", [
    (dict(mesh={"x": 4}, shard={"i": "z"}), "mesh axis 'z'"),
    (dict(mesh={"x": 4}, shard={"q": "x"}), "index 'q'"),
    (dict(mesh={"x": 5}, shard={"i": "x"}), "does not divide into 5"),
    (dict(mesh={"x": 4}, shard={"i": "x", "j": "x"}), "assigned to both i and j"),
    (dict(shard={"i": "x"}), "shard= needs mesh="),
    (dict(mesh={"x": 4}, shard="everything"), "'auto' or None"),
    (dict(mesh={"x": 4}, shard={"i": ("x", "x")}), "twice"),
    (dict(mesh={"x": 0}), "positive"),
    (dict(mesh=[4]), "mesh= takes"),
    (dict(mesh={"x": 4}, cost_model=3), "CostModel"),
])
def test_refused_loudly(kwargs, words):
    with pytest.raises(ef.EinfuseError) as caught:
        ef.explain(DIST, shapes=DIST_SHAPES, **kwargs)
    assert words in str(caught.value)


def test_refused_writes_and_ranges_on_split_indices():
    with pytest.raises(ef.EinfuseError, match="creates its result"):
        ef.explain("C[i] = A[i] * 2", shapes={"A": (8,), "C": (8,)}, mesh={"x": 2})
    with pytest.raises(ef.EinfuseError, match="ranges= sets the range of index i"):
        ef.explain("y[i] := A[i] * 2", shapes={"A": (8,)}, ranges={"i": 8},
                   mesh={"x": 2}, shard={"i": "x"})
    with pytest.raises(ef.EinfuseError, match="runs on JAX arrays"):
        import numpy as np
        ef.ein("y[i] := A[i] * 2", A=np.ones(8), mesh={"x": 2}, shard={"i": "x"})


def test_explain_on_a_dict_mesh_does_not_import_jax():
    code = ("import sys, einfuse as ef; "
            f"e = ef.explain({MLP!r}, shapes={MLP_SHAPES!r}, mesh={{'m': 4}}, "
            "shard='auto'); str(e); "
            "assert 'jax' not in sys.modules and 'torch' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=os.environ, timeout=120)
    assert done.returncode == 0, done.stderr


def test_options_that_the_sharded_explanation_does_not_show_are_refused():
    for extra in (dict(gradients=True), dict(source=True)):
        with pytest.raises(ef.EinfuseError, match="not gradients= or source="):
            ef.explain(DIST, shapes=DIST_SHAPES, mesh={"x": 4}, **extra)
    with pytest.raises(ef.EinfuseError, match="einsum"):
        ef.explain("ij,jk->ik", shapes={"A": (4, 4)}, mesh={"x": 2})
    with pytest.raises(ef.EinfuseError, match="index 'q'"):
        ef.compile(DIST, mesh={"x": 4}, shard={"q": "x"})     # at compile time
