"""A call's signature: what a prepared call depends on (names, shapes, dtypes and
strides of the arrays), the key of every repeated-call fast path (repeat.py,
torch_prepared.py, run_groups.py, the program's prepared runs)."""

from __future__ import annotations

import sys
import weakref
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from ..analysis.frameworks import for_torch_caller, has_tangent


# torch's tensor classes (Tensor, Parameter) -> torch.func's "is this a wrapped tensor"
# test, found once per class rather than by name on every call
_TENSOR_CLASSES: Dict[type, Callable[[object], bool]] = {}

# The prepared runners of NumPy calls that look their arrays up by name and ignore any
# other name passed (so a caller holding more arrays may pass them all)
BY_NAME: "weakref.WeakSet" = weakref.WeakSet()


# the last entry of a signature of NumPy views of a torch caller's tensors
TORCH_VIEWS = ("<views of torch tensors>",)


def signature_of(kwargs) -> Optional[Tuple]:
    """What a prepared call depends on: names, shapes, dtypes and strides of plain
    ndarrays or CPU torch tensors (and whether each requires a gradient), and which names
    are Python floats (a float's value is a kernel argument; it decides no dtype, range or
    check).
    Anything else -- ints, subclasses, other frameworks, devices -- None."""
    signature = []
    for name, value in kwargs.items():
        kind = type(value)
        if kind is np.ndarray:     # (a dtype hashes and compares as its .str does)
            signature.append((name, value.shape, value.dtype, value.strides))
        elif kind is float:
            signature.append((name, float))
        else:
            wrapped = _TENSOR_CLASSES.get(kind)
            if wrapped is None:
                if kind.__name__ not in ("Tensor", "Parameter") or \
                        not kind.__module__.startswith("torch"):
                    return None
                wrapped = _TENSOR_CLASSES[kind] = \
                    sys.modules["torch"]._C._functorch.is_functorch_wrapped_tensor
            if wrapped(value):    # inside torch.func: the full path refuses
                return None
            # a forward-mode dual tensor: the full path refuses it (its tangent would
            # be dropped)
            if has_tangent(value):
                return None
            try:     # (a torch.Size hashes and compares as the tuple it is)
                if value.is_cpu:
                    signature.append((name, value.shape, value.dtype, value.stride(),
                                      value.requires_grad))
                elif value.is_cuda:     # the Triton backend's runner (triton_repeat.py)
                    signature.append((name, value.shape, value.dtype, value.stride(),
                                      value.requires_grad, value.device))
                else:
                    return None
            except RuntimeError:     # no strides (sparse) or no shape (nested): full path
                return None
    if for_torch_caller():      # (views of a torch caller's tensors: torch's BLAS)
        signature.append(TORCH_VIEWS)
    return tuple(signature)
