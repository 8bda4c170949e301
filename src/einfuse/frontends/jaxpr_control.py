"""Rules for control flow and call wrappers: ``scan``, ``while``, ``cond`` become a
:class:`Loop` or :class:`Switch` inside the one generated kernel (carries in buffers, the
body's statements as loop nests inside a C loop over steps); ``pjit``, ``closed_call``,
``custom_jvp_call``, ``custom_vjp_call`` and ``checkpoint`` are inlined."""

from __future__ import annotations

from ..ir import (INDEX, Affine, Apply, Const, Index, Loop, LoopKind, ReduceOp, Reduction,
                  ScalarType, Select, Switch)
from .jaxpr_values import Value, constant_value, index_add, read_value, scalar_type, unsupported


def closed_consts(conv, closed):
    """Values for a ClosedJaxpr's constants: scalars as literals, arrays as inputs."""
    import numpy as np
    values = []
    jaxpr = getattr(closed, "jaxpr", closed)    # (a Jaxpr is its own .jaxpr in jax 0.11)
    for var, const in zip(jaxpr.constvars, getattr(closed, "consts", ())):
        array = np.asarray(const)
        dtype = scalar_type(var.aval)
        if array.shape == ():
            values.append(constant_value(array, dtype))
        else:
            values.append(read_value(conv.constant_buffer(array, dtype), 0))
    return values


def _inline(param_names):
    def rule(conv, eqn, invals, level):
        for name in param_names:
            sub = eqn.params.get(name)
            if sub is not None:
                break
        else:
            raise unsupported(eqn, "no jaxpr to inline")
        jaxpr = getattr(sub, "jaxpr", sub)
        count = len(jaxpr.invars)
        if len(getattr(sub, "consts", ())) == len(jaxpr.constvars):
            consts = closed_consts(conv, sub)
        else:
            # an open jaxpr (jax 0.11 merged ClosedJaxpr into Jaxpr: one whose consts
            # are not attached) takes its constvars' values ahead of its arguments
            consts = list(invals[len(invals) - count - len(jaxpr.constvars):
                                 len(invals) - count])
            if len(consts) != len(jaxpr.constvars):
                raise unsupported(eqn, "constants of a sub-jaxpr that are not passed")
        return conv.run_jaxpr(jaxpr, consts, invals[len(invals) - count:])
    return rule


def scan_layout(eqn) -> tuple:
    """``(consts, carries)``: how many of a scan's operands are loop invariants and how
    many carries (the rest are the scanned ``xs``; its results are the carries, then the
    stacked ``ys``).  jax <= 0.10 says so in ``num_consts``/``num_carry``; jax 0.11 in
    flat trees, ``ft_in`` of ``(consts, carries, xs)`` and ``ft_out`` of ``(carries,
    ys)``, whose parts are read here by filling them with operand positions."""
    params = eqn.params
    if "num_consts" in params and "num_carry" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    n_in, n_out = len(eqn.invars), len(eqn.outvars)
    try:
        consts, carries, xs = (list(part) for part in
                               params["ft_in"].update(tuple(range(n_in))).unpack())
        carries_out, ys = (list(part) for part in
                           params["ft_out"].update(tuple(range(n_out))).unpack())
    except (KeyError, AttributeError, TypeError, ValueError, AssertionError):
        raise unsupported(eqn, "a scan whose operands this einfuse cannot tell apart "
                          f"(parameters {sorted(params)})") from None
    if consts + carries + xs != list(range(n_in)) or \
            carries_out + ys != list(range(n_out)) or len(carries_out) != len(carries):
        raise unsupported(eqn, "a scan whose operands are not in the order consts, "
                          "carries, xs")
    return len(consts), len(carries)



def _carries(conv, initial, level):
    buffers = []
    for value in initial:
        buffer = conv.new_buffer(value.shape, value.dtype, "c")
        conv.write(buffer.name, (), value, conv.level, "loop carry (initial value)")
        buffers.append(buffer)
    return buffers


