"""Block sizes for Triton kernels: a small autotune over candidate configurations per
(kernel source, storage dtypes, shape bucket), its choice cached on disk next to the
compiled-kernel cache so that later processes skip the search.

A shape bucket rounds every runtime int of the kernel (extents, strides) to its power of
two: shapes within a factor of two of each other share a choice.  On a GPU the first
call in a new bucket times each candidate (``triton.testing.do_bench``) on the caller's
own arrays; under ``TRITON_INTERPRET=1`` timing means nothing, so the default is used
unless ``EINFUSE_TRITON_AUTOTUNE=1`` asks for the search (how the tests exercise it)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .. import disk_cache

_FILE = "triton_tuning.json"
_lock = threading.Lock()
_memory: Dict[str, "Config"] = {}
_loaded = False


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
               reduce_block: bool = False, dot: bool = False) -> List[Config]:
    """The configurations one search times (tl.dot needs every tile side >= 16).  The
    lists come from timing every configuration of a wider grid on an H100
    (tools/gpu_kernels.py): tl.dot tiles want 128 x 256 x 64 with 8 warps and 3-4
    pipeline stages (tensor cores fed from shared memory); element-wise tile updates
    (a distance matrix) want about 128 accumulators per thread, 128 x 128 on 4 warps."""
    if interpreted:   # a search that proves the machinery, not a speed
        return [Config(16, 16, 16, 256, reduce_block=16), Config(32, 32, 32, 1024)]
    if not tiles and reduce_block:
        return [Config(block=b, reduce_block=r, num_warps=w) for b, r, w in
                ((1, 1024, 4), (8, 256, 4), (16, 128, 4), (32, 128, 4), (64, 64, 4),
                 (32, 256, 8), (128, 32, 4))]
    if not tiles:
        return [Config(block=b, num_warps=w) for b, w in
                ((128, 4), (256, 4), (512, 4), (1024, 8), (2048, 8))]
    if not has_rows:
        return [Config(rows=1, lanes=n, block=0, num_warps=w) for n, w in
                ((64, 2), (128, 4), (256, 4), (512, 8), (1024, 8))]
    if dot:
        return [Config(r, n, k, 0, w, s) for r, n, k, w, s in (
            (64, 64, 32, 4, 3), (64, 128, 32, 4, 3), (128, 128, 64, 4, 4),
            (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 256, 64, 8, 4),
            (256, 128, 64, 8, 3))]
    return [Config(r, n, 32, 0, w, 2) for r, n, w in (
        (32, 32, 2), (64, 64, 2), (64, 64, 4), (128, 64, 4), (128, 128, 4), (256, 128, 8))]


def shape_bucket(ints: Sequence[int]) -> Tuple[int, ...]:
    return tuple(int(v).bit_length() for v in ints)


def tuning_key(source_hash: str, dtypes: Sequence[str], ints: Sequence[int]) -> str:
    return "|".join([source_hash, ",".join(dtypes),
                     ",".join(str(b) for b in shape_bucket(ints))])


def _path() -> str:
    return os.path.join(disk_cache.cache_dir(), _FILE)


def _read_disk() -> Dict[str, Dict[str, int]]:
    try:
        with open(_path()) as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}   # no file yet, or a torn/foreign one: tune again


def _load() -> None:
    global _loaded
    if _loaded:
        return
    for key, fields in _read_disk().items():
        try:
            _memory[key] = Config(**{k: int(v) for k, v in fields.items()})
        except (TypeError, ValueError):
            continue
    _loaded = True


def lookup(key: str) -> Optional[Config]:
    with _lock:
        _load()
        return _memory.get(key)


def remember(key: str, config: Config) -> None:
    """Record a choice in memory and on disk (merged with what other processes wrote;
    written whole to a temporary file, then renamed, so a reader never sees half)."""
    with _lock:
        _load()
        _memory[key] = config
        path = _path()
        # another process may be merging its own choices into the file: the read-merge-
        # write happens under a lock on a side file, so that neither loses the other's
        with disk_cache.file_lock(path + ".lock"):
            data = _read_disk()
            data[key] = asdict(config)
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
            try:
                with open(tmp, "w") as handle:
                    json.dump(data, handle, indent=0, sort_keys=True)
                os.replace(tmp, path)
            except OSError:   # an unwritable cache only costs a search in the next process
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


def forget_memory() -> None:
    """Drop the in-memory copy (tests: the next lookup reads the disk)."""
    global _loaded
    with _lock:
        _memory.clear()
        _loaded = False


def measure(run: Callable[[], object], on_gpu: bool) -> float:
    """Seconds per run of ``run``."""
    if on_gpu:
        from triton.testing import do_bench
        return do_bench(run, warmup=5, rep=25) * 1e-3
    run()
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def search(configs: Sequence[Config], launch_with: Callable[[Config], object],
           on_gpu: bool) -> Config:
    """The fastest configuration that compiles and runs; a candidate the compiler
    refuses (too much shared memory for this GPU, say) is skipped."""
    best, best_time, failures = None, float("inf"), []
    for config in configs:
        try:
            seconds = measure(lambda: launch_with(config), on_gpu)
        except Exception as error:   # noqa: BLE001 -- any compile/launch failure
            failures.append(f"{config}: {type(error).__name__}: {error}")
            continue
        if seconds < best_time:
            best, best_time = config, seconds
    if best is None:
        raise RuntimeError("no Triton launch configuration ran:\n" + "\n".join(failures))
    return best
