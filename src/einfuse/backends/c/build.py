"""Compile generated C into shared libraries, cache them, load them with ctypes.

Compiler: ``$CC`` if set, else the first of ``cc``, ``gcc``, ``clang`` on PATH
that builds a small OpenMP test library; none -> the C backend is unavailable.

Flags: ``-O3 -march=native -fopenmp -fPIC -shared`` (``EINFUSE_CPU`` picks another
``-march``: analysis/machine.py) plus

* ``-fwrapv``: integer overflow wraps, as NumPy's integer arithmetic does;
* ``-fno-math-errno -fno-trapping-math``: never change a result, let sqrt and
  friends inline and vectorise;
* ``-fno-loop-unroll-and-jam`` where the compiler takes it: half the build time of
  some kernels, no speed lost (LEAN_FLAGS);
* ``-freciprocal-math`` (x / 3 as x * (1/3), a rounding difference) for statements
  without NaN-sensitive operations (no comparisons, ``&``/``|``, min/max/where/relu/
  softplus, max/min/logsumexp reductions); none of the rest of -ffast-math, which
  changes results beyond rounding (see FAST_MATH_FLAGS).  Statements
  with the NaN-sensitive operations get no fast-math at all, because their
  ``x != x`` tests and ordered selects must keep IEEE semantics exactly.

Cache: ``$EINFUSE_CACHE_DIR`` (default ``~/.cache/einfuse``) holds
``<key>.so`` keyed by source + compiler identity + flags + CPU, and beside it
``<key>.so.sha256``, the size and SHA-256 of the library as built.  A library is
loaded only when it matches that record; anything else (emptied, truncated,
overwritten, a record missing) is rebuilt, because mapping a damaged library can
kill the process (SIGBUS) or fail forever.  A build runs in a private directory
inside the cache and is renamed into place (library first, then its record), so
readers never see a half-written file; a per-kernel file lock makes concurrent
processes and threads compile a kernel once.  A cache directory that cannot be
written is still read; new libraries then go to a temporary directory, with one
``EinfuseWarning``.  An in-process dict makes each library load once.  The cache is
bounded (backends/cache_limit.py: least recently used libraries go past
``$EINFUSE_CACHE_MAX_MB``, default 2048).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Dict, List, Optional, Tuple

from ...analysis.machine import machine
from ...errors import warn
from .. import cache_limit, disk_cache
from ..disk_cache import cache_dir, configured_cache_dir, fallback_dir, file_lock
from . import compile_progress, compiler_process as compiler_process
from .compiler_process import CompileError, CompileLimitError, run_compiler
from .process import process_settings

# -march=native unless EINFUSE_CPU picks another target (analysis/machine.py)
BASE_FLAGS = ("-O3", *machine().march, "-fopenmp", "-fPIC", "-shared", "-fwrapv",
              "-fno-math-errno", "-fno-trapping-math")
# Of -ffast-math only reciprocals: x / 3 as x * (1/3), a rounding difference (a division
# costs several times a product).  The rest changes results: -fno-signed-zeros lets GCC
# fold 0 - d into -d (1/(0 - d) was -inf for d = +0), -funsafe-math-optimizations pow(x,
# 0.5) into sqrt(x) (-inf ** 0.5 was nan) and pow(x, 1/3) into cbrt(x) (negative x gave
# a number, not NaN), and -fassociative-math would undo compensated sums.  SIMD sums are
# OpenMP reductions and need no reassociation; the bench cases run as fast.
FAST_MATH_FLAGS = ("-freciprocal-math",)
# Compile latency (issue 11): GCC's unroll-and-jam at -O3 doubled the build time of
# kernels whose reduction loop holds a lane loop (gauss: 1.1 s -> 0.55 s; median over
# the bench kernels -18%) and sped up none of them: the register blocks are unrolled
# by complete peeling, which stays.  Used where the probe found the compiler takes it.
LEAN_FLAGS = ("-fno-loop-unroll-and-jam",)

_lock = threading.Lock()
_loaded: Dict[str, ctypes.CDLL] = {}
_by_source: Dict[Tuple[str, bool], ctypes.CDLL] = {}   # skips hashing on repeat loads
_compiler: Optional[Tuple[Tuple[str, ...], str]] = None
_probed = False

# Seconds a compiler may run before it (and everything it started) is killed; the
# environment's EINFUSE_COMPILE_TIMEOUT overrides it (backends/c/compiler_process.py).
COMPILE_TIMEOUT = 300.0
PROBE_TIMEOUT = 60.0
RECORD_SUFFIX = ".sha256"        # <key>.so.sha256: "<size> <sha256>" of <key>.so as built


_PROBE = """\
#include <omp.h>
#include <math.h>
int einfuse_probe(void) { int n = 0;
#pragma omp parallel for reduction(+:n)
for (int i = 0; i < 4; ++i) n += (int)sqrt(1.0);
return n + 0 * omp_get_max_threads(); }
"""


_wait_exit = compiler_process.wait_exit      # (the tests call it by this name)


def compile_timeout() -> float:
    """Seconds a kernel's compile may take: $EINFUSE_COMPILE_TIMEOUT, else COMPILE_TIMEOUT."""
    return compiler_process.compile_timeout(COMPILE_TIMEOUT)


