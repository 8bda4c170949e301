"""The tuning cache and search of Triton launch blocks: the measurement that the rule of
:mod:`einfuse.schedule.triton_blocks` consults.  A search times candidate
configurations per (kernel source, storage dtypes, shape bucket); its choice is cached
on disk next to the compiled-kernel cache so that later processes skip the search.
Which blocks a kernel launches with (cached, searched, or the default) is the
schedule's decision, not this module's.

A shape bucket rounds every runtime int of the kernel (extents, strides) to its power of
two: shapes within a factor of two of each other share a choice.  On a GPU the first
call in a new bucket times each candidate (``triton.testing.do_bench``) on the caller's
own arrays; under ``TRITON_INTERPRET=1`` timing means nothing, so the schedule takes the
default unless ``EINFUSE_TRITON_AUTOTUNE=1`` asks for the search (how the tests
exercise it)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import asdict
from typing import Callable, Dict, Optional, Sequence, Tuple

from ...schedule.triton_blocks import Config
from .. import disk_cache

_FILE = "triton_tuning.json"
_lock = threading.Lock()
_memory: Dict[str, "Config"] = {}
_loaded = False


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