def _updates(conv, carries, news):
    """The (carry, new) copies that end a step; a new value that is not already in a
    buffer of its own (or is another carry: a swap) is computed into one first."""
    carry_names = {b.name for b in carries}
    pairs = []
    for buffer, value in zip(carries, news):
        if value.buffer == buffer.name:
            continue
        if value.buffer is None or value.buffer in carry_names:
            temp = conv.new_buffer(value.shape, value.dtype, "n")
            conv.write(temp.name, (), value, conv.level, "next carry")
            pairs.append((buffer.name, temp.name))
        else:
            pairs.append((buffer.name, value.buffer))
    return tuple(pairs)


def scan(conv, eqn, invals, level):
    params = eqn.params
    body = params["jaxpr"]
    n_consts, n_carry = scan_layout(eqn)
    length = int(params["length"])
    consts = invals[:n_consts]
    carries = _carries(conv, invals[n_consts:n_consts + n_carry], level)
    xs = [conv.materialize(v) if v.compound else v for v in invals[n_consts + n_carry:]]
    ys_avals = [v.aval for v in eqn.outvars[n_carry:]]
    ys = [conv.new_buffer(tuple(a.shape), scalar_type(a, eqn), "ys") for a in ys_avals]
    counter = conv.fresh("s")
    step = Index(counter)
    if params.get("reverse"):
        step = index_add(Const(length - 1, INDEX), Apply("mul", (step, Const(-1, INDEX)), INDEX))
    conv.blocks.append([])
    inner = conv.level
    carry_values = [read_value(b, inner) for b in carries]
    slices = [Value(x.shape[1:], x.dtype, lambda subs, x=x: x.at((step,) + tuple(subs)),
                    inner, False) for x in xs]
    outs = conv.run_jaxpr(body.jaxpr, closed_consts(conv, body),
                          list(consts) + carry_values + slices)
    for buffer, value in zip(ys, outs[n_carry:]):
        conv.write(buffer.name, (step,), value, inner, "stacked output (ys)")
    updates = _updates(conv, carries, outs[:n_carry])
    steps = tuple(conv.blocks.pop())
    conv.emit(conv.level, Loop(counter, Affine(const=length), LoopKind.SCAN, steps,
                               updates=updates, origin=f"scan of length {length}"))
    return [read_value(b, conv.level) for b in carries] + \
        [read_value(b, conv.level) for b in ys]


def while_loop(conv, eqn, invals, level):
    params = eqn.params
    cond, body = params["cond_jaxpr"], params["body_jaxpr"]
    nc, nb = params["cond_nconsts"], params["body_nconsts"]
    cond_consts, body_consts = invals[:nc], invals[nc:nc + nb]
    carries = _carries(conv, invals[nc + nb:], level)
    conv.blocks.append([])
    inner = conv.level
    (test,) = conv.run_jaxpr(cond.jaxpr, closed_consts(conv, cond),
                             list(cond_consts) + [read_value(b, inner) for b in carries])
    if test.shape:
        # a batched predicate (a vmapped while): as XLA runs it, the loop goes on while
        # any element's holds, and a step updates only the carries of those elements
        if any(tuple(b.shape[:len(test.shape)]) != test.shape for b in carries):
            raise unsupported(eqn, "a batched predicate that is not a prefix of the carries")
        test = conv.materialize(test)
        condition = _any(conv, test).at(())
    else:
        condition = test.at(())
    condition_steps = tuple(conv.blocks.pop())
    conv.blocks.append([])
    olds = [read_value(b, inner) for b in carries]
    outs = conv.run_jaxpr(body.jaxpr, closed_consts(conv, body), list(body_consts) + olds)
    if test.shape:   # the predicate's buffer still holds this step's values
        outs = [_where(test, new, old) for new, old in zip(outs, olds)]
    updates = _updates(conv, carries, outs)
    steps = tuple(conv.blocks.pop())
    conv.emit(conv.level, Loop(conv.fresh("s"), None, LoopKind.WHILE, steps,
                               condition_steps=condition_steps, condition=condition,
                               updates=updates, origin="while_loop"))
    return [read_value(b, conv.level) for b in carries]


