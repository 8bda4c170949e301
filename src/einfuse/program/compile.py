"""A text compiled as what it is: a program (several statements, or outputs= chosen)
into a Program, one statement into a Kernel (the front door's dispatch below the
mesh; einfuse.api.compile adds mesh= and the checks of its keywords)."""

from __future__ import annotations

import functools
import warnings

from ..analysis.options import Options, make_options
from ..analysis.spec import spec_of
from ..errors import EinfuseError, OptionError, attach_statement, warn
from ..runtime.kernel import Kernel
from ..lang.printer import format_statement
from ..rewrite.canonical import canonical_statement
from ..runtime.kernel_maker import option_collision, shared_kernel, statement_kernel
from .program import compile_program, is_program, output_names


def compile_source(statement: str, ranges=None, pad=None, bounds="check", fill=0.0,
                   dtype=None, backend="auto", threads=None, memory_limit=None,
                   outputs=None, precision="exact"):
    """``statement`` (a checked string) compiled with ``compile``'s options."""
    try:
        options = make_options(ranges, pad, bounds, fill, dtype, backend, threads,
                               memory_limit, precision)
    except OptionError as error:
        raise attach_statement(option_collision(error, statement), statement) from None
    if is_program(statement, outputs):
        try:
            if outputs is not None:     # a tuple of names (hashable: the cache's key)
                outputs = output_names(outputs)
            program = shared_program(statement, options, outputs)
            for part in program.statements:      # as compiling it anew would
                for message, span in part.kernel.spec.warnings:
                    warn(message, source=part.kernel.statement, span=span)
            return program
        except OptionError as error:
            raise attach_statement(option_collision(error, statement), statement) from None
        except EinfuseError as error:
            raise attach_statement(error, statement) from None
    kernel = statement_kernel(statement, options)    # its errors and warnings as written
    return canonical_kernel(kernel, options)


def canonical_kernel(kernel, options: Options):
    """The Kernel of ``kernel``'s statement in canonical form (rewrite/canonical.py), or
    ``kernel`` where the rules change nothing or the canonical text does not compile."""
    text = canonical_text(kernel.statement, options.rewrite_options)
    if text is None:
        return kernel
    try:
        rewritten = shared_kernel(text, options)
    except EinfuseError:
        return kernel
    # (the arguments' order of first use is the order positional arguments take)
    return rewritten if rewritten.spec.arg_order == kernel.spec.arg_order else kernel


@functools.lru_cache(maxsize=512)
def canonical_text(statement: str, options: frozenset = frozenset()):
    """The canonical statement's text, or None where no rule fires (cached by the text:
    ``ein`` in a loop asks on every call); ``options``: Options.rewrite_options."""
    spec = spec_of(statement)
    canonical, fired = canonical_statement(spec.statement, spec.rhs, options)
    return format_statement(canonical) if fired else None


@functools.lru_cache(maxsize=128)
def shared_program(statement: str, options: Options, outputs):
    """One Program per (text, options, outputs), as for statements (runtime.kernel.shared_kernel)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile_program(statement, options, outputs, Kernel)
