"""The launch-block rule of Triton kernels is a schedule value
(schedule/triton_blocks.launch_blocks); the backend launches what it gives."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.schedule.triton_blocks import (
    TUNING_MIN_WORK, BlockChoice, BlockSource, Config, KernelShape, candidates, default_config,
    launch_blocks)

DOT = KernelShape(tiles=True, has_rows=True, reduce_block=False, dot=True,
                  work=TUNING_MIN_WORK)
SMALL = KernelShape(tiles=False, has_rows=False, reduce_block=True, dot=False, work=100)


@pytest.fixture(autouse=True)
def no_forced_search(monkeypatch):
    monkeypatch.delenv("EINFUSE_TRITON_AUTOTUNE", raising=False)


def test_a_tuned_choice_is_taken_before_any_other():
    tuned = Config(128, 256, 64, 0, 8, 4)
    for shape in (DOT, SMALL):
        for on_gpu in (True, False):
            choice = launch_blocks(shape, on_gpu, tuned)
            assert choice.source is BlockSource.TUNED and choice.config == tuned


def test_large_gpu_work_is_searched_and_small_work_takes_the_default():
    big = launch_blocks(DOT, on_gpu=True, tuned=None)
    assert big.source is BlockSource.SEARCH and big.config is None
    assert big.candidates == candidates(True, True, False, False, True)
    assert all(min(c.rows, c.lanes, c.k_block) >= 16 for c in big.candidates)   # tl.dot
    small = launch_blocks(SMALL, on_gpu=True, tuned=None)
    assert small.source is BlockSource.DEFAULT
    assert small.config == default_config(False, False, True, False)
    below = KernelShape(True, True, False, True, TUNING_MIN_WORK - 1)
    assert launch_blocks(below, on_gpu=True, tuned=None).source is BlockSource.DEFAULT


def test_the_interpreter_searches_only_when_asked(monkeypatch):
    assert launch_blocks(DOT, on_gpu=False, tuned=None).config == \
        default_config(True, True, False, True)
    monkeypatch.setenv("EINFUSE_TRITON_AUTOTUNE", "1")
    forced = launch_blocks(SMALL, on_gpu=False, tuned=None)
    assert forced.source is BlockSource.SEARCH
    assert forced.candidates == candidates(False, False, True, True, False)
    # where nothing can be timed (inside a JAX program) the rule answers a default
    assert launch_blocks(DOT, on_gpu=True, tuned=None, can_search=False).config == \
        default_config(True, False, False, True)


def test_the_backend_launches_the_blocks_the_schedule_gives(monkeypatch):
    """A flat kernel launched with the schedule's block of 16 outputs: its grid has
    ceil(total / 16) programs and the values are the statement's."""
    from einfuse.backends.triton import backend as triton_backend
    given = Config(block=16, reduce_block=16)
    asked = []

    def rule(shape, on_gpu, tuned, can_search=True):
        asked.append(shape)
        return BlockChoice(BlockSource.DEFAULT, config=given)
    monkeypatch.setattr(triton_backend, "launch_blocks", rule)
    chosen = []
    original = triton_backend.ready_launch

    def recording(prepared, config, device):
        chosen.append((config, prepared.grid(config)))
        return original(prepared, config, device)
    monkeypatch.setattr(triton_backend, "ready_launch", recording)
    rng = np.random.default_rng(3)
    X = rng.standard_normal((37, 5))
    got = ef.ein("z[i] := sum[j](X[i,j] * 2.5)", X=X, backend="triton")
    np.testing.assert_allclose(got, (X * 2.5).sum(1), rtol=1e-12)
    assert asked and chosen and chosen[0][0] == given
    assert chosen[0][1] == (-(-37 // 16),)
