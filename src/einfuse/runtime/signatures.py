"""A call's signature: what a prepared call depends on (names, shapes, dtypes and
strides of the arrays), the key of every repeated-call fast path (repeat.py,
torch_prepared.py, run_groups.py, the program's prepared runs)."""

from __future__ import annotations

import sys
import weakref
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from ..analysis.frameworks import for_torch_caller, has_tangent
from ..backends.c import torch_node as c_torch_node


# torch's tensor classes (Tensor, Parameter) -> torch.func's "is this a wrapped tensor"
# test, found once per class rather than by name on every call
_TENSOR_CLASSES: Dict[type, Callable[[object], bool]] = {}

# The prepared runners of NumPy calls that look their arrays up by name and ignore any
# other name passed (so a caller holding more arrays may pass them all)
BY_NAME: "weakref.WeakSet" = weakref.WeakSet()


# the last entry of a signature of NumPy views of a torch caller's tensors
TORCH_VIEWS = ("<views of torch tensors>",)

# (remembered_signature, remember_signature) of the C++ node's extension once it is
# loaded (backends/c/torch_node_calls.cpp): a call of torch tensors and floats whose
# layout was seen before gets the signature built then, with no Python per tensor
_NATIVE: list = []


def _native_loaded(module) -> None:
    _NATIVE[:] = [module.remembered_signature, module.remember_signature]


c_torch_node.when_loaded(_native_loaded)


def signature_of(kwargs) -> Optional[Tuple]:
    """What a prepared call depends on: names, shapes, dtypes and strides of plain
    ndarrays or CPU torch tensors (and whether each requires a gradient), and which names
    are Python floats (a float's value is a kernel argument; it decides no dtype, range or
    check).
    Anything else -- ints, subclasses, other frameworks, devices -- None.

    Every repeated call pays this (about 1 us a tensor): so the forward-mode question
    is asked once per call, not per tensor (whether a dual level is open: only then can
    a tensor carry a tangent), and each entry is built from the tensor's own attributes
    with nothing looked up again.  Where the C++ node is loaded, a dict of CPU tensors
    and floats whose layout it has seen costs one C++ call (about 0.2 us): it gives back
    the tuple built the first time (torch_node_calls.cpp says when it declines)."""
    views = for_torch_caller()
    native = _NATIVE
    if native and type(kwargs) is dict:
        found = native[0](kwargs, views)
        if found is not None:
            return found
    signature = []
    append = signature.append
    duals = None        # whether a forward-mode level is open (asked at the first tensor)
    for name, value in kwargs.items():
        kind = type(value)
        if kind is np.ndarray:     # (a dtype hashes and compares as its .str does)
            append((name, value.shape, value.dtype, value.strides))
            native = None          # (the C++ node reads no NumPy array)
            continue
        if kind is float:
            append((name, float))
            continue
        wrapped = _TENSOR_CLASSES.get(kind)
        if wrapped is None:
            if kind.__name__ not in ("Tensor", "Parameter") or \
                    not kind.__module__.startswith("torch"):
                return None
            wrapped = _TENSOR_CLASSES[kind] = \
                sys.modules["torch"]._C._functorch.is_functorch_wrapped_tensor
        if wrapped(value):    # inside torch.func: the full path refuses
            return None
        if duals is None:
            duals = _dual_level_open()
        # a forward-mode dual tensor: the full path refuses it (its tangent would
        # be dropped)
        if duals and has_tangent(value):
            return None
        try:     # (a torch.Size hashes and compares as the tuple it is)
            if value.is_cpu:
                append((name, value.shape, value.dtype, value.stride(),
                        value.requires_grad))
            elif value.is_cuda:     # the Triton backend's runner (triton_repeat.py)
                append((name, value.shape, value.dtype, value.stride(),
                        value.requires_grad, value.device))
            else:
                return None
        except RuntimeError:     # no strides (sparse) or no shape (nested): full path
            return None
    if views:      # (views of a torch caller's tensors: torch's BLAS)
        append(TORCH_VIEWS)
    signature = tuple(signature)
    if native and type(kwargs) is dict:
        native[1](kwargs, views, signature)
    return signature


def _dual_level_open() -> bool:
    """Whether a ``torch.autograd.forward_ad`` level is open now (has_tangent's own
    first question), so that no tensor of a call outside one is unpacked."""
    forward_ad = sys.modules.get("torch.autograd.forward_ad")
    return forward_ad is not None and getattr(forward_ad, "_current_level", -1) >= 0
