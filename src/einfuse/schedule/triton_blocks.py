"""Launch blocks of a Triton kernel: which block sizes, warps and pipeline stages a
kernel signature launches with, decided here as a value; the Triton backend only
launches what it is given.

The rule (:func:`launch_blocks`), per kernel signature (kernel source, storage dtypes,
shape bucket: backends/triton/tuning.tuning_key):

* a configuration the tuning cache holds for the signature (chosen by an earlier
  search, in this process or one before it) is taken;
* otherwise, on a GPU, work of at least TUNING_MIN_WORK points of the iteration space
  is searched (:func:`candidates`: the backend times each on the caller's arrays and
  records the fastest in the tuning cache), as is any kernel when
  ``EINFUSE_TRITON_AUTOTUNE=1`` asks for it (how the tests exercise the search under the
  interpreter, where timing means nothing);
* otherwise the default (:func:`default_config`): few, wide programs under the
  interpreter (its cost is per program), the H100-measured shapes on a GPU.

The search is a measurement the rule consults through the cache; where no measurement
can be made (a JAX call, which launches inside JAX's own program), the rule is asked
with ``can_search=False`` and answers the cached or the default choice."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

AUTOTUNE_ENV = "EINFUSE_TRITON_AUTOTUNE"


@dataclass(frozen=True)
class Config:
    """One launch configuration: output tile (rows x lanes) and the reduction block of a
    tl.dot loop for tiled kernels; a flat block of outputs otherwise, and how many
    positions of a reduction each step takes (``reduce_block``); warps and software
    pipeline stages for the GPU compiler."""
    rows: int = 32
    lanes: int = 32
    k_block: int = 32
    block: int = 256
    num_warps: int = 4
    num_stages: int = 2
    reduce_block: int = 64

    def constexprs(self, tiles: bool, has_rows: bool,
                   reduce_block: bool = False) -> Dict[str, int]:
        if tiles:
            return {"ROWS": self.rows if has_rows else 1, "LANES": self.lanes,
                    "KB": self.k_block}
        if reduce_block:
            return {"BLOCK": self.block, "RB": self.reduce_block}
        return {"BLOCK": self.block}


@dataclass(frozen=True)
class KernelShape:
    """What the rule reads of a rendered kernel: tiled or flat, whether its tile has
    rows, a blocked reduction, a tl.dot loop, and its points of iteration space."""
    tiles: bool
    has_rows: bool
    reduce_block: bool
    dot: bool
    work: int


class BlockSource(enum.Enum):
    TUNED = "the tuning cache's choice for this kernel and shape bucket"
    SEARCH = "a search over the candidates, timed on the caller's arrays"
    DEFAULT = "the default blocks"


@dataclass(frozen=True)
class BlockChoice:
    """The rule's answer: ``config`` to launch (TUNED, DEFAULT), or the ``candidates``
    a search times (SEARCH: its winner is recorded in the tuning cache)."""
    source: BlockSource
    config: Optional[Config] = None
    candidates: Tuple[Config, ...] = ()


# Below this many points of the iteration space (every index's extent multiplied) a
# kernel runs in microseconds, where block sizes hardly matter and a search (a compile
# per candidate, about a second each on an H100) would cost far more than it could save.
TUNING_MIN_WORK = 1 << 22


def worth_tuning(work: int) -> bool:
    return work >= TUNING_MIN_WORK


def default_config(tiles: bool, interpreted: bool, reduce_block: bool = False,
                   dot: bool = False) -> Config:
    if interpreted:   # few, wide programs: the interpreter's cost is per program
        return Config(rows=32, lanes=32, k_block=32, block=64 if reduce_block else 1024,
                      reduce_block=64)
    if reduce_block:   # a [32, 128] tile per reduction step
        return Config(block=32, reduce_block=128, num_warps=4)
    if tiles and not dot:   # element-wise tile updates: 32 accumulators per thread
        return Config(rows=64, lanes=64, k_block=32, block=0, num_warps=4, num_stages=2)
    return Config(rows=64, lanes=64, k_block=32, block=256, num_warps=4, num_stages=3)


def candidates(tiles: bool, has_rows: bool, interpreted: bool,
               reduce_block: bool = False, dot: bool = False) -> Tuple[Config, ...]:
    """The configurations one search times (tl.dot needs every tile side >= 16).  The
    lists come from timing every configuration of a wider grid on an H100
    (tools/gpu_kernels.py): tl.dot tiles want 128 x 256 x 64 with 8 warps and 3-4
    pipeline stages (tensor cores fed from shared memory); element-wise tile updates
    (a distance matrix) want about 128 accumulators per thread, 128 x 128 on 4 warps."""
    if interpreted:   # a search that proves the machinery, not a speed
        return (Config(16, 16, 16, 256, reduce_block=16), Config(32, 32, 32, 1024))
    if not tiles and reduce_block:
        return tuple(Config(block=b, reduce_block=r, num_warps=w) for b, r, w in
                     ((1, 1024, 4), (8, 256, 4), (16, 128, 4), (32, 128, 4), (64, 64, 4),
                      (32, 256, 8), (128, 32, 4)))
    if not tiles:
        return tuple(Config(block=b, num_warps=w) for b, w in
                     ((128, 4), (256, 4), (512, 4), (1024, 8), (2048, 8)))
    if not has_rows:
        return tuple(Config(rows=1, lanes=n, block=0, num_warps=w) for n, w in
                     ((64, 2), (128, 4), (256, 4), (512, 8), (1024, 8)))
    if dot:
        return tuple(Config(r, n, k, 0, w, s) for r, n, k, w, s in (
            (64, 64, 32, 4, 3), (64, 128, 32, 4, 3), (128, 128, 64, 4, 4),
            (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 256, 64, 8, 4),
            (256, 128, 64, 8, 3)))
    return tuple(Config(r, n, 32, 0, w, 2) for r, n, w in (
        (32, 32, 2), (64, 64, 2), (64, 64, 4), (128, 64, 4), (128, 128, 4), (256, 128, 8)))


def autotune_forced() -> bool:
    return os.environ.get(AUTOTUNE_ENV) == "1"


def launch_blocks(shape: KernelShape, on_gpu: bool, tuned: Optional[Config],
                  can_search: bool = True) -> BlockChoice:
    """The launch blocks of one kernel signature (the rule in the module docstring);
    ``tuned`` is the tuning cache's entry for it, None where it has none."""
    if tuned is not None:
        return BlockChoice(BlockSource.TUNED, config=tuned)
    wanted = autotune_forced() or (on_gpu and worth_tuning(shape.work))
    if can_search and wanted:
        return BlockChoice(BlockSource.SEARCH, candidates=candidates(
            shape.tiles, shape.has_rows, not on_gpu, shape.reduce_block, shape.dot))
    return BlockChoice(BlockSource.DEFAULT, config=default_config(
        shape.tiles, not on_gpu, shape.reduce_block, shape.dot))
