"""Faults around the C build cache (issue 9, item 8) and C kernels called from many
threads at once (item 10): a damaged cached library is rebuilt, never loaded; an
unwritable cache still runs (one warning); a cache path that is a file is a clear error;
an interrupted compile leaves no files and no compiler processes behind; concurrent
builds compile a kernel once."""

import hashlib
import os
import shlex
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import backend as c_backend, build as c_build
from einfuse.backends import disk_cache

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="no C compiler with OpenMP")
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh, empty cache directory, with every in-process memo of libraries cleared."""
    directory = tmp_path / "cache"
    directory.mkdir()
    monkeypatch.setenv("EINFUSE_CACHE_DIR", str(directory))
    monkeypatch.setattr(c_backend, "_kernels", {})
    monkeypatch.setattr(disk_cache, "_warned_dirs", set(), raising=False)
    monkeypatch.setattr(disk_cache, "_fallback", [], raising=False)
    monkeypatch.setattr(c_build, "_swept", set(), raising=False)
    c_build.clear_memory_cache()
    yield directory
    c_build.clear_memory_cache()


def run_python(code, cache, timeout=120):
    """Run ``code`` in a fresh interpreter on ``cache``: a damaged library may kill the
    process that maps it, which must not be the test runner."""
    env = dict(os.environ, EINFUSE_CACHE_DIR=str(cache),
               PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # a runner that ignores Ctrl-C (pytest-xdist's workers) passes that on to its children:
    # the interrupt tests need Python's own KeyboardInterrupt back
    code = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n" + code
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout)


def leftovers(directory):
    """What a build may not leave behind: temporaries and build directories (lock files
    are kept on purpose; libraries are checked by the callers)."""
    return [name for name in os.listdir(directory)
            if name.startswith(".") or "tmp" in name or name.endswith((".c", ".log"))]


# -- a damaged library is rebuilt --------------------------------------------------------

DAMAGE = {
    "emptied": lambda data: b"",
    "truncated": lambda data: data[:64],
    "half": lambda data: data[:len(data) // 2],     # headers intact: SIGBUS when mapped
    "garbage": lambda data: np.random.default_rng(0).bytes(len(data)),
    "tail-zeroed": lambda data: data[:len(data) // 2] + bytes(len(data) - len(data) // 2),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE) + ["record-missing"])
def test_damaged_cached_library_is_rebuilt_not_loaded(cache, damage):
    source = f"/* {damage} */ int einfuse_damaged(void) {{ return 5; }}\n"
    flags = c_build.flags_for(False)
    path = cache / (c_build.library_key(source, flags) + ".so")
    c_build.compile_library(source, flags, str(path))   # built, never mapped here
    good = path.read_bytes()
    if damage == "record-missing":        # e.g. left by an einfuse without records
        os.unlink(str(path) + ".sha256")
    else:
        path.write_bytes(DAMAGE[damage](good))   # in place, as a crash or a disk would
    done = run_python("from einfuse.backends.c import build as c_build\n"
                      f"print('got', c_build.load({source!r}).einfuse_damaged())\n", cache)
    assert done.returncode == 0 and "got 5" in done.stdout, done.stderr[-2000:]
    rebuilt = path.read_bytes()
    size, digest = (cache / (path.name + ".sha256")).read_text().split()
    assert (int(size), digest) == (len(rebuilt), hashlib.sha256(rebuilt).hexdigest())
    assert not leftovers(cache)


# -- an unwritable cache still runs; a cache path that is a file is an error --------------

def _make_read_only(directory):
    """Mode bits, and for root (who ignores them) the immutable attribute; True when
    the directory really is unwritable now."""
    directory.chmod(0o555)
    if os.access(directory, os.W_OK):
        subprocess.run(["chattr", "+i", str(directory)], capture_output=True)
    return not os.access(directory, os.W_OK)


def _make_writable(directory):
    subprocess.run(["chattr", "-i", str(directory)], capture_output=True)
    directory.chmod(0o755)


def test_read_only_cache_still_runs_with_one_warning(cache):
    prebuilt = "int einfuse_prebuilt(void) { return 3; }\n"
    assert c_build.load(prebuilt).einfuse_prebuilt() == 3
    c_build.clear_memory_cache()
    try:
        if not _make_read_only(cache):
            pytest.skip("cannot make a directory read-only here")
        before = sorted(os.listdir(cache))
        with warnings.catch_warnings():
            warnings.simplefilter("error")    # an intact library is read, silently
            assert c_build.load(prebuilt).einfuse_prebuilt() == 3
        with pytest.warns(ef.EinfuseWarning, match="not writable"):
            assert c_build.load("int einfuse_ro1(void) { return 1; }\n").einfuse_ro1() == 1
        with warnings.catch_warnings():
            warnings.simplefilter("error")    # one warning per directory and process
            assert c_build.load("int einfuse_ro2(void) { return 2; }\n").einfuse_ro2() == 2
            x = np.arange(10.0)
            y = ef.ein("y[i] := x[i] * 3 + 1", x=x, backend="c")
        np.testing.assert_array_equal(y, x * 3 + 1)
        assert sorted(os.listdir(cache)) == before
    finally:
        _make_writable(cache)


def test_cache_path_that_is_a_file_is_a_clear_error(cache, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    for path in (blocker, blocker / "below"):
        monkeypatch.setenv("EINFUSE_CACHE_DIR", str(path))
        with pytest.raises(ef.EinfuseError, match="EINFUSE_CACHE_DIR"):
            c_build.load("int einfuse_blocked(void) { return 0; }\n")
        with pytest.raises(ef.EinfuseError, match="not a directory"):
            ef.ein("y[i] := x[i] * 5 - 2", x=np.ones(3), backend="c")
    assert blocker.read_text() == ""


# -- interrupted compiles leave nothing behind -------------------------------------------

FAKE_CC = """#!/bin/sh
# a compiler that starts a helper process, writes a temporary file, then misbehaves
sleep 60 </dev/null >/dev/null 2>&1 &
echo $! > {state}/helper.pid
tmp="${{TMPDIR:-{state}}}/einfuse-fake-cc-temporary"
: > "$tmp"
echo "$tmp" > {state}/temporary
{action}
"""
# (the compiler runs under a shell that ties it to its caller: the caller's pid is passed)
ACTIONS = {"timeout": "wait", "killed": "kill -9 $$",
           "interrupt": "kill -INT $EINFUSE_TEST_CALLER; wait"}


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")     # a zombie is dead, waiting for a reaper


@pytest.mark.parametrize("mode", sorted(ACTIONS))
def test_interrupted_compile_leaves_no_files_and_no_processes(cache, tmp_path, monkeypatch,
                                                              mode):
    state = tmp_path / "state"
    state.mkdir()
    fake = tmp_path / "fake-cc"
    fake.write_text(FAKE_CC.format(state=shlex.quote(str(state)), action=ACTIONS[mode]))
    fake.chmod(0o755)
    source = "int einfuse_never(void) { return 0; }\n"
    try:
        if mode == "interrupt":   # Ctrl-C reaches a Python process: not the test runner
            done = run_python(
                "import os\nos.environ['EINFUSE_TEST_CALLER'] = str(os.getpid())\n"
                "from einfuse.backends.c import build as c_build\n"
                f"c_build._compiler, c_build._probed = (({str(fake)!r},), 'fake'), True\n"
                f"try:\n    c_build.load({source!r})\n"
                "except KeyboardInterrupt:\n    print('interrupted')\n", cache, timeout=60)
            assert "interrupted" in done.stdout, done.stderr[-2000:]
        else:
            monkeypatch.setattr(c_build, "_compiler", ((str(fake),), "fake"))
            monkeypatch.setattr(c_build, "_probed", True)
            monkeypatch.setattr(c_build, "COMPILE_TIMEOUT", 1.0, raising=mode == "timeout")
            started = time.monotonic()
            with pytest.raises(ef.EinfuseError, match="more than 1 s" if mode == "timeout"
                               else "exit status"):
                c_build.load(source)
            assert time.monotonic() - started < 30
        helper = int((state / "helper.pid").read_text())
        deadline = time.monotonic() + 20   # generous: a loaded machine reaps slowly
        while _alive(helper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(helper), "the compiler's child outlived the build"
        assert not os.path.exists((state / "temporary").read_text().strip())
        assert not leftovers(cache)
        assert not [name for name in os.listdir(cache) if name.endswith((".so", ".sha256"))]
    finally:
        if (state / "helper.pid").exists() and _alive(int((state / "helper.pid").read_text())):
            os.kill(int((state / "helper.pid").read_text()), 9)


def test_an_interrupt_while_the_compiler_starts_still_kills_it(cache, tmp_path):
    """Ctrl-C that lands while Popen is starting the compiler (the child forked, its pid
    not handed back yet) used to leave the compiler's process group running: the
    KeyboardInterrupt escaped Popen before anything knew whom to kill."""
    state = tmp_path / "state"
    state.mkdir()
    fake = tmp_path / "fake-cc"
    fake.write_text(FAKE_CC.format(state=shlex.quote(str(state)), action="wait"))
    fake.chmod(0o755)
    done = run_python(
        "import os, signal, subprocess, time\n"
        "from einfuse.backends.c import build as c_build\n"
        f"c_build._compiler, c_build._probed = (({str(fake)!r},), 'fake'), True\n"
        "real = subprocess.Popen\n"
        "def popen(*args, **kwargs):\n"
        "    process = real(*args, **kwargs)\n"
        f"    while not os.path.exists({str(state / 'helper.pid')!r}): time.sleep(0.01)\n"
        "    os.kill(os.getpid(), signal.SIGINT)   # before Popen returns\n"
        "    for _ in range(100): time.sleep(0.001)\n"
        "    return process\n"
        "subprocess.Popen = popen\n"
        "try:\n    c_build.load('int einfuse_never2(void) { return 0; }\\n')\n"
        "except KeyboardInterrupt:\n    print('interrupted')\n"
        # the caller lives on (a notebook would): its death must not be what kills it
        f"helper = int(open({str(state / 'helper.pid')!r}).read())\n"
        "for _ in range(200):\n"
        "    state = open(f'/proc/{helper}/stat').read().rsplit(')', 1)[1].split()[0] \\\n"
        "        if os.path.exists(f'/proc/{helper}') else 'X'\n"
        "    if state in ('Z', 'X'): break\n"
        "    time.sleep(0.05)\n"
        "print('dead' if state in ('Z', 'X') else 'alive')\n", cache, timeout=60)
    assert "interrupted" in done.stdout, done.stderr[-2000:]
    assert "dead" in done.stdout, "the compiler's child outlived the interrupt"
    helper = int((state / "helper.pid").read_text())
    try:
        deadline = time.monotonic() + 20
        while _alive(helper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(helper), "the compiler's child outlived the interrupt"
    finally:
        if _alive(helper):
            os.kill(helper, 9)


# -- concurrent builds ---------------------------------------------------------------------

def _counting_compiler(tmp_path):
    """The real compiler behind a script that logs each run."""
    log = tmp_path / "compiles.log"
    script = tmp_path / "counting-cc"
    real = " ".join(shlex.quote(part) for part in c_build.find_compiler()[0])
    script.write_text(f'#!/bin/sh\necho run >> {shlex.quote(str(log))}\nexec {real} "$@"\n')
    script.chmod(0o755)
    return script, log


def test_concurrent_builds_compile_each_kernel_once(cache, tmp_path, monkeypatch):
    script, log = _counting_compiler(tmp_path)
    monkeypatch.setattr(c_build, "_compiler", ((str(script),), "counting"))
    monkeypatch.setattr(c_build, "_probed", True)
    source = "int einfuse_once(void) { return 11; }\n"
    barrier = threading.Barrier(8)

    def build(_):
        barrier.wait()
        return c_build.load(source).einfuse_once()
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(build, range(8))) == [11] * 8
    assert log.read_text().split() == ["run"]

    # Processes: each loads a second kernel at about the same moment.
    log.unlink()
    code = ("from einfuse.backends.c import build as c_build\n"
            f"c_build._compiler, c_build._probed = (({str(script)!r},), 'counting'), True\n"
            "assert c_build.load('int einfuse_twice(void) { return 12; }\\n')"
            ".einfuse_twice() == 12\n")
    env = dict(os.environ, EINFUSE_CACHE_DIR=str(cache), PYTHONPATH=SRC)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    assert log.read_text().split() == ["run"]
    assert len([name for name in os.listdir(cache) if name.endswith(".so")]) == 2
    assert not leftovers(cache)


# -- C kernels from 8 threads at once (issue 9, item 10) -----------------------------------

_rng = np.random.default_rng(9)
_X = _rng.standard_normal((64, 300))
CASES = [
    ("D[i,j] := (w[k,i] - x[k,j])**2",
     dict(w=_rng.standard_normal((48, 96)), x=_rng.standard_normal((48, 80))), {}),
    ("y[i] := x[i+a] * ker[a]", dict(x=_rng.standard_normal(5000), ker=np.arange(7.0)), {}),
    ("z[i] := log(sum[j](exp(X[i,j] - m[i])))", dict(X=_X, m=_X.max(1)), {}),
    ("s[i] := max[j](X[i,j]) + min[j](X[i,j])", dict(X=_X), {}),
    ("E[b,d] := W[idx[b], d]",
     dict(W=_rng.standard_normal((50, 40)), idx=_rng.integers(-5, 60, 300)),
     dict(bounds="clip")),
    ("C[i,j] := A[i,k] * B[k,j]",
     dict(A=_rng.standard_normal((40, 30)), B=_rng.standard_normal((30, 20))), {}),
    ("r[i,j] := relu(X[i,j]) * sigmoid(X[i,j]) + tanh(X[i,j])",
     dict(X=_X.astype(np.float32)), {}),
    ("g[i] := sum[j](where(X[i,j] > 0, X[i,j], 0.1 * X[i,j]))", dict(X=_X), {}),
]


@pytest.mark.parametrize("backend", ["numpy", "c"])
def test_statements_from_eight_threads_match_numpy(cache, backend):
    expected = [ef.ein(text, backend="numpy", **options, **arrays)
                for text, arrays, options in CASES]
    shared = [ef.compile(text, backend=backend, **options) for text, _, options in CASES]

    def work(thread):
        # Threads 0..7 run: the same statement, their own statement through ef.ein, and
        # their own statement through a kernel object shared by all threads.
        found = []
        for case in (0, thread % len(CASES)):
            text, arrays, options = CASES[case]
            for _ in range(3):
                found.append((case, ef.ein(text, backend=backend, **options, **arrays)))
            found.append((case, shared[case](**arrays)))
        return found

    barrier = threading.Barrier(8)   # the first calls (and C compiles) overlap

    def start(thread):
        barrier.wait()
        return work(thread)
    with ThreadPoolExecutor(8) as pool:
        results = [r for found in pool.map(start, range(8)) for r in found]
    assert len(results) == 8 * 8
    for case, result in results:
        tolerance = 1e-5 if expected[case].dtype == np.float32 else 1e-10
        np.testing.assert_allclose(result, expected[case], rtol=tolerance, atol=tolerance,
                                   err_msg=CASES[case][0])


def test_vanished_compiler_and_stale_build_directories(cache, monkeypatch):
    stale = cache / ".build-left-by-a-killed-process"
    stale.mkdir()
    (stale / "kernel.c").write_text("int x;\n")
    os.utime(stale, (time.time() - 2 * 86400,) * 2)
    fresh = cache / ".build-of-a-running-compile"
    fresh.mkdir()
    monkeypatch.setattr(c_build, "_compiler", (("/nonexistent/einfuse-cc",), "gone"))
    monkeypatch.setattr(c_build, "_probed", True)
    with pytest.raises(ef.EinfuseError, match="cannot run the C compiler"):
        c_build.load("int einfuse_orphan(void) { return 0; }\n")
    assert not stale.exists() and fresh.exists()


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "timed-wait"])
def test_compiler_wait_returns_status_or_times_out(monkeypatch, pidfd):
    """c_build._wait_exit: a pidfd where the platform has one, else Popen's timed wait;
    both give the exit status and both stop at the timeout."""
    import subprocess
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    done = subprocess.Popen(["sh", "-c", "exit 3"])
    assert c_build._wait_exit(done, 30) == 3
    slow = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            c_build._wait_exit(slow, 0.2)
    finally:
        slow.kill()
        slow.wait()
