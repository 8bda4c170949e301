"""The one key type of the caches of compiled and prepared things: a
:class:`CacheKey` is (what is cached, the value that decides it), so that every such
cache says the same way what its entries depend on, and two entries are one exactly
where those values are equal.  The values are the schedule's own where there is one (a
C loop nest's :class:`~einfuse.schedule.schedule.LoopChoice`), else what the cache's
owner decides by (a fused group's members and their joins, a call's signature).  A
tuple underneath: building one and hashing it cost what the bare value does."""

from __future__ import annotations

import enum
from typing import Hashable, NamedTuple


class CacheKind(enum.Enum):
    """What a cache holds, and what its key's value is."""
    LOOP_NEST = ("a compiled C loop nest", "the schedule's loop choice")
    COMPILED_NEST = ("a compiled C loop nest, shared by equal spellings",
                     "the loop choice's structural key (LoopChoice.key: the statement "
                     "by structure, exact constants, indices by position)")
    FUSED_GROUP = ("a compiled fused C group", "its members' loop choices, the reads between "
                   "them, the rows kept per thread and the column sums")
    COMPILED_GROUP = ("a compiled fused C group, shared by equal spellings",
                      "its members' loop choices' structural keys, the reads between "
                      "them, the rows kept per thread and the column sums")
    SCHEDULE = ("a call's schedule", "the call's signature (runtime/signatures.py)")

    @property
    def holds(self) -> str:
        return self.value[0]

    @property
    def decided_by(self) -> str:
        return self.value[1]


class CacheKey(NamedTuple):
    kind: CacheKind
    value: Hashable

    def describe(self) -> str:
        return f"{self.kind.holds}, keyed by {self.kind.decided_by}"


def loop_nest_key(choice) -> CacheKey:
    """The key of the compiled C loop nest of ``choice`` (a LoopChoice)."""
    return CacheKey(CacheKind.LOOP_NEST, choice)


def compiled_nest_key(choice) -> CacheKey:
    """The key of the compiled C loop nest that every choice structurally equal to
    ``choice`` shares (LoopChoice.key)."""
    return CacheKey(CacheKind.COMPILED_NEST, choice.key)
