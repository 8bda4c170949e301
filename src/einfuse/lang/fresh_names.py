"""The one generator of fresh names.  Every stage that invents names -- the sugar
expansion and the parser, the converters, derivation, the BLAS epilogue's products, a
folded backward's renamed reductions, the named-dimension front end, the C rewrites --
hands them out of a :class:`FreshNames` holding the names already in use, so no new
name can capture one that exists.  The spellings differ by what the name stands for
(a copy of an index ``k2``, a numbered temporary ``p1``, a suffixed dimension ``i_1``,
a free letter), so each spelling is a method; the set of taken names is one."""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Sequence, Set


class FreshNames:
    """Names unused among ``taken`` (the names of the statement being expanded, or of
    the buffers of a typed program), each one taken as it is handed out."""

    def __init__(self, taken: Iterable[str] = ()):
        self.taken: Set[str] = set(taken)
        self.count = 0                    # numbered(): one count shared by every stem
        self.next: Dict[str, int] = {}    # counted(): the first number worth trying

    def __contains__(self, name: str) -> bool:
        return name in self.taken

    def take(self, name: str) -> str:
        """``name``, now in use (the caller chose it)."""
        self.taken.add(name)
        return name

    def copy_of(self, name: str) -> str:
        """``name2``, ``name3`` ...: a copy of index ``name``."""
        n = 2
        while f"{name}{n}" in self.taken:
            n += 1
        return self.take(f"{name}{n}")

    def primed(self, name: str) -> str:
        """``name'``, ``name''`` ...: a second index standing for ``name`` (the position
        a windowed read reaches, beside the output index it is added back into)."""
        name += "'"
        while name in self.taken:
            name += "'"
        return self.take(name)

    def numbered(self, stem: str) -> str:
        """``stem`` and the next number of one count shared by every stem (``t1``,
        ``i2``, ``t3`` ...), skipping taken names."""
        while True:
            self.count += 1
            name = f"{stem}{self.count}"
            if name not in self.taken:
                return self.take(name)

    def counted(self, stem: str) -> str:
        """``stem1``, ``stem2`` ...: the first free number of ``stem``'s own count.
        Names are only added, so the first free number never moves down and is not
        searched from 1 again (a long backward renames thousands of reductions)."""
        number = self.next.get(stem, 1)
        while f"{stem}{number}" in self.taken:
            number += 1
        self.next[stem] = number + 1
        return self.take(f"{stem}{number}")

    def suffixed(self, base: str, reserved: Iterable[str] = (),
                 local: Iterable[str] = (), bare: bool = True) -> str:
        """``base`` itself where it is free (and not ``reserved``; not at all where
        ``bare`` is false), else ``base_1``, ``base_2`` ...; ``local``: names taken only
        where this one is used."""
        local = set(local)
        if bare and base not in self.taken and base not in local and \
                base not in set(reserved):
            return self.take(base)
        n = 1
        while f"{base}_{n}" in self.taken or f"{base}_{n}" in local:
            n += 1
        return self.take(f"{base}_{n}")

    def underscored(self, name: str) -> str:
        """``name``, else ``name_``, ``name__`` ...: a variable named after the one it
        belongs to (``dx`` for ``x``'s gradient)."""
        while name in self.taken:
            name += "_"
        return self.take(name)

    def letter(self, letters: Sequence[str]) -> Optional[str]:
        """The first of ``letters`` that is free (taken), or None."""
        for letter in letters:
            if letter not in self.taken:
                return self.take(letter)
        return None


__all__ = ["FreshNames"]
