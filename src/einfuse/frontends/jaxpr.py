"""The jaxpr front end of ``ef.jit``: a ``ClosedJaxpr`` becomes a :class:`JitProgram`.

Every jaxpr variable is held as a :class:`Value`: a function from subscripts (integer
:class:`Expr` s, one per axis) to the element's expression.  Elementwise equations, and
those that only move elements (broadcast, reshape, transpose, slice, gather ...), compose
these functions, so a chain of them becomes one expression - one statement, no
intermediate array.  A value is *materialised* (an :class:`Assign` into a buffer) where
recomputing it would cost: a reduction or contraction, a compound value read more than
once, read by a broadcast or contraction that would recompute each element many times,
or read inside a loop that it does not depend on.

Levels implement hoisting: each block of steps (the top level, a loop body, a cond
branch) has a depth, and every value records the deepest block it depends on.  A value
that does not depend on a loop's carries or counter has a lower level than the loop's
body and is materialised in the block it belongs to, before the loop: loop-invariant
work such as ``softplus(w)`` runs once.  Cond branches raise the floor instead, so that
work inside a branch stays there.

One rule per primitive lives in ``jaxpr_rules.RULES`` (elementwise) and
``jaxpr_structural.RULES`` (shapes, reductions, gathers, loops)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from ..ir import Apply, Assign, Buffer, Expr, Index, JitProgram, ScalarType, Step
from ..lang.fresh_names import FreshNames
from .jaxpr_values import (ADVICE, JaxprConversionError, Value, constant_value, read_value,
                           scalar_type, source_line)
from .jaxpr_control import closed_consts
from .jaxpr_rules import rule_for


def _located(error: "JaxprConversionError", eqn) -> "JaxprConversionError":
    """``error`` from inside a call wrapper (jnp.sort's own jit, say) whose equations
    carry JAX's source lines: the wrapper's line is the user's."""
    where = source_line(eqn)
    if getattr(error, "located", True) or not where:
        return error
    message = error.message.replace(ADVICE, f", used at {where}" + ADVICE)
    located = JaxprConversionError(message)
    located.located = True
    return located


# The most equations composed into one value before it is computed into a buffer.  A
# value's elements are built by calling the functions of the values it is made of, and
# its expression is rendered by walking it: both recurse once per equation, so a chain of
# 600 elementwise operations (``for _ in range(600): x = jnp.tanh(x)``) exhausted
# Python's recursion limit.  Cut every MAX_COMPOSED equations, such a chain costs one
# array written and read again per 100 operations.
MAX_COMPOSED = 100


class Converter:
    """Converts one traced function; ``convert(closed_jaxpr)`` gives the program."""

    def __init__(self):
        self.buffers: Dict[str, Buffer] = {}
        self.blocks: List[List[Step]] = [[]]
        self.floor = 0
        self.names_made = FreshNames()    # the converter's names: t1, i2, s3 ...
        self.mapping: List[Tuple[str, Tuple[str, ...]]] = []   # (equation, its outvars)
        self.homes: Dict[str, str] = {}    # jaxpr variable -> the buffer that holds it
        self.names: Dict[int, str] = {}    # id of a jaxpr variable -> its name here
        self.uses: Dict[object, int] = {}
        self.current_eqn = None
        self.constants: List[Tuple[str, object]] = []   # (input buffer, array)

    # -- names and buffers ---------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        return self.names_made.numbered(prefix)

    def new_buffer(self, shape, dtype: ScalarType, prefix: str = "t") -> Buffer:
        buffer = Buffer(self.fresh(prefix), dtype, shape=tuple(int(d) for d in shape))
        self.buffers[buffer.name] = buffer
        return buffer

    def index_names(self, shape) -> Tuple[Tuple[str, int], ...]:
        return tuple((self.fresh("i"), int(extent)) for extent in shape)

    @property
    def level(self) -> int:
        return len(self.blocks) - 1

    def emit(self, level: int, step: Step) -> None:
        self.blocks[level].append(step)

    # -- materialising ---------------------------------------------------------------------
    def materialize(self, value: Value, origin: str = "") -> Value:
        """``value`` computed into a buffer of its own, in the block of its level."""
        if value.buffer is not None:
            return value
        buffer = self.new_buffer(value.shape, value.dtype)
        self.write(buffer.name, (), value, value.level, origin)
        if value.var is not None:
            self.homes.setdefault(value.var, buffer.name)
        return read_value(buffer, value.level)

    def write(self, buffer: str, prefix: Tuple[Expr, ...], value: Value, level: int,
              origin: str = "") -> None:
        """``buffer[prefix..., :] := value`` as a step of block ``level``."""
        indices = self.index_names(value.shape)
        element = value.at(tuple(Index(name) for name, _ in indices))
        self.emit(level, Assign(buffer, prefix, indices, element, origin=origin or
                                self.origin()))

    def reduce_into(self, shape, dtype: ScalarType, level: int, reduction_of) -> Value:
        """A new buffer ``out[i...] := reduction`` where ``reduction_of(out_subs)`` builds
        the :class:`Reduction` for one output element."""
        buffer = self.new_buffer(shape, dtype)
        indices = self.index_names(shape)
        reduction = reduction_of(tuple(Index(name) for name, _ in indices))
        self.emit(level, Assign(buffer.name, (), indices, None, reduction,
                                origin=self.origin()))
        return read_value(buffer, level)

    def origin(self) -> str:
        eqn = self.current_eqn
        return "" if eqn is None else equation_text(eqn, self.names)

    def cheap(self, value: Value) -> Value:
        """``value``, materialised first if it is compound: for readers that would
        compute each of its elements many times."""
        return self.materialize(value) if value.compound else value

    # -- walking jaxprs ----------------------------------------------------------------------
    def lookup(self, env, var) -> Value:
        from jax.extend.core import Literal
        if isinstance(var, Literal):
            return constant_value(var.val, scalar_type(var.aval), var.aval.shape)
        return env[var]

    def constant_buffer(self, array, dtype: ScalarType) -> Buffer:
        """An array constant of the jaxpr: one more input of the kernel."""
        buffer = Buffer(f"k{len(self.constants)}", dtype, shape=tuple(array.shape))
        self.buffers[buffer.name] = buffer
        self.constants.append((buffer.name, array))
        return buffer

    def run_jaxpr(self, jaxpr, consts: Sequence[Value], args: Sequence[Value]) -> List[Value]:
        """Convert ``jaxpr``'s equations with its constvars and invars bound; returns the
        values of its outvars."""
        from jax.extend.core import Literal
        env = {}
        for var, value in zip(jaxpr.constvars, consts):
            env[var] = value
        for var, value in zip(jaxpr.invars, args):
            env[var] = value
        uses: Dict[object, int] = {}
        for eqn in jaxpr.eqns:
            for var in eqn.invars:
                if not isinstance(var, Literal):
                    uses[var] = uses.get(var, 0) + 1
        for var in jaxpr.outvars:
            if not isinstance(var, Literal):
                uses[var] = uses.get(var, 0) + 1
        for eqn in jaxpr.eqns:
            try:
                self.equation(env, uses, eqn)
            except JaxprConversionError as error:
                located = _located(error, eqn)
                if located is error:
                    raise
                raise located from None
        return [self.lookup(env, var) for var in jaxpr.outvars]

    def equation(self, env, uses, eqn) -> None:
        """Apply ``eqn``'s rule; a compound result read more than once is materialised."""
        rule = rule_for(eqn)
        invals = [self.lookup(env, var) for var in eqn.invars]
        level = max([self.floor] + [v.level for v in invals])
        for k, (var, value) in enumerate(zip(eqn.invars, invals)):
            if value.compound and value.level < level:
                # an outer value read inside a loop or branch: computed once, outside
                invals[k] = env[var] = self.materialize(value)
        previous, self.current_eqn = self.current_eqn, eqn
        try:
            outs = rule(self, eqn, invals, level)
        finally:
            self.current_eqn = previous
        depth = 1 + max((v.depth for v in invals if v.buffer is None), default=0)
        for var, value in zip(eqn.outvars, outs):
            if value.buffer is None:
                value.depth = max(value.depth, depth)
            if value.compound and uses.get(var, 0) > 1 or \
                    value.buffer is None and value.depth > MAX_COMPOSED:
                value = self.materialize(value, equation_text(eqn, self.names))
            if value.var is None and not isinstance(var, type(None)):
                value.var = var_name(var, self.names)
            env[var] = value
        for var, value in zip(eqn.outvars, outs):
            if env[var].buffer is not None:
                self.homes.setdefault(var_name(var, self.names), env[var].buffer)
        self.mapping.append((equation_text(eqn, self.names),
                             tuple(var_name(v, self.names) for v in eqn.outvars)))

    def convert(self, closed) -> JitProgram:
        """The program of ``closed`` (a ClosedJaxpr): inputs ``x0, x1, ...`` (the flat
        arguments), outputs ``y0, y1, ...``."""
        jaxpr = closed.jaxpr
        inputs = []
        args = []
        for number, var in enumerate(jaxpr.invars):
            buffer = Buffer(f"x{number}", scalar_type(var.aval), shape=tuple(var.aval.shape))
            self.buffers[buffer.name] = buffer
            inputs.append(buffer.name)
            args.append(read_value(buffer, 0))
        consts = closed_consts(self, closed)
        outs = self.run_jaxpr(jaxpr, consts, args)
        outputs = []
        for number, value in enumerate(outs):
            buffer = Buffer(f"y{number}", value.dtype, shape=tuple(value.shape))
            self.buffers[buffer.name] = buffer
            self.write(buffer.name, (), value, 0, "output")
            outputs.append(buffer.name)
        inputs += [name for name, _ in self.constants]
        return JitProgram(tuple(self.buffers.values()), tuple(inputs), tuple(outputs),
                          tuple(self.blocks[0]),
                          tuple((text, ", ".join(self.homes.get(v, "inline") for v in outs))
                                for text, outs in self.mapping),
                          tuple(self.constants))


def var_name(var, names: Dict[int, str]) -> str:
    """A short name for a jaxpr variable ('v12', numbered in order of first mention in
    ``names``, so the same function always gets the same names and the same C source),
    or a literal's value."""
    from jax.extend.core import Literal
    if isinstance(var, Literal):
        return repr(var.val.item()) if hasattr(var.val, "item") else repr(var.val)
    return names.setdefault(id(var), f"v{len(names)}")


def equation_text(eqn, names: Dict[int, str]) -> str:
    """One line for ``eqn``: ``v3:f32[3] = mul v1 v2`` (sub-jaxprs left out)."""
    outs = " ".join(f"{var_name(v, names)}:{v.aval.str_short()}" for v in eqn.outvars)
    ins = " ".join(var_name(v, names) for v in eqn.invars)
    return f"{outs} = {eqn.primitive.name} {ins}".strip()


def convert(closed) -> JitProgram:
    return Converter().convert(closed)


