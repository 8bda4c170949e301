"""Checks that need JAX to see 8 CPU devices run in one subprocess: XLA_FLAGS counts the
host devices only before jax is first imported, and other test modules import it first
in the test process (JAX_PLATFORMS=cpu keeps a GPU machine's JAX on the host devices).
``run_script`` is the pytest side; ``report`` is the script's: it runs the checks and
prints one JSON line, check name -> null when it passed, else what failed."""

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

from check_reports import run_checks

FLAGS = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def run_script(path: str, timeout: float = 600) -> dict:
    """Run the checks script ``path`` on 8 devices; its report.  Under pytest-xdist the
    report is shared by the run's workers: with ``--dist worksteal`` a module's tests
    are split among them, and each worker's module-scoped fixture would otherwise run
    the whole script again (15 s of CPU or more, compiles included).  The first worker
    runs it under a lock; the others read its report."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return _run(path, timeout)
    key = hashlib.sha256(f"{run}\0{os.path.abspath(path)}".encode()).hexdigest()[:20]
    directory = os.path.join(tempfile.gettempdir(), "einfuse-eight-devices")
    os.makedirs(directory, exist_ok=True)
    shared = os.path.join(directory, key)
    with open(shared + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(shared):
            with open(shared, encoding="utf-8") as handle:
                return json.load(handle)
        found = _run(path, timeout)      # a failed run leaves no report: the next retries
        _forget_old_reports(directory)
        with open(shared + ".part", "w", encoding="utf-8") as handle:
            json.dump(found, handle)
        os.replace(shared + ".part", shared)
        return found


def _forget_old_reports(directory: str, age: float = 86400) -> None:
    """Earlier runs' reports and locks (a day old): each run has its own keys."""
    now = time.time()
    for name in os.listdir(directory):
        try:
            if now - os.path.getmtime(os.path.join(directory, name)) > age:
                os.remove(os.path.join(directory, name))
        except OSError:
            pass


def _run(path: str, timeout: float) -> dict:
    env = dict(os.environ, **FLAGS)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, os.path.abspath(path)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, f"the checks did not run:\n{done.stderr[-4000:]}"
    return json.loads(lines[-1])


def report(checks: dict, setup) -> None:
    """In the script: 8 devices set up, then ``checks`` (those named on the command line,
    or all), each reported by name."""
    os.environ.update(FLAGS)
    setup()
    import jax
    assert len(jax.devices()) == 8, jax.devices()
    print(json.dumps(run_checks(checks, sys.argv[1:])))
