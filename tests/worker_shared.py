"""One result per test run, shared by pytest-xdist's workers: an expensive job that
several tests read (a subprocess of 8 JAX devices, a job of local torch ranks) runs once,
not once per worker that happens to run one of those tests (``--dist worksteal`` splits
a module's tests among the workers, and different modules can need the same job).

The first worker that asks runs the job under a file lock and leaves its JSON result
for the others; without xdist the result is kept in this process.  A job that raises
leaves no result, so the next test that asks runs it again (and reports its own
failure)."""

import fcntl
import hashlib
import json
import os
import tempfile
import time

_IN_PROCESS = {}


def shared_result(name: str, compute):
    """``compute()``'s JSON-able result, computed once per test run under ``name``."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        if name not in _IN_PROCESS:
            _IN_PROCESS[name] = compute()
        return _IN_PROCESS[name]
    key = hashlib.sha256(f"{run}\0{name}".encode()).hexdigest()[:20]
    directory = os.path.join(tempfile.gettempdir(), "einfuse-worker-shared")
    os.makedirs(directory, exist_ok=True)
    shared = os.path.join(directory, key)
    with open(shared + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(shared):
            with open(shared, encoding="utf-8") as handle:
                return json.load(handle)
        found = compute()
        _forget_old_results(directory)
        with open(shared + ".part", "w", encoding="utf-8") as handle:
            json.dump(found, handle)
        os.replace(shared + ".part", shared)
        return found


def _forget_old_results(directory: str, age: float = 86400) -> None:
    """Earlier runs' results and locks (a day old): each run has its own keys."""
    now = time.time()
    for name in os.listdir(directory):
        try:
            if now - os.path.getmtime(os.path.join(directory, name)) > age:
                os.remove(os.path.join(directory, name))
        except OSError:
            pass
