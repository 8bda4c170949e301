"""Write docs/img/pictures-*.png: the pages docs/pictures.md shows (the softmax program,
attention, the Megatron MLP on a 2x4 mesh), saved by ``explanation.save`` and
photographed by headless Chromium at 1280 px.  The roofline uses this machine's
calibration (``einfuse calibrate``).  Run from the repository root:

    PYTHONPATH=src python tools/picture_screenshots.py"""

import os
import shutil
import subprocess
import sys
import tempfile

import einfuse as ef

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the docs' example programs, as the picture tests check them (one copy)
sys.path.insert(0, os.path.join(ROOT, "tests"))
from picture_checks import ATTENTION, MLP, SOFTMAX  # noqa: E402


def pages():
    qkv = (2, 8, 256, 64)
    return {
        "softmax": (ef.explain(SOFTMAX, shapes={"X": (4096, 1024)}, measure=True), 1150),
        "attention": (ef.explain(ATTENTION, shapes={"Q": qkv, "K": qkv, "V": qkv},
                                 scale=0.125), 1150),
        "megatron": (ef.explain(MLP, shapes={"x": (64, 1024), "W1": (1024, 4096),
                                             "W2": (4096, 1024)},
                                mesh={"data": 2, "model": 4},
                                shard={"b": "data", "f": "model"}), 1000),
    }


def main() -> int:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("needs chromium (apt-get install chromium)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as scratch:
        for name, (explanation, height) in pages().items():
            page = os.path.join(scratch, f"{name}.html")
            explanation.save(page)
            image = os.path.join(ROOT, "docs", "img", f"pictures-{name}.png")
            subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                            "--disable-background-networking", "--no-first-run",
                            "--disable-component-update", "--disable-sync",
                            "--hide-scrollbars", f"--user-data-dir={scratch}/profile",
                            f"--window-size=1280,{height}", f"--screenshot={image}",
                            f"file://{page}"], check=True, capture_output=True)
            print(f"wrote {os.path.relpath(image, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
