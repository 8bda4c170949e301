"""A recorded statement on the Triton backend as a one-statement program's autograd
node (runtime/program_triton_autograd.py), not as the statement's own node
(runtime/torch_autograd.py).

The statement's own node runs each gradient statement as its own kernel: a
cross-entropy written as one statement, ``L[i] := logsumexp[j](X[i,j]) - X[i, t[i]]``,
has two, ``dX[i,j] := dL[i] * exp(X[i,j] - logsumexp[j2](X[i,j2]))`` (its row group)
and the label's scatter ``dX[i, t[i]] += -dL[i]`` (a second launch).  The program's
backward (autodiff/backward.py) folds such a scatter into the row kernel before it
(``where(j == t[i], ...)``, runtime/program_scatter.where_form), so the statement's
backward is one launch, as its forward is.  The forward runs the statement's own
kernel, unchanged.

Taken (:func:`takes_program_node`) for a ':=' statement whose call runs on the Triton
backend with a tensor that autograd records, where the statement reduces and reads a
gathered position (its gradient's scatter is what the program's row kernel takes in);
other statements keep their own node, whose gradient statements run where their
tensors are (the program's backward runs a gather's plain copy on the host).  Where the
program's backward cannot be derived the statement's own node runs instead (the
caller's path).  A repeated call of the signature goes through
:func:`repeat_runner` (runtime/repeat.py asks for it), the node's prepared call."""

from __future__ import annotations

from typing import Callable, Dict, Mapping, Optional

from ..lang.ast import accesses, reductions
from .program_autograd import prepared_call, recorded
from .program_triton_autograd import statement_by_statement


def takes_program_node(spec) -> bool:
    """Whether a recorded statement of ``spec`` on the Triton backend runs as a
    one-statement program node: it has a reduction and a gathered subscript."""
    if statement_by_statement():     # a differentiable backward's own statements
        return False
    return any(True for _ in reductions(spec.rhs)) and any(
        sub.gathers for access in accesses(spec.rhs) for sub in access.indices)


def _as_program(kernel):
    """The one-statement program of ``kernel`` (one tuple per kernel: the autograd owner
    is kept by its identity)."""
    found = kernel.__dict__.get("_as_program")
    if found is None:
        found = kernel.__dict__.setdefault("_as_program", (kernel,))
    return found


def recorded_statement(kernel, named: Mapping[str, object]) -> Optional[object]:
    """The statement's result on ``named`` (its arguments by name) as one recorded
    Triton program node, or None where the statement's own node is to run."""
    results = recorded(kernel, _as_program(kernel), dict(named), (kernel.spec.output,),
                       kernel.options)
    return None if results is None else results[0]


def repeat_runner(kernel, named: Mapping[str, object],
                  full_path: Callable[[Dict[str, object]], object]
                  ) -> Optional[Callable[[Mapping[str, object]], object]]:
    """A runner for repeated calls of ``named``'s signature: the node's prepared call
    (made by the first call), or ``full_path`` where it declines (grad mode off) or a
    differentiable backward records the statement's own node; None where the first
    call made none."""
    kernels = _as_program(kernel)
    call = prepared_call(kernel, kernels, dict(named))
    if call is None:
        return None

    def run(given):
        if statement_by_statement():
            return full_path(given)
        results = call.apply(given)
        return results[0] if results is not None else full_path(given)
    return run
