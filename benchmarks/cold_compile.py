"""Cold compile time of the C kernels of every `einfuse bench` case (issue 11: within
300 ms median).

    python benchmarks/cold_compile.py [--out benchmarks/results/cold_compile.md]

Wall time and the compiler's CPU time (user + system of its processes) are both
reported: on a busy machine only the second is the figure a quiet one would show.

Runs each case's einfuse call once with an empty kernel cache (a temporary directory)
and times every compiler run it makes.  The compiler probe and the kernel-call
extension, built once per machine, are built first and not counted.  The kernels are
size-generic, so the cases' small (--quick) sizes compile the same kernels as the
full sizes."""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the table (markdown) here as well")
    args = parser.parse_args()
    os.environ["EINFUSE_CACHE_DIR"] = tempfile.mkdtemp(prefix="einfuse-cold-")

    import numpy as np

    import einfuse as ef
    from einfuse.backends.c import build as c_build, call as c_call
    from einfuse.bench.catalogue import all_cases

    if c_build.find_compiler() is None:
        print("no C compiler: nothing to measure", file=sys.stderr)
        return 1
    c_call.caller()
    seconds, cpu_seconds = [], []
    compile_library = c_build.compile_library

    def children_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    def timed(source, flags, path):
        # The compiler's own CPU time beside the wall time: on a busy machine the wall
        # time measures the neighbours, the CPU time what a quiet machine would see.
        start, cpu = time.perf_counter(), children_cpu()
        built = compile_library(source, flags, path)   # (where it landed: the caller loads it)
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(children_cpu() - cpu)
        return built
    c_build.compile_library = timed

    rows = []
    rng = np.random.default_rng(0)
    for case in all_cases(quick=True):
        arrays = case.inputs(rng)
        before = len(seconds)
        started = time.perf_counter()
        try:
            # (some cases make their call, and so compile, when they are set up)
            if case.einfuse_call is not None:
                call = case.einfuse_call(arrays, "auto")
            else:
                def call(statement=case.statement, arrays=arrays):
                    return ef.ein(statement, **arrays)
            call()
        except Exception as error:    # a peer framework missing: say so, go on
            rows.append((case.name, f"not run ({type(error).__name__}: {error})"[:200], "-"))
            continue
        first = time.perf_counter() - started
        mine = seconds[before:]
        rows.append((case.name, ", ".join(f"{1000 * s:.0f}" for s in mine) or "-",
                     f"{1000 * first:.0f}"))
    lines = ["| case | compiles (ms each) | set-up and first call (ms, wall) |", "|---|---|---|"]
    lines += [f"| {name} | {times} | {first} |" for name, times, first in rows]
    if seconds:
        lines.append("")
        lines.append(f"{len(seconds)} compiles: median {1000 * statistics.median(seconds):.0f} "
                     f"ms, max {1000 * max(seconds):.0f} ms "
                     f"(load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs); "
                     f"the compiler's CPU time: median "
                     f"{1000 * statistics.median(cpu_seconds):.0f} ms, max "
                     f"{1000 * max(cpu_seconds):.0f} ms")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("# Cold compile times\n\n`python benchmarks/cold_compile.py`\n\n"
                         + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
