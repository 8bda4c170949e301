"""One rule per primitive of the chain rewrite (runtime/jit_chains.py): how an equation
of the batch function is the equation of one chain, and the kind of what it makes
(runtime/jit_chain_kinds.py).  An equation on shared values only runs as written;
one that meets the chain axis in a way the rules do not know raises NotPerChain."""

from __future__ import annotations

import contextvars
import math
from typing import Callable, Dict, List, Sequence

import jax
import numpy as np

from ..frontends.jaxpr_rules import ELEMENTWISE_PRIMITIVES
from .jit_chain_kinds import (PARTIAL, SHARED, Kind, NotPerChain, Val, chain_slice, convert,
                              drop, join, literal)

# the elementwise primitives taken per chain: JAX's (frontends/jaxpr_rules.py) but the
# shifts, which no chain rule was written or tested for (an equation of them on a chain's
# values raises NotPerChain; on shared values it runs as written)
SHIFTS = frozenset({"shift_left", "shift_right_logical", "shift_right_arithmetic"})
ELEMENTWISE = frozenset(ELEMENTWISE_PRIMITIVES) - SHIFTS
# the number of chains of the candidate being interpreted (runtime/jit_chains.py sets it)
CHAINS: contextvars.ContextVar = contextvars.ContextVar("chains", default=0)
# operations linear in a partial operand, with the other operands' kinds they allow
_LINEAR_UNARY = frozenset({"neg", "copy", "copy_p", "reduce_precision"})


