"""The OpenMP wait policy einfuse's kernels run with: passive unless the user chose one,
and glibc's heap trimming (backends/c/process.py, docs/backends.md "Threads", "Memory").  Checked in fresh processes, since
libgomp reads the policy once, when the first kernel loads it."""

import os
import subprocess
import sys

import pytest

from einfuse.backends.c import build as c_build

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")

# Runs a threaded kernel, then asks libgomp for the settings it runs with.
SCRIPT = r"""
import ctypes, ctypes.util, os, sys
import numpy as np
import einfuse as ef
A = np.random.rand(512, 512)
y = ef.ein("y[i] := sum[j](exp(A[i,j]))", A=A, backend="c")
assert np.allclose(y, np.exp(A).sum(1))
print("ENV", os.environ.get("OMP_WAIT_POLICY"), flush=True)
ctypes.CDLL("libgomp.so.1").omp_display_env(1)   # verbose: spin count too
"""


def run(environment):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(environment)
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def test_kernels_wait_passively_and_leave_the_environment_as_it_was():
    out, err = run({})
    assert "ENV None" in out
    # libgomp's default spins 300000 times before sleeping; passive never spins
    assert "GOMP_SPINCOUNT = '0'" in err


def test_the_user_s_policy_wins():
    out, err = run({"OMP_WAIT_POLICY": "active"})
    assert "ENV active" in out
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in err and "GOMP_SPINCOUNT = '0'" not in err


# Frees the top of the heap after each step, as a training step does; counts page faults.
MALLOC_SCRIPT = r"""
import resource, sys
import numpy as np
import einfuse as ef
if sys.argv[1] == "load":
    A = np.random.rand(64, 64)
    ef.ein("y[i] := sum[j](A[i,j])", A=A, backend="c")
first = np.ones(1 << 17)        # 1 MiB: mapped, then freed: glibc adapts its thresholds
del first
def step():
    blocks = [np.ones(1 << 17) for _ in range(4)]     # 4 x 1 MiB at the heap's top
    del blocks
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.parametrize("load, environment, refaults", [
    ("load", {}, False), ("none", {}, True),
    ("load", {"EINFUSE_MALLOC_TUNING": "0"}, True),
    ("load", {"MALLOC_TRIM_THRESHOLD_": "131072"}, True)])
def test_freed_buffers_are_kept_for_the_next_call(load, environment, refaults):
    """After the first kernel, memory a step frees is not given back to be faulted in
    again by the next step (c_process.py); the opt-out and glibc's own variables win."""
    import platform
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc's malloc only")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES",
                                                       "EINFUSE_MALLOC_TUNING")}
    env.update(environment)
    done = subprocess.run([sys.executable, "-c", MALLOC_SCRIPT, load], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    faults = int(done.stdout.split()[-1])
    # 50 steps of 4 MiB given back and faulted in again: about 51000 faults
    assert (faults > 20000) if refaults else (faults < 2000), faults


# -- thread counts beside busy processes (backends/c/threads.py) ---------------------------

def test_thread_count_rules(monkeypatch):
    from einfuse.backends.c import threads as c_threads
    monkeypatch.setattr(c_threads, "free_threads", lambda: 5)
    assert c_threads.thread_count(3, 10**9) == 3           # threads= wins
    assert c_threads.thread_count(None, 100) == 1          # small work: the calling thread
    assert c_threads.thread_count(None, c_threads.PARALLEL_MIN_WORK) == 5


@pytest.mark.parametrize("running, cores, expected", [
    (1, 2, 0), (2, 2, 1), (5, 2, 1), (1, 8, 0), (3, 8, 6), (None, 8, 0), (4, 1, 1)])
def test_free_cores_from_running_tasks(monkeypatch, running, cores, expected):
    from einfuse.backends.c import threads as c_threads
    monkeypatch.setattr(c_threads, "_whole_machine", lambda: True)
    monkeypatch.setattr(c_threads.os, "cpu_count", lambda: cores)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(c_threads, "_own_running_threads", lambda: 1)
    assert c_threads._from_running_tasks(running) == expected


def test_this_process_s_own_spinning_threads_are_not_contention(monkeypatch):
    """Idle OpenMP/XLA workers of this process spin after a parallel loop: counted as
    other tasks they would put every repeated kernel on one thread."""
    from einfuse.backends.c import threads as c_threads
    monkeypatch.setattr(c_threads, "_whole_machine", lambda: True)
    monkeypatch.setattr(c_threads.os, "cpu_count", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(c_threads, "_own_running_threads", lambda: 2)
    assert c_threads._from_running_tasks(2) == 0          # all ours: every core
    assert c_threads._from_running_tasks(3) == 1          # one other task: one core left


def test_own_running_threads_reads_this_process():
    import threading
    from einfuse.backends.c import threads as c_threads
    tasks = len(os.listdir("/proc/self/task"))
    assert 1 <= c_threads._own_running_threads() <= max(tasks, 1)
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait)          # sleeping: not running
    helper.start()
    try:
        assert c_threads._own_running_threads() <= len(os.listdir("/proc/self/task")) - 1
    finally:
        stop.set()
        helper.join()


def test_a_cpu_limited_process_keeps_openmp_s_default(monkeypatch):
    from einfuse.backends.c import threads as c_threads
    monkeypatch.setattr(c_threads, "_whole_machine", lambda: False)
    assert c_threads._from_running_tasks(50) == 0


def test_kernels_beside_busy_tasks_give_the_same_results(monkeypatch):
    """Every C path (a statement, its repeated call, a fused program and its prepared
    run) with the thread count a busy machine gives (1) and an idle one gives (0)."""
    import numpy as np

    import einfuse as ef
    from einfuse.backends.c import threads as c_threads
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 257))
    program = ef.compile("m[i] := max[j](X[i,j])\ne[i,j] := exp(X[i,j] - m[i])\n"
                         "P[i,j] := e[i,j] / sum[k](e[i,k])")
    e = np.exp(X - X.max(1, keepdims=True))
    for free in (1, 0, 1):
        monkeypatch.setattr(c_threads, "_sample", [float("inf"), free])   # as sampled
        for _ in range(2):
            np.testing.assert_allclose(ef.ein("y[i] := sum[j](exp(X[i,j]))", X=X),
                                       np.exp(X).sum(1), rtol=1e-12)
            np.testing.assert_allclose(program(X=X), e / e.sum(1, keepdims=True),
                                       rtol=1e-12)
