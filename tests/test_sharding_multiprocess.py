"""Sharded statements and programs on a multi-process JAX job: 2 (and 4) local processes
on 127.0.0.1, 2 CPU devices each, JAX's gloo CPU collectives.  The checks run in the
processes (multiprocess_jax_checks.py) and compare every result shard with the
one-process result; here each process's report is read.  The quick smoke test stays in
the default run; the rest is marked slow (``pytest -m slow``)."""

import pytest

pytest.importorskip("jax")
import multiprocess_jax_checks as checks  # noqa: E402  (conftest puts tests/ on sys.path)
from multiprocess_launch import assert_all_passed, free_port, launch  # noqa: E402

TIMEOUT = 300           # seconds for a whole job; the machine may be slow and shared


def _job(tmp_path, processes, names, timeout=TIMEOUT):
    env = {"XLA_FLAGS": f"--xla_force_host_platform_device_count="
                        f"{checks.DEVICES_PER_PROCESS}",
           "JAX_PLATFORMS": "cpu",
           # one fresh kernel cache for the whole job: the processes build the same
           # kernels at the same time into it
           "EINFUSE_CACHE_DIR": str(tmp_path / "cache")}
    outcomes = launch(checks.__file__, processes, [str(free_port()), ",".join(names)],
                      env, timeout)
    for outcome in outcomes:
        assert outcome.report is not None, outcome.describe()
    return outcomes


def test_failures_on_global_arrays_are_einfuse_errors():
    """What an eager call on a multi-process mesh raises for JAX's runtime errors (the
    slow tests provoke them for real)."""
    from einfuse.errors import BackendError, OutOfBoundsError
    from einfuse.sharding.multiprocess import failure, spans_processes
    lost = failure(RuntimeError("UNKNOWN: Gloo all-reduce failed: [pair.cc:547] Connection "
                                "closed by peer [127.0.0.1]:49549"), "y[i] := x[i]",
                   "process 0 of 2")
    assert isinstance(lost, BackendError) and "process 0 of 2" in str(lost)
    assert "another process of the job probably exited" in str(lost)
    bad = failure(RuntimeError("OUT_OF_RANGE: idx[1] = 99 is outside its valid range "
                               "0..7"), "E[b,d] := W[idx[b], d]", "process 1 of 2")
    assert isinstance(bad, OutOfBoundsError) and "idx[1] = 99" in str(bad)
    other = failure(RuntimeError("INTERNAL: something else"), "y[i] := x[i]", "process 1")
    assert type(other) is BackendError and "something else" in str(other)

    class Global:
        is_fully_addressable = False
    assert spans_processes([1.0, Global()]) and not spans_processes([1.0, object()])


def test_two_processes_smoke(tmp_path):
    """The Megatron MLP (one all-reduce) and dist with k over both processes' devices."""
    assert_all_passed(_job(tmp_path, 2, checks.QUICK), checks.QUICK)
    assert any((tmp_path / "cache").rglob("*.so")), "the kernels were not cached"


SLOW = [name for name in checks.CHECKS if name not in checks.QUICK]


@pytest.mark.slow
def test_two_processes_all_checks(tmp_path):
    assert_all_passed(_job(tmp_path, 2, SLOW), SLOW)


@pytest.mark.slow
def test_four_processes(tmp_path):
    names = ["mlp_hidden_split_one_all_reduce", "dist_split_over_k_across_processes",
             "dist_split_over_i_and_j", "program_gradient"]
    assert_all_passed(_job(tmp_path, 4, names), names)


@pytest.mark.slow
def test_a_killed_process_makes_the_others_fail_loudly(tmp_path):
    outcomes = _job_with_victim(tmp_path, 2)
    *survivors, victim = outcomes
    assert victim.report is None             # it died before reporting
    for outcome in survivors:
        found = outcome.report["killed_peer"]
        assert found["error"] is not None, "the call succeeded without its peer"
        assert found["error"] in ("BackendError",), outcome.describe()
        assert "process" in found["message"] and "collective" in found["message"], \
            found["message"]


def _job_with_victim(tmp_path, processes):
    env = {"XLA_FLAGS": f"--xla_force_host_platform_device_count="
                        f"{checks.DEVICES_PER_PROCESS}",
           "JAX_PLATFORMS": "cpu", "EINFUSE_CACHE_DIR": str(tmp_path / "cache")}
    # the bound: a hang is killed here and then fails the test (no report)
    return launch(checks.__file__, processes, [str(free_port()), "killed_peer"], env,
                  TIMEOUT)
