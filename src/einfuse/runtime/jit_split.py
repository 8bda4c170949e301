"""``ef.jit(fn, fallback=True)``: a function with equations einfuse cannot convert is
split at its top level into parts: maximal runs of convertible equations, each compiled
into one einfuse kernel (with the same jit/grad/vmap integration as a whole function),
and the unconvertible equations, run by JAX itself.

An equation counts as convertible when it converts on its own (a ``scan`` whose body
holds a ``sort`` runs in JAX as a whole: loops are split only at the top level)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from ..frontends.jaxpr import Converter, equation_text
from ..frontends.jaxpr_values import JaxprConversionError, source_line
from ..ir import ScalarType
from .jit_compiled import CompiledFunction


@dataclass(frozen=True)
class Part:
    """A run of equations: compiled by einfuse (``compiled`` set) or run by JAX."""
    closed: object                 # ClosedJaxpr of the part
    invars: Tuple[object, ...]     # the outer variables it reads, in its invars' order
    outvars: Tuple[object, ...]    # the outer variables it defines that are read later
    compiled: object = None        # CompiledFunction, or None: JAX runs it
    equations: Tuple[str, ...] = ()
    why: str = ""                  # for a JAX part: the conversion error


def _jaxpr(invars, outvars, eqns):
    """A Jaxpr of some of a traced function's equations (JAX asks for debug info that a
    part of a function has none of; the warning says nothing to the user)."""
    import warnings
    from jax.extend.core import Jaxpr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return Jaxpr((), list(invars), list(outvars), list(eqns))


def _convertible(eqn) -> Tuple[bool, str]:
    from jax.extend.core import ClosedJaxpr, Var
    invars = list(dict.fromkeys(v for v in eqn.invars if isinstance(v, Var)))
    for v in invars + list(eqn.outvars):
        # a kernel's arguments and results are plain arrays: an equation that reads or
        # makes a typed key (random_wrap, random_bits) runs in JAX, even though the
        # converter handles keys inside a kernel
        if ScalarType.of(v.aval.dtype) is None:
            name = getattr(v.aval.dtype, "name", str(v.aval.dtype))
            return False, (f"ef.jit cannot pass arrays of dtype {name} into or out of a "
                           f"kernel ({eqn.primitive.name}, used at {source_line(eqn)})")
    try:
        jaxpr = _jaxpr(invars, eqn.outvars, [eqn])
        Converter().convert(ClosedJaxpr(jaxpr, ()))
    except JaxprConversionError as error:
        return False, str(error)
    return True, ""


def split(closed, name: str) -> List[Part]:
    from jax.extend.core import ClosedJaxpr, Literal, Var
    jaxpr = closed.jaxpr
    runs: List[Tuple[bool, list, str]] = []
    for eqn in jaxpr.eqns:
        ok, why = _convertible(eqn)
        if ok and runs and runs[-1][0]:
            runs[-1][1].append(eqn)
        else:
            runs.append((ok, [eqn], why))
    parts = []
    names = {}
    for number, (ok, eqns, why) in enumerate(runs):
        defined = {v for e in eqns for v in e.outvars}
        reads = []
        for e in eqns:
            for v in e.invars:
                if isinstance(v, Var) and v not in defined and v not in reads:
                    reads.append(v)
        later = {v for _, es, _ in runs[number + 1:] for e in es for v in e.invars
                 if isinstance(v, Var)} | {v for v in jaxpr.outvars if not isinstance(v, Literal)}
        outs = [v for e in eqns for v in e.outvars if v in later]
        sub = ClosedJaxpr(_jaxpr(reads, outs, eqns), ())
        if not outs:      # nothing after it reads what it computes
            continue
        compiled = None
        if ok:
            examples = [_struct(v.aval) for v in reads]
            from jax.extend.core import jaxpr_as_fun
            compiled = CompiledFunction(lambda *x, sub=sub: list(jaxpr_as_fun(sub)(*x)),
                                        examples, f"part {number + 1} of {name}")
        parts.append(Part(sub, tuple(reads), tuple(outs), compiled,
                          tuple(equation_text(e, names) + (f"   at {source_line(e)}"
                                                   if source_line(e) else "") for e in eqns),
                          why))
    return parts


def _struct(aval):
    import jax
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype)


class SplitFunction:
    """Runs the parts in order; the same ``run(leaves)`` as a CompiledFunction."""

    def __init__(self, closed, name: str):
        self.closed = closed
        self.name = name
        self.parts = split(closed, name)

    def run(self, leaves):
        from jax.extend.core import Literal, jaxpr_as_fun
        jaxpr = self.closed.jaxpr
        env = dict(zip(jaxpr.constvars, self.closed.consts))
        env.update(zip(jaxpr.invars, leaves))
        for part in self.parts:
            values = [env[v] for v in part.invars]
            if part.compiled is not None:
                outs = part.compiled.run(values)
            elif part.outvars:
                outs = jaxpr_as_fun(part.closed)(*values)
            else:
                outs = []
            env.update(zip(part.outvars, outs))
        # JAX arrays of the traced dtypes, as jax.jit returns: not a literal's raw value,
        # nor an argument passed through as the caller gave it (a NumPy array, a float)
        import jax.numpy as jnp
        return [jnp.asarray(v.val if isinstance(v, Literal) else env[v], dtype=v.aval.dtype)
                for v in jaxpr.outvars]


__all__ = ["SplitFunction", "Part", "split"]
