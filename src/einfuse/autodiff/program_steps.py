"""What a program's gradient passes through, read from its statements' Specs: which
names depend on ``wrt``, which reach an output, the names each statement reads as
values, a gradient prefix no name of the program takes, and one statement's options.
Derivation facts shared by program/gradient.py (derive_program) and backward.py."""

from __future__ import annotations

from typing import Dict, Set, Tuple

from .derive import used_names


def depends_on(specs, wrt: str) -> Dict[str, bool]:
    """For each defined name (and ``wrt``): whether its value depends on ``wrt``."""
    depends = {wrt: True}
    for spec in specs:
        depends[spec.output] = any(depends.get(name) for name in value_names(spec))
    return depends


def reaching_outputs(specs, outputs: Tuple[str, ...]) -> Set[str]:
    """Defined names some output depends on (the outputs included)."""
    needed = set(outputs)
    for spec in reversed(specs):
        if spec.output in needed:
            needed |= set(value_names(spec))
    return needed


def value_names(spec) -> Tuple[str, ...]:
    """The names a statement reads as values (tensors and scalar parameters; index
    arrays carry no gradient)."""
    return tuple(dict.fromkeys([t.name for t in spec.tensors if t.as_value] +
                               list(spec.params)))


def gradient_prefix(specs) -> str:
    """``d``, or ``dd``... so that no gradient name is a name of the program."""
    names: Set[str] = set()
    for spec in specs:
        names |= used_names(spec)
    prefix = "d"
    while any(prefix + name in names for name in names):
        prefix += "d"
    return prefix


def statement_options(options: Dict[str, object], spec) -> Dict[str, object]:
    """The program's options for one statement: ranges= entries of its own indices."""
    own = dict(options)
    if "ranges" in own and own["ranges"]:
        own["ranges"] = {k: v for k, v in dict(own["ranges"]).items()
                         if k in spec.all_indices}
    return own
