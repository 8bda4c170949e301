"""Starting a job of several local processes for the multi-process tests (JAX and
torch.distributed): loopback addresses only, a free port, a bounded time, and every
process killed (its whole process group) whatever happens.  Each process prints one
JSON object as the last line of its stdout; :func:`launch` returns them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import List, Optional

from worker_shared import shared_result

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
TESTS = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Outcome:
    process: int
    returncode: Optional[int]        # None: killed at the deadline
    report: Optional[dict]           # the JSON of its last stdout line, if any
    stdout: str
    stderr: str

    def describe(self) -> str:
        return (f"process {self.process}: returncode {self.returncode}\n"
                f"stdout tail:\n{self.stdout[-2000:]}\nstderr tail:\n{self.stderr[-3000:]}")


def environment(extra: dict) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, TESTS, env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def launch(script: str, processes: int, arguments: List[str], env: dict,
           timeout: float) -> List[Outcome]:
    """Run ``python script PROCESS_ID PROCESSES *arguments`` for each process at once,
    wait at most ``timeout`` seconds for all of them, kill what is left, and return
    what each reported."""
    children = []
    outputs = []
    try:
        for rank in range(processes):
            # files, not pipes: a chatty child can never block on a full pipe
            stdout = _temporary(f"out{rank}")
            stderr = _temporary(f"err{rank}")
            outputs.append((stdout, stderr))
            children.append(subprocess.Popen(
                [sys.executable, script, str(rank), str(processes), *arguments],
                stdout=stdout, stderr=stderr, env=environment(env),
                start_new_session=True))          # its own group: killed with its children
        deadline = time.monotonic() + timeout
        for child in children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
    finally:
        for child in children:
            if child.poll() is None:
                _kill_group(child)
        for child in children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:   # pragma: no cover - a stuck kernel call
                pass
    outcomes = []
    for rank, (child, (stdout, stderr)) in enumerate(zip(children, outputs)):
        texts = []
        for handle in (stdout, stderr):
            handle.seek(0)
            texts.append(handle.read().decode(errors="replace"))
            handle.close()
        report = None
        lines = [line for line in texts[0].splitlines() if line.startswith("{")]
        if lines:
            try:
                report = json.loads(lines[-1])
            except ValueError:
                report = None
        killed = child.returncode is not None and child.returncode == -signal.SIGKILL
        outcomes.append(Outcome(rank, None if killed and report is None else
                                child.returncode, report, texts[0], texts[1]))
    return outcomes


def launch_shared(script: str, processes: int, names: List[str], env: dict,
                  timeout: float) -> List[Outcome]:
    """:func:`launch` of ``script`` running the checks ``names`` (after a free port),
    once per test run for all the tests that ask for the same job (worker_shared.py):
    each job of its own started the processes, torch and the process group again."""
    key = json.dumps([os.path.abspath(script), processes, names, sorted(env.items())])
    found = shared_result("launch " + key, lambda: [asdict(outcome) for outcome in launch(
        script, processes, [str(free_port()), ",".join(names)], env, timeout)])
    return [Outcome(**outcome) for outcome in found]


def assert_all_passed(outcomes, names) -> None:
    """Every process reported every check in ``names`` as passed (None) and exited 0;
    a failure names the process, the check and what it reported."""
    for outcome in outcomes:
        assert outcome.report is not None, outcome.describe()
        for name in names:
            assert name in outcome.report, outcome.describe()
            assert outcome.report[name] is None, \
                f"process {outcome.process}, {name}:\n{outcome.report[name]}"
        assert outcome.returncode == 0, outcome.describe()


def _temporary(name: str):
    import tempfile
    return tempfile.TemporaryFile(prefix=f"einfuse-mp-{name}-")


def _kill_group(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
