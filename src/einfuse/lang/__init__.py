"""The notation: tokens, syntax tree, parser and printer."""

from .ast import Statement
from .parser import parse

__all__ = ["Statement", "parse"]
