"""What a fusion group is made of, for the C groups (fusion.py) and the Triton row
groups (row_groups.py) alike: a statement, or the statements of its hoisted form."""

from __future__ import annotations

from typing import Tuple

from ..errors import EinfuseError
from .choose import epilogue_form_for, resolved_backend, runs_hoisted


def needed(spec) -> Tuple[str, ...]:
    """The names a statement reads, and for '='/'+=' the array it writes into."""
    return spec.arg_order + ((spec.output,) if spec.assign != ":=" else ())


def statement_units(kernel, scratch, number: int):
    """(kernel, local name -> key in scratch, output key) for the statement, or for each
    statement of its hoisted form where that applies to this call (temporaries get
    keys with '#', which no name has); None when the statement is not a ':='
    statement or cannot be bound."""
    spec = kernel.spec
    if spec.assign != ":=":
        return None
    form = kernel.hoisted_form
    if form is None and getattr(kernel, "epilogue_form", None) is None:
        return [(kernel, {}, spec.output)]
    try:
        call = kernel.bind(arrays={name: scratch[name] for name in needed(spec)})
    except (EinfuseError, KeyError):
        return None
    # a contraction under elementwise work: its product on BLAS, then the epilogue, as
    # the statement alone runs (choose.py decides where)
    epilogue = epilogue_form_for(kernel, call, resolved_backend(kernel, call))
    form = epilogue if epilogue is not None else form
    if form is None:
        return [(kernel, {}, spec.output)]
    kernels = form.kernels(call.dtypes) if runs_hoisted(form, call) else None
    if kernels is None:
        return [(kernel, {}, spec.output)]
    local = {k.spec.output: f"#{number}#{k.spec.output}" for k in kernels[:-1]}
    return [(k, local, local.get(k.spec.output, k.spec.output)) for k in kernels]
