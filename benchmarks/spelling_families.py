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

_BENCH = Path(__file__).resolve().parent.parent / "src/einfuse/bench"


def _load(name: str, package: str = "spelling_families_data"):
    # this checkout's files as a package of their own (spelling_audit imports spellings)
    if package not in sys.modules:
        root = importlib.util.spec_from_loader(package, loader=None, is_package=True)
        module = importlib.util.module_from_spec(root)
        module.__path__ = [str(_BENCH)]
        sys.modules[package] = module
    spec = importlib.util.spec_from_file_location(f"{package}.{name}", _BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module       # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def _families(quick: bool, which: str):
    found = []
    if which in ("all", "first"):
        found += _load("spellings").families(quick)
    if which in ("all", "audit"):
        found += _load("spelling_audit").audit_families(quick)
    return found


def _normal_forms(spellings):
    """A letter per spelling: spellings with one letter have the same canonical program
    (rewrite/canonical.normal_form; '?' where this checkout has none)."""
    try:
        from einfuse.analysis.spec import spec_of
        from einfuse.lang.split import split_program
        from einfuse.rewrite.canonical import normal_form
    except ImportError:
        return {name: "?" for name, _ in spellings}
    letters = {}
    found = {}
    for name, text in spellings:
        specs = [spec_of(piece.text) for piece in split_program(text)]
        form = normal_form([(s.statement, s.rhs) for s in specs], (specs[-1].output,))
        found[name] = letters.setdefault(form, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[len(letters) % 26])
    return found


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


def run(quick: bool, rounds: int, which: str = "all", only: str = "") -> None:
    print(f"einfuse from {Path(ef.__file__).parent}; one thread, CPU time, "
          f"median of {rounds} interleaved rounds; the letter: spellings with one letter "
          f"have one canonical program")
    for family in _families(quick, which):
        if only and only not in family.name:
            continue
        arrays = family.inputs(np.random.default_rng(0))
        calls = []
        reference = None
        if family.reference is not None:
            reference = family.reference({k: v.astype(np.float64) if v.dtype.kind == "f"
                                          else v for k, v in arrays.items()})
        for name, text in family.spellings:
            program = ef.compile(text)
            given = {k: v for k, v in arrays.items() if f"{k}[" in text}
            result = np.asarray(program(**given))
            if reference is None:
                reference = result
            ok = result.shape == np.shape(reference) and np.allclose(
                result, reference, rtol=2e-3, atol=2e-4, equal_nan=True)
            calls.append((name, (lambda p=program, a=given: p(**a)), ok))
        forms = _normal_forms(family.spellings)
        medians = {name: [] for name, _, _ in calls}
        for _ in range(rounds):
            for name, call, _ in calls:
                medians[name].append(_timed(call, 0.05 if quick else 0.3))
        times = {name: statistics.median(values) for name, values in medians.items()}
        best = min(times.values())
        print(f"\n{family.name}")
        for name, _, ok in calls:
            print(f"  {name:40s} {forms[name]} {times[name] * 1e3:9.3f} ms  "
                  f"{times[name] / best:5.2f}x best{'' if ok else '  (VALUES DIFFER)'}",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--families", choices=("all", "first", "audit"), default="all",
                        help="spellings.py's families, spelling_audit.py's, or both")
    parser.add_argument("--only", default="", help="families whose name holds this text")
    args = parser.parse_args()
    run(args.quick, args.rounds, args.families, args.only)


if __name__ == "__main__":
    main()
