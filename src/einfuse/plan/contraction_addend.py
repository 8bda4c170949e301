"""Recognising a contraction plus a broadcast term, ``y[b,o] := sum[i](x[b,i]*W[i,o]) +
bias[o]`` (a Linear layer), which runs best as one BLAS matmul and an add (``addmm``):
BLAS's own kernels are faster than a fused loop nest of the same contraction (at
1024x784x1024 float32 on 2 cores: 8.8 ms against 17 ms), and the add is one pass over the
result, where the fused kernel saved only a read of the product.

A statement qualifies when it is ``:=`` and its right side is ``C + T`` or ``T + C``:
``C`` a contraction as plan/contraction.py recognises it (with the statement's output
indices) and ``T`` an access by distinct plain indices that are all output indices (so
``T`` is broadcast along the others).  Anything else (``-``, a factor on the sum, a term
reading a reduced index) keeps the fused kernel.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Tuple

from ..lang import ast
from .contraction import Contraction, match_contraction


@dataclass(frozen=True)
class ContractionAddend:
    """``contraction`` (computed by BLAS) plus ``addend[addend_indices]``, broadcast
    along the output indices it does not name."""
    contraction: Contraction
    addend: str
    addend_indices: Tuple[str, ...]

    def describe(self) -> str:
        return (f"{self.contraction.describe()}, then {self.addend}"
                f"[{','.join(self.addend_indices)}] added to the product in place")


@dataclass(frozen=True)
class _ContractionPart:
    """What match_contraction reads of a statement's spec, for the sum alone."""
    assign: str
    rhs: ast.Expr
    output: str
    output_indices: Tuple[str, ...]


def match_contraction_addend(spec) -> Optional[ContractionAddend]:
    """The contraction and its addend where ``spec`` has that form, else None."""
    if spec.assign != ":=":
        return None
    return _match(spec.rhs, spec.output, spec.output_indices)


@functools.lru_cache(maxsize=512)
def _match(rhs: ast.Expr, output: str, output_indices: Tuple[str, ...]):
    if not isinstance(rhs, ast.Binary) or rhs.op != "+":
        return None
    for part, term in ((rhs.left, rhs.right), (rhs.right, rhs.left)):
        if not isinstance(term, ast.Access) or term.tensor == output:
            continue
        names = tuple(sub.plain_index for sub in term.indices)
        if not all(names) or len(set(names)) != len(names) or \
                not set(names) <= set(output_indices):
            continue
        contraction = match_contraction(_ContractionPart(":=", part, output, output_indices))
        if contraction is not None:
            return ContractionAddend(contraction, term.tensor, names)
    return None
