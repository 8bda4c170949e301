"""Named expressions with mesh=/shard= by dimension, run on 8 CPU devices in one
subprocess (JAX must see 8 devices, which XLA_FLAGS sets only before jax is first
imported); the checks are in dims_sharding_checks.py."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")
import dims_sharding_checks  # noqa: E402  (conftest puts tests/ on sys.path)


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, dims_sharding_checks.__file__], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, f"the checks did not run:\n{done.stderr[-4000:]}"
    return json.loads(lines[-1])


@pytest.mark.parametrize("name", list(dims_sharding_checks.CHECKS))
def test_named_sharded(results, name):
    assert name in results, f"{name} did not report"
    assert results[name] is None, results[name]