def _candidates() -> List[List[str]]:
    if os.environ.get("CC"):
        return [shlex.split(os.environ["CC"])]
    return [[tool] for tool in ("cc", "gcc", "clang") if shutil.which(tool)]


# glibc's libmvec has SIMD versions of these (float and double) since 2.35.
VECTOR_MATH_FUNCTIONS = ("exp", "log", "sin", "cos", "expm1", "log1p", "tanh", "erf")


def vector_math_declarations(suffix: str, ctype: str) -> str:
    """Declarations that let ``#pragma omp simd`` loops call libmvec's vector versions
    (glibc declares them only under -ffast-math, which einfuse does not always use)."""
    return "".join(f'extern {ctype} {f}{suffix}({ctype}) __attribute__((__simd__("notinbranch")));\n'
                   for f in VECTOR_MATH_FUNCTIONS)


_VECTOR_MATH_PROBE = vector_math_declarations("f", "float") + vector_math_declarations(
    "", "double") + """\
float einfuse_probe(const float *x, const double *y, long n) { float a = 0; double b = 0;
#pragma omp simd reduction(+:a, b)
for (long i = 0; i < n; ++i) {
  a += expf(x[i]) + logf(x[i]) + sinf(x[i]) + cosf(x[i]) + expm1f(x[i]) + log1pf(x[i])
       + tanhf(x[i]) + erff(x[i]);
  b += exp(y[i]) + log(y[i]) + sin(y[i]) + cos(y[i]) + expm1(y[i]) + log1p(y[i])
       + tanh(y[i]) + erf(y[i]); }
return a + (float)b; }
"""
_vector_math = False
_lean = False


def _fingerprint(command: List[str]) -> Optional[str]:
    """Path, size and modification time of the compiler: a new compiler (or a changed
    CC) gets a new probe and new cache keys, without running it in every process."""
    path = shutil.which(command[0])
    if path is None:
        return None
    real = os.path.realpath(path)
    info = os.stat(real)
    return f"{' '.join(command)}|{real}|{info.st_size}|{info.st_mtime_ns}"


def _try_compile(command: List[str], source: str, extra: List[str]) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as handle:
            handle.write(source)
        try:
            status, _ = run_compiler(command + list(BASE_FLAGS) + [
                src, "-o", os.path.join(tmp, "probe.so"), "-lm"] + extra, tmp, PROBE_TIMEOUT)
        except CompileLimitError:
            raise          # timed out or out of memory: _probe remembers nothing
        except CompileError:   # it cannot be run: not a usable compiler
            return False
    return status == 0


def _probe(command: List[str], fingerprint: str) -> dict:
    """Whether ``command`` compiles OpenMP code, and whether it can call glibc's vector
    math (libmvec), remembered on disk so later processes skip the probe."""
    import json
    directory = configured_cache_dir()
    path = os.path.join(directory, "compiler-" + hashlib.sha256(
        (fingerprint + _cpu_identity() + _PROBE_VERSION).encode()).hexdigest()[:24] + ".json")
    try:
        with open(path) as handle:
            found = json.load(handle)
        if isinstance(found, dict) and isinstance(found.get("ok"), bool):
            return found
    except (OSError, ValueError):
        pass     # none yet, or unreadable or damaged: probe again (and rewrite it)
    result = {"ok": False, "vector_math": False, "lean": False}
    try:
        result["ok"] = _try_compile(command, _PROBE, [])
        if result["ok"]:
            result["vector_math"] = _try_compile(command, _VECTOR_MATH_PROBE, ["-lmvec"])
            result["lean"] = _try_compile(command, _PROBE, list(LEAN_FLAGS))
    except (OSError, subprocess.SubprocessError, CompileLimitError):
        return result    # (a loaded machine or a low limit says nothing lasting)
    # Remembering is only an optimisation: an unwritable cache just probes again.
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as handle:
            json.dump(result, handle)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return result


