"""Errors raised by a gradient statement, told in terms of the statement the user wrote.

A gradient statement (``dx[k] := dy[k - 1] * w[idx[k - 1]]``) is einfuse's own text: an
error it raises while its options are resolved or while it runs would otherwise show
names and advice the user never wrote.  :func:`gradient_errors` re-raises such an error
(same class) saying whose gradient it is -- the user's statement and the input -- with
carets under that input's read in the user's statement, and the derived statement and
its own message only as detail."""

from __future__ import annotations

from typing import List, Optional, Tuple

from ..errors import BackendError, EinfuseError
from ..lang import parse
from ..lang.ast import Access, Param
from .derive import GradientStatement


def written_statement(g: GradientStatement) -> Tuple[str, List[str]]:
    """The statement as the user wrote it whose (repeated) gradient ``g`` computes, and
    the inputs it is differentiated with respect to, first derivative first."""
    chain = []
    root: Optional[GradientStatement] = g
    while root is not None:
        chain.append(root)
        if root.parent is None:
            break
        root = root.parent
    first = chain[-1]
    return first.forward, [s.wrt for s in reversed(chain)]


def _span_of(statement: str, name: str) -> Optional[Tuple[int, int]]:
    """The span of the first read of ``name`` in ``statement`` (None if not found)."""
    try:
        parsed = parse(statement)
    except EinfuseError:
        return None
    for node in parsed.rhs.walk():
        if isinstance(node, Access) and node.tensor == name or \
                isinstance(node, Param) and node.name == name:
            span = getattr(node, "span", None)
            if span and span[1] > span[0]:
                return span
    return None


def told_of_statement(error: EinfuseError, g: GradientStatement) -> EinfuseError:
    """``error``, raised by gradient statement ``g``, as an error of the same class about
    the user's statement."""
    written, wrt = written_statement(g)
    if len(wrt) == 1:
        what = f"the gradient of {written!r} with respect to {wrt[0]}"
    else:
        what = (f"a derivative of order {len(wrt)} of {written!r} (with respect to "
                f"{', then '.join(wrt)})")
    own, derived = str(error), g.description or g.text
    if derived not in own:
        own = f"{derived}: {own}"
    message = (f"computing {what} failed, in a gradient statement einfuse derived from it "
               f"(not written by you):\n      " + own.replace("\n", "\n      "))
    found = type(error)(message, source=written, span=_span_of(written, wrt[0]))
    found.gradient_of = (written, tuple(wrt))
    return found


def attributed(error: EinfuseError, g: GradientStatement) -> bool:
    """Has ``error`` to be told of the user's statement?  Not when it already is, or
    when it is a backend's own (not the statement's) or a signal between einfuse's
    parts."""
    if getattr(error, "gradient_of", None) is not None or isinstance(error, BackendError):
        return False
    written, _ = written_statement(g)
    return error.source != written


class gradient_errors:    # noqa: N801 (used as a context manager, like a function)
    """``with gradient_errors(g):`` around resolving, running or scattering gradient
    statement ``g``: its EinfuseErrors come out told of the user's statement
    (:func:`told_of_statement`).  A class, not a generator: backwards of a training
    loop enter it per kernel call."""

    __slots__ = ("statement",)

    def __init__(self, g: GradientStatement):
        self.statement = g

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        if isinstance(error, EinfuseError) and attributed(error, self.statement):
            raise told_of_statement(error, self.statement) from error
        return False
