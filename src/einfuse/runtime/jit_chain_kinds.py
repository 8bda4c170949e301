"""The kinds of values the chain rewrite (runtime/jit_chains.py) gives each jaxpr
variable of a batch function -- chained at an axis, shared, a partial sum over the
chains, an 'any over the chains' -- and how one kind is held as another."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import FrozenSet, Optional

import jax
import numpy as np


class NotPerChain(Exception):
    """The candidate chain axis is not one that every operation treats independently."""


@dataclass(frozen=True)
class Kind:
    chain: Optional[int] = None        # the chain axis of a chained value
    partial: bool = False              # a sum over the chains, held as the chain's term
    zero: bool = False                 # a shared zero (a partial's identity)
    uniform: FrozenSet[int] = field(default_factory=frozenset)   # broadcast axes (shared)
    any_of: bool = False               # a reduce_or over the chains (a while's predicate)

    @property
    def shared(self) -> bool:
        return self.chain is None and not self.partial and not self.any_of

    def describe(self) -> str:
        if self.chain is not None:
            return f"chained at axis {self.chain}"
        if self.partial:
            return "a sum over the chains"
        if self.any_of:
            return "any over the chains"
        return "shared"


SHARED = Kind()
PARTIAL = Kind(partial=True)


@dataclass
class Val:
    kind: Kind
    value: object        # a JAX value (tracer) of the one-chain shape (full where not chained)


def drop(shape, axis):
    return tuple(n for k, n in enumerate(shape) if k != axis)


def chain_slice(val: Val, axis: int):
    """The chain's slice of ``val`` as a value chained at ``axis``."""
    if val.kind.chain == axis:
        return val.value
    if val.kind.chain is not None:
        raise NotPerChain(f"two different chain axes ({val.kind.chain} and {axis}) meet")
    if val.kind.shared and np.ndim(val.value) == 0:
        return val.value
    if val.kind.shared and axis in val.kind.uniform:
        return jax.lax.index_in_dim(val.value, 0, axis, keepdims=False)
    raise NotPerChain(f"a {val.kind.describe()} value of shape {np.shape(val.value)} "
                      f"meets values chained at axis {axis}")


def join(a: Kind, b: Kind) -> Kind:
    """The kind a loop carry takes that starts as ``a`` and is written as ``b``."""
    if a == b:
        return a
    if a.chain is not None or b.chain is not None:
        chained = a if a.chain is not None else b
        other = b if chained is a else a
        if other.chain is None and other.shared and chained.chain in other.uniform:
            return Kind(chain=chained.chain)
        raise NotPerChain(f"a loop carry starts {a.describe()} and is written "
                          f"{b.describe()}")
    if a.partial or b.partial:
        other = b if a.partial else a
        if other.partial or other.zero:
            return PARTIAL
        raise NotPerChain("a loop carry adds a shared value to a sum over the chains "
                          "(each chain would add it again)")
    if a.any_of or b.any_of:
        raise NotPerChain("a loop carry is an 'any over the chains'")
    return Kind(zero=a.zero and b.zero, uniform=a.uniform & b.uniform)


def convert(val: Val, kind: Kind) -> object:
    """``val``'s value held as ``kind`` (a join of its own kind)."""
    if val.kind == kind:
        return val.value
    if kind.chain is not None:
        return chain_slice(val, kind.chain)
    if kind.partial and (val.kind.partial or val.kind.zero):
        return val.value
    if kind.shared and val.kind.shared:
        return val.value
    raise NotPerChain(f"a {val.kind.describe()} value is held as {kind.describe()}")


def literal(value) -> Val:
    array = np.asarray(value)
    zero = bool(array.size) and not np.any(array)
    return Val(Kind(zero=zero, uniform=frozenset(range(array.ndim))), value)


__all__ = ["Kind", "NotPerChain", "PARTIAL", "SHARED", "Val", "chain_slice", "convert",
           "drop", "join", "literal"]
