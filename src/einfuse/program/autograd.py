"""A whole program (or a statement's hoisted form) as one torch autograd node.

Recorded statement by statement, a softmax program is three autograd nodes, each
running its gradient statements as separate kernels for each input, and the max's
arg-max gradient on top: many passes over memory.  Here the forward runs fused on
NumPy views of the CPU tensors (schedule/fusion.py), keeping the intermediates the
backward reads, and the backward runs the program's backward (autodiff/backward.py:
every wanted input in one sweep, the shift of a softmax left out) fused the same way.

Used for CPU tensors of float32/float64 where autograd records the call, on the C or
NumPy backend, when every statement is a ':=' statement and the backward can be
derived; anything else keeps the statement-by-statement path.  A call on such tensors
that autograd does not record runs fused too, and returns tensors.  A backward that must
itself be differentiable (``create_graph=True``) recomputes the forward statement by
statement on the saved tensors and differentiates that graph, so higher derivatives
are those of the statements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from ..autodiff.backward import Backward, backward_program
from ..errors import EinfuseError
from ..lang.ast import reductions
from ..runtime.frameworks import contiguous, is_functorch_tensor, placeholder, to_numpy
from ..schedule import run_statements
from ..runtime.repeat import signature_of
from .backward_run import PLANS_KEPT, run_backward

_FLOATS = (torch.float32, torch.float64)


@dataclass(frozen=True)
class _State:
    """What the node's backward needs: the kernels and names of the forward, the
    backward program, and the NumPy environment of the forward (inputs and the
    intermediates the backward reads)."""
    kernels: Tuple
    outputs: Tuple[str, ...]
    names: Tuple[str, ...]         # the differentiable inputs, in the order passed
    sources: Dict[str, object]     # the caller's values by name
    arrays: Dict[str, object]      # the same as NumPy views (and Python scalars)
    backward: Backward
    saved: Tuple[str, ...]         # intermediates the forward keeps for the backward
    recompute: Tuple               # forward kernels the backward runs again, first
    backend: str
    plans: dict
    runs: dict


class ProgramFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, state: _State, *tensors):
        env = dict(state.arrays)
        keep = set(state.outputs) | set(state.saved)
        run_statements(state.kernels, env, "numpy", keep=keep, runs=state.runs)
        saved = {name: env[name] for name in state.saved if name not in state.outputs}
        for name in state.backward.shaped:
            saved.setdefault(name, placeholder(env[name]))
        for name in state.sources:
            saved[name] = env[name]
        results = tuple(torch.from_numpy(contiguous(np.asarray(env[name])))
                        for name in state.outputs)
        read = []          # outputs the backward reads (their arrays are the tensors')
        for name, tensor in zip(state.outputs, results):
            if name in state.backward.reads or name in state.saved:
                saved[name] = tensor.numpy()
                read.append(tensor)
            elif name in state.backward.shaped:
                saved[name] = placeholder(env[name])
            if not tensor.dtype.is_floating_point:
                ctx.mark_non_differentiable(tensor)
        ctx.state, ctx.saved = state, saved
        # every tensor the backward reads is saved, so that torch's version counter
        # refuses a backward after one of them (an output too) was modified in place
        others = [v for n, v in state.sources.items()
                  if isinstance(v, torch.Tensor) and n not in state.names]
        ctx.save_for_backward(*tensors, *others, *read)
        return results

    @staticmethod
    def backward(ctx, *grads):
        state = ctx.state
        inputs = ctx.saved_tensors[:len(state.names)]
        wanted = [name for name, needed in zip(state.names, ctx.needs_input_grad[1:])
                  if needed]
        if torch.is_grad_enabled():
            found = _differentiable_backward(state, inputs, grads, wanted)
        else:
            env = dict(ctx.saved)
            for seed, grad in zip(state.backward.seeds, grads):
                env[seed] = to_numpy(grad.resolve_neg().resolve_conj())
            found = run_backward(state.backward, env, state.backend, state.plans,
                                 state.recompute)
        return (None,) + tuple(
            torch.as_tensor(found[name]).to(tensor.dtype).reshape(tensor.shape)
            if name in found and name in wanted else None
            for name, tensor in zip(state.names, inputs))


def _differentiable_backward(state: _State, inputs, grads, wanted):
    """create_graph=True: the gradients as a graph torch can differentiate again."""
    with torch.enable_grad():
        env = dict(state.sources)
        env.update(zip(state.names, inputs))
        run_statements(state.kernels, env, "torch", keep=set(state.outputs))
        outputs = [env[name] for name in state.outputs]
        chosen = [env[name] for name in wanted]
        pairs = [(o, g) for o, g in zip(outputs, grads) if o.requires_grad]
        found = torch.autograd.grad([o for o, _ in pairs], chosen, [g for _, g in pairs],
                                    create_graph=True, allow_unused=True)
    return {name: value for name, value in zip(wanted, found) if value is not None}


@dataclass
class ProgramAutograd:
    """Per program (or hoisted form): its backward programs by the set of inputs
    that need a gradient, and their plans and prepared forward runs."""
    pieces: Tuple[str, ...]
    specs: Tuple
    outputs: Tuple[str, ...]
    options: Dict[str, object]
    backwards: Dict[Tuple[str, ...], Optional[Tuple[Backward, Tuple[str, ...], Tuple]]]
    plans: Dict[Tuple[str, ...], dict]
    runs: dict
    # call signatures (runtime/repeat.signature_of) whose checks passed -> the names
    # that need a gradient
    checked: Dict[Tuple, Tuple[str, ...]] = field(default_factory=dict)

    @staticmethod
    def of(pieces: Sequence[str], specs: Sequence, outputs: Sequence[str],
           options) -> "ProgramAutograd":
        passed = {key: getattr(options, key) for key in ("pad", "bounds", "fill")
                  if getattr(options, key, None) is not None}
        if getattr(options, "ranges", None):
            passed["ranges"] = {n: range(lo, hi) for n, (lo, hi) in options.ranges}
        return ProgramAutograd(tuple(pieces), tuple(specs), tuple(outputs), passed, {},
                               {}, {})

    def backward_for(self, names: Tuple[str, ...], kernels):
        """(the backward, the intermediates to save, the forward kernels to recompute)
        for gradients of ``names``, or None where it cannot be derived."""
        if names not in self.backwards:
            try:
                backward = backward_program(self.pieces, self.specs, self.outputs, names,
                                            self.options)
            except EinfuseError:     # the statements' own path says what is wrong, later
                self.backwards[names] = None
            else:
                saved, recompute = _saved_or_recomputed(backward, kernels, self.outputs)
                self.backwards[names] = (backward, saved, recompute)
        return self.backwards[names]


def _saved_or_recomputed(backward: Backward, kernels, outputs) -> Tuple[Tuple[str, ...],
                                                                          Tuple]:
    """Which intermediates the backward reads are kept from the forward and which it
    computes again.  An intermediate with as many axes as the widest output, computed
    without a reduction from inputs and kept values (softmax's ``e = exp(X - m)``), is
    recomputed row by row inside the backward's first kernel: writing it whole in the
    forward and reading it back would cost a full pass over memory each way, where
    recomputing costs one ``exp`` per element in cache.  Everything else is kept."""
    defined = {k.spec.output: k for k in kernels}
    widest = max((len(defined[o].spec.output_indices) for o in outputs if o in defined),
                 default=0)
    recompute, saved = [], []
    for kernel in kernels:
        name = kernel.spec.output
        if name in outputs or name not in backward.reads:
            continue
        spec = kernel.spec
        cheap = not any(True for _ in reductions(spec.rhs)) and widest >= 2 and \
            len(spec.output_indices) >= widest and \
            all(n not in defined or n in saved or n in outputs for n in spec.arg_order)
        (recompute if cheap else saved).append(kernel if cheap else name)
    # an output that a recomputed statement reads is kept (as the returned tensor)
    saved += [n for k in recompute for n in k.spec.arg_order if n in outputs]
    return tuple(dict.fromkeys(saved)), tuple(recompute)


def recorded(holder, kernels: Sequence, env: Dict[str, object], outputs: Sequence[str],
             options) -> Optional[Tuple]:
    """The outputs of ``kernels`` run on ``env`` as tensors that autograd records as
    one node, or None where this call keeps the statement-by-statement path.
    ``holder`` (a Program, a HoistedForm) keeps the derived backwards across calls."""
    owners = holder.__dict__.setdefault("_autograd", {})
    owner = owners.get(id(kernels))
    if owner is None:
        owner = owners[id(kernels)] = ProgramAutograd.of(
            [k.statement for k in kernels], [k.spec for k in kernels], outputs, options)
    return _run_recorded(owner, kernels, env, options.backend)


def _run_recorded(owner: ProgramAutograd, kernels: Sequence, env: Dict[str, object],
                  backend: str) -> Optional[Tuple]:
    if backend not in ("auto", "c", "numpy") or any(k.spec.assign != ":=" for k in kernels):
        return None
    # a repeated call (same names, shapes, dtypes, strides, requires_grad on CPU) skips
    # the checks below: they passed for its signature already
    signature = signature_of(env) if torch.is_grad_enabled() else None
    names = owner.checked.get(signature) if signature is not None else None
    if names is not None:
        try:
            arrays = {name: value.detach().numpy() if isinstance(value, torch.Tensor)
                      else value for name, value in env.items()}
        except RuntimeError:     # a negative or conjugate bit: as below
            return None
        backward, saved, recompute = owner.backward_for(names, kernels)
        state = _State(tuple(kernels), owner.outputs, names, dict(env), arrays, backward, saved,
                       recompute, backend, owner.plans.setdefault(names, {}), owner.runs)
        return ProgramFunction.apply(state, *[env[name] for name in names])
    names = []
    for name, value in env.items():
        if isinstance(value, torch.Tensor):
            if value.device.type != "cpu" or value.layout != torch.strided or \
                    value.is_nested or is_functorch_tensor(value) or value.is_complex() or \
                    (value.dtype.is_floating_point and value.dtype not in _FLOATS):
                return None
            if value.requires_grad and value.dtype in _FLOATS:
                names.append(name)
        elif not isinstance(value, (int, float)):
            return None
    try:
        arrays = {name: to_numpy(value) if isinstance(value, torch.Tensor) else value
                  for name, value in env.items()}
    except RuntimeError:    # no NumPy view (a negative or conjugate bit): as before
        return None
    if not names or not torch.is_grad_enabled():
        return _unrecorded(owner, kernels, arrays)
    found = owner.backward_for(tuple(names), kernels)
    if found is None:
        return None
    if signature is not None:
        if len(owner.checked) >= PLANS_KEPT:
            owner.checked.clear()
        owner.checked[signature] = tuple(names)
    backward, saved, recompute = found
    state = _State(tuple(kernels), owner.outputs, tuple(names), dict(env), arrays, backward,
                   saved, recompute, backend, owner.plans.setdefault(tuple(names), {}), owner.runs)
    return ProgramFunction.apply(state, *[env[name] for name in names])


def _unrecorded(owner: ProgramAutograd, kernels: Sequence, arrays: Dict[str, object]):
    """A call autograd does not record: the statements fused on NumPy views, as for
    NumPy callers; the outputs as tensors sharing their arrays."""
    run_statements(kernels, arrays, "numpy", keep=set(owner.outputs), runs=owner.runs)
    return tuple(torch.from_numpy(contiguous(np.asarray(arrays[name])))
                 for name in owner.outputs)


__all__ = ["ProgramAutograd", "recorded"]
