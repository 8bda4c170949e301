"""einfuse's directory of cached files (compiled C libraries, Triton kernels, tuning
records) and the file lock that keeps two processes from doing the same work: shared
by the C and Triton backends."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import threading
import time
from typing import Iterator, List

from ..errors import BackendError, warn

_dir_lock = threading.Lock()     # guards the fallback directory and its warning
_fallback: List[str] = []        # this process's temporary cache, made on first need
_warned_dirs: set = set()        # unwritable cache directories already warned about


def configured_cache_dir() -> str:
    """The cache directory the user asked for (created when possible); it may be
    read-only.  A path that is (or lies under) a file is an error: nothing sensible can
    be cached there and silently using another directory would hide the mistake."""
    path = os.environ.get("EINFUSE_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "einfuse")
    try:
        os.makedirs(path, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise BackendError(f"the einfuse cache path {path!r} is not a directory; set "
                           "EINFUSE_CACHE_DIR to a directory (it is created if missing)") \
            from None
    except OSError:
        pass   # no permission or a read-only file system: cache_dir() falls back
    return path


def cache_dir() -> str:
    """A directory einfuse may write cached files into: the configured one when it is
    writable, else a temporary directory for this process (removed at exit), with one
    EinfuseWarning per unwritable directory."""
    path = configured_cache_dir()
    if os.access(path, os.W_OK | os.X_OK):
        return path
    return fallback_dir(path, f"the cache directory {path} is not writable",
                         "set EINFUSE_CACHE_DIR to a writable directory to keep them")


def fallback_dir(path: str, trouble: str, advice: str) -> str:
    """This process's temporary cache directory (made on first need, removed at exit),
    used because of ``trouble`` at ``path``: one EinfuseWarning per path says so."""
    with _dir_lock:
        if not _fallback:
            try:
                _fallback.append(tempfile.mkdtemp(prefix="einfuse-cache-"))
            except OSError as error:
                raise BackendError(f"einfuse: {trouble}, and no temporary directory could "
                                   f"be made: {error}") from None
            atexit.register(shutil.rmtree, _fallback[0], True)
        first = path not in _warned_dirs
        _warned_dirs.add(path)
    if first:
        warn(f"einfuse: {trouble}; compiled kernels go to {_fallback[0]} for this "
             f"process only ({advice})")
    return _fallback[0]


@contextlib.contextmanager
def file_lock(path: str, timeout: float = 60.0) -> Iterator[bool]:
    """Hold an exclusive lock on the file ``path`` (created if missing) against other
    processes and other threads, waiting at most ``timeout`` seconds; yields whether the
    lock is held.  Never raises: a lock file that cannot be created (read-only
    directory), a platform without ``fcntl`` or a holder stuck past the timeout yield
    False, so callers must stay correct without the lock (write to a unique name and
    rename) and use it only to avoid duplicate work."""
    try:
        import fcntl
        handle = open(path, "ab")
    except (ImportError, OSError):
        yield False
        return
    with handle:
        held = False
        deadline = time.monotonic() + timeout
        while True:
            try:
                # flock locks belong to the open file: a second open() in another
                # thread of this process waits like another process does.
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.02)
            except OSError:
                break
        try:
            yield held
        finally:
            if held:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def fallback_dirs() -> List[str]:
    """This process's temporary cache directory, where one was made (else empty)."""
    return _fallback[:1]
