"""Times einfuse and its peers on each case, in one process, one after another."""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import numpy as np

from .cases import Case, installed


@dataclass
class Measurement:
    case: str
    implementation: str
    median_s: Optional[float]       # None when skipped or failed
    runs: int = 0
    first_call_s: Optional[float] = None   # includes compilation
    note: str = ""


def time_call(fn: Callable[[], object], min_runs: int = 3, max_runs: int = 25,
              budget_s: float = 3.0):
    """(median seconds, runs, first-call seconds): one untimed warm-up call (it compiles),
    then repeats until ``budget_s`` is spent or ``max_runs`` reached."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    times: List[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < min_runs or (len(times) < max_runs and time.perf_counter() < deadline):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), len(times), first


def _progress(message: str, stream=sys.stderr):
    print(message, file=stream, flush=True)


def run_case(case: Case, backend: str = "auto", peers: Optional[Sequence[str]] = None,
             budget_s: float = 3.0, progress=_progress) -> List[Measurement]:
    import einfuse as ef
    rng = np.random.default_rng(0)
    arrays = case.inputs(rng)
    results = []
    progress(f"[{case.name}] compiling and measuring einfuse ...")
    if case.einfuse_call is not None:
        ours = case.einfuse_call(arrays, backend)
    else:
        kernel = ef.compile(case.statement, backend=backend, **case.options)
        ours = lambda: kernel(**arrays)  # noqa: E731
    median, runs, first = time_call(ours, budget_s=budget_s)
    results.append(Measurement(case.name, "einfuse", median, runs, first))
    reference = _as_numpy(ours())
    for peer in case.peers:
        if peers is not None and not any(p in peer.name for p in peers):
            continue
        if not installed(peer.needs):
            results.append(Measurement(case.name, peer.name, None, note=f"{peer.needs} "
                                       "not installed"))
            continue
        if peer.skip_reason:
            results.append(Measurement(case.name, peer.name, None, note=peer.skip_reason))
            continue
        progress(f"[{case.name}] measuring {peer.name} ...")
        try:
            fn = peer.make(arrays)
            median, runs, first = time_call(fn, budget_s=budget_s)
            note = _agreement(reference, fn())
        except Exception as error:  # a peer's failure is reported, not fatal
            results.append(Measurement(case.name, peer.name, None,
                                       note=f"failed: {type(error).__name__}: {error}"[:120]))
            continue
        results.append(Measurement(case.name, peer.name, median, runs, first, note))
    return results


def _as_numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def _agreement(reference: np.ndarray, value) -> str:
    """A note when a peer's result differs from einfuse's (it should not)."""
    try:
        array = _as_numpy(value).reshape(reference.shape)
        scale = max(1e-30, float(np.max(np.abs(reference))))
        worst = float(np.max(np.abs(array - reference))) / scale
        return "" if worst < 1e-3 else f"differs from einfuse by {worst:.1e} (relative)"
    except Exception:
        return ""