def _any(conv, test: Value) -> Value:
    """``any(test)``: a boolean scalar computed in the current block."""
    def reduction_of(_subs):
        names = [conv.fresh("r") for _ in test.shape]
        return Reduction(ReduceOp.OR, tuple(zip(names, test.shape)),
                         test.at(tuple(Index(n) for n in names)))
    return conv.reduce_into((), ScalarType.BOOL, conv.level, reduction_of)


def _where(test: Value, new: Value, old: Value) -> Value:
    """``new`` where ``test`` (over the leading axes) holds, else ``old``."""
    rank = len(test.shape)
    return Value(old.shape, old.dtype, lambda subs: Select(
        test.at(tuple(subs[:rank])), (old.at(tuple(subs)), new.at(tuple(subs))), old.dtype),
        old.level, True)


def cond(conv, eqn, invals, level):
    which, *operands = invals
    branches = eqn.params["branches"]
    results = [conv.new_buffer(tuple(v.aval.shape), scalar_type(v.aval, eqn), "b")
               for v in eqn.outvars]
    which = conv.cheap(which)
    bodies = []
    saved_floor = conv.floor
    for branch in branches:
        conv.blocks.append([])
        conv.floor = conv.level      # work inside a branch stays inside it
        try:
            outs = conv.run_jaxpr(branch.jaxpr, closed_consts(conv, branch), operands)
            for buffer, value in zip(results, outs):
                conv.write(buffer.name, (), value, conv.level, "branch result")
        finally:
            conv.floor = saved_floor
        bodies.append(tuple(conv.blocks.pop()))
    conv.emit(conv.level, Switch(which.at(()), tuple(bodies),
                                 origin=f"cond of {len(branches)} branches"))
    return [read_value(b, conv.level) for b in results]


def einfuse_kernel(conv, eqn, invals, level):
    """Another ``ef.jit`` function called inside this one (``ef.jit(g)`` where ``g``
    calls ``ef.jit(f)``, or ``ef.explain`` of such a ``g``): its kernel is one
    primitive, ``einfuse_jit``, whose function holds the jaxpr it was converted from;
    that jaxpr is inlined, so the whole of ``g`` is one program."""
    closed = getattr(eqn.params.get("function"), "closed", None)
    if closed is None:
        raise unsupported(eqn, "a kernel without its jaxpr")
    return _inline(("jaxpr",))(conv, _Params(eqn, {"jaxpr": closed}), invals, level)


class _Params:
    """``eqn`` with other params (its primitive and source info unchanged)."""

    def __init__(self, eqn, params):
        self._eqn, self.params = eqn, params

    def __getattr__(self, name):
        return getattr(self._eqn, name)


RULES = {
    "pjit": _inline(("jaxpr",)), "jit": _inline(("jaxpr",)),
    "closed_call": _inline(("call_jaxpr",)), "core_call": _inline(("call_jaxpr",)),
    "custom_jvp_call": _inline(("call_jaxpr",)),
    "custom_vjp_call": _inline(("call_jaxpr", "fun_jaxpr")),
    "custom_vjp_call_jaxpr": _inline(("fun_jaxpr", "call_jaxpr")),
    "checkpoint": _inline(("jaxpr",)), "remat": _inline(("jaxpr",)),
    "remat2": _inline(("jaxpr",)),      # jax.checkpoint's primitive
    "scan": scan, "while": while_loop, "cond": cond,
    "custom_vmap_call": _inline(("call", "call_jaxpr")), "einfuse_jit": einfuse_kernel,
}
