"""Statements and programs on PyTorch DTensors: 2 (and 4) local ranks of a gloo process
group on 127.0.0.1.  The checks run in the ranks (multiprocess_torch_checks.py) and
compare each result and gradient with the one-process result; here each rank's report
is read.  The quick smoke test stays in the default run; the rest is marked slow."""

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import multiprocess_torch_checks as checks  # noqa: E402  (conftest puts tests/ on sys.path)
from multiprocess_launch import assert_all_passed, free_port, launch, launch_shared  # noqa: E402

TIMEOUT = 300


def _job(tmp_path, ranks, names):
    env = {"OMP_NUM_THREADS": "1"}     # the default kernel cache: the JAX tests share a fresh one
    return launch(checks.__file__, ranks, [str(free_port()), ",".join(names)], env,
                  TIMEOUT)


def test_two_ranks_smoke(tmp_path):
    """The Megatron MLP on DTensors: one all-reduce, the result a DTensor."""
    assert_all_passed(launch_shared(checks.__file__, 2, checks.DEFAULT_TWO_RANKS,
                                    checks.DEFAULT_ENV, TIMEOUT), checks.QUICK)


# (the planned backward's checks: test_sharding_dtensor_backward.py)
SLOW = [name for name in checks.CHECKS if name not in checks.QUICK and
        name not in checks.BACKWARD]


@pytest.mark.slow
def test_two_ranks_all_checks(tmp_path):
    assert_all_passed(_job(tmp_path, 2, SLOW), SLOW)


@pytest.mark.slow
def test_four_ranks(tmp_path):
    names = ["mlp_hidden_split_one_all_reduce", "mlp_gradient_through_dtensors",
             "dist_split_over_k_and_over_i", "partial_input_float64_and_a_two_dimensional_mesh"]
    assert_all_passed(_job(tmp_path, 4, names), names)


@pytest.mark.slow
def test_a_killed_rank_makes_the_others_fail_loudly(tmp_path):
    *survivors, victim = _job(tmp_path, 2, ["killed_peer"])
    assert victim.report is None
    for outcome in survivors:
        assert outcome.report is not None, outcome.describe()
        found = outcome.report["killed_peer"]
        assert found["error"] == "BackendError", found
        assert "rank 0 of 2" in found["message"] and "collective" in found["message"]