# Part of the probe record's name: a probe that asks more gets a new record.
_PROBE_VERSION = "3"


def find_compiler() -> Optional[Tuple[Tuple[str, ...], str]]:
    """(command, identity) of a working C compiler with OpenMP, or None; probed once
    per compiler (the result is kept in the cache directory)."""
    global _compiler, _probed, _vector_math, _lean
    with _lock:
        if _probed:
            return _compiler
        for command in _candidates():
            fingerprint = _fingerprint(command) if command else None
            if fingerprint is None:
                continue
            found = _probe(command, fingerprint)
            if found["ok"]:
                _compiler = (tuple(command), fingerprint)
                _vector_math = bool(found["vector_math"])
                _lean = bool(found.get("lean"))
                break
        _probed = True
        return _compiler


def vector_math() -> bool:
    """True when kernels may call glibc's SIMD math functions (libmvec)."""
    find_compiler()
    return _vector_math


@functools.lru_cache(maxsize=1)
def _cpu_identity() -> str:
    """-march=native code is only valid on the CPU it was built for."""
    text = platform.machine() + machine().target
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith(("model name", "flags")):
                    text += line
                if line.startswith("flags"):
                    break
    except OSError:
        pass
    return text


def flags_for(fast_math: bool) -> Tuple[str, ...]:
    find_compiler()
    return BASE_FLAGS + (LEAN_FLAGS if _lean else ()) + (FAST_MATH_FLAGS if fast_math else ())


def library_key(source: str, flags: Tuple[str, ...]) -> str:
    compiler = find_compiler()
    identity = compiler[1] if compiler else "none"
    digest = hashlib.sha256()
    for part in (source, identity, " ".join(flags), _cpu_identity()):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:40]


def load(source: str, fast_math: bool = False) -> ctypes.CDLL:
    """The loaded library for ``source``: from memory, else from the disk cache (only
    when it matches its build record), else compiled now."""
    by_source = _by_source.get((source, fast_math))
    if by_source is not None:
        return by_source
    flags = flags_for(fast_math)
    key = library_key(source, flags)
    library = _loaded.get(key)
    if library is not None:
        _by_source[(source, fast_math)] = library
        return library
    path = _cached_library(key) or _build(source, flags, key)
    with _lock:
        library = _loaded.get(key)
        if library is None:
            try:
                with process_settings(first=not _loaded):
                    library = _loaded[key] = ctypes.CDLL(path)
            except OSError as error:
                # It matches what the compiler wrote, so rebuilding would not help.
                raise CompileError(f"could not load the compiled kernel {path}: {error}") \
                    from None
        _by_source[(source, fast_math)] = library
    return library


def build_extension(source: str, extra_flags: Tuple[str, ...]) -> str:
    """The path of ``source`` built as a shared library with ``extra_flags`` too (a
    CPython extension: -I for Python's headers), from the cache or compiled now."""
    flags = flags_for(False) + tuple(extra_flags)
    key = library_key(source, flags)
    return _cached_library(key) or _build(source, flags, key)


def is_built(source: str, fast_math: bool = False) -> bool:
    """Would :func:`load` find ``source``'s library without compiling it?"""
    if (source, fast_math) in _by_source:
        return True
    key = library_key(source, flags_for(fast_math))
    return key in _loaded or _cached_library(key) is not None


def _cached_library(key: str) -> Optional[str]:
    """The path of an intact cached library for ``key``: in the configured directory
    (which may be read-only), else in this process's fallback directory."""
    for directory in [configured_cache_dir()] + disk_cache.fallback_dirs():
        path = os.path.join(directory, key + ".so")
        if _intact(path):
            cache_limit.touch(path)       # recently used: kept by the size limit
            return path
    return None


def _build(source: str, flags: Tuple[str, ...], key: str) -> str:
    directory = cache_dir()
    path = os.path.join(directory, key + ".so")
    # One compile per kernel: whoever waited for the lock finds the library built.
    with file_lock(os.path.join(directory, key + ".lock"), compile_timeout()):
        if not _intact(path):
            started = time.perf_counter()
            compile_progress.compile_started(directory, started)
            try:
                path = compile_library(source, flags, path)
            finally:
                compile_progress.compile_ended(directory)
            _record_compile(time.perf_counter() - started, directory)
            cache_limit.enforce(directory, keep=path)
    return path


# Compiles in this process: how many and how long (bench and explain report them).
compile_count = 0
compile_seconds = 0.0
SLOW_COMPILE_S = 1.0
_slow_said = False


