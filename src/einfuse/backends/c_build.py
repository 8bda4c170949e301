"""Compile generated C into shared libraries, cache them, load them with ctypes.

Compiler: ``$CC`` if set, else the first of ``cc``, ``gcc``, ``clang`` on PATH
that builds a small OpenMP test library; none -> the C backend is unavailable.

Flags: ``-O3 -march=native -fopenmp -fPIC -shared`` plus

* ``-fwrapv``: integer overflow wraps, as NumPy's integer arithmetic does;
* ``-fno-math-errno -fno-trapping-math``: never change a result, let sqrt and
  friends inline and vectorise;
* fast-math only for statements without NaN-sensitive operations (no
  comparisons, ``&``/``|``, min/max/where/relu/softplus, max/min/logsumexp
  reductions), and even then with ``-fno-finite-math-only`` so that NaN and inf
  are still honoured: fast-math only reassociates and may use reciprocals,
  which changes results by rounding, never a NaN into a number.  Statements
  with the NaN-sensitive operations get no fast-math at all, because their
  ``x != x`` tests and ordered selects must keep IEEE semantics exactly.

Cache: ``$EINFUSE_CACHE_DIR`` (default ``~/.cache/einfuse``) holds
``<sha256>.so`` keyed by source + compiler identity + flags + CPU; a library is
compiled to a temporary file in the same directory and renamed into place with
``os.replace``, so processes compiling the same kernel at once never see a
half-written file.  An in-process dict makes each library load once.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
from typing import Dict, List, Optional, Tuple

BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-fwrapv",
              "-fno-math-errno", "-fno-trapping-math")
FAST_MATH_FLAGS = ("-ffast-math", "-fno-finite-math-only")

_lock = threading.Lock()
_loaded: Dict[str, ctypes.CDLL] = {}
_by_source: Dict[Tuple[str, bool], ctypes.CDLL] = {}   # skips hashing on repeat loads
_compiler: Optional[Tuple[Tuple[str, ...], str]] = None
_probed = False

_PROBE = """\
#include <omp.h>
#include <math.h>
int einfuse_probe(void) { int n = 0;
#pragma omp parallel for reduction(+:n)
for (int i = 0; i < 4; ++i) n += (int)sqrt(1.0);
return n + 0 * omp_get_max_threads(); }
"""


class CompileError(RuntimeError):
    pass


def cache_dir() -> str:
    path = os.environ.get("EINFUSE_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "einfuse")
    os.makedirs(path, exist_ok=True)
    return path


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
        done = subprocess.run(command + list(BASE_FLAGS) +
                              [src, "-o", os.path.join(tmp, "probe.so"), "-lm"] + extra,
                              capture_output=True, timeout=60)
    return done.returncode == 0


def _probe(command: List[str], fingerprint: str) -> dict:
    """Whether ``command`` compiles OpenMP code, and whether it can call glibc's vector
    math (libmvec), remembered on disk so later processes skip the probe."""
    import json
    path = os.path.join(cache_dir(), "compiler-" + hashlib.sha256(
        (fingerprint + _cpu_identity()).encode()).hexdigest()[:24] + ".json")
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        pass
    result = {"ok": False, "vector_math": False}
    try:
        result["ok"] = _try_compile(command, _PROBE, [])
        if result["ok"]:
            result["vector_math"] = _try_compile(command, _VECTOR_MATH_PROBE, ["-lmvec"])
    except (OSError, subprocess.SubprocessError):
        return result
    fd, tmp = tempfile.mkstemp(dir=cache_dir(), suffix=".json.tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(result, handle)
    os.replace(tmp, path)
    return result


def find_compiler() -> Optional[Tuple[Tuple[str, ...], str]]:
    """(command, identity) of a working C compiler with OpenMP, or None; probed once
    per compiler (the result is kept in the cache directory)."""
    global _compiler, _probed, _vector_math
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
    text = platform.machine()
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
    return BASE_FLAGS + (FAST_MATH_FLAGS if fast_math else ())


def library_key(source: str, flags: Tuple[str, ...]) -> str:
    compiler = find_compiler()
    identity = compiler[1] if compiler else "none"
    digest = hashlib.sha256()
    for part in (source, identity, " ".join(flags), _cpu_identity()):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:40]


def load(source: str, fast_math: bool = False) -> ctypes.CDLL:
    """The loaded library for ``source``: from memory, else from the disk cache, else
    compiled now."""
    by_source = _by_source.get((source, fast_math))
    if by_source is not None:
        return by_source
    flags = flags_for(fast_math)
    key = library_key(source, flags)
    library = _loaded.get(key)
    if library is not None:
        _by_source[(source, fast_math)] = library
        return library
    path = os.path.join(cache_dir(), key + ".so")
    if not os.path.exists(path):
        compile_library(source, flags, path)
    with _lock:
        library = _loaded.get(key)
        if library is None:
            library = _loaded[key] = ctypes.CDLL(path)
        _by_source[(source, fast_math)] = library
    return library


def compile_library(source: str, flags: Tuple[str, ...], path: str) -> None:
    compiler = find_compiler()
    if compiler is None:
        raise CompileError("no C compiler with OpenMP support found (set CC)")
    directory = os.path.dirname(path)
    fd, tmp_so = tempfile.mkstemp(dir=directory, suffix=".so.tmp")
    os.close(fd)
    tmp_c = tmp_so[:-len(".so.tmp")] + ".c"
    try:
        with open(tmp_c, "w") as handle:
            handle.write(source)
        libraries = ["-lmvec", "-lm"] if "__simd__" in source else ["-lm"]
        done = subprocess.run(list(compiler[0]) + list(flags) + [tmp_c, "-o", tmp_so] +
                              libraries,
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise CompileError(f"C compilation failed:\n{done.stderr[-4000:]}")
        os.replace(tmp_so, path)  # atomic: readers see the old state or the whole file
    finally:
        for leftover in (tmp_c, tmp_so):
            if os.path.exists(leftover):
                os.unlink(leftover)


def clear_memory_cache() -> None:
    """Forget loaded libraries (tests use this to exercise the disk cache)."""
    with _lock:
        _loaded.clear()
        _by_source.clear()
