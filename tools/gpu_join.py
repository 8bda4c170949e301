"""Join the per-case tables of a lent-GPU bench run (tools/gpu_session.sh writes
``bench-N/gpu.md``, one `einfuse bench --device cuda --case NAME` per process) into one
table with one targets list, in case order.

    python3 tools/gpu_join.py RESULTS_DIR > table.md
"""

from __future__ import annotations

import glob
import os
import re
import sys


def main(folder: str) -> int:
    machine, rows, targets = None, [], []
    paths = glob.glob(os.path.join(folder, "bench-*", "gpu.md"))
    for path in sorted(paths, key=lambda p: int(re.search(r"bench-(\d+)", p).group(1))):
        section = None
        for line in open(path):
            line = line.rstrip("\n")
            if line.startswith("machine:") and machine is None:
                machine = line
            elif line.startswith("## Targets"):
                section = "targets"
            elif line.startswith("| ") and not line.startswith("| case ") and section is None:
                rows.append(line)
            elif line.startswith("- ") and section == "targets":
                targets.append(line)
    print(machine or "machine: (no table found)")
    print("\n| case | implementation | median | peer / einfuse | note |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    if targets:
        print("\n## Targets\n")
        print("\n".join(targets))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
