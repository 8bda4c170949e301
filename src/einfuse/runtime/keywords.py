"""Keywords given to the API that it does not take: each named, with the closest name of
the statement or option suggested (``dtyp=`` is ``dtype=`` misspelt, ``Bb=`` the
statement's ``B``)."""

from __future__ import annotations

import functools
import inspect
from typing import Mapping, Tuple

from ..errors import UnexpectedArgumentError, attach_statement, did_you_mean


@functools.lru_cache(maxsize=None)
def keyword_options(function) -> Tuple[str, ...]:
    """The keyword-only options of an API function, as its signature names them."""
    return tuple(name for name, parameter in inspect.signature(function).parameters.items()
                 if parameter.kind is inspect.Parameter.KEYWORD_ONLY)


@functools.lru_cache(maxsize=512)
def _statement_names(spec) -> frozenset:
    """What a call of a statement may name: its tensors, scalars and output, and its
    indices (an index passed by name has its own message, in binding)."""
    return frozenset(spec.arg_order) | {spec.output} | set(spec.all_indices)


def check_named(compiled, named: Mapping[str, object], options) -> None:
    """Keywords given to ein or explain that are neither a name of the
    compiled statement or program nor one of ``options``: an error naming the first,
    with the closest name or option suggested."""
    spec = getattr(compiled, "spec", None)
    if spec is not None:                         # a Kernel
        takes, inputs, what = _statement_names(spec), spec.arg_order, "statement"
        text = compiled.statement
    elif hasattr(compiled, "intermediates"):     # a Program: inputs and intermediates
        inputs, what = tuple(compiled.inputs), "program"
        takes, text = set(inputs) | set(compiled.intermediates), compiled.source
    else:       # a sharded computation checks its own arguments
        return
    unknown = [name for name in named if name not in takes and name not in options
               and name.isascii()]
    if not unknown:
        return
    name = unknown[0]
    # (worded alike for ein and explain: explaining a call names the call's error)
    raise attach_statement(UnexpectedArgumentError(
        f"{name}={did_you_mean(name, [*takes, *options])} is neither a name of the {what} "
        f"(it takes {', '.join(inputs) or 'no arrays'}) nor an option"), text)
