"""Splits a statement into tokens; no user text is ever evaluated."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List

from ..errors import EinfuseSyntaxError

NAME = "name"
NUMBER = "number"
OP = "op"
END = "end"

# Longest operators first so that ':=' is not read as ':' then '='.
_OPERATORS = (":=", "+=", "**", "<=", ">=", "==", "!=",
              "+", "-", "*", "/", "<", ">", "=", "&", "|", "(", ")", "[", "]", ",")
_NUMBER = re.compile(r"(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    start: int

    @property
    def end(self) -> int:
        return self.start + max(1, len(self.text))


def tokenize(source: str) -> List[Token]:
    tokens: List[Token] = []
    pos = 0
    while pos < len(source):
        char = source[pos]
        if char in " \t\r\n":
            pos += 1
            continue
        if char == "#":  # a comment runs to the end of the line
            newline = source.find("\n", pos)
            pos = len(source) if newline < 0 else newline
            continue
        number = _NUMBER.match(source, pos)
        if number:
            tokens.append(Token(NUMBER, number.group(0), pos))
            pos = number.end()
            if pos < len(source) and (source[pos].isalpha() or source[pos] == "_"):
                raise EinfuseSyntaxError("a number may not run into a name",
                                         source=source, span=(number.start(), pos + 1))
            continue
        name = _NAME.match(source, pos)
        if name:
            tokens.append(Token(NAME, name.group(0), pos))
            pos = name.end()
            continue
        for op in _OPERATORS:
            if source.startswith(op, pos):
                tokens.append(Token(OP, op, pos))
                pos += len(op)
                break
        else:
            raise EinfuseSyntaxError(f"unexpected character {char!r}", source=source,
                                     span=(pos, pos + 1))
    tokens.append(Token(END, "", len(source)))
    return tokens
