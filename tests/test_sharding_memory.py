"""Memory in the sharding cost model (sharding/memory.py): the bytes one device holds,
counted by hand here, and plans refused or ranked by memory= (no JAX needed)."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.errors import OptionError
from einfuse.sharding import CostModel
from einfuse.sharding.memory import memory_use

MLP = "h[b,f] := relu(sum[d](x[b,d]*W1[d,f])); y[b,o] := sum[f](h[b,f]*W2[f,o])"
B, D, F, O = 64, 1024, 4096, 1024
SHAPES = {"x": (B, D), "W1": (D, F), "W2": (F, O)}
FOUR = 4            # bytes of a float32


def test_peak_counts_inputs_intermediates_and_results():
    e = ef.explain(MLP, shapes=SHAPES, mesh={"m": 4}, shard={"f": "m"})
    use = memory_use(e.plan)
    inputs = (B * D + D * F // 4 + F // 4 * O) * FOUR
    assert use.inputs == inputs
    # statement 2: the inputs, h's block and y's partial sum; the all-reduce's result
    # replaces h (read for the last time) beside the partial sum
    assert use.peak == inputs + (B * F // 4 + B * O) * FOUR
    replicated = ef.explain(MLP, shapes=SHAPES, mesh={"m": 4}, shard={"b": "m"})
    assert memory_use(replicated.plan).peak == \
        (B // 4 * D + D * F + F * O + B // 4 * F + B // 4 * O) * FOUR
    assert "memory       peak" in str(e) and "memory/device" in str(e)


def test_auto_keeps_to_the_memory_per_device():
    free = ef.explain(MLP, shapes=SHAPES, mesh={"m": 4}, shard="auto")
    assert free.plan.assignment.as_dict == {"b": ("m",)}     # weights replicated
    need = memory_use(free.plan).peak
    tight = ef.explain(MLP, shapes=SHAPES, mesh={"m": 4}, shard="auto", memory=need - 1)
    assert tight.plan.assignment.as_dict == {"f": ("m",)}    # Megatron: weights split
    assert memory_use(tight.plan).peak <= need - 1
    assert "(does not fit)" in str(tight)
    same = ef.explain(MLP, shapes=SHAPES, mesh={"m": 4}, shard="auto",
                      cost_model=CostModel(memory_per_device=need - 1))
    assert same.plan.assignment == tight.plan.assignment


def test_nothing_fits_is_refused_naming_the_smallest_need():
    smallest = memory_use(ef.explain(MLP, shapes=SHAPES, mesh={"m": 4},
                                     shard={"f": "m"}).plan).peak
    with pytest.raises(ef.EinfuseError, match=f"{smallest:,} bytes") as caught:
        ef.explain(MLP, shapes=SHAPES, mesh={"m": 4}, shard="auto", memory=10**6)
    assert isinstance(caught.value, MemoryError)


def test_a_given_plan_over_the_limit_is_explained_and_refused_to_run():
    e = ef.explain(MLP, shapes=SHAPES, mesh={"m": 4}, shard={"b": "m"}, memory=10**7)
    assert "DOES NOT FIT" in str(e)
    f = ef.compile(MLP, mesh={"m": 4}, shard={"b": "m"}, memory=10**7)
    arrays = {n: np.zeros(s, np.float32) for n, s in SHAPES.items()}
    with pytest.raises(ef.EinfuseError, match="more than the 10,000,000 bytes per device"):
        f.plan(**arrays)
    ok = ef.compile(MLP, mesh={"m": 4}, shard={"f": "m"}, memory=10**7)
    assert ok.plan(**arrays).assignment.as_dict == {"f": ("m",)}


@pytest.mark.parametrize("call", [
    lambda: ef.explain(MLP, shapes=SHAPES, memory=10**9),
    lambda: ef.compile(MLP, memory=10**9),
    lambda: ef.explain(MLP, shapes=SHAPES, mesh={"m": 4}, memory=0),
    lambda: ef.explain(MLP, shapes=SHAPES, mesh={"m": 4}, memory=True),
    lambda: ef.compile(MLP, mesh={"m": 4}, memory=2.5e9),
    lambda: CostModel(memory_per_device=-1),
])
def test_bad_memory_refused(call):
    with pytest.raises(OptionError, match="memory"):
        call()
