"""The one exception hierarchy of einfuse.

Every error a user can cause is an :class:`EinfuseError`.  Subclasses also
derive from the built-in exception that fits (``ValueError``, ``IndexError``,
``TypeError``) so callers that catch those keep working.

An error may carry the statement's source text and a span ``(start, end)``
into it; ``str(error)`` then shows the statement with carets under the
offending part.  Deep stages raise with whatever span they know; the public
API adds the statement once (:func:`attach_statement`).
"""

from __future__ import annotations

import warnings
from typing import Optional, Tuple

Span = Tuple[int, int]


class EinfuseError(Exception):
    """Base class of every error a user of einfuse can cause."""

    def __init__(self, message: str, *, source: Optional[str] = None,
                 span: Optional[Span] = None):
        super().__init__(message)
        self.message = message
        self.source = source
        self.span = span

    def __str__(self) -> str:
        if self.source is None:
            return self.message
        if self.span is None:
            return "\n".join([self.message] + ["    " + line
                                               for line in self.source.split("\n")])
        # Show the line holding the span's start, carets under the span's part of it.
        start, end = self.span
        start = max(0, min(start, len(self.source)))
        line_start = self.source.rfind("\n", 0, start) + 1
        line_end = self.source.find("\n", start)
        line_end = len(self.source) if line_end < 0 else line_end
        end = max(start + 1, min(end, line_end + 1))
        return "\n".join([self.message, "    " + self.source[line_start:line_end],
                          "    " + " " * (start - line_start) + "^" * (end - start)])

    # Exceptions are pickled when they cross process boundaries (multiprocessing,
    # pytest-xdist); keep the keyword-only context through that round trip.
    def __reduce__(self):
        return (_rebuild, (type(self), self.message, self.source, self.span))


def _rebuild(cls, message, source, span):
    return cls(message, source=source, span=span)


class EinfuseSyntaxError(EinfuseError, ValueError):
    """The statement's text does not parse."""


class EinfuseNameError(EinfuseError, ValueError):
    """A name is reserved, unknown, missing or used inconsistently."""


class MissingArgumentError(EinfuseError, TypeError):
    """A tensor or scalar named in the statement was not passed."""


class UnexpectedArgumentError(EinfuseError, TypeError):
    """An argument was passed that the statement does not use."""


class IndexRuleError(EinfuseError, ValueError):
    """An index is unbound, repeated, shadowed or otherwise misused."""


class ShapeError(EinfuseError, ValueError):
    """Array shapes disagree with each other or with the statement."""


class RangeError(EinfuseError, ValueError):
    """An index range cannot be inferred, or an access would leave its array."""


class OutOfBoundsError(EinfuseError, IndexError):
    """A gathered index value lies outside the axis it indexes."""


class EinfuseTypeError(EinfuseError, TypeError):
    """A dtype is not allowed where it is used, or frameworks are mixed."""


class OptionError(EinfuseError, ValueError):
    """An option (``ranges=``, ``bounds=``, ``backend=`` ...) is invalid."""


class NoGradientError(EinfuseError, ValueError):
    """The name asked for has no gradient in this statement (an integer index array, a
    name the statement does not read, its own output), or the statement's form is not
    supported by derivation."""


class GradientBlockedError(NoGradientError):
    """A name a gradient is asked for reaches the result only through operations that
    pass none (argmax, argmin, sign, //, %): the error to report wherever it is found,
    a program's fused backward included, rather than a form of statement that another
    path could still differentiate."""


class EinfuseOverflowError(EinfuseError, OverflowError):
    """An integer does not fit the integer type it is computed in: a literal or index
    arithmetic beyond int64, or a Python int that the statement's integer dtype cannot
    hold (NumPy 2 raises OverflowError for ``int8_array + 300`` too)."""


class AllocationError(EinfuseError, MemoryError):
    """The result is too large to allocate."""


class BackendError(EinfuseError, RuntimeError):
    """A backend could not build or run a kernel (not the user's statement)."""


class ContractionPathError(EinfuseError, ValueError, RuntimeError):
    """An explicit einsum contraction path (``optimize=[...]``) that is not a path for
    the operands: numpy.einsum raises a RuntimeError for one that leaves operands."""


class EinfuseWarning(UserWarning):
    """A statement is legal but probably not what was meant."""


def warn(message: str, *, source: Optional[str] = None, span: Optional[Span] = None) -> None:
    """Warn with the statement and carets, attributed to the caller's line (the first
    frame outside einfuse)."""
    import os
    import sys
    package = os.path.dirname(os.path.abspath(__file__))
    level, frame = 2, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    text = str(EinfuseError(message, source=source, span=span))
    warnings.warn(text, EinfuseWarning, stacklevel=level)


def attach_statement(error: EinfuseError, source: str) -> EinfuseError:
    """Give ``error`` the statement text, once, at the API boundary."""
    if error.source is None:
        error.source = source
    return error


def did_you_mean(name: str, choices) -> str:
    """' (did you mean X=?)' for the one of ``choices`` closest to a misspelt keyword
    ``name`` (difflib's ratio at least 0.6), else ''."""
    import difflib
    names = sorted({c for c in choices if isinstance(c, str) and c != name})
    close = difflib.get_close_matches(name, names, n=1) if isinstance(name, str) else []
    return f" (did you mean {close[0]}=?)" if close else ""


def unexpected_keywords(function: str, names, accepted) -> "UnexpectedArgumentError":
    """The error for keywords ``names`` that ``function`` does not take: each named, a
    close one of the ``accepted`` keywords suggested, and those listed."""
    accepted = list(accepted)
    names = list(names)
    shown = ", ".join(f"{n}={did_you_mean(n, accepted)}" for n in names)
    plural = "s" if len(names) > 1 else ""
    return UnexpectedArgumentError(f"{function} got the unexpected keyword argument{plural} "
                                   f"{shown}; it takes "
                                   f"{', '.join(f'{a}=' for a in accepted) or 'none'}")
