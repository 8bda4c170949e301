"""Times einfuse and its peers on each case, in one process, one after another."""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import numpy as np

from .cases import Case, installed


class PeerUnavailable(Exception):
    """A peer that is installed but cannot run here (a CPU-only jax or pykeops build on a
    GPU run): reported with its reason, not as a failure."""


@dataclass
class Measurement:
    case: str
    implementation: str
    median_s: Optional[float]       # None when skipped or failed
    runs: int = 0
    first_call_s: Optional[float] = None   # includes compilation, if any
    note: str = ""
    compiled: Optional[int] = None         # C kernels the first call compiled
    first_launches: int = 0                # Triton kernels it launched for the first time
    device_note: str = ""                  # the device's own time per call, where measured


def time_call(fn: Callable[[], object], min_runs: int = 3, max_runs: int = 25,
              budget_s: float = 3.0, sync: Optional[Callable[[], None]] = None):
    """(median seconds, runs, first-call seconds): one untimed warm-up call (it compiles),
    then repeats until ``budget_s`` is spent or ``max_runs`` reached.  ``sync``, when
    given, is called after every call inside the timed region (a device synchronisation:
    a launch returns before the kernel has run).  ``fn.before``, where the callable has
    one, runs before every call, untimed (the BLAS call a gather follows)."""
    before = getattr(fn, "before", None)

    def timed() -> float:
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        return time.perf_counter() - start

    first = timed()
    times: List[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < min_runs or (len(times) < max_runs and time.perf_counter() < deadline):
        times.append(timed())
    return statistics.median(times), len(times), first


def _progress(message: str, stream=sys.stderr):
    print(message, file=stream, flush=True)


def run_case(case: Case, backend: str = "auto", peers: Optional[Sequence[str]] = None,
             budget_s: float = 3.0, progress=_progress, *,
             sync: Optional[Callable[[], None]] = None, tolerance: float = 1e-3,
             between_peers: Optional[Callable[[], None]] = None,
             device_time: Optional[Callable[[Callable[[], object]], str]] = None
             ) -> List[Measurement]:
    """einfuse, then each peer (those whose name contains one of ``peers``; all when it is
    None), each timed by :func:`time_call` with ``sync`` and checked against einfuse's
    result within ``tolerance`` (relative).  A peer that is missing, skipped, raises
    :class:`PeerUnavailable` or fails is a row with its reason.  ``between_peers`` runs
    after einfuse and after each peer that ran, once their callables are dropped (to free
    device memory).  ``device_time``, when given, describes what one call costs the device
    itself (kernel time, launches) for einfuse and for each peer that does not need jax."""
    import einfuse as ef
    rng = np.random.default_rng(0)
    arrays = case.inputs(rng)
    results = []
    progress(f"[{case.name}] compiling and measuring einfuse ...")
    if any(peer.needs == "torch" for peer in case.peers) and installed("torch"):
        # einfuse's side runs on torch tensors: its C++ autograd node is built first
        # (once per machine, then cached), as a training run has it after a few steps;
        # else its build starts at the third backward, inside the timed repeats, which
        # then time the Python path sharing the cores with the compiler (the module
        # step read 12.5 ms against 2.6 ms with the node)
        from ..backends.c import torch_node
        torch_node.module(wait=True)
    if case.einfuse_call is not None:
        ours = case.einfuse_call(arrays, backend)
    else:
        kernel = ef.compile(case.statement, backend=backend, **case.options)
        ours = lambda: kernel(**arrays)  # noqa: E731
    from ..backends.c import build as c_build
    from ..backends.triton import backend as triton_backend
    compiles, launches = c_build.compile_count, triton_backend.first_launches
    median, runs, first = time_call(ours, budget_s=budget_s, sync=sync)
    results.append(Measurement(case.name, "einfuse", median, runs, first,
                               compiled=c_build.compile_count - compiles,
                               first_launches=triton_backend.first_launches - launches))
    if device_time is not None:
        results[-1].device_note = device_time(ours)
    reference = host(ours())
    ours = kernel = None   # einfuse's device values go before the peers allocate theirs
    if between_peers is not None:
        between_peers()
    for peer in case.peers:
        if peers is not None and not any(p in peer.name for p in peers):
            continue
        skipped = f"{peer.needs} not installed" if not installed(peer.needs) else \
            peer.skip_reason
        if skipped:
            results.append(Measurement(case.name, peer.name, None, note=skipped))
            continue
        progress(f"[{case.name}] measuring {peer.name} ...")
        fn = None
        try:
            fn = peer.make(arrays)
            median, runs, first = time_call(fn, budget_s=budget_s, sync=sync)
            note = agreement(reference, fn(), tolerance)
            results.append(Measurement(case.name, peer.name, median, runs, first, note))
            if device_time is not None and peer.needs != "jax":
                results[-1].device_note = device_time(fn)
        except PeerUnavailable as reason:
            results.append(Measurement(case.name, peer.name, None, note=str(reason)))
        except Exception as error:  # a peer's failure is reported, not fatal
            results.append(Measurement(case.name, peer.name, None,
                                       note=f"failed: {type(error).__name__}: {error}"[:120]))
        fn = None
        if between_peers is not None:
            between_peers()
    return results


def host(value):
    """A result (or a list of them, for a tuple or list) as NumPy arrays on the host;
    half-precision tensors as float32 (NumPy has no bfloat16, ``.numpy()`` refuses it)."""
    if isinstance(value, (tuple, list)):
        return [host(item) for item in value]
    if hasattr(value, "detach"):
        value = value.detach()
        if str(value.dtype) in ("torch.float16", "torch.bfloat16"):
            value = value.float()
        return value.cpu().numpy()
    array = np.asarray(value)
    if array.dtype.name == "bfloat16":   # ml_dtypes' (jax's) bfloat16
        array = array.astype(np.float32)
    return array


def agreement(reference, value, tolerance: float = 1e-3) -> str:
    """'' when ``value`` matches einfuse's ``reference`` (a result or a list of them, from
    :func:`host`) within ``tolerance`` relative to the reference's largest magnitude; else
    a note saying how it differs, or why it could not be compared."""
    try:
        want = reference if isinstance(reference, list) else [reference]
        got = host(value)
        got = got if isinstance(got, list) else [got]
        if len(got) != len(want):
            return f"returns {len(got)} values, einfuse {len(want)}"
        for expected, actual in zip(want, got):
            expected, actual = np.asarray(expected), np.asarray(actual)
            if actual.size != expected.size:
                return f"shape {actual.shape} differs from einfuse's {expected.shape}"
            wide = np.result_type(expected.dtype, actual.dtype, np.float64)
            expected = expected.astype(wide)
            error = np.abs(actual.reshape(expected.shape).astype(wide) - expected)
            scale = max(1e-30, float(np.max(np.abs(expected), initial=0.0)))
            worst = float(np.max(error, initial=0.0)) / scale
            if not worst <= tolerance:   # NaN counts as a difference
                return f"differs from einfuse by {worst:.1e} (relative; allowed {tolerance:g})"
    except Exception as error:
        return f"could not compare: {type(error).__name__}: {error}"[:120]
    return ""
