"""The docs' example pages in a real browser: headless Chromium (Debian's ``chromium``;
.ci/run installs it where missing) loads each page and takes a screenshot; the test
checks the screenshot is not blank and that the page logged nothing to the console.

Where Chromium is missing this FAILS: CI installs it.  Only an explicit
EINFUSE_NO_BROWSER=1 skips it (a machine that cannot have a browser)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib

import pytest

from einfuse.pictures import Calibration, cpu_model, store

from picture_checks import docs_examples, parse_page

BROWSERS = ("chromium", "chromium-browser")


@pytest.fixture(scope="module")
def browser():
    if os.environ.get("EINFUSE_NO_BROWSER") == "1":
        pytest.skip("EINFUSE_NO_BROWSER=1: the browser test is switched off explicitly")
    found = next((path for path in map(shutil.which, BROWSERS) if path), None)
    assert found, ("headless Chromium is needed for the picture tests: apt-get install "
                   "chromium (.ci/run does), or set EINFUSE_NO_BROWSER=1 to skip them")
    return found


def screenshot(browser: str, page: str, image: str, profile: str) -> str:
    """Load ``page`` and write its screenshot to ``image``; return the browser's log."""
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-background-networking", "--no-first-run",
               "--disable-component-update", "--disable-sync", "--hide-scrollbars",
               f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
               "--window-size=1280,1000", f"--screenshot={image}", f"file://{page}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


def png_pixels(path: str):
    """(width, height, rows of bytes per pixel) of an 8-bit RGB or RGBA PNG."""
    with open(path, "rb") as handle:
        data = handle.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, chunks, header = 8, [], None
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        body = data[position + 8:position + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        position += 12 + length
    width, height, depth, colour = header[:4]
    assert depth == 8 and colour in (2, 6), header
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up = previous[x]
            corner = previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 255
            elif kind == 2:
                line[x] = (line[x] + up) & 255
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                best = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
                line[x] = (line[x] + best) & 255
        rows.append(bytes(line))
        previous = line
    return width, height, channels, rows


def test_docs_pages_render_in_chromium(browser, tmp_path, monkeypatch):
    monkeypatch.setenv("EINFUSE_CALIBRATION_FILE", str(tmp_path / "calibration.json"))
    store(Calibration(2.5e10, 1.6e11, cpu_model(), os.cpu_count(), "2026-01-02"))
    for name, explanation in docs_examples().items():
        page = tmp_path / f"{name}.html"
        explanation.save(str(page))
        parse_page(page.read_text())
        image = tmp_path / f"{name}.png"
        log = screenshot(browser, str(page), str(image), str(tmp_path / f"profile-{name}"))
        console = [line for line in log.splitlines() if "CONSOLE" in line]
        assert not console, console
        width, height, channels, rows = png_pixels(str(image))
        assert (width, height) == (1280, 1000)
        inked = sum(1 for row in rows[::4] for x in range(0, len(row), channels * 4)
                    if min(row[x:x + 3]) < 200)
        sampled = (height // 4) * (width // 4)
        assert inked > 0.01 * sampled, f"{name}: the screenshot is blank"
        colours = {row[x:x + 3] for row in rows[::8] for x in range(0, len(row), channels * 8)}
        assert len(colours) > 8, f"{name}: the screenshot has {len(colours)} colours"