def bind(eqn, values, **changes) -> list:
    params = dict(eqn.params)
    params.update(changes)
    out = eqn.primitive.bind(*values, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def full_shape(eqn, k: int):
    return tuple(eqn.invars[k].aval.shape)


def _uniform_elementwise(eqn, ins) -> frozenset:
    rank = len(eqn.outvars[0].aval.shape)
    found = frozenset(range(rank))
    for val in ins:
        if np.ndim(val.value) == rank and rank:
            found &= val.kind.uniform
    return found


def shared_bind(eqn, ins) -> List[Val]:
    """The equation as written, on values the chains share."""
    outs = bind(eqn, [v.value for v in ins])
    name = eqn.primitive.name
    if name in ELEMENTWISE:
        zero = name in ("convert_element_type", "neg", "copy") and ins[0].kind.zero
        uniform = _uniform_elementwise(eqn, ins)
        return [Val(Kind(zero=zero, uniform=uniform), out) for out in outs]
    if name == "broadcast_in_dim":
        dims = eqn.params["broadcast_dimensions"]
        shape, source = eqn.params["shape"], full_shape(eqn, 0)
        uniform = {k for k in range(len(shape)) if k not in dims}
        uniform |= {dims[i] for i in range(len(source))
                    if source[i] == 1 or i in ins[0].kind.uniform}
        return [Val(Kind(zero=ins[0].kind.zero, uniform=frozenset(uniform)), outs[0])]
    if name == "transpose":
        perm = eqn.params["permutation"]
        uniform = frozenset(i for i, p in enumerate(perm) if p in ins[0].kind.uniform)
        return [Val(Kind(zero=ins[0].kind.zero, uniform=uniform), outs[0])]
    return [Val(SHARED, out) for out in outs]


def _remap(d: int, removed: int) -> int:
    return d - (d > removed)


def elementwise(eqn, ins) -> List[Val]:
    name = eqn.primitive.name
    if any(v.kind.any_of for v in ins):
        raise NotPerChain(f"{name} reads an 'any over the chains'")
    if any(v.kind.partial for v in ins):
        return [Val(PARTIAL, out) for out in _linear(eqn, ins)]
    chains = {v.kind.chain for v in ins if v.kind.chain is not None}
    if len(chains) > 1:
        raise NotPerChain(f"{name} meets values chained at axes {sorted(chains)}")
    axis = chains.pop()
    outs = bind(eqn, [chain_slice(v, axis) for v in ins])
    return [Val(Kind(chain=axis), out) for out in outs]


def _linear(eqn, ins) -> list:
    """A partial operand through an operation linear in it, or NotPerChain."""
    name = eqn.primitive.name
    values = [v.value for v in ins]
    summable = all(v.kind.partial or v.kind.zero for v in ins)
    others_shared = [v.kind.shared for v in ins if not v.kind.partial]
    ok = False
    if name in ("add", "sub", "add_any"):
        ok = summable
    elif name == "mul":
        ok = sum(v.kind.partial for v in ins) == 1 and all(others_shared)
    elif name == "div":
        ok = ins[0].kind.partial and ins[1].kind.shared
    elif name in _LINEAR_UNARY:
        ok = True
    elif name == "convert_element_type":
        ok = jax.numpy.issubdtype(eqn.params["new_dtype"], jax.numpy.inexact)
    elif name == "select_n":
        ok = ins[0].kind.shared and all(v.kind.partial or v.kind.zero for v in ins[1:])
    if not ok:
        raise NotPerChain(f"{name} reads a sum over the chains in a way not linear in it "
                          f"(it needs every chain's result)")
    return bind(eqn, values)


def broadcast_in_dim(eqn, ins) -> List[Val]:
    val = ins[0]
    if val.kind.partial:
        return [Val(PARTIAL, bind(eqn, [v.value for v in ins])[0])]
    axis = val.kind.chain
    if axis is None or len(ins) > 1:
        raise NotPerChain("broadcast_in_dim of a value of no chain form")
    dims = eqn.params["broadcast_dimensions"]
    target = dims[axis]
    shape = drop(eqn.params["shape"], target)
    new_dims = tuple(_remap(d, target) for i, d in enumerate(dims) if i != axis)
    out = bind(eqn, [val.value], shape=shape, broadcast_dimensions=new_dims)[0]
    return [Val(Kind(chain=target), out)]


def transpose(eqn, ins) -> List[Val]:
    val = ins[0]
    if val.kind.partial:
        return [Val(PARTIAL, bind(eqn, [val.value])[0])]
    perm = eqn.params["permutation"]
    axis = val.kind.chain
    new_perm = tuple(_remap(p, axis) for p in perm if p != axis)
    return [Val(Kind(chain=perm.index(axis)), bind(eqn, [val.value], permutation=new_perm)[0])]


def reshape(eqn, ins) -> List[Val]:
    val = ins[0]
    if len(ins) > 1 or eqn.params.get("dimensions") is not None:
        raise NotPerChain("a reshape with dimensions or dynamic sizes")
    if val.kind.partial:
        return [Val(PARTIAL, bind(eqn, [val.value])[0])]
    axis = val.kind.chain
    source, target = full_shape(eqn, 0), tuple(eqn.outvars[0].aval.shape)
    before, after = math.prod(source[:axis]), math.prod(source[axis + 1:])
    for place in range(len(target)):
        if math.prod(target[:place]) == before and target[place] == source[axis] and \
                math.prod(target[place + 1:]) == after:
            out = bind(eqn, [val.value], new_sizes=drop(target, place))[0]
            return [Val(Kind(chain=place), out)]
    raise NotPerChain(f"a reshape {source} -> {target} mixes the chain axis with others")


def squeeze(eqn, ins) -> List[Val]:
    val = ins[0]
    if val.kind.partial:
        return [Val(PARTIAL, bind(eqn, [val.value])[0])]
    axis, dims = val.kind.chain, eqn.params["dimensions"]
    if axis in dims:
        raise NotPerChain("a squeeze of the chain axis (one chain)")
    out = bind(eqn, [val.value], dimensions=tuple(_remap(d, axis) for d in dims))[0]
    return [Val(Kind(chain=axis - sum(d < axis for d in dims)), out)]


def reduction(eqn, ins) -> List[Val]:
    name, val = eqn.primitive.name, ins[0]
    axes = tuple(eqn.params["axes"])
    if val.kind.partial:
        if name != "reduce_sum":
            raise NotPerChain(f"{name} of a sum over the chains")
        return [Val(PARTIAL, bind(eqn, [val.value])[0])]
    if val.kind.chain is None:
        raise NotPerChain(f"{name} of a value of no chain form")
    axis = val.kind.chain
    rest = tuple(_remap(d, axis) for d in axes if d != axis)
    if axis not in axes:
        out = bind(eqn, [val.value], axes=rest)[0]
        return [Val(Kind(chain=axis - sum(d < axis for d in axes)), out)]
    if name == "reduce_sum":
        out = bind(eqn, [val.value], axes=rest)[0] if rest else val.value
        return [Val(PARTIAL, out)]
    if name == "reduce_or" and not eqn.outvars[0].aval.shape:
        out = bind(eqn, [val.value], axes=rest)[0] if rest else val.value
        return [Val(Kind(any_of=True), out)]
    raise NotPerChain(f"{name} across the chain axis (a value every chain needs)")


def dot_general(eqn, ins) -> List[Val]:
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    left, right = ins
    values = [left.value, right.value]
    if left.kind.partial or right.kind.partial:
        other = right if left.kind.partial else left
        if other.kind.shared:
            return [Val(PARTIAL, bind(eqn, values)[0])]
        raise NotPerChain("a contraction of a sum over the chains with a chained value")
    la, ra = left.kind.chain, right.kind.chain
    if la is None and ra is None:
        raise NotPerChain("dot_general of values of no chain form")
    lrank, rrank = len(full_shape(eqn, 0)), len(full_shape(eqn, 1))
    lfree = [d for d in range(lrank) if d not in lc and d not in lb]
    rfree = [d for d in range(rrank) if d not in rc and d not in rb]

    def numbers(lc2, rc2, lb2, rb2):
        return ((tuple(lc2), tuple(rc2)), (tuple(lb2), tuple(rb2)))
    if la is not None and ra is None:
        if la not in lfree:
            raise NotPerChain("a contraction over the chain axis with a shared value")
        out = bind(eqn, values, dimension_numbers=numbers(
            [_remap(d, la) for d in lc], rc, [_remap(d, la) for d in lb], rb))[0]
        return [Val(Kind(chain=len(lb) + lfree.index(la)), out)]
    if ra is not None and la is None:
        if ra not in rfree:
            raise NotPerChain("a contraction over the chain axis with a shared value")
        out = bind(eqn, values, dimension_numbers=numbers(
            lc, [_remap(d, ra) for d in rc], lb, [_remap(d, ra) for d in rb]))[0]
        return [Val(Kind(chain=len(lb) + len(lfree) + rfree.index(ra)), out)]
    for (ls, rs), batch in (((lb, rb), True), ((lc, rc), False)):
        if la in ls and rs[list(ls).index(la)] == ra:
            k = list(ls).index(la)
            kept_l = [_remap(d, la) for i, d in enumerate(ls) if i != k]
            kept_r = [_remap(d, ra) for i, d in enumerate(rs) if i != k]
            if batch:
                nums = numbers([_remap(d, la) for d in lc], [_remap(d, ra) for d in rc],
                               kept_l, kept_r)
            else:
                nums = numbers(kept_l, kept_r, [_remap(d, la) for d in lb],
                               [_remap(d, ra) for d in rb])
            out = bind(eqn, values, dimension_numbers=nums)[0]
            return [Val(Kind(chain=k) if batch else PARTIAL, out)]
    raise NotPerChain("a contraction pairs the chain axis with another axis")


def per_chain_shape(aval, kind: Kind):
    shape = tuple(aval.shape)
    return drop(shape, kind.chain) if kind.chain is not None else shape


def traced_kinds(closed, kinds: Sequence[Kind]) -> List[Kind]:
    """The output kinds of ``closed`` on inputs of ``kinds`` (traced, not run)."""
    avals = [v.aval for v in closed.jaxpr.invars]
    examples = [jax.ShapeDtypeStruct(per_chain_shape(a, k), a.dtype) for a, k in zip(avals, kinds)]
    found: list = []

    def fn(*values):
        outs = closed_interpret(closed, [Val(k, v) for k, v in zip(kinds, values)])
        found[:] = [o.kind for o in outs]
        return [o.value for o in outs]
    jax.make_jaxpr(fn)(*examples)
    return found


def carry_kinds(body, fixed: Sequence[Kind], carries: Sequence[Kind], extra: Sequence[Kind],
                count: int) -> List[Kind]:
    """The kinds a loop's carries settle at: each the join of what it starts as and what
    the body writes, until none changes."""
    avals = [v.aval for v in body.jaxpr.invars][len(fixed):len(fixed) + count]
    chains = CHAINS.get()
    # first with every shared carry that is a broadcast along an axis of the chains'
    # size held per chain (a carry JAX's batching broadcast, such as a chain's zero
    # initial state), then, where that does not hold, as they start
    hopeful = [Kind(chain=min(u for u in k.uniform if a.shape[u] == chains))
               if k.shared and any(a.shape[u] == chains for u in k.uniform) else k
               for k, a in zip(carries, avals)]
    starts = [hopeful, list(carries)] if hopeful != list(carries) else [list(carries)]
    failure = None
    for kinds in starts:
        try:
            for _ in range(8):
                outs = traced_kinds(body, list(fixed) + kinds + list(extra))[:count]
                joined = [join(k, o) for k, o in zip(kinds, outs)]
                if joined == kinds:
                    return kinds
                kinds = joined
            failure = NotPerChain("a loop's carries do not settle at one kind")
        except NotPerChain as why:
            failure = why
    raise failure


def scan(eqn, ins) -> List[Val]:
    p = eqn.params
    body, nc, ncar = p["jaxpr"], p["num_consts"], p["num_carry"]
    consts, init, xs = ins[:nc], ins[nc:nc + ncar], ins[nc + ncar:]
    inner = []
    for x in xs:
        if x.kind.chain == 0:
            raise NotPerChain("a scan runs along the chain axis")
        if x.kind.any_of:
            raise NotPerChain("a scan over an 'any over the chains'")
        if x.kind.chain is not None:
            inner.append(Kind(chain=x.kind.chain - 1))
        elif x.kind.partial:
            inner.append(PARTIAL)
        else:
            inner.append(Kind(zero=x.kind.zero,
                              uniform=frozenset(u - 1 for u in x.kind.uniform if u > 0)))
    fixed = [c.kind for c in consts]
    kinds = carry_kinds(body, fixed, [v.kind for v in init], inner, ncar)
    ys_kinds: list = []

    def step(carry, x):
        args = [Val(c.kind, c.value) for c in consts] + \
            [Val(k, v) for k, v in zip(kinds, carry)] + [Val(k, v) for k, v in zip(inner, x)]
        outs = closed_interpret(body, args)
        ys_kinds[:] = [o.kind for o in outs[ncar:]]
        return [convert(o, k) for o, k in zip(outs[:ncar], kinds)], [o.value for o in outs[ncar:]]
    start = [convert(v, k) for v, k in zip(init, kinds)]
    carry, ys = jax.lax.scan(step, start, [x.value for x in xs], length=p["length"],
                             reverse=p["reverse"], unroll=p["unroll"])
    out = [Val(k, v) for k, v in zip(kinds, carry)]
    for kind, value in zip(ys_kinds, ys):
        if kind.any_of:
            raise NotPerChain("a scan stacks an 'any over the chains'")
        if kind.chain is not None:
            kind = Kind(chain=kind.chain + 1)
        elif not kind.partial:
            kind = Kind(zero=kind.zero, uniform=frozenset(u + 1 for u in kind.uniform))
        out.append(Val(kind, value))
    return out


def while_loop(eqn, ins) -> List[Val]:
    p = eqn.params
    cond_body, body = p["cond_jaxpr"], p["body_jaxpr"]
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cond_consts, body_consts, init = ins[:nc], ins[nc:nc + nb], ins[nc + nb:]
    kinds = carry_kinds(body, [v.kind for v in body_consts], [v.kind for v in init], (),
                        len(init))
    predicate = traced_kinds(cond_body, [v.kind for v in cond_consts] + kinds)[0]
    if predicate.any_of:
        raise NotPerChain("a while loop runs until no chain is left (a trip count per "
                          "chain)")
    if predicate.chain is not None and not all(k.chain is not None for k in kinds):
        raise NotPerChain("a while loop whose condition is per chain carries a shared value")
    if not predicate.shared and predicate.chain is None:
        raise NotPerChain(f"a while loop's condition is {predicate.describe()}")
    # a condition chained at its only axis: JAX's while over a batch of predicates runs
    # each chain until its own is false (a carry of a finished chain stays): the chain's
    # own loop on its own predicate

    def keep_going(carry):
        return closed_interpret(cond_body, list(cond_consts) +
                                [Val(k, v) for k, v in zip(kinds, carry)])[0].value

    def step(carry):
        outs = closed_interpret(body, list(body_consts) +
                                [Val(k, v) for k, v in zip(kinds, carry)])
        return [convert(o, k) for o, k in zip(outs, kinds)]
    outs = jax.lax.while_loop(keep_going, step, [convert(v, k) for v, k in zip(init, kinds)])
    return [Val(k, v) for k, v in zip(kinds, outs)]


def cond(eqn, ins) -> List[Val]:
    index, operands = ins[0], ins[1:]
    if not index.kind.shared:
        raise NotPerChain("a cond whose branch differs per chain")
    branches = eqn.params["branches"]
    kinds = None
    for branch in branches:
        outs = traced_kinds(branch, [v.kind for v in operands])
        kinds = outs if kinds is None else [join(a, b) for a, b in zip(kinds, outs)]

    def branch_fn(branch):
        def run(*values):
            outs = closed_interpret(branch, [Val(v.kind, x) for v, x in zip(operands, values)])
            return [convert(o, k) for o, k in zip(outs, kinds)]
        return run
    outs = jax.lax.switch(index.value, [branch_fn(b) for b in branches],
                          *[v.value for v in operands])
    return [Val(k, v) for k, v in zip(kinds, outs)]


def inline(key: str) -> Callable:
    def rule(eqn, ins) -> List[Val]:
        inner = eqn.params[key]
        if hasattr(inner, "jaxpr"):
            return closed_interpret(inner, ins)
        return interpret(inner, [], ins)
    return rule


RULES: Dict[str, Callable] = {
    "broadcast_in_dim": broadcast_in_dim, "transpose": transpose, "reshape": reshape,
    "squeeze": squeeze, "dot_general": dot_general, "scan": scan, "while": while_loop,
    "cond": cond, "jit": inline("jaxpr"), "pjit": inline("jaxpr"),
    "closed_call": inline("call_jaxpr"), "core_call": inline("call_jaxpr"),
    "custom_jvp_call": inline("call_jaxpr"), "custom_vjp_call": inline("call_jaxpr"),
    "custom_vjp_call_jaxpr": inline("fun_jaxpr"), "checkpoint": inline("jaxpr"),
    "remat": inline("jaxpr"),
}
for _name in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
              "reduce_or", "argmax", "argmin"):
    RULES[_name] = reduction
