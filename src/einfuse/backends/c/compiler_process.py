"""Running the C compiler (``run_compiler``: backends/c/build.py runs every compile
through it, the kernels' and the extensions'), with limits on its processes, so that no
compile outlives or outgrows the process that asked for it.  A kernel whose source had
grown exponentially once kept GCC busy for 75 minutes and 23 GB, swapping the machine,
long after its caller had been killed.

* **Memory**: each process of the compile may map at most ``$EINFUSE_COMPILE_MEMORY_MB``
  (default 4096; ``RLIMIT_AS``); GCC's cc1 needs under 200 MB for the largest kernels
  einfuse writes.  ``0`` removes the limit.
* **Time**: ``$EINFUSE_COMPILE_TIMEOUT`` seconds (default 300) of wall-clock time, after
  which the compile's whole process group is killed, and as many seconds of CPU time per
  process (``RLIMIT_CPU``), which hold even where nothing is left to kill the group.
* **Tied to its caller**: a compile is killed, every process of it, within a second of
  its caller's death (killed outright, say, with no chance to clean up).

All of it is done by a small POSIX shell that the compile runs under, not by Python code
in the child between fork and exec (``preexec_fn``: unsafe in a threaded process, which
a JAX user's is, and JAX warns of every such fork).  The shell sets the limits
(``ulimit``), which the compiler's children (cc1, as, ld) inherit; it starts the
compiler and a watcher that checks once a second that the caller lives, and kills the
process group when it does not (a death signal, ``PR_SET_PDEATHSIG``, would not do: the
kernel clears it in the compiler's children, and cc1 would run on).  Without a shell
(Windows) the compiler runs with the wall-clock limit only.  A compile stopped by a
limit is a CompileLimitError that says which limit and which variable raises it."""

from __future__ import annotations

import contextlib
import errno
import math
import os
import select
import shutil
import signal
import subprocess
import threading
from typing import Iterator, List, Optional, Tuple

from ...errors import BackendError

try:
    import resource
except ImportError:        # not POSIX: no shell either (below)
    resource = None

MEMORY_VARIABLE = "EINFUSE_COMPILE_MEMORY_MB"
TIME_VARIABLE = "EINFUSE_COMPILE_TIMEOUT"
DEFAULT_MEMORY_MB = 4096

# The limits, then the compiler ("$@") in the background and a watcher of the caller;
# the exit status is the compiler's (128 + n where a signal n ended it).  ``kill 0``
# signals the whole process group: the shell, the compiler and all it started.
_GUARD = """\
trap 'kill -KILL 0' TERM HUP
{limits}"$@" & compiler=$!
{{ while kill -0 {caller} 2>/dev/null; do sleep 1; done; kill -KILL 0; }} &
watcher=$!
wait $compiler
status=$?
kill $watcher 2>/dev/null
exit $status
"""
_SHELL = shutil.which("sh") if os.name == "posix" and resource is not None else None


