"""The C++ autograd node of a program's call on CPU torch tensors (torch_node_source.cpp;
its halves run apart under torch.compile, torch_node_compiled.cpp; the plan both read,
torch_node.h): a torch extension built once per machine, torch version and sources,
into the cache directory, under a file lock so that concurrent processes
(pytest-xdist workers) build it once.

Why C++: at 256x256 a softmax program's training step spent about 60 of its 117 µs in
Python around two 15-20 µs kernels, 28 of them in torch's machinery for a Python
``autograd.Function`` alone (an empty one costs that per step); the node runs the
prepared kernels' function pointers itself, forward and backward, and torch's engine
calls its backward with no Python (benchmarks/torch_node.py measures it).

The build takes 20-40 s of one core (torch's headers), so it runs in a background
thread: calls take the Python path (runtime/program_autograd.py) until it is loaded.
Where it cannot be built (no compiler, no torch headers, a failed build) :func:`module`
stays None and the Python path is all there is; :func:`reason` says why.
``EINFUSE_TORCH_NODE=0`` turns the node off."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import threading
from typing import Dict

from ..disk_cache import cache_dir, file_lock
from . import build as c_build

# the extension's files: the translation units first (built in this order), the header
# they include last; copied side by side into the build directory
_SOURCE_FILES = ("torch_node_source.cpp", "torch_node_compiled.cpp",
                 "torch_node_calls.cpp", "torch_node.h")
# a cold build on a loaded 2-core machine took 40 s; allow far more before giving up
_BUILD_TIMEOUT_S = 900

_lock = threading.Lock()
_state = {"module": None, "reason": "not built yet", "thread": None}
# called with the extension once it is loaded (runtime/signatures.py's native lookup)
_when_loaded = []


def enabled() -> bool:
    return os.environ.get("EINFUSE_TORCH_NODE", "1") != "0"


def module(wait: bool = False):
    """The loaded extension, or None: not built yet (the build is started in the
    background, or awaited where ``wait``), or not buildable here (see :func:`reason`)."""
    if not enabled():
        return None
    found = _state["module"]
    if found is not None:
        return found
    with _lock:
        thread = _state["thread"]
        if thread is None:
            thread = _state["thread"] = threading.Thread(
                target=_build_and_load, name="einfuse-torch-node-build", daemon=True)
            thread.start()
    if wait:
        thread.join()
    return _state["module"]


def loaded():
    """The extension where it is loaded already, else None (no build started)."""
    return _state["module"] if enabled() else None


def when_loaded(callback) -> None:
    """``callback(module)`` once the extension is loaded: now, where it is; never where
    it cannot be built.  (It starts no build.)"""
    with _lock:
        found = _state["module"]
        if found is None:
            _when_loaded.append(callback)
    if found is not None:
        callback(found)


def reason() -> str:
    """Why :func:`module` is None (or "loaded")."""
    return "loaded" if _state["module"] is not None else _state["reason"]


def _key(sources: Dict[str, str]) -> str:
    import torch
    compiler = c_build.find_compiler()
    digest = hashlib.sha256()
    files = [part for name, text in sources.items() for part in (name, text)]
    for part in (*files, torch.__version__, getattr(torch.version, "git_version", ""),
                 sys.version, compiler[1] if compiler else ""):
        digest.update(str(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _build_and_load() -> None:
    try:
        found = _load()
        if found is not None:     # (the classes its lookups take as plain tensors)
            import torch
            found.signature_types(torch.Tensor, torch.nn.Parameter)
    except Exception as error:      # any failure leaves the Python path: say why
        found, why = None, f"{type(error).__name__}: {error}"
    else:
        why = "loaded"
    if found is None:
        logging.getLogger("einfuse").info(
            "einfuse: the torch autograd node could not be built (%s); programs on torch "
            "tensors take the Python autograd path", why)
    _state["reason"] = why
    with _lock:
        _state["module"] = found
        waiting = list(_when_loaded) if found is not None else []
        _when_loaded.clear()
    for callback in waiting:
        callback(found)


def _load():
    if c_build.find_compiler() is None:
        raise RuntimeError("no C compiler")
    sources = {}
    for file in _SOURCE_FILES:
        with open(os.path.join(os.path.dirname(__file__), file)) as handle:
            sources[file] = handle.read()
    key = _key(sources)
    name = f"einfuse_torch_node_{key}"
    directory = os.path.join(cache_dir(), name)
    os.makedirs(directory, exist_ok=True)
    logging.getLogger("einfuse").info(
        "einfuse: building the torch autograd node in %s (once per machine and torch "
        "version)", directory)
    with file_lock(os.path.join(cache_dir(), name + ".lock"), _BUILD_TIMEOUT_S):
        built_before = _import_built(name, directory)
        if built_before is not None:      # (the key names the source: no build to check)
            return built_before
        # (imported only to build: its imports, on this background thread, would change
        # sys.modules under a torch.compile tracing the main thread, which iterates it)
        from torch.utils import cpp_extension
        # the sources are copied in: the build directory's ninja file names them
        paths = []
        for file, text in sources.items():
            path = os.path.join(directory, file)
            if not os.path.exists(path) or open(path).read() != text:
                with open(path + ".tmp", "w") as handle:
                    handle.write(text)
                os.replace(path + ".tmp", path)
            if file.endswith(".cpp"):
                paths.append(path)
        # built by a process of its own, in a session of its own: a process that ends
        # while the build runs (its thread is a daemon) must not leave torch's build
        # lock behind half-way, which would stop every later build
        built = subprocess.run([sys.executable, "-c", _BUILD, name, directory, *paths],
                               start_new_session=True, capture_output=True, text=True,
                               timeout=_BUILD_TIMEOUT_S)
        if built.returncode != 0:
            raise RuntimeError(f"the build failed: {built.stderr[-2000:]}")
        return cpp_extension.load(name=name, sources=paths, build_directory=directory,
                                  extra_cflags=_FLAGS, verbose=False)


def _import_built(name: str, directory: str):
    """The extension a build of this key left in ``directory``, imported as it is, or
    None: asking torch's builder to check it (a process importing torch, then ninja)
    costs seconds of CPU in every process, counted against the calls it runs beside."""
    import importlib.util
    library = os.path.join(directory, name + ".so")
    if not os.path.exists(library):
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, library)
        found = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(found)
    except (ImportError, OSError):    # (a partial or foreign file: built again)
        return None
    return found


_FLAGS = ["-O2", "-ffp-contract=off"]
_BUILD = ("import sys\nfrom torch.utils import cpp_extension\n"
          "cpp_extension.load(name=sys.argv[1], sources=sys.argv[3:], "
          f"build_directory=sys.argv[2], extra_cflags={_FLAGS!r}, verbose=False)\n")