def _record_compile(seconds: float, directory: str) -> None:
    """Count a compile; the first one over a second says so (once per process), since a
    first call that stalls for a second otherwise looks like a hang or a slow kernel."""
    global compile_count, compile_seconds, _slow_said
    with _lock:
        compile_count += 1
        compile_seconds += seconds
        said, _slow_said = _slow_said, _slow_said or seconds > SLOW_COMPILE_S
    if seconds > SLOW_COMPILE_S and not said:
        logging.getLogger("einfuse").warning(
            "einfuse: compiling a kernel took %.1f s; compiled kernels are cached in %s, so "
            "later calls and processes skip this (said once per process)", seconds, directory)


def _digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _intact(path: str) -> bool:
    """Whether ``path`` is byte for byte the library its record describes (both regular
    files: opening a FIFO put there would wait forever)."""
    try:
        if not (os.path.isfile(path) and os.path.isfile(path + RECORD_SUFFIX)):
            return False
        with open(path + RECORD_SUFFIX) as handle:
            size, digest = handle.read().split()
        return os.path.getsize(path) == int(size) and _digest(path) == digest
    except (OSError, ValueError):
        return False


def compile_library(source: str, flags: Tuple[str, ...], path: str) -> str:
    """Compile ``source`` to ``path`` and write its record beside it; both appear by
    atomic renames, the library first, and nothing else is left behind, even when the
    compile fails, times out or is interrupted.  Returns where the library is: ``path``,
    or where something is in the way there (a directory, say) this process's temporary
    cache, with a warning naming ``path``."""
    compiler = find_compiler()
    if compiler is None:
        raise CompileError("no C compiler with OpenMP support found (set CC)")
    directory = os.path.dirname(path)
    _sweep(directory)
    try:
        # Same file system as ``path``, so the renames below are atomic.
        build = tempfile.mkdtemp(dir=directory, prefix=".build-")
    except OSError as error:
        raise CompileError(f"cannot build in the cache directory {directory}: {error}") \
            from None
    try:
        src, built = os.path.join(build, "kernel.c"), os.path.join(build, "kernel.so")
        with open(src, "w") as handle:
            handle.write(source)
        libraries = ["-lmvec", "-lm"] if "__simd__" in source else ["-lm"]
        status, output = run_compiler(list(compiler[0]) + list(flags) + [src, "-o", built] +
                                      libraries, build, compile_timeout())
        if status != 0:
            raise CompileError(f"C compilation failed (exit status {status}):\n"
                               f"{output[-4000:]}")
        record = os.path.join(build, "record")
        with open(record, "w") as handle:
            handle.write(f"{os.path.getsize(built)} {_digest(built)}\n")
        try:
            _place(built, record, path)
        except OSError as error:
            path = _place_elsewhere(built, record, path, error)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return path


def _place(built: str, record: str, path: str) -> None:
    os.replace(built, path)
    try:
        os.replace(record, path + RECORD_SUFFIX)
    except OSError:
        with contextlib.suppress(OSError):
            os.replace(path, built)      # never a library without its record
        raise


def _place_elsewhere(built: str, record: str, path: str, error: OSError) -> str:
    """The library and its record moved into this process's temporary cache, where
    ``error`` kept them from ``path``; a CompileError naming ``path`` where that fails
    too."""
    where = error.filename2 if error.filename2 else path
    trouble = f"the cached kernel library {where} cannot be written ({error.strerror or error})"
    directory = fallback_dir(where, trouble, "remove what is in the way to cache there")
    target = os.path.join(directory, os.path.basename(path))
    try:
        if os.path.dirname(os.path.abspath(path)) == os.path.abspath(directory):
            raise error
        shutil.move(built, target)
        shutil.move(record, target + RECORD_SUFFIX)
    except OSError as again:
        raise CompileError(f"einfuse: {trouble}, nor in {directory}: {again}") from None
    return target


# Build directories older than this were left by a process that was killed outright
# (SIGKILL, power loss): no live build runs that long (COMPILE_TIMEOUT).
STALE_SECONDS = 3600.0
_swept: set = set()


def _sweep(directory: str) -> None:
    """Remove stale build directories and temporaries, once per directory and process."""
    if directory in _swept:
        return
    _swept.add(directory)
    try:
        names = [n for n in os.listdir(directory) if n.startswith((".build-", ".tmp-"))]
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        with contextlib.suppress(OSError):
            if time.time() - os.lstat(path).st_mtime > STALE_SECONDS:
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)


def clear_memory_cache() -> None:
    """Forget loaded libraries (tests use this to exercise the disk cache)."""
    with _lock:
        _loaded.clear()
        _by_source.clear()
