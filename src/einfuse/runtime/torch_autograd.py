"""PyTorch integration: a statement on tensors is a ``torch.autograd.Function`` whose
backward runs the gradient statements (``ef.derive``), each as its own kernel, for just
the inputs that need a gradient (``ctx.needs_input_grad``).

Imported only when the caller's arrays are torch tensors."""

from __future__ import annotations

import functools
import warnings
from typing import Dict, List, Tuple

import numpy as np
import torch

from ..autodiff import derive, run_reference
from .frameworks import contiguous


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


@functools.lru_cache(maxsize=256)
def gradient_statements(statement: str, wrt: str, options_key: Tuple):
    """The gradient statements of ``statement`` w.r.t. ``wrt``, derived once."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return derive(statement, wrt, options=_forward_options(options_key))


def options_key(options) -> Tuple:
    ranges = {name: range(lo, hi) for name, (lo, hi) in options.ranges}
    key = []
    if ranges:
        key.append(("ranges", tuple(sorted((k, (v.start, v.stop)) for k, v in ranges.items()))))
    if options.pad is not None:
        key.append(("pad", options.pad))
    key += [("bounds", options.bounds), ("fill", options.fill)]
    return tuple(key)


def _forward_options(key: Tuple) -> Dict[str, object]:
    options = dict(key)
    if "ranges" in options:
        options["ranges"] = {k: range(*v) for k, v in options["ranges"]}
    return options


def apply(kernel, call, run_forward):
    """The statement's result as a tensor tracked by autograd."""
    names = differentiable_names(call)
    tensors = [call.sources[name] for name in names]
    like = tensors[0]

    class EinfuseFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            result = run_forward()
            return torch.from_numpy(contiguous(result)).to(like.device)

        @staticmethod
        def backward(ctx, grad_output):
            arrays = dict(call.arrays)
            arrays.update(call.params)
            arrays["d" + call.spec.output] = grad_output.detach().cpu().numpy()
            key = options_key(call.options)
            grads = []
            for name, needed, tensor in zip(names, ctx.needs_input_grad, tensors):
                if not needed:
                    grads.append(None)
                    continue
                statements = gradient_statements(kernel.statement, name, key)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    value = run_reference(statements, arrays,
                                          backend=call.options.backend)["d" + name]
                grads.append(torch.as_tensor(np.asarray(value)).to(tensor.device,
                                                                   tensor.dtype)
                             .reshape(tensor.shape))
            return tuple(grads)

    return EinfuseFunction.apply(*tensors)
