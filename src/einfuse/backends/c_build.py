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


def find_compiler() -> Optional[Tuple[Tuple[str, ...], str]]:
    """(command, identity) of a working C compiler with OpenMP, or None; probed once."""
    global _compiler, _probed
    with _lock:
        if _probed:
            return _compiler
        for command in _candidates():
            if not command or not shutil.which(command[0]):
                continue
            try:
                version = subprocess.run(command + ["--version"], capture_output=True,
                                         text=True, timeout=30).stdout.strip()
                with tempfile.TemporaryDirectory() as tmp:
                    src = os.path.join(tmp, "probe.c")
                    with open(src, "w") as handle:
                        handle.write(_PROBE)
                    done = subprocess.run(command + list(BASE_FLAGS) +
                                          [src, "-o", os.path.join(tmp, "probe.so"), "-lm"],
                                          capture_output=True, timeout=60)
                if done.returncode == 0:
                    identity = f"{shutil.which(command[0])}|{' '.join(command)}|{version}"
                    _compiler = (tuple(command), identity)
                    break
            except (OSError, subprocess.SubprocessError):
                continue
        _probed = True
        return _compiler


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
    flags = flags_for(fast_math)
    key = library_key(source, flags)
    library = _loaded.get(key)
    if library is not None:
        return library
    path = os.path.join(cache_dir(), key + ".so")
    if not os.path.exists(path):
        compile_library(source, flags, path)
    with _lock:
        library = _loaded.get(key)
        if library is None:
            library = _loaded[key] = ctypes.CDLL(path)
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
        done = subprocess.run(list(compiler[0]) + list(flags) + [tmp_c, "-o", tmp_so, "-lm"],
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
