"""Splits a statement into tokens; no user text is ever evaluated."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import List

from ..errors import EinfuseSyntaxError

NAME = "name"
NUMBER = "number"
OP = "op"
END = "end"

# Longest operators first so that ':=' is not read as ':' then '='.
_OPERATORS = (":=", "+=", "**", "//", "<=", ">=", "==", "!=",
              "+", "-", "*", "/", "%", "<", ">", "=", "&", "|", "(", ")", "[", "]", ",")
# ASCII digits only: '\d' would also read other scripts' digits as numbers.
_NUMBER = re.compile(r"([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][+-]?[0-9]+)?")


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    start: int
    size: int = 0  # characters in the source, when that differs from len(text)

    @property
    def end(self) -> int:
        return self.start + max(1, self.size or len(self.text))


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
            if pos < len(source) and (source[pos].isalnum() or source[pos] == "_"):
                raise EinfuseSyntaxError("a number may not run into a name",
                                         source=source, span=(number.start(), pos + 1))
            continue
        if char.isidentifier():
            token = _name_token(source, pos)
            tokens.append(token)
            pos = token.end
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


def _name_token(source: str, start: int) -> Token:
    """The name starting at ``start``.  A name is a Python identifier (the spec's rule),
    Unicode letters and combining marks included: Python's own XID_Start/XID_Continue
    test decides each character."""
    end = start + 1
    while end < len(source) and ("a" + source[end]).isidentifier():
        end += 1
    text = source[start:end]
    # Python normalises identifiers to NFKC, so the keyword 'ﬁ=' arrives as 'fi';
    # the statement's names must match the keywords they are passed by.
    normal = unicodedata.normalize("NFKC", text)
    return Token(NAME, normal, start, size=end - start)
