"""Every identifier a renderer prints (C or Triton) goes through ``name``: a generated
name that is not a plain identifier is a bug, caught before it reaches a compiler."""

from __future__ import annotations

import re

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def name(text: str) -> str:
    """Every identifier printed goes through here."""
    if not _NAME.match(text):
        raise ValueError(f"not a valid generated C identifier: {text!r}")
    return text
