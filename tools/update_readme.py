"""Re-run every `$ einfuse explain ...` block in README.md and write its current output.

Run after a change to explain or to the planner; tests/test_explain_cli.py fails while the
README shows stale output."""

import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = re.compile(r"(```text\n\$ (einfuse explain .*?)\n)(.*?)(```)", re.S)


def refresh(match: re.Match) -> str:
    argv = shlex.split(match.group(2))[1:]
    done = subprocess.run([sys.executable, "-m", "einfuse.cli", *argv], capture_output=True,
                          text=True, check=True, cwd=ROOT)
    return match.group(1) + done.stdout + match.group(4)


def main() -> None:
    path = os.path.join(ROOT, "README.md")
    text = open(path).read()
    open(path, "w").write(BLOCK.sub(refresh, text))


if __name__ == "__main__":
    main()
