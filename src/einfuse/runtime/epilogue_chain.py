"""A repeated call of a statement its schedule runs as BLAS, then an elementwise
epilogue (Route.BLAS_THEN_EPILOGUE: a Linear layer's ``max(x @ W.T + b, 0)``), where
autograd records nothing: the epilogue form's kernels chained directly, each by its
prepared runner (backends/c/repeat.py) -- the products on BLAS (torch's for a torch
caller, as the statement's own BLAS route takes it), then the one epilogue pass --
instead of through the program machinery, which binds, converts and looks each
kernel up again per call (about 20 us of Python against a 12 us product at
32x128x128).

What the chain computes is what the form's kernels compute (the same kernels, the
same BLAS route as a torch caller's statements take, the same thread rule).  A call
autograd records (grad mode on and an input that requires a gradient) takes the
form's own run, which builds the autograd node; so does any call the chain's
runners decline.

Where the C++ autograd node is loaded (runtime/torch_node.py; its build starts after
a few calls), the chain runs as one node call with nothing recorded: the same product
(at::matmul / at::addmm on the same views, runtime/torch_node_products.py), then the
same epilogue kernel by its function pointer, with no Python between them (at
32x128x128 the chain's Python was most of a forward's time)."""

from __future__ import annotations

from operator import itemgetter
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ..analysis.frameworks import TORCH, torch_recording
from ..errors import EinfuseError
from ..schedule.choose import as_written
from ..schedule.units import needed
from . import torch_node


def epilogue_chain(form, call, kwargs, generic: Callable) -> Optional[Callable]:
    """``run(named)`` -> the statement's result for torch calls of ``call``'s signature
    (``kwargs``: the first call's arguments), or None where a kernel of the form has no
    prepared runner (a gather, a parameter of another type, a packed input).  A call
    that autograd records, or that a runner of the chain declines, runs ``generic``
    (the form's own run, which says why).  (One function per call, the node called
    from it: at 32x128x128 each layer of Python between the call and the node was
    about 0.3 us of a 17 us forward.)"""
    import torch
    from ..backends.c.repeat import blas_runner, repeat_runner
    from .torch_autograd import numpy_views
    kernels = form.kernels(call.dtypes)
    if kernels is None or call.framework != TORCH:
        return None
    env: Dict[str, object] = {name: call.arrays[name] for name in call.arrays}
    env.update(call.params)
    steps: List[Tuple[str, Callable]] = []
    described = []      # (the node's translation: torch_node.forward_only's steps)
    for kernel in kernels:
        spec = kernel.spec
        if any(t.as_index for t in spec.tensors) or spec.assign != ":=":
            return None
        try:
            bound = kernel.bind(arrays={n: env[n] for n in spec.arg_order if n in env})
        except (EinfuseError, KeyError):
            return None
        schedule = as_written(kernel, bound)
        if schedule.backend != "c":
            return None
        # (bound on NumPy views: the products take torch's BLAS as the caller's would)
        prepared = blas_runner(bound, schedule.blas, True) if schedule.blas is not None \
            else repeat_runner(bound, schedule)
        if prepared is None:
            return None
        steps.append((spec.output, prepared.run))
        described.append((kernel, prepared.run, schedule.blas is not None,
                          {name: _layout(env[name]) for name in needed(spec)}))
        env[spec.output] = np.empty(tuple(bound.output_shape), prepared.dtype)
    result_dtype = np.dtype(call.dtypes.result)
    # (the signature fixes which arguments are tensors)
    tensors = tuple(n for n, v in kwargs.items() if isinstance(v, torch.Tensor))
    node = [None, 0]     # the node's plan, once made; calls before it was tried
    # (a float parameter, or a result converted at the end: the chain in Python)
    whole = len(tensors) == len(kwargs) and env[steps[-1][0]].dtype == result_dtype
    # (the signature fixes whether an argument requires a gradient: per call, only
    # whether autograd records now)
    grads = any(getattr(v, "requires_grad", False) for v in kwargs.values())
    # the passed tensors in the node's order, as a tuple (one C call)
    passed = itemgetter(*tensors) if len(tensors) > 1 else \
        (lambda named: [named[name] for name in tensors])

    def run(named):
        if grads and torch_recording():
            return generic(named)
        found = node[0]
        if found is not None:      # (the C++ node raises no EinfuseError)
            result = torch_node.run(found, passed(named))
            if result is not None:
                return result[0]
        try:
            return in_python(named)
        except EinfuseError:    # (a runner that declines: the form's own run says why)
            return generic(named)

    def in_python(named):
        if node[0] is None and whole and node[1] >= 0:
            node[1] += 1
            if torch_node.available(node[1]):
                node[1] = -1        # (tried once)
                node[0] = torch_node.forward_only(
                    tensors, torch_node.layouts_of(kwargs, tensors), described)
        values = dict(named)
        values.update(numpy_views(named, tensors))
        for output, step in steps:
            values[output] = step(values)
        result = np.asarray(values[steps[-1][0]])
        if result.dtype != result_dtype:
            result = result.astype(result_dtype)
        return torch.from_numpy(result)
    return run


def _layout(value) -> Tuple:
    """(shape, dtype, byte strides) of an array or CPU tensor, as the node's slots;
    None for anything else (a scalar parameter)."""
    if isinstance(value, np.ndarray):
        return tuple(value.shape), value.dtype, tuple(value.strides)
    if not hasattr(value, "layout"):      # (not a tensor)
        return None
    found = torch_node.layouts_of({"value": value}, ("value",))
    return found[0] if found is not None else None


__all__ = ["epilogue_chain"]
