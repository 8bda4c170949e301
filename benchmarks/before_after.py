"""What the before/after benchmark scripts share (gather_layers.py, torch_compile_mlp.py):
each measures its contenders in a child process per source tree -- this tree's src/ and
the src/ of a git revision -- so that both sides run in one sitting, on one machine,
under the same load, with one thread (OMP_NUM_THREADS=1) and CPU time
(``time.process_time``), the contenders interleaved."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, Iterator, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def interleaved(found: Dict[str, Tuple[str, Callable]], repeats: int, calls: int,
                warm: int = 3) -> Dict[str, dict]:
    """``found``: name -> (group, call).  Each call's first-call wall time, then the
    median over ``repeats`` rounds of its CPU time per call, the contenders taking turns
    in every round."""
    import numpy as np
    first = {}
    for name, (_, fn) in found.items():
        start = time.perf_counter()
        fn()
        first[name] = time.perf_counter() - start
        for _ in range(warm):
            fn()
    times = {name: [] for name in found}
    for _ in range(repeats):
        for name, (_, fn) in found.items():
            start = time.process_time()
            for _ in range(calls):
                fn()
            times[name].append((time.process_time() - start) / calls)
    return {name: {"group": found[name][0], "seconds": float(np.median(times[name])),
                   "first": first[name]} for name in found}


def without_grad(fn: Callable) -> Callable:
    """``fn`` run under torch.no_grad (a forward that records nothing)."""
    def run():
        import torch
        with torch.no_grad():
            fn()
    return run


def training_step(fn: Callable, weight, leaves: Sequence) -> Callable:
    """``fn``'s result weighted by ``weight`` and summed (or, with None, the scalar
    result itself), then its backward; the ``leaves``' gradients cleared first."""
    def run():
        for leaf in leaves:
            leaf.grad = None
        value = fn()
        (value * weight).sum().backward() if weight is not None else value.backward()
    return run


@contextlib.contextmanager
def source_trees(before: str) -> Iterator[Dict[str, str]]:
    """label -> a src/ folder: the revision ``before`` (git archive into a temporary
    folder; none when empty) and this tree."""
    trees = {}
    with tempfile.TemporaryDirectory() as folder:
        if before:
            archive = subprocess.run(["git", "-C", ROOT, "archive", before, "src"],
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
            trees[f"before ({before})"] = os.path.join(folder, "src")
        trees["after (this tree)"] = os.path.join(ROOT, "src")
        yield trees


def run_child(script: str, src: str, arguments: Sequence[str]) -> dict:
    """``script --child arguments`` with ``src`` on the path, at one thread: the JSON
    object its last line prints."""
    env = dict(os.environ, PYTHONPATH=src, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, script, "--child", *arguments], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
