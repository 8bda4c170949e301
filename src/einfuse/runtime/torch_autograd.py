"""PyTorch integration: a statement on tensors is a ``torch.autograd.Function`` whose
backward runs the gradient statements (``ef.derive``), each as its own kernel, for just
the inputs that need a gradient (``ctx.needs_input_grad``).

Higher derivatives: with ``create_graph=True`` torch runs the backward with grad mode on.
The gradient statements then run through ``ef.ein`` on the tensors themselves (the saved
inputs and ``grad_output``, not NumPy copies), so each is again an ``EinfuseFunction``
that torch records, and its own backward derives the gradient statements' gradients:
any order, as statements.

Imported only when the caller's arrays are torch tensors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Mapping, Tuple

import torch

from . import gradients
from .frameworks import contiguous, to_numpy


def differentiable_names(call) -> List[str]:
    """Float inputs (tensors read for their values, and scalar parameters) that are
    tensors requiring a gradient."""
    spec = call.spec
    names = [t.name for t in spec.tensors if t.as_value and t.name != spec.output]
    names += list(spec.params)
    result = []
    for name in names:
        value = call.sources.get(name)
        if isinstance(value, torch.Tensor) and value.requires_grad and \
                value.dtype.is_floating_point:
            result.append(name)
    return result


@dataclass(frozen=True)
class _Forward:
    """What the backward needs of one call: the statement and its options, the
    caller's objects by name (``sources``), the host arrays the kernels read
    (``arrays``: NumPy views, scalar parameters included), the differentiable names (in
    the order of the tensors passed) and where it ran."""
    statement: str
    options: object
    sources: Mapping[str, object]
    arrays: Callable[[], Mapping[str, object]]
    names: Tuple[str, ...]
    run_forward: Callable[[], object]
    on_device: bool
    # a gradient reads the forward's result (autodiff/reuse.py): the node saves it
    keeps_output: bool = False


class EinfuseFunction(torch.autograd.Function):
    """One class for every statement (defining a class per call cost more than a small
    kernel); the statement travels in ``_Forward``, a non-tensor argument."""

    @staticmethod
    def forward(ctx, state: _Forward, *inputs):
        ctx.state = state
        # the other tensors the backward reads are saved too, so that torch's version
        # check refuses a backward after one of them was modified in place (the
        # gradient statements would read the new values: a wrong gradient)
        others = [value for name, value in state.sources.items()
                  if isinstance(value, torch.Tensor) and name not in state.names]
        result = state.run_forward()
        if not isinstance(result, torch.Tensor):   # (else already a tensor on its device)
            result = torch.from_numpy(contiguous(result)).to(inputs[0].device)
        ctx.save_for_backward(*inputs, *others, *([result] if state.keeps_output else []))
        return result

    @staticmethod
    def backward(ctx, grad_output):
        state = ctx.state
        names = state.names
        wanted = [name for name, needed in zip(names, ctx.needs_input_grad[1:]) if needed]
        output = None
        if torch.is_grad_enabled():
            # create_graph=True: the statements run on the tensors that carry the
            # graph (the saved inputs, grad_output), so torch records them in turn
            arrays = dict(state.sources)
            arrays.update(zip(names, ctx.saved_tensors))
            grad = grad_output
        elif state.on_device:   # the statements run as Triton kernels where dOUT is
            arrays = {name: value.detach() if isinstance(value, torch.Tensor)
                      else value for name, value in state.sources.items()}
            grad = grad_output.detach()
        else:           # C / NumPy kernels on host arrays (no copy on the CPU)
            arrays, grad = dict(state.arrays()), to_numpy(grad_output)
            if state.keeps_output:
                output = to_numpy(ctx.saved_tensors[-1])
        found = gradients.compute_gradients(state.statement, state.options, arrays,
                                            grad, wanted, output)
        return (None,) + input_gradients(found, names, ctx.saved_tensors)


def input_gradients(found: Mapping[str, object], names, tensors) -> Tuple:
    """The gradients ``found`` by name as tensors like the inputs they belong to (device,
    dtype, shape), in the order of ``names``; None for a name not found."""
    return tuple(torch.as_tensor(found[name]).to(tensor.device, tensor.dtype)
                 .reshape(tensor.shape) if name in found else None
                 for name, tensor in zip(names, tensors))


def apply(kernel, call, run_forward, backend_name: str):
    """The statement's result as a tensor tracked by autograd; ``backend_name`` is the
    backend the forward runs on (with Triton, so do the gradients, on the device)."""
    names = tuple(differentiable_names(call))
    tensors = [call.sources[name] for name in names]

    def arrays():
        found = dict(call.arrays)
        found.update(call.params)
        return found
    on_device = backend_name == "triton"
    state = _Forward(kernel.statement, call.options, call.sources, arrays, names,
                     run_forward, on_device, not on_device and
                     gradients.reads_output(kernel.statement, call.options, names))
    return EinfuseFunction.apply(state, *tensors)

