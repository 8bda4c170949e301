"""A program's text as its statements: separated by newlines or ';' outside brackets and
parentheses (a statement may span lines inside them), with '#' comments and blank lines."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import List, Tuple

from ..errors import EinfuseSyntaxError

_OPEN = {"(": ")", "[": "]"}
_CLOSE = {")": "(", "]": "["}


@dataclass(frozen=True)
class StatementText:
    text: str      # the statement alone, comments removed, stripped
    start: int     # offset of its first character in the program's text
    line: int      # 1-based line of the program where it starts


_ASSIGNMENT = re.compile(r":=|\+=|(?<![<>=!:+])=(?!=)")


def _complete(text: str) -> bool:
    """Whether a newline after ``text`` ends a statement: it has its assignment and does
    not end in an operator (v1 statements could continue on the next line after ':=' or
    a binary operator, and still can)."""
    text = text.strip()
    return bool(text) and bool(_ASSIGNMENT.search(text)) and \
        not text.endswith(("=", "+", "-", "*", "/", ",", "<", ">", "&", "|"))


def split_program(source: str) -> List[StatementText]:
    """The statements of ``source`` in order.  A single statement gives one entry: the
    caller decides whether that is a v1 statement or a program of one."""
    if not isinstance(source, str):
        raise EinfuseSyntaxError(f"a statement must be a string, not {type(source).__name__}")
    return list(_split(source))


@functools.lru_cache(maxsize=1024)
def _split(source: str) -> Tuple[StatementText, ...]:
    """(cached: every ``ein`` call asks whether its text is a program)"""
    pieces: List[StatementText] = []
    depth: List[str] = []
    chars: List[str] = []
    start = line = None
    current_line, comment = 1, False

    def finish():
        nonlocal chars, start, line
        text = "".join(chars).strip()
        if text:
            pieces.append(StatementText(text, start, line))
        chars, start, line = [], None, None

    for offset, char in enumerate(source):
        if char == "\n":
            current_line += 1
            comment = False
            if not depth and _complete("".join(chars)):
                finish()
                continue
            chars.append("\n")
            continue
        if comment:
            continue
        if char == "#":
            comment = True
            continue
        if char == ";" and not depth:
            finish()
            continue
        if char in _OPEN:
            depth.append(char)
        elif char in _CLOSE and depth and depth[-1] == _CLOSE[char]:
            depth.pop()
        if start is None and not char.isspace():
            start, line = offset, current_line
        chars.append(char)
    finish()
    return tuple(pieces)
