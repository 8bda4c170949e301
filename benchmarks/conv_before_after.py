"""benchmarks/conv_cases_ratio.py on two source trees, case by case alternately (each
case's ratio measured within one process, ours against torch interleaved), so that a
before/after comparison shares the machine's load of the moment.

    OMP_NUM_THREADS=1 python benchmarks/conv_before_after.py BEFORE_SRC AFTER_SRC [--rounds 2]
        [--case s2 --case c1s2]

(BEFORE_SRC, e.g. ``git archive <rev> src | tar -x -C /tmp/before`` then /tmp/before/src.)"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--case", action="append", help="only these cases (keys of "
                        "conv_cases_ratio.CASES); all by default")
    args = parser.parse_args()
    sys.path.insert(0, HERE)
    from conv_cases_ratio import CASES
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for key in args.case or list(CASES):
        for round_ in range(args.rounds):
            for label, tree in (("before", args.before), ("after", args.after)):
                line = subprocess.run(
                    [sys.executable, os.path.join(HERE, "conv_cases_ratio.py"), "--case", key,
                     "--repeats", str(args.repeats)],
                    env=dict(env, PYTHONPATH=tree), capture_output=True, text=True,
                    check=True).stdout.strip()
                print(f"{label:6s} {line}", flush=True)


if __name__ == "__main__":
    main()
