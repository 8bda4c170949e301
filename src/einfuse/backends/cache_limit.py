"""A bounded kernel cache: past a size limit the least recently used compiled libraries
are removed (issue 13, item 5).

Use is recorded by a library's modification time, touched whenever a process loads it
from the disk cache (access times are often not kept: noatime, relatime).  After each
new build, when the C libraries in the cache directory (``<key>.so`` and their build
records) exceed the limit, the oldest are removed until they fill at most 80% of it,
sparing anything used in the last minute (another process may be loading it; a library
already loaded stays mapped whatever happens to its file).  The limit is
``$EINFUSE_CACHE_MAX_MB`` (default 2048; 0 or less: no limit)."""

from __future__ import annotations

import contextlib
import os
import time
from typing import List, Tuple

DEFAULT_LIMIT_MB = 2048
# Never remove a library used this recently: a concurrent process may be about to map it.
RECENT_SECONDS = 60.0
RECORD_SUFFIX = ".sha256"        # as c_build writes it beside each library


def limit_bytes() -> int:
    """The cache's size limit in bytes (0: unlimited)."""
    try:
        megabytes = float(os.environ.get("EINFUSE_CACHE_MAX_MB", DEFAULT_LIMIT_MB))
    except ValueError:
        megabytes = DEFAULT_LIMIT_MB
    return max(0, int(megabytes * 1e6))


def touch(path: str) -> None:
    """Record a use of the library at ``path`` (a read-only cache keeps its times)."""
    with contextlib.suppress(OSError):
        os.utime(path)


def libraries(directory: str) -> List[Tuple[float, int, str]]:
    """(last use, bytes with its record, path) of each C library in ``directory``."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            if not entry.name.endswith(".so") or not entry.is_file(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                stat = entry.stat(follow_symlinks=False)
                size = stat.st_size
                with contextlib.suppress(OSError):
                    size += os.path.getsize(entry.path + RECORD_SUFFIX)
                found.append((stat.st_mtime, size, entry.path))
    return found


def enforce(directory: str, keep: str = "") -> int:
    """Remove least recently used libraries past the limit (never ``keep``, the library
    just built); the bytes removed."""
    limit = limit_bytes()
    if limit <= 0:
        return 0
    entries = libraries(directory)
    total = sum(size for _, size, _ in entries)
    if total <= limit:
        return 0
    removed = 0
    now = time.time()
    for used, size, path in sorted(entries):
        if total - removed <= 0.8 * limit:
            break
        if now - used < RECENT_SECONDS or path == keep:
            continue
        with contextlib.suppress(OSError):
            os.unlink(path + RECORD_SUFFIX)    # the record first: never a library
            os.unlink(path)                    # that looks intact without one
            removed += size
    return removed
