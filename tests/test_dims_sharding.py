"""Named expressions with mesh=/shard= by dimension, run on 8 CPU devices in one
subprocess (JAX must see 8 devices, which XLA_FLAGS sets only before jax is first
imported); the checks are in dims_sharding_checks.py."""

import pytest

pytest.importorskip("jax")
import dims_sharding_checks  # noqa: E402  (conftest puts tests/ on sys.path)
from eight_devices import run_script  # noqa: E402


@pytest.fixture(scope="module")
def results():
    return run_script(dims_sharding_checks.__file__)


@pytest.mark.parametrize("name", list(dims_sharding_checks.CHECKS))
def test_named_sharded(results, name):
    assert name in results, f"{name} did not report"
    assert results[name] is None, results[name]
