"""Reading the forward's result in its gradient instead of recomputing it.

A local derivative often contains the forward's own right side: cdist's
``D[i,j] := sqrt(sum[d]((x[i,d] - y[j,d])**2))`` has ``dD[i,j] / (2*sqrt(x..y)) * ...``
in both gradients, ``sqrt(sum[d2](...))`` being ``D[i,j]`` itself.  derive writes
gradients as statements of the forward's inputs and ``dOUT`` alone (every runtime can
run them); where a runtime still holds the forward's result (PyTorch's autograd node
saves it), :func:`with_output` rewrites a gather statement to read it, so that the
O(n*m*d) recomputation becomes an O(n*m) read.

When the rewrite is exact: the subexpression replaced is the forward's right side up to
the names of its reduced indices, its free indices are the forward's output indices
with their own names (the gather frame keeps them), and per call (:func:`applies`) the
gradient's ranges for those indices are exactly the output's axes (``0..n-1``), no
``pad=`` reads outside them, and the output has the working dtype of the gradient's
inputs.  The value read then is the one the forward computed at that point, which
differs from the recomputation only in the order of the forward's additions."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

import numpy as np

from ..lang.ast import Access, Expr, IndexExpr, map_children
from ..lang.printer import format_statement
from ..lang.rewrite import names_in
from ..lang.rewrite import free_indices
from ..rewrite.hoist import canonical
from ..analysis.spec import spec_of


@dataclass(frozen=True)
class OutputRead:
    """A gradient statement rewritten to read the forward's output ``output`` (indexed
    by ``indices``, the forward's output indices)."""
    text: str
    output: str
    indices: Tuple[str, ...]


@functools.lru_cache(maxsize=256)
def _rewritten(gradient_text: str, forward_text: str) -> Optional[OutputRead]:
    forward = spec_of(forward_text)
    if forward.statement.assign != ":=":
        return None
    spec = spec_of(gradient_text)
    output, indices = forward.output, tuple(forward.output_indices)
    if output in names_in(spec.statement) or len(set(indices)) != len(indices):
        return None
    target = canonical(forward.rhs)
    wanted = set(indices)
    read = Access(output, tuple(IndexExpr(((i, 1),)) for i in indices))
    found = [False]

    def replace(expr: Expr) -> Expr:
        if expr.children():      # (a bare access is no work to save)
            if free_indices(expr) == wanted and canonical(expr) == target:
                found[0] = True
                return read
        return map_children(expr, replace)

    rhs = replace(spec.rhs)
    if not found[0]:
        return None
    return OutputRead(format_statement(spec.statement, rhs), output, indices)


def with_output(g, forward_text: str) -> Optional[OutputRead]:
    """Gather statement ``g`` rewritten to read the output of ``forward_text`` (the
    statement ``g`` differentiates) where its right side recurs in ``g``, or None.  (A
    gather with a fallback is run only where it covers its axes: statements_to_run.)"""
    if g.kind != "gather" or g.parent is not None or g.options.get("pad") is not None:
        return None
    return _rewritten(g.text, forward_text)


def applies(read: OutputRead, options: Mapping[str, object], output,
            arrays: Mapping[str, object], inputs) -> bool:
    """Whether ``read`` computes what its statement does for this call: ``options``
    are the gradient's resolved ones, ``output`` the forward's result (a NumPy array),
    ``arrays`` the gradient's other inputs by name (``inputs``)."""
    if type(output) is not np.ndarray or output.dtype.kind != "f" or \
            options.get("pad") is not None:
        return False
    ranges = options["ranges"]
    if output.ndim != len(read.indices) or any(
            ranges.get(index) != range(0, n) for index, n in zip(read.indices, output.shape)):
        return False
    floats = [arrays[name].dtype for name in inputs if name != read.output and
              type(arrays.get(name)) is np.ndarray and arrays[name].dtype.kind == "f"]
    return bool(floats) and np.result_type(*floats) == output.dtype


def options_for(read: OutputRead, options: Mapping[str, object]):
    """The gradient's resolved ``options`` for its rewritten statement: ranges only for
    the indices it still has (the replaced reduction's are gone)."""
    own = set(spec_of(read.text).all_indices)
    found = dict(options)
    found["ranges"] = {name: r for name, r in options["ranges"].items() if name in own}
    return found
