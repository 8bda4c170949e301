"""Programs: several statements, where a name defined with ':=' is an intermediate that
later statements read (programs.md section 1).

Each statement is a v1 :class:`~einfuse.runtime.kernel.Kernel` (its own analysis, plan
and compiled kernel, with its loop-invariant reductions hoisted); intermediates are
arrays of the caller's framework, so PyTorch autograd and jax.grad, jit and vmap work
through a program as they do through its statements.  The scheduler
(schedule/fusion.py) runs consecutive statements over the same rows as one C kernel
for NumPy callers; ``explain`` shows those kernels and every materialised
intermediate."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

from ..analysis.options import Options, option_error, shown
from ..errors import (EinfuseError, EinfuseNameError, EinfuseSyntaxError, MissingArgumentError,
                      UnexpectedArgumentError, attach_statement, did_you_mean)
from ..runtime.attention import program_attention, run_fused_attention
from ..analysis.frameworks import common_framework, from_numpy, has_dtensor, torch_compiling
from ..runtime.signatures import signature_of
from ..runtime.run_groups import run_statements
from ..lang.split import StatementText, split_program
from ..rewrite.canonical import canonical_program
from ..lang.printer import format_statement
from .writes import guarded_names, keep_contents, restore_contents
from ..analysis.spec import spec_of
from ..runtime.distributed import run_on_dtensors
from ..runtime.tracing import traced_call


@dataclass(frozen=True)
class ProgramStatement:
    kernel: object          # the statement's Kernel
    source: StatementText

    @property
    def output(self) -> str:
        return self.kernel.spec.output

    @property
    def assign(self) -> str:
        return self.kernel.spec.assign

    @property
    def reads(self) -> Tuple[str, ...]:
        """Names the statement reads: its tensors and scalars, and for '+=' its output."""
        spec = self.kernel.spec
        return spec.arg_order + ((spec.output,) if spec.assign == "+=" else ())


class Program:
    """A compiled program: call it with its inputs (and the arrays that '='/'+='
    statements write into) by keyword, or positionally in order of first use."""

    def __init__(self, source: str, statements: Sequence[ProgramStatement],
                 outputs: Tuple[str, ...], options: Optional[Options] = None,
                 inputs: Optional[Tuple[str, ...]] = None,
                 written: Optional[Sequence[ProgramStatement]] = None):
        self.source = source
        self.options = options if options is not None else Options()
        # the online-softmax rewrite of the whole program (rewrite/online_softmax.py)
        self.attention = program_attention([s.kernel.spec for s in statements], outputs) \
            if options is not None else None
        self.statements = tuple(statements)
        self.outputs = outputs
        # positional arguments take the inputs in their order of first use as written
        # (``inputs``, where the statements run in another order)
        self.inputs = inputs if inputs is not None else _input_order(self.statements)
        # the intermediates as written (``written``: the statements before the canonical
        # form, which may compute one inside its reader instead)
        self._written = tuple(written) if written is not None else self.statements
        self.intermediates = tuple(s.output for s in self._written if s.assign == ":=")
        self._kernels = tuple(s.kernel for s in self.statements)
        # arrays written by '='/'+=' with statements still to follow (program/writes.py)
        self._guarded = guarded_names(self._kernels)
        self._runs: dict = {}       # prepared runs by call signature (schedule/fusion.py)

    def __repr__(self) -> str:
        return (f"<einfuse.Program of {len(self.statements)} statements | takes "
                f"{', '.join(self.inputs) or 'no inputs'} | returns {', '.join(self.outputs)}>")

    def __call__(self, /, *args, arrays=None, **kwargs):
        if torch_compiling():
            return traced_call(self, args, kwargs, arrays)
        # a repeated call under autograd (program/autograd.py): by keyword, with the
        # names, shapes, dtypes and strides of a call whose checks passed before
        recorded_calls = self.__dict__.get("_recorded_calls")
        if recorded_calls and not args and arrays is None and self.attention is None:
            prepared = recorded_calls.get(signature_of(kwargs))
            results = prepared.apply(kwargs) if prepared is not None else None
            if results is not None:
                return results[0] if len(results) == 1 else results
        env = self._named(args, kwargs, arrays)
        if has_dtensor((), env):     # torch.distributed.tensor: docs/sharding.md
            return run_on_dtensors(self, env)
        try:     # one framework per call, even where no statement reads two of them
            framework = common_framework(env)
        except EinfuseError as error:
            raise attach_statement(error, self.source) from None
        if self.attention is not None and framework in ("numpy", "torch"):
            fused = run_fused_attention(self.attention, env, self.options, framework)
            if fused is not None:
                return from_numpy(fused, framework)
        if framework == "torch":     # one autograd node for the whole program
            from ..runtime.program_autograd import recorded
            results = recorded(self, self._kernels, env, self.outputs, self.options)
            if results is not None:
                return results[0] if len(results) == 1 else results
        elif framework == "jax":     # one differentiable function, its backward fused
            from ..runtime import jax_program
            results = jax_program.recorded(self, self._kernels, env, self.outputs,
                                           self.options)
            if results is not None:
                return results[0] if len(results) == 1 else results
        kept = keep_contents(env, self._guarded) if self._guarded else None
        try:
            run_statements(self._kernels, env, framework, keep=set(self.outputs),
                           runs=self._runs)
        except BaseException:
            if kept:       # nothing written when an error is raised
                restore_contents(kept)
            raise
        results = tuple(env[name] for name in self.outputs)
        return results[0] if len(results) == 1 else results

    def _named(self, args, kwargs, arrays) -> Dict[str, object]:
        if len(args) > len(self.inputs):
            raise UnexpectedArgumentError(
                f"the program takes {len(self.inputs)} inputs ({', '.join(self.inputs)}), "
                f"not {len(args)} positional arguments")
        named = dict(zip(self.inputs, args))
        for extra in (kwargs, arrays or {}):
            for name, value in extra.items():
                if name in named:
                    raise UnexpectedArgumentError(f"{name} is given twice")
                named[name] = value
        for name in named:
            if name in self.intermediates:
                where = next(i for i, s in enumerate(self._written, 1)
                             if s.assign == ":=" and s.output == name)
                raise UnexpectedArgumentError(
                    f"{name} is computed by the program (statement {where}: "
                    f"{self._written[where - 1].source.text}); it cannot be passed")
            if name not in self.inputs:
                raise UnexpectedArgumentError(
                    f"the program has no input {name}{did_you_mean(name, self.inputs)}; it "
                    f"takes {', '.join(self.inputs)}")
        missing = [name for name in self.inputs if name not in named]
        if missing:
            raise MissingArgumentError(f"the program needs {', '.join(missing)} "
                                       f"(its inputs are {', '.join(self.inputs)})")
        return named


def is_program(source, outputs) -> bool:
    """Whether ``source`` is compiled as a program rather than one v1 statement."""
    return outputs is not None or (isinstance(source, str) and
                                   len(split_program(source)) > 1)


def compile_program(source: str, options: Options, outputs, make_kernel) -> Program:
    """Split, compile each statement (``make_kernel(text, options)``) and check the
    program's names: an intermediate is defined once and only read after its
    definition; ``outputs`` name defined tensors."""
    pieces = split_program(source)
    if not pieces:
        raise EinfuseSyntaxError("the program has no statements")
    statements = []
    for piece in pieces:
        spec_options = _options_for(piece.text, options)
        statements.append(ProgramStatement(make_kernel(piece.text, spec_options), piece))
    _check_ranges_used(options, statements)
    definitions: Dict[str, list] = {}       # the numbers of the ':=' defining each name
    for number, statement in enumerate(statements, 1):
        if statement.assign == ":=":
            definitions.setdefault(statement.output, []).append(number)
    defined: Dict[str, int] = {}
    for number, statement in enumerate(statements, 1):
        spec = statement.kernel.spec
        for name in statement.reads:
            if name in defined:
                continue
            numbers = definitions.get(name, ())
            later = next((n for n in numbers if n > number), None) if numbers else None
            if later is not None:
                raise attach_statement(EinfuseNameError(
                    f"{name} is read here but defined later, by statement {later}; a "
                    "statement reads only intermediates defined before it"),
                    statement.source.text)
        if statement.assign == ":=":
            if spec.output in defined:
                raise attach_statement(EinfuseNameError(
                    f"{spec.output} is defined twice (statements {defined[spec.output]} and "
                    f"{number}); each intermediate is defined once",
                    span=spec.statement.output_span), statement.source.text)
            defined[spec.output] = number
        elif spec.output in defined:
            raise attach_statement(EinfuseNameError(
                f"'{spec.assign}' writes into {spec.output}, an intermediate defined by "
                f"statement {defined[spec.output]}; write into a new name with ':='",
                span=spec.statement.output_span), statement.source.text)
    chosen = _outputs(statements, outputs)
    return Program(source, _canonical(statements, chosen, options, make_kernel), chosen,
                   options, inputs=_input_order(statements), written=statements)


def _canonical(statements, outputs, options: Options, make_kernel):
    """The program's statements in canonical form (rewrite/canonical.py), compiled as the
    written ones were; the written ones where nothing changes or where the canonical
    form does not compile (it is then not the program's: the written form decides)."""
    specs = [s.kernel.spec for s in statements]
    form = canonical_program([(spec.statement, spec.rhs) for spec in specs], outputs,
                             plain_ranges=not options.ranges and options.pad is None,
                             options=options.rewrite_options)
    if not form.changed:
        return statements
    try:
        rewritten = []
        for statement, origin, changed in zip(form.statements, form.origins,
                                              form.rewritten):
            if not changed:      # compiled already, as written
                rewritten.append(statements[origin])
                continue
            text = format_statement(statement)
            written = statements[origin].source
            rewritten.append(ProgramStatement(
                make_kernel(text, _options_for(text, options)),
                dataclasses.replace(written, text=text)))
    except EinfuseError:
        return statements
    # the same inputs (the program takes them in their order as written, whatever the
    # order the statements run in)
    return rewritten if set(_input_order(rewritten)) == set(_input_order(statements)) \
        else statements


def _input_order(statements) -> Tuple[str, ...]:
    defined = {s.output for s in statements if s.assign == ":="}
    order: Dict[str, None] = {}
    for statement in statements:
        for name in statement.reads + ((statement.output,) if statement.assign != ":="
                                       else ()):
            if name not in defined:
                order.setdefault(name)
    return tuple(order)


def _options_for(text: str, options: Options) -> Options:
    """The program's options for one statement: ranges= entries of its own indices."""
    if not options.ranges:
        return options
    indices = spec_of(text).all_indices
    own = tuple((name, bounds) for name, bounds in options.ranges if name in indices)
    return dataclasses.replace(options, ranges=own)


def _check_ranges_used(options: Options, statements) -> None:
    used = {i for s in statements for i in s.kernel.spec.all_indices}
    unknown = [name for name, _ in options.ranges if name not in used]
    if unknown:
        raise EinfuseNameError(f"ranges= names {', '.join(unknown)}, which no statement of "
                               "the program uses as an index")


def _outputs(statements, outputs: Optional[Sequence[str]]) -> Tuple[str, ...]:
    """By default each defined name (by ':=', '=' or '+=') that no later statement
    reads, in order of definition; ``outputs`` chooses."""
    last_written: Dict[str, int] = {}      # in order of first definition
    last_read: Dict[str, int] = {}
    for number, statement in enumerate(statements):
        last_written[statement.output] = number
        for name in statement.reads:
            last_read[name] = number
    written = list(last_written)
    if outputs is None:
        return tuple(name for name, last in last_written.items()
                     if last_read.get(name, -1) <= last)
    outputs = output_names(outputs)
    for name in outputs:
        if name not in written:
            raise EinfuseNameError(f"outputs= names {name!r}, which no statement of the "
                                   f"program defines (it defines {', '.join(written)})")
    if not outputs:
        raise EinfuseNameError("outputs= names no tensor")
    return outputs


def output_names(outputs) -> Tuple[str, ...]:
    """``outputs=`` as a tuple of names: one name, or an ordered collection of them (a
    set has no order the results could follow)."""
    if isinstance(outputs, str):
        return (outputs,)
    if isinstance(outputs, (set, frozenset)):
        raise option_error("outputs", f"outputs= takes the names in the order wanted (a "
                           f"tuple or list), not a set: {shown(outputs)} has no order")
    try:
        names = tuple(outputs)
    except TypeError:
        names = None
    if names is None or not all(isinstance(name, str) for name in names):
        raise option_error("outputs", "outputs= takes a name or a tuple or list of names, "
                           f"not {shown(outputs)}")
    return names
