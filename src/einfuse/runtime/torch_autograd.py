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

import numpy as np
import torch

from ..errors import EinfuseTypeError
from . import gradients
from ..analysis.frameworks import contiguous, to_numpy
from ..backends.c import torch_node as c_torch_node

# the C++ node's extension's numpy_views once it is loaded
# (backends/c/torch_node_calls.cpp): the same views, with no Python per tensor
_NATIVE_VIEWS: list = []


def _native_loaded(module) -> None:
    _NATIVE_VIEWS[:] = [module.numpy_views]


c_torch_node.when_loaded(_native_loaded)


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


def numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor's NumPy view; its values where it has none (a lazily negated or
    conjugated view, or one that requires grad: ``to_numpy`` resolves it)."""
    try:
        return tensor.numpy()
    except RuntimeError:
        return to_numpy(tensor)


def numpy_views(values: Mapping[str, object], names) -> dict:
    """``numpy_view`` of the tensors ``names`` of ``values``, by name (detached first:
    the common case, a tensor that requires grad, then needs no exception).  Where the
    C++ node is loaded, one C++ call makes them (it declines what Python resolves)."""
    if _NATIVE_VIEWS and type(values) is dict and type(names) is tuple:
        found = _NATIVE_VIEWS[0](values, names)
        if found is not None:
            return found
    try:
        return {name: values[name].detach().numpy() for name in names}
    except RuntimeError:     # a lazily negated or conjugated view: its values
        return {name: to_numpy(values[name]) for name in names}


def refuse_in_transform(names) -> None:
    """Recording a tensor that requires a gradient inside a torch.func transform (one the
    function closes over, not the transform's own input, which is refused as a wrapper)
    needs a Function with torch.func's rules, which einfuse's nodes do not have: torch's
    raw RuntimeError ('must override the setup_context staticmethod'), said here."""
    if torch._C._are_functorch_transforms_active():
        raise EinfuseTypeError(
            f"{names[0]} requires a gradient inside a torch.func transform (grad, vmap, "
            "jacrev, ...), which einfuse does not support; detach it, or use "
            "torch.autograd (backward, torch.autograd.grad) outside the transform")


def save_tensors(ctx, tensors) -> None:
    """``ctx.save_for_backward(*tensors)`` but for inference tensors (made under
    ``torch.inference_mode``), which torch refuses to save (a raw RuntimeError) although
    a computation that reads one is valid where nothing needs its gradient; they have no
    version counter to check either, so the node holds them as they are, and
    :func:`saved_tensors` gives all of them back in order."""
    inference = [t.is_inference() for t in tensors]
    if any(inference):
        ctx.inference = tuple(t if held else None for t, held in zip(tensors, inference))
        ctx.save_for_backward(*[t for t, held in zip(tensors, inference) if not held])
    else:
        ctx.inference = None
        ctx.save_for_backward(*tensors)


def saved_tensors(ctx) -> Tuple:
    """The tensors given to :func:`save_tensors`, in order (torch's version check
    applied to those it saved)."""
    saved = ctx.saved_tensors
    if ctx.inference is None:
        return saved
    rest = iter(saved)
    return tuple(next(rest) if t is None else t for t in ctx.inference)


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
        save_tensors(ctx, (*inputs, *others, *([result] if state.keeps_output else [])))
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
            arrays.update(zip(names, saved_tensors(ctx)))
            grad = grad_output
        elif state.on_device:   # the statements run as Triton kernels where dOUT is
            arrays = {name: value.detach() if isinstance(value, torch.Tensor)
                      else value for name, value in state.sources.items()}
            grad = grad_output.detach()
        else:           # C / NumPy kernels on host arrays (no copy on the CPU)
            arrays, grad = dict(state.arrays()), to_numpy(grad_output)
            if state.keeps_output:
                output = to_numpy(saved_tensors(ctx)[-1])
        found = gradients.compute_gradients(state.statement, state.options, arrays,
                                            grad, wanted, output)
        return (None,) + input_gradients(found, names, saved_tensors(ctx))


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
    refuse_in_transform(names)
    return EinfuseFunction.apply(state, *tensors)

