"""Sharded execution on 8 CPU devices (jax.shard_map), in one subprocess: JAX must see 8
devices, which XLA_FLAGS sets only before jax is first imported, and other test modules
import it first in this process (JAX_PLATFORMS=cpu keeps a GPU machine's JAX on them).  The checks themselves are in sharding_checks.py."""

import pytest

pytest.importorskip("jax")
import sharding_checks  # noqa: E402  (conftest puts tests/ on sys.path)
from eight_devices import run_script  # noqa: E402


@pytest.fixture(scope="module")
def results():
    return run_script(sharding_checks.__file__)


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
