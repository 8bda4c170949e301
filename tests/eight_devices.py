"""Checks that need JAX to see 8 CPU devices run in one subprocess: XLA_FLAGS counts the
host devices only before jax is first imported, and other test modules import it first
in the test process (JAX_PLATFORMS=cpu keeps a GPU machine's JAX on the host devices).
``run_script`` is the pytest side; ``report`` is the script's: it runs the checks and
prints one JSON line, check name -> null when it passed, else what failed.

The scripts in SCRIPTS run together, one after another in one subprocess (this file run
as ``python eight_devices.py SCRIPT...``): each subprocess of its own paid JAX's and
einfuse's start and JAX's compiles of the same small computations again."""

import json
import os
import runpy
import subprocess
import sys
import traceback

from check_reports import run_checks
from worker_shared import shared_result

FLAGS = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
TESTS = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(TESTS), "src")
# the checks scripts that share one subprocess (test_sharding_run.py, test_review8_sharding.py,
# test_dims_sharding.py); another script passed to run_script runs in one of its own
SCRIPTS = ("sharding_checks.py", "test_review8_sharding.py", "dims_sharding_checks.py")
# set by this file's main: the reports of the scripts it runs, in order
COLLECTED = None


def run_script(path: str, timeout: float = 600) -> dict:
    """The report of the checks script ``path`` run on 8 devices.  Under pytest-xdist
    the reports are shared by the run's workers (worker_shared.py): with ``--dist
    worksteal`` a module's tests are split among them, and each worker's module-scoped
    fixture would otherwise run the whole script again (15 s of CPU or more, compiles
    included)."""
    name = os.path.basename(path)
    if os.path.dirname(os.path.abspath(path)) != TESTS or name not in SCRIPTS:
        return shared_result(f"eight-devices {os.path.abspath(path)}",
                             lambda: _run([os.path.abspath(path)], timeout)[0])
    reports = shared_result("eight-devices " + " ".join(SCRIPTS), lambda: _run(
        [os.path.join(TESTS, script) for script in SCRIPTS], timeout * len(SCRIPTS)))
    found = reports[SCRIPTS.index(name)]
    assert "<script failed>" not in found, f"{name} did not run:\n{found['<script failed>']}"
    return found


def _run(paths, timeout: float) -> list:
    env = dict(os.environ, **FLAGS)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, TESTS, env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, os.path.abspath(__file__), *paths], env=env,
                          capture_output=True, text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, f"the checks did not run:\n{done.stderr[-4000:]}"
    reports = json.loads(lines[-1])
    assert len(reports) == len(paths), f"{len(reports)} reports for {paths}"
    return reports


def report(checks: dict, setup) -> None:
    """In the script: 8 devices set up, then ``checks`` (those named on the command line
    when the script runs alone, or all), each reported by name."""
    os.environ.update(FLAGS)
    setup()
    import jax
    assert len(jax.devices()) == 8, jax.devices()
    if COLLECTED is None:
        print(json.dumps(run_checks(checks, sys.argv[1:])))
    else:
        COLLECTED.append(run_checks(checks))


def _main(paths) -> None:
    """Each script in ``paths`` run as ``__main__``, its report collected; one JSON list
    printed.  A script that fails outside its checks (an import, its setup) is reported
    as failed, and the others still run."""
    import eight_devices as shared      # the module the scripts import, not __main__
    reports = []
    for path in paths:
        shared.COLLECTED = []
        try:
            runpy.run_path(path, run_name="__main__")
            assert len(shared.COLLECTED) == 1, f"{path} reported {len(shared.COLLECTED)} times"
            reports.append(shared.COLLECTED[0])
        except Exception:   # reported per script by the pytest side
            reports.append({"<script failed>": traceback.format_exc()})
    print(json.dumps(reports))


if __name__ == "__main__":
    sys.path.insert(0, TESTS)
    _main(sys.argv[1:])
