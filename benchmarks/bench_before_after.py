"""`einfuse bench`'s own cases, einfuse's side only, on two source trees: this tree and a
git revision (the one-compiler issue asks for bench ratios before/after "in one run").

    python benchmarks/bench_before_after.py --before 3c60a2c [--rounds 3] [--case dist]

Each tree runs in its own child process (one thread, ``OMP_NUM_THREADS=1``) that builds
the cases *its* ``einfuse.bench`` defines and times einfuse's callable by CPU time
(``time.process_time``); the trees take turns round by round, so both see the machine's
load of the moment, and each child keeps its own kernel cache across rounds (the first
call, which compiles, is not timed).  Only the cases both trees define by the same name
are compared; the ratio printed is before / after (above 1: this tree is faster)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from before_after import source_trees

HERE = os.path.abspath(__file__)


def _cases():
    """The tree's full-size bench cases (catalogue.py on later trees, cases.py before)."""
    try:
        from einfuse.bench.catalogue import all_cases
    except ImportError:
        from einfuse.bench.cases import all_cases
    return all_cases()


def _callable(case):
    import numpy as np
    import einfuse as ef
    arrays = case.inputs(np.random.default_rng(0))
    if case.einfuse_call is not None:
        return case.einfuse_call(arrays, "auto")
    kernel = ef.compile(case.statement, **case.options)
    return lambda: kernel(**arrays)


def child(names, budget: float) -> dict:
    """{case name: CPU seconds per call (median of timed batches)} for ``names`` (all
    cases with None), and the names this tree defines."""
    cases = _cases()
    defined = [c.name for c in cases]
    out = {}
    for case in cases:
        if names is not None and case.name not in names:
            continue
        try:
            fn = _callable(case)
            fn()                                    # compiles: not timed
            times = []
            deadline = time.process_time() + budget
            while len(times) < 3 or (time.process_time() < deadline and len(times) < 50):
                start = time.process_time()
                fn()
                times.append(time.process_time() - start)
            out[case.name] = statistics.median(times)
        except Exception as error:  # a case one tree cannot run is reported, not fatal
            out[case.name] = f"failed: {type(error).__name__}: {error}"[:200]
        fn = None
    return {"times": out, "defined": defined}


def _run_child(src: str, cache: str, names, budget: float) -> dict:
    env = dict(os.environ, PYTHONPATH=src, OMP_NUM_THREADS="1", EINFUSE_CACHE_DIR=cache)
    argv = [sys.executable, HERE, "--child", "--budget", str(budget)]
    for name in names or ():
        argv += ["--case", name]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"child on {src} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", default="3c60a2c")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=1.0,
                        help="CPU seconds of timed calls per case per round")
    parser.add_argument("--case", action="append", help="only cases whose name starts so")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(set(args.case) if args.case else None, args.budget)))
        return
    with source_trees(args.before) as trees, tempfile.TemporaryDirectory() as caches:
        labels = list(trees)
        # which cases both trees define (a cheap first child per tree: no case timed)
        defined = [set(_run_child(trees[t], os.path.join(caches, str(i)), ["(none)"],
                                  0.0)["defined"]) for i, t in enumerate(labels)]
        common = sorted(set.intersection(*defined))
        if args.case:
            common = [n for n in common if any(n.startswith(p) for p in args.case)]
        print(f"{len(common)} cases in both trees; rounds {args.rounds}; "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
        rounds = {t: [] for t in labels}
        for r in range(args.rounds):
            for i, t in enumerate(labels if r % 2 == 0 else labels[::-1]):
                index = labels.index(t)
                rounds[t].append(_run_child(trees[t], os.path.join(caches, str(index)),
                                            common, args.budget)["times"])
            print(f"round {r + 1} done, load {os.getloadavg()[0]:.1f}", flush=True)
    before, after = labels
    print(f"\n| case | {before} ms | {after} ms | before/after |\n|---|---|---|---|")
    for name in common:
        cells = []
        for t in labels:
            got = [x[name] for x in rounds[t] if isinstance(x.get(name), float)]
            cells.append(statistics.median(got) if got else None)
        if None in cells:
            why = next(x[name] for t in labels for x in rounds[t]
                       if not isinstance(x.get(name), float))
            print(f"| {name} | - | - | {why} |")
            continue
        print(f"| {name} | {cells[0] * 1e3:.3f} | {cells[1] * 1e3:.3f} | "
              f"{cells[0] / cells[1]:.2f} |")


if __name__ == "__main__":
    main()
