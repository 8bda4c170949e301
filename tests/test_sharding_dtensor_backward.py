"""The planned backward of statements and programs on PyTorch DTensors (2 and 4 local
ranks of a gloo group on 127.0.0.1): gradients equal torch autograd's on the plain
tensors, each at its input's placement, and the collectives torch issues in the
backward are those of the plan ``explain(..., gradients=True)`` shows.  The checks
run in the ranks (multiprocess_torch_checks.py); the quick one stays in the default
run, the rest is marked slow.  Also, without ranks: what the planner makes of the
gradient statements on a dict mesh."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.sharding.api import choose, statements_of
from einfuse.sharding.cost import CostModel
from einfuse.sharding.dtensor_backward import (BackwardNotPlanned, backward_plan,
                                               backward_statements, forward_shapes,
                                               gradient_inputs, gradient_targets,
                                               seed_placements)
from einfuse.sharding.mesh import mesh_shape

MLP = "h[b,f] := relu(sum[d](x[b,d]*W1[d,f])); y[b,o] := sum[f](h[b,f]*W2[f,o])"
DIST = "D[i,j] := sum[k]((w[k,i] - x[k,j])**2)"


def _planned(text, values, mesh, shard):
    compiled = ef.compile(text)
    program, info = statements_of(compiled), mesh_shape(mesh)
    forward = choose(program, values, info, shard, CostModel(), rank=False,
                     narrow=False).plan
    backward = backward_statements(program, compiled.options,
                                   gradient_inputs({}, forward),
                                   forward_shapes(forward, program.params))
    return backward, backward_plan(forward, backward, info,
                                   seed_placements(forward, backward),
                                   gradient_targets({}, forward, info, backward.wrt),
                                   CostModel())


def _zeros(*shape):
    return np.zeros(shape, np.float32)


def test_megatron_backward_plans_one_all_reduce_of_the_input_gradient():
    backward, plan = _planned(MLP, dict(x=_zeros(8, 16), W1=_zeros(16, 32),
                                        W2=_zeros(32, 12)), {"m": 2}, {"f": "m"})
    (reduce,) = plan.collectives
    assert reduce.kind.value == "all-reduce" and reduce.tensor == "dx_1"
    assert dict(plan.outputs)["dW1_1"].layout == ((), ("m",))    # W1's own placement
    assert backward.seeds == ("dy",)


@pytest.mark.parametrize("shard, kinds", [({"k": "m"}, []), ({"i": "m"}, ["all-reduce"]),
                                          ({"j": "m"}, ["all-reduce"])])
def test_dist_backward_collectives_follow_the_split(shard, kinds):
    _, plan = _planned(DIST, dict(w=_zeros(8, 4), x=_zeros(8, 6)), {"m": 2}, shard)
    assert [m.kind.value for m in plan.collectives] == kinds


def test_a_scatter_gradient_is_not_planned():
    with pytest.raises(BackwardNotPlanned, match="scatter-add"):
        _planned("y[i] := x[2*i]", dict(x=_zeros(8)), {"m": 2}, {})


def test_gradients_with_a_dict_mesh_are_still_refused():
    with pytest.raises(ef.EinfuseError, match="not gradients= or source="):
        ef.explain(DIST, shapes={"w": (8, 4), "x": (8, 6)}, mesh={"m": 2},
                   gradients=True)


try:
    import torch
    distributed = torch.distributed.is_available() and \
        torch.distributed.is_gloo_available()
except ImportError:
    distributed = False

import multiprocess_torch_checks as checks  # noqa: E402  (conftest puts tests/ on sys.path)
from multiprocess_launch import assert_all_passed, free_port, launch, launch_shared  # noqa: E402

TIMEOUT = 300
BACKWARD = checks.BACKWARD
needs_gloo = pytest.mark.skipif(not distributed,
                                reason="torch with torch.distributed and gloo is not available")


def _passed(ranks, names):
    assert_all_passed(launch(checks.__file__, ranks, [str(free_port()), ",".join(names)],
                             {"OMP_NUM_THREADS": "1"}, TIMEOUT), names)


@needs_gloo
def test_two_ranks_megatron_backward():
    assert_all_passed(launch_shared(checks.__file__, 2, checks.DEFAULT_TWO_RANKS,
                                    checks.DEFAULT_ENV, TIMEOUT), [BACKWARD[0]])


@needs_gloo
@pytest.mark.slow
def test_two_ranks_backward_checks():
    _passed(2, BACKWARD[1:])


@needs_gloo
@pytest.mark.slow
def test_four_ranks_backward_checks():
    _passed(4, BACKWARD)