def _setting(variable: str, default: float) -> float:
    """A non-negative number from the environment, or ``default`` where it is unset."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise BackendError(f"{variable}={text!r} is not a number of "
                           f"{'MB' if variable == MEMORY_VARIABLE else 'seconds'} "
                           "(0 or more)")
    return value


def compile_timeout(default: float) -> float:
    """The seconds a compile may run: ``$EINFUSE_COMPILE_TIMEOUT``, else ``default``."""
    return _setting(TIME_VARIABLE, default) or default


def memory_limit_mb() -> float:
    """The MB of address space a compile may use (0: no limit)."""
    return _setting(MEMORY_VARIABLE, DEFAULT_MEMORY_MB)


def guarded(command: List[str], seconds: float, memory_mb: float) -> List[str]:
    """``command`` as the child runs it: under the shell above (where there is one),
    with at most ``seconds`` of CPU time and ``memory_mb`` of address space per
    process."""
    if _SHELL is None:
        return list(command)
    if shutil.which(command[0]) is None:   # as exec would say, not the shell's 127
        raise FileNotFoundError(errno.ENOENT, "No such executable file", command[0])
    limits = [f"ulimit -t {_within('RLIMIT_CPU', math.ceil(seconds) + 1, 1)}"]
    if memory_mb:
        limits.append(f"ulimit -v {_within('RLIMIT_AS', math.ceil(memory_mb * 1024), 1024)}")
    script = _GUARD.format(limits="".join(f"{line} 2>/dev/null\n" for line in limits),
                           caller=os.getpid())
    return [_SHELL, "-c", script, "einfuse-compile"] + list(command)


def _within(limit: str, wanted: int, unit: int) -> int:
    """``wanted`` (in ``unit`` bytes or seconds), or less where this process's own hard
    limit is lower: ``ulimit`` may lower a limit, never raise it."""
    _, hard = resource.getrlimit(getattr(resource, limit))
    if hard == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, hard // unit))


class CompileError(BackendError):
    """A kernel could not be compiled or loaded (an EinfuseError, still a RuntimeError)."""


class CompileLimitError(CompileError):
    """A compile stopped by its time or memory limit."""


def run_compiler(command: List[str], workdir: str, timeout: float) -> Tuple[int, str]:
    """Run ``command`` in its own process group with TMPDIR=``workdir`` (so its own
    temporary files die with ``workdir``); returns (exit status, output).  On a timeout,
    an interrupt or any other exception, and after a compiler that was killed, the whole
    group is killed: gcc's cc1/as/ld must not outlive the build.  Output goes to a file,
    not a pipe, so an orphan holding the pipe open cannot stall the wait.  The child
    runs under the limits above and dies with its caller; a compile stopped by a limit
    is a CompileLimitError saying which."""
    log_path = os.path.join(workdir, "compiler.log")
    memory = memory_limit_mb()
    with open(log_path, "w+") as log:
        interrupted: List[bool] = []
        try:
            with _interrupts_deferred(interrupted):
                process = subprocess.Popen(guarded(command, timeout, memory),
                                           stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True,
                                           env=dict(os.environ, TMPDIR=workdir))
        except OSError as error:   # the compiler vanished or lost its x bit since the probe
            raise CompileError(start_error(error, command, memory)) from None
        try:
            if interrupted:        # now that the group is known, it is killed below
                raise KeyboardInterrupt
            status = wait_exit(process, timeout)
        except subprocess.TimeoutExpired:
            raise CompileLimitError(f"the C compiler ran for more than {timeout:g} s and was "
                                    f"stopped: {' '.join(command[:1])} (set {TIME_VARIABLE} "
                                    "to allow more seconds)") from None
        finally:
            # Also after a normal exit: a killed driver leaves cc1/as/ld behind.  The
            # group id (the leader's pid) stays reserved while any member lives.
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)
            if process.returncode is None:
                process.kill()
                process.wait()
        log.seek(0)
        output = log.read()
    stopped = limit_reached(status, output, timeout, memory)
    if stopped is not None:
        raise CompileLimitError(stopped)
    return status, output


@contextlib.contextmanager
def _interrupts_deferred(interrupted: List[bool]) -> Iterator[None]:
    """Ctrl-C while Popen starts the compiler is held until Popen has returned: raised
    inside Popen (the child forked, its pid not yet handed back), the interrupt left the
    compiler's whole process group running with nobody to kill it.  Only the main thread
    receives KeyboardInterrupt, and only Python's own handler raises it; another handler
    (the user's) is left alone."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda number, frame: interrupted.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def wait_exit(process: subprocess.Popen, timeout: float) -> int:
    """``process.wait(timeout)`` without its polling: CPython's timed wait sleeps in
    steps growing to 50 ms, which added up to 50 ms (often more than the compile
    itself) to every kernel build.  A pidfd becomes readable the moment the process
    exits; where there is none (not Linux, old kernels) the timed wait remains."""
    try:
        handle = os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        return process.wait(timeout=timeout)
    try:
        # poll, not select: select refuses descriptors from FD_SETSIZE (1024) on, which a
        # process with many files open gets
        waiter = select.poll()
        waiter.register(handle, select.POLLIN)
        ready = waiter.poll(max(0, math.ceil(timeout * 1000)))
    finally:
        os.close(handle)
    if not ready:
        raise subprocess.TimeoutExpired(process.args, timeout)
    return process.wait()


_OUT_OF_MEMORY = ("out of memory", "memory exhausted", "cannot allocate memory",
                  "bad_alloc", "enomem")
_CRASHED = ("internal compiler error", "segmentation fault", "signal terminated",
            "stack dump")


def limit_reached(status: int, output: str, seconds: float, memory_mb: float
                  ) -> Optional[str]:
    """Why the compile with exit ``status`` and ``output`` failed, where a limit stopped
    it (the message of its CompileError), else None."""
    # (SIGXCPU comes at the soft limit; a SIGKILL may be anyone's: the system's OOM
    # killer, a user)
    if status in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return (f"the C compiler used its CPU-time limit ({seconds:g} s) and was stopped; "
                f"set {TIME_VARIABLE} to allow more seconds")
    text = output.lower()
    if memory_mb and any(words in text for words in _OUT_OF_MEMORY):
        return memory_message(memory_mb)
    if memory_mb and status != 0 and any(words in text for words in _CRASHED):
        # an allocation that fails where the compiler does not check (its stack, say)
        # is a crash, not a message
        return (f"the C compiler crashed (exit status {status}), most likely out of "
                f"memory under its limit of {memory_mb:g} MB; set {MEMORY_VARIABLE} to "
                f"allow more (0: no limit). Its output:\n{output[-2000:]}")
    return None


def memory_message(memory_mb: float) -> str:
    return (f"the C compiler ran out of memory under its limit of {memory_mb:g} MB; set "
            f"{MEMORY_VARIABLE} to allow more (0: no limit)")


def start_error(error: OSError, command: List[str], memory_mb: float) -> str:
    """The message for a compiler that could not be started."""
    if error.errno == errno.ENOMEM and memory_mb:
        return memory_message(memory_mb)
    return f"cannot run the C compiler {command[0]}: {error}"


__all__ = ["CompileError", "CompileLimitError", "DEFAULT_MEMORY_MB", "MEMORY_VARIABLE",
           "TIME_VARIABLE", "compile_timeout", "guarded", "limit_reached",
           "memory_limit_mb", "memory_message", "run_compiler", "start_error", "wait_exit"]
