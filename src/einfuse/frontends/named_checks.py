"""Named dimensions: where an expression was built, and the errors that say so.

Every named expression remembers the Python line that built it (the first frame outside
einfuse), so that an error -- a dimension bound to two sizes, two dimension objects with
one name, frameworks mixed -- names the dimension and points at the user's code, not at
einfuse's.  The bookkeeping each node carries is a dict ``name -> DimInfo`` (the
dimension object, and the first use that gave it a size), merged when nodes combine."""

from __future__ import annotations

import linecache
import os
import sys
from typing import Dict, NamedTuple, Optional, Tuple

from ..errors import EinfuseError, EinfuseNameError, EinfuseTypeError, ShapeError

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# the array libraries' dispatch (torch's __torch_function__ handling, NumPy's ufuncs) is
# not the user's line either
_LIBRARIES = ("torch", "numpy", "jax", "jaxlib")
_inside: Dict[str, bool] = {}      # a code object's file name -> is it einfuse's


Where = Optional[Tuple[str, int]]


def caller_line() -> Where:
    """(file, line) of the innermost frame outside einfuse: the user's line."""
    # (the caller is einfuse's; most often its caller is the user's, known as such)
    try:
        frame = sys._getframe(2)
    except ValueError:          # (called from a frame with no Python caller)
        frame = None
    if frame is not None and _inside.get(frame.f_code.co_filename) is False:
        return (frame.f_code.co_filename, frame.f_lineno)
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        inside = _inside.get(name)
        if inside is None:
            module = str(frame.f_globals.get("__name__", "")).split(".", 1)[0]
            inside = _inside[name] = os.path.abspath(name).startswith(_PACKAGE) or \
                module in _LIBRARIES
        if not inside:
            return (name, frame.f_lineno)
        frame = frame.f_back
    return None


def caller_frame():
    """The innermost frame outside einfuse (for reading the names a call assigns to)."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame = frame.f_back
    return frame


def shown_line(where: Where) -> str:
    """'file.py:12: <the line's code>' for a message."""
    if where is None:
        return "(line unknown)"
    path, line = where
    code = linecache.getline(path, line).strip()
    short = os.path.basename(path)
    return f"{short}:{line}: {code}" if code else f"{short}:{line}"


def at_lines(*wheres: Where) -> str:
    """The lines that built an expression, each once, for the end of a message."""
    seen = []
    for where in wheres:
        if where is not None and where not in seen:
            seen.append(where)
    if not seen:
        return ""
    return "".join(f"\n    at {shown_line(w)}" for w in seen)


def error(cls, message: str, *wheres: Where) -> EinfuseError:
    """An ``cls`` error whose message ends with the Python lines that built the
    expression (each on its own line, as a traceback shows them)."""
    return cls(message + at_lines(*wheres))


class Use(NamedTuple):
    """What gave a dimension its size: ``what`` in words, at ``where``."""
    size: int
    what: str
    where: Where
    explicit: bool = False        # from ``dim.size = n`` (passed to the program)


class DimInfo(NamedTuple):
    dim: object
    use: Optional[Use]             # None: no size known yet (affine or index uses only)


class Records(dict):
    """A ``name -> DimInfo`` dict that holds no array (its uses are described by text,
    not by the wrapped array), so that it may be kept in a cache: ``merged`` remembers
    the union of two of them."""
    __slots__ = ()


def merged(first: Records, second: Records, where: Where) -> Records:
    """``merge_info`` of two records, remembered by their identities (records are never
    written to once made; the entry holds both, so their ids stay theirs): a rebuilt
    expression merges the same records again."""
    held = _MERGED.get((id(first), id(second)))
    if held is not None:
        return held[2]
    result = merge_info((first, second), where)
    if type(result) is not Records:
        result = Records(result)
    if len(_MERGED) >= 1024:
        _MERGED.clear()
    _MERGED[(id(first), id(second))] = (first, second, result)
    return result


_MERGED: Dict[tuple, tuple] = {}


def merge_info(infos, where: Where) -> Dict[str, DimInfo]:
    """The union of nodes' ``name -> DimInfo`` dicts: one dimension object per name and
    one size per dimension, else the error naming both uses and the line combining
    them.  The dicts are shared, not copied, while one side holds everything."""
    result = None
    for info in infos:
        if not info or info is result:
            continue
        if result is None:
            result = info
            continue
        copied = False
        for name, entry in info.items():
            mine = result.get(name)
            if mine is None or (mine.use is None and entry.use is not None):
                if mine is not None and mine.dim is not entry.dim:
                    raise same_name(name, mine, entry, where)
                if not copied:
                    result, copied = dict(result), True
                result[name] = entry
                continue
            if mine.dim is not entry.dim:
                raise same_name(name, mine, entry, where)
            if entry.use is not None and mine.use.size != entry.use.size:
                raise two_sizes(name, mine.use, entry.use, where)
    return result if result is not None else {}


def two_sizes(name: str, first: Use, second: Use, where: Where) -> ShapeError:
    shown = f"dimension {name}" if not name.startswith("_") else \
        f"positional axis {int(name[1:]) + 1} from the right (a ':')"
    return error(ShapeError,
                 f"{shown} is bound to two sizes in one expression: {first.size} "
                 f"by {first.what} and {second.size} by {second.what}; a dimension has one "
                 "size (use another dimension for the other axis)",
                 first.where, second.where, where)


def same_name(name: str, first: DimInfo, second: DimInfo, where: Where) -> EinfuseNameError:
    return error(EinfuseNameError,
                 f"two different dimension objects are both named {name!r} in one "
                 "expression; a name stands for one dimension (create each dimension "
                 "once, or give the other one another name)",
                 *(u.where for u in (first.use, second.use) if u is not None), where)


def merge_framework(first, second, where: Where):
    """Frameworks are (name, what, where) triples or None; one per expression."""
    if first is None or second is None or first[0] == second[0]:
        return first if first is not None else second
    raise error(EinfuseTypeError,
                f"a named expression mixes frameworks: {first[1]} is a {first[0]} array "
                f"and {second[1]} a {second[0]} array; convert them to one framework first",
                first[2], second[2], where)


def framework_name(value) -> Optional[str]:
    """'numpy', 'torch' or 'jax' for an array of one of them (tracers included)."""
    module = type(value).__module__ or ""
    root = module.split(".", 1)[0]
    if root == "torch":
        return "torch"
    if root in ("jax", "jaxlib"):
        return "jax"
    if root == "numpy":
        return "numpy"
    return None
