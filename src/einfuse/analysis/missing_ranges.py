"""The error for indices whose ranges cannot be inferred: it says which extent is missing.

Range inference (ranges.py) gets stuck when the indices left have no plain use and every
subscript they appear in also holds another index without a range: in a max-pool
``max[p,q](x[b,c,2*i+p,2*j+q])`` the output's ``i`` could follow from the window's ``p``
('valid' semantics) and ``p`` from ``i``, but no array gives either a size.  The extent
the user has to supply is the window's (a reduced index); the output's then follows.  So
the message names the reduced ("window") indices when there are any, the output indices
otherwise, and points at a subscript that ties them together.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from ..errors import RangeError
from .spec import IndexUse, Spec


def _names(names: Sequence[str]) -> str:
    if len(names) == 1:
        return names[0]
    return ", ".join(names[:-1]) + " and " + names[-1]


def _tying_use(spec: Spec, named: Sequence[str], stuck: Sequence[str]) -> Optional[IndexUse]:
    """The first subscript (in source order) that holds a named index and another index
    without a range: the place that would settle one from the other."""
    first = None
    for index in named:
        for use in spec.uses(index):
            if use.subscript.gathers:
                continue
            first = first or use
            others = [n for n in use.subscript.index_names if n != index]
            if any(n in stuck for n in others):
                return use
    return first


def _partners(spec: Spec, named: Sequence[str], stuck: Sequence[str]) -> List[str]:
    """The unranged indices that share a subscript with the named ones."""
    found: List[str] = []
    for index in named:
        for use in spec.uses(index):
            for other in use.subscript.index_names:
                if other in stuck and other not in named and other not in found:
                    found.append(other)
    return found


def _ranges_hint(names: Sequence[str]) -> str:
    """What to pass, as ``give ...`` continues it."""
    if len(names) == 1:
        return f"ranges={{{names[0]!r}: ...}}"
    sizes = ", ".join(f"{n!r}: 3" for n in names)
    window = "x".join("3" for _ in names)
    return f"ranges= for {_names(names)} (e.g. ranges={{{sizes}}} for a {window} window)"


def unranged_error(spec: Spec, stuck: Sequence[str]) -> RangeError:
    """The RangeError for ``stuck``: indices without a plain use or binding range whose
    shifted/strided subscripts all involve another index of ``stuck``."""
    stuck = list(stuck)
    window = [n for n in stuck if n not in spec.output_indices]
    named = window or stuck
    use = _tying_use(spec, named, stuck)
    where = f" {use.access}" if use is not None else " the statement"
    partners = _partners(spec, named, stuck)
    if window:
        what = "the window index" if len(window) == 1 else "the window indices"
        they = "it" if len(window) == 1 else "them"
        message = (f"{what} {_names(window)} {'has' if len(window) == 1 else 'have'} no "
                   f"range: no array is indexed by {they} alone")
        if partners:
            either = "which has" if len(partners) == 1 else "which have"
            message += (f", and{where} only ties {they} to {_names(partners)}, {either} no "
                        "range either")
        subs = ", ".join(window)
        message += (f"; give {_ranges_hint(window)} or read an array indexed by {they}, such as "
                    f"a window w[{subs}] or a mask m[{subs}]")
        if partners:
            follows = f"the range of {partners[0]} then follows" if len(partners) == 1 \
                else f"the ranges of {_names(partners)} then follow"
            message += f" ({follows}: the largest for which every read stays inside " \
                "its array)"
    else:
        message = (f"indices {_names(named)} have no range: no array is indexed by any of "
                   f"them alone, and{where} only ties them together; give ranges= for one "
                   f"of them ({_ranges_hint(named[:1])})")
    return RangeError(message, source=spec.source,
                      span=use.access.span if use is not None else None)


def unsized_error(spec: Spec, missing: Sequence[str], pad: bool,
                  fallback_span=None) -> RangeError:
    """The RangeError for indices that no subscript bounds at all (no plain use, and every
    shifted one is padded or absent), all of them in one message."""
    uses = [u for n in missing for u in spec.uses(n)]
    window = [n for n in missing if n not in spec.output_indices]
    if not uses:
        why = "no array is indexed by " + ("it" if len(missing) == 1 else "them")
    elif pad:
        why = "no plain subscript gives " + ("its" if len(missing) == 1 else "their") + \
            " size, and with pad= shifted subscripts do not limit ranges"
    else:
        why = "no plain subscript gives " + ("its" if len(missing) == 1 else "their") + " size"
    if len(missing) == 1:
        kind = "window index" if window and uses else "index"
        head = f"{kind} {missing[0]}: its range cannot be inferred ({why})"
        hint = f"give ranges={{{missing[0]!r}: ...}}"
    else:
        head = f"indices {_names(missing)}: their ranges cannot be inferred ({why})"
        sizes = ", ".join(f"{n!r}: ..." for n in missing)
        hint = f"give ranges= for each (ranges={{{sizes}}})"
    if window and len(missing) == 1:
        hint += f" or read an array indexed by {missing[0]}"
    elif window:
        hint += f"; {_names(window)} can also take " + \
            ("its extent from an array indexed by it" if len(window) == 1
             else "their extents from an array indexed by them")
    span = uses[0].access.span if uses else fallback_span
    return RangeError(f"{head}; {hint}", source=spec.source, span=span)
