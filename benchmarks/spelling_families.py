"""Each spelling of a computation against its family's best (issue 31, v3.md section 1).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/spelling_families.py [--quick]
    # the same families on another checkout (before the rewrite rules):
    OMP_NUM_THREADS=1 PYTHONPATH=/work/main/src python benchmarks/spelling_families.py

One thread, CPU time (time.process_time), the spellings of a family interleaved round
by round, the median of the rounds; each spelling is checked against the first before
it is timed.  The families are read from this checkout's src/einfuse/bench/spellings.py
whatever einfuse is imported, so that two checkouts time the same programs."""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import einfuse as ef  # noqa: E402

_SPELLINGS = Path(__file__).resolve().parent.parent / "src/einfuse/bench/spellings.py"


def _families_module():
    spec = importlib.util.spec_from_file_location("spelling_families_data", _SPELLINGS)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module       # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def _timed(call, budget: float) -> float:
    """CPU seconds of one call: the median of enough calls to fill ``budget``."""
    times = []
    spent = 0.0
    while spent < budget or len(times) < 3:
        start = time.process_time()
        call()
        elapsed = time.process_time() - start
        times.append(elapsed)
        spent += elapsed
        if len(times) >= 50:
            break
    return statistics.median(times)


def run(quick: bool, rounds: int) -> None:
    data = _families_module()
    print(f"einfuse from {Path(ef.__file__).parent}; one thread, CPU time, "
          f"median of {rounds} interleaved rounds")
    for family in data.families(quick):
        arrays = family.inputs(np.random.default_rng(0))
        calls = []
        reference = None
        for name, text in family.spellings:
            program = ef.compile(text)
            given = {k: v for k, v in arrays.items() if f"{k}[" in text}
            result = np.asarray(program(**given))
            if reference is None:
                reference = result
            ok = np.allclose(result, reference, rtol=2e-4, atol=2e-5, equal_nan=True)
            calls.append((name, (lambda p=program, a=given: p(**a)), ok))
        medians = {name: [] for name, _, _ in calls}
        for _ in range(rounds):
            for name, call, _ in calls:
                medians[name].append(_timed(call, 0.05 if quick else 0.3))
        times = {name: statistics.median(values) for name, values in medians.items()}
        best = min(times.values())
        print(f"\n{family.name}")
        for name, _, ok in calls:
            print(f"  {name:28s} {times[name] * 1e3:9.3f} ms  {times[name] / best:5.2f}x best"
                  f"{'' if ok else '  (VALUES DIFFER)'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    run(args.quick, args.rounds)


if __name__ == "__main__":
    main()
