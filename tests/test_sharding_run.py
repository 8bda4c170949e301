"""Sharded execution on 8 CPU devices (jax.shard_map), in one subprocess: JAX must see 8
devices, which XLA_FLAGS sets only before jax is first imported, and other test modules
import it first in this process (JAX_PLATFORMS=cpu keeps a GPU machine's JAX on them).  The checks themselves are in sharding_checks.py."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")
import sharding_checks  # noqa: E402  (conftest puts tests/ on sys.path)


@pytest.fixture(scope="module")
def results():
    # the CPU platform alone: on a machine with a GPU, JAX would otherwise pick the GPU
    # backend (one device) and leave the 8 host devices unused
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, sharding_checks.__file__], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, f"the checks did not run:\n{done.stderr[-4000:]}"
    return json.loads(lines[-1])


@pytest.mark.parametrize("name", list(sharding_checks.CHECKS))
def test_sharded(results, name):
    assert name in results, f"{name} did not report"
    assert results[name] is None, results[name]


def test_hlo_parser_reads_operand_bytes():
    text = """
  %p.1 = f32[8,12]{1,0} parameter(0)
  %ag = f32[32,12]{1,0} all-gather(%p.1), dimensions={0}
  ROOT %ar = (f32[8,12]{1,0}, s32[4]{0}) all-reduce(%p.1, %q), to_apply=%add
"""
    assert sharding_checks.hlo_collectives(text) == [("all-gather", 384),
                                                     ("all-reduce", 384)]
