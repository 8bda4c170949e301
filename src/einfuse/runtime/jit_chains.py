"""The batch a jaxpr has lost: a function of a whole batch of chains (what ``jax.grad``
of a sum over ``jax.vmap`` hands ``ef.jit``: batched primitives over the chain axis, no
vmap left) rewritten as the function of ONE chain, so that the Triton route runs it
spread over programs and lanes as a vmapped call (runtime/jit_chain_route.py).

:func:`find_chains` tries the inputs' leading axes as the chain axis and interprets the
jaxpr once per candidate, each value of a :class:`Kind`:

* **chained** at an axis: the value has the chain axis there and every operation on it
  so far treats the chains independently (elementwise, a ``dot_general`` whose batch
  dimension or free dimension it is, reductions over other axes, scans and whiles whose
  carries keep it); the one-chain function holds the chain's slice;
* **shared**: the same for every chain (the weights; ``uniform`` names the axes along
  which it is a broadcast, so that a chain's slice of it is its first);
* **partial**: a sum over the chains (a ``reduce_sum`` or a contraction over the chain
  axis: the shared weights' gradient), held as the chain's own term.  Linear operations
  keep it partial (sums of partials, products with shared values, transposes,
  reshapes, accumulating scan carries); an output that is partial is summed over the
  chains after the kernel, in chain order;
* **any**: a ``reduce_or`` over the chain axis (a value every chain needs: declined
  wherever it is read).  A ``while`` whose condition is a batch of predicates (JAX's
  batched while: each chain runs until its own predicate is false, its carries kept
  after) is the chain's own loop on its own predicate.

Anything else across the chain axis (a max over chains, a partial read nonlinearly, a
gather along it, a scan over it) ends the candidate with a reason; where no candidate
holds the reasons are what explain prints.  Imported by runtime/jit_triton.py only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import jax

from .jit_chain_kinds import SHARED, Kind, NotPerChain, Val, drop
from .jit_chain_rules import CHAINS, closed_interpret


@dataclass(frozen=True)
class ChainForm:
    """How a batch function is one chain's function over ``chains`` chains:
    ``in_axes[i]`` the chain axis of input ``i`` (None: shared), ``out_kinds`` each
    output's kind (chained: stacked with the chain axis at ``chain``; partial: summed over
    the chains in chain order; shared: the first chain's), ``per_chain`` the flat
    one-chain function (inputs in order, chained ones without their chain axis)."""
    chains: int
    in_axes: Tuple[Optional[int], ...]
    out_kinds: Tuple[Kind, ...]
    per_chain: Callable
    examples: Tuple[jax.ShapeDtypeStruct, ...]

    def describe(self) -> str:
        ins = ", ".join("shared" if a is None else f"chained at axis {a}" for a in self.in_axes)
        outs = ", ".join(k.describe() for k in self.out_kinds)
        return f"{self.chains} chains (inputs: {ins}; outputs: {outs})"


def _candidate(closed, chains: int, in_axes: Tuple[Optional[int], ...],
               needs_sum: bool = False) -> ChainForm:
    avals = [v.aval for v in closed.jaxpr.invars]
    examples = tuple(jax.ShapeDtypeStruct(drop(a.shape, axis) if axis is not None
                                          else tuple(a.shape), a.dtype)
                     for a, axis in zip(avals, in_axes))
    found: List[Tuple[Kind, ...]] = []

    def per_chain(*values):
        args = [Val(Kind(chain=axis) if axis is not None else SHARED, value)
                for value, axis in zip(values, in_axes)]
        token = CHAINS.set(chains)
        try:
            outs = closed_interpret(closed, args)
        finally:
            CHAINS.reset(token)
        for out in outs:
            if out.kind.any_of:
                raise NotPerChain("an output is an 'any over the chains'")
        if not found:
            found.append(tuple(out.kind for out in outs))
        return [out.value for out in outs]
    jax.make_jaxpr(per_chain)(*examples)     # the kinds (NotPerChain where none hold)
    kinds = found[0]
    if not any(k.chain is not None or k.partial for k in kinds):
        raise NotPerChain("no output depends on the chains")
    if needs_sum and not any(k.partial for k in kinds):
        raise NotPerChain("no output is a sum over the chains")
    return ChainForm(chains, tuple(in_axes), kinds, per_chain, examples)


def find_chains(closed) -> Tuple[Optional[ChainForm], str]:
    """The chain form of ``closed`` (a ClosedJaxpr of a whole batch), or None and why.
    Candidates, for each size >= 2 of an input's axis (largest first): every input whose
    leading axis has that size chained there, then each such input alone; then every
    input with that size at one axis only (any axis: ``jax.vmap(..., in_axes=1)`` leaves
    the chains there) chained at it, then each of those alone.  A candidate chained
    off the leading axes holds only where an output is a sum over the chains (the
    gradient of a sum over a vmap, what this rewrite is for): any axis of independent
    columns (a weight's, read by a product column by column) would otherwise be taken
    for chains."""
    avals = [v.aval for v in closed.jaxpr.invars]
    sizes = sorted({int(n) for a in avals for n in a.shape if n >= 2}, reverse=True)
    if not sizes:
        return None, "no input has an axis of two or more chains"
    reasons: List[str] = []
    tried = set()
    for size in sizes:
        for axes in _candidates(avals, size):
            if axes in tried:
                continue
            tried.add(axes)
            chained = [i for i, axis in enumerate(axes) if axis is not None]
            named = ", ".join(f"{i}" if axes[i] == 0 else f"{i} (axis {axes[i]})"
                              for i in chained)
            try:
                return _candidate(closed, size, axes, needs_sum=any(
                    axis not in (None, 0) for axis in axes)), ""
            except NotPerChain as why:
                reasons.append(f"inputs {named} chained over {size}: {why}")
            except Exception as error:    # noqa: BLE001 -- an unforeseen form: not spread
                reasons.append(f"inputs {named} chained over {size}: not rewritten "
                               f"({type(error).__name__}: {str(error)[:160]})")
    return None, "; ".join(reasons[:3])


def _candidates(avals, size: int) -> List[Tuple[Optional[int], ...]]:
    """The in_axes to try for chains of ``size`` (see find_chains), in order."""
    found: List[Tuple[Optional[int], ...]] = []
    leading = {i: 0 for i, a in enumerate(avals) if len(a.shape) >= 1 and a.shape[0] == size}
    single = {i: [k for k, n in enumerate(a.shape) if n == size] for i, a in enumerate(avals)}
    anywhere = {i: axes[0] for i, axes in single.items() if len(axes) == 1}
    for chosen in (leading, anywhere):
        if not chosen:
            continue
        found.append(tuple(chosen.get(i) for i in range(len(avals))))
        if len(chosen) > 1:
            found += [tuple(chosen[i] if j == i else None for j in range(len(avals)))
                      for i in chosen]
    return found


__all__ = ["ChainForm", "find_chains"]