_CALLS = frozenset({"jit", "pjit", "closed_call", "core_call", "custom_jvp_call",
                    "custom_vjp_call", "custom_vjp_call_jaxpr", "checkpoint", "remat"})


def apply(eqn, ins: Sequence[Val]) -> List[Val]:
    name = eqn.primitive.name
    if all(v.kind.shared for v in ins) and name not in _CALLS:
        return shared_bind(eqn, ins)
    if name in ELEMENTWISE:
        return elementwise(eqn, ins)
    rule = RULES.get(name)
    if rule is None:
        kinds = ", ".join(sorted({v.kind.describe() for v in ins}))
        raise NotPerChain(f"{name} of {kinds} values (no rule takes it per chain)")
    return rule(eqn, ins)


def interpret(jaxpr, consts: Sequence[Val], args: Sequence[Val]) -> List[Val]:
    """Runs ``jaxpr`` (an open jaxpr) on one chain's values, tracing the one-chain
    computation; every equation through its rule."""
    from jax.extend.core import Literal
    env = {}

    def read(atom) -> Val:
        if isinstance(atom, Literal):
            return literal(atom.val)
        return env[atom]
    for var, val in zip(jaxpr.constvars, consts):
        env[var] = val
    for var, val in zip(jaxpr.invars, args):
        env[var] = val
    for eqn in jaxpr.eqns:
        outs = apply(eqn, [read(atom) for atom in eqn.invars])
        for var, val in zip(eqn.outvars, outs):
            env[var] = val
    return [read(atom) for atom in jaxpr.outvars]


def closed_interpret(closed, args: Sequence[Val]) -> List[Val]:
    consts = [literal(c) if np.ndim(c) == 0 else Val(SHARED, c) for c in closed.consts]
    return interpret(closed.jaxpr, consts, args)


__all__ = ["ELEMENTWISE", "RULES", "apply", "bind", "carry_kinds", "closed_interpret",
           "interpret", "traced_kinds"]
