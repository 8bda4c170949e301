"""Which framework the caller's arrays belong to, and moving between it and NumPy.

Adapters are lazy: torch and jax are imported only when the caller's arrays
are theirs, found by the array type's module name.
"""

from __future__ import annotations

import numbers
import sys
import threading
from typing import Dict, Mapping, Tuple

import numpy as np

from ..errors import EinfuseTypeError

NUMPY, TORCH, JAX = "numpy", "torch", "jax"


# read-only, so shared: (shape, dtype) -> placeholder (a torch program's backward asks
# for its outputs' on every call)
_placeholders: Dict[Tuple, np.ndarray] = {}


class _CallerState(threading.local):
    torch_views = False


_CALLER = _CallerState()


class torch_views:
    """Within it, the NumPy arrays this thread hands einfuse's kernels are views of a
    torch caller's tensors (a program's prepared forward and backward, the operator
    under torch.compile).  What that changes: whose BLAS computes their large products
    (torch's, as for the tensors themselves: MKL beside torch's own thread pool rather
    than NumPy's OpenBLAS competing with it; backends/c/blas.py), and so the call's
    signature (runtime/signatures.py), which keys every prepared runner: a NumPy
    caller's runner is never a torch caller's."""
    __slots__ = ("_before",)

    def __enter__(self):
        self._before = _CALLER.torch_views
        _CALLER.torch_views = True
        return self

    def __exit__(self, *exc):
        _CALLER.torch_views = self._before
        return False


def for_torch_caller() -> bool:
    """Whether this thread's kernel calls are on views of a torch caller's tensors."""
    return _CALLER.torch_views


def torch_compiling() -> bool:
    """Is torch.compile tracing the caller?  (Never imports torch: a process that has
    not imported it is not compiling with it.)"""
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def framework_of(value) -> str:
    module = type(value).__module__ or ""
    root = module.split(".", 1)[0]
    if root == "torch":
        return TORCH
    if root in ("jax", "jaxlib"):
        return JAX
    return NUMPY


def has_dtensor(args, kwargs: Mapping[str, object]) -> bool:
    """Whether an argument is a ``torch.distributed.tensor.DTensor`` (without importing
    torch): those run sharded (sharding/dtensor.py)."""
    for value in (*args, *kwargs.values()):
        kind = type(value)
        if kind.__name__ == "DTensor" and (kind.__module__ or "").startswith(
                "torch.distributed"):
            return True
    return False


def common_framework(arrays: Mapping[str, object]) -> str:
    found = {}
    for name, value in arrays.items():
        if isinstance(value, (numbers.Number, list, tuple)):
            continue  # plain Python data goes with any framework
        found.setdefault(framework_of(value), name)
    if len(found) > 1:
        pairs = ", ".join(f"{name} is a {fw} array" for fw, name in found.items())
        raise EinfuseTypeError(f"arrays from different frameworks in one call ({pairs}); "
                               "convert them to one framework first")
    return next(iter(found), NUMPY)


def check_torch_layout(name: str, value) -> None:
    """A sparse, MKL-DNN or nested tensor has no strides (nor, nested, one shape): the
    caller converts it; einfuse reads dense strided tensors only.  A tensor inside a
    torch.func transform has no data einfuse could read, and its autograd.Function has
    no functorch rules."""
    if framework_of(value) != TORCH or not hasattr(value, "layout"):
        return
    if is_functorch_tensor(value):
        raise EinfuseTypeError(f"{name} is a tensor inside a torch.func transform (grad, "
                               "vmap, jacrev, ...), which einfuse does not support; use "
                               "torch.autograd (backward, torch.autograd.grad) instead")
    if has_tangent(value):
        raise EinfuseTypeError(f"{name} carries a forward-mode tangent "
                               "(torch.autograd.forward_ad), which einfuse does not "
                               "support; use reverse mode (backward, torch.autograd.grad)")
    layout = str(value.layout).rsplit(".", 1)[-1]
    if getattr(value, "is_nested", False) or layout != "strided":
        what = "a nested tensor" if getattr(value, "is_nested", False) else \
            f"a torch tensor with layout {layout}"
        raise EinfuseTypeError(f"{name} is {what}; einfuse reads dense (strided) tensors: "
                               "convert it to one first")


def has_tangent(value) -> bool:
    """Whether a torch tensor carries a forward-mode tangent (``torch.autograd.
    forward_ad.make_dual``) at the level now open: einfuse's kernels read its values
    only, so its tangent would be dropped without a word (a wrong result)."""
    forward_ad = sys.modules.get("torch.autograd.forward_ad")
    if forward_ad is None or getattr(forward_ad, "_current_level", -1) < 0:
        return False
    return forward_ad.unpack_dual(value).tangent is not None


def is_functorch_tensor(value) -> bool:
    """Whether a torch tensor is wrapped by a torch.func transform (grad, vmap...)."""
    return sys.modules["torch"]._C._functorch.is_functorch_wrapped_tensor(value)


def to_numpy(value) -> np.ndarray:
    framework = framework_of(value)
    if framework == TORCH:
        torch = sys.modules["torch"]
        if torch._C._are_functorch_transforms_active():
            # a plain tensor a function under torch.func.grad closes over: inside the
            # transform even .detach() gives a wrapper with no storage to read, so its
            # values are read with the transforms set aside (a wrapped tensor itself
            # was refused before this, check_torch_layout)
            with torch._C._DisableFuncTorch():
                return _torch_numpy(value)
        return _torch_numpy(value)
    return np.asarray(value)


def _torch_numpy(value) -> np.ndarray:
    # a lazily negated or conjugated view has no NumPy view: its values, resolved
    value = value.detach().cpu().resolve_neg().resolve_conj()
    if is_bfloat16(value):   # NumPy has no bfloat16: computed in float32
        value = value.float()
    return value.numpy()


def numpy_dtype(value) -> np.dtype:
    """The NumPy dtype ``value`` converts to, read without copying any data (a CUDA
    tensor stays where it is); bfloat16 reads as float32, as :func:`to_numpy` gives."""
    if framework_of(value) == TORCH:
        name = str(value.dtype).rsplit(".", 1)[-1]
        try:
            return np.dtype(np.float32 if name == "bfloat16" else name)
        except TypeError:
            raise EinfuseTypeError(f"torch tensors of dtype {name} are not supported; "
                                   "convert to a float or integer dtype") from None
    dtype = getattr(value, "dtype", None)
    return np.dtype(dtype) if dtype is not None else np.asarray(value).dtype


class TorchStandIn(np.ndarray):
    """A NumPy array standing for a torch tensor (a view of its data, or a shape-only
    placeholder of it) where einfuse runs on NumPy inside torch's own machinery
    (torch.compile's operator and its fake implementation): binding takes it as the
    tensor it stands for where the dtype rules differ (a sum of uint8 is int64, as
    torch.sum gives, not NumPy's uint64)."""


def torch_stand_in(array: np.ndarray) -> np.ndarray:
    """``array`` standing for a torch tensor: a :class:`TorchStandIn` view where the
    rules differ (narrow unsigned dtypes), else ``array`` itself, which keeps a plain
    ndarray's fast paths."""
    dtype = array.dtype
    if dtype.kind == "u" and dtype.itemsize < 8:
        return array.view(TorchStandIn)
    return array


def dtype_rules(framework: str, values: Mapping[str, object]) -> str:
    """The framework whose dtype rules a call on ``values`` follows: its own, or torch's
    where NumPy arrays stand for torch tensors (:class:`TorchStandIn`)."""
    if framework == NUMPY and any(type(v) is TorchStandIn for v in values.values()):
        return TORCH
    return framework


def tensor_placeholder(shape, dtype, device):
    """A zero torch tensor of ``shape`` and torch ``dtype`` on ``device`` with one
    element of memory (stride 0 on every axis): what binding and planning need of a
    tensor not yet computed (an intermediate of a program on the GPU).  Zero, so that a
    binding that checks an index array's range finds it in range."""
    import torch
    return torch.zeros((), dtype=dtype, device=device).expand(tuple(shape))


def placeholder(value):
    """A read-only zero array of ``value``'s shape and NumPy dtype (one element of
    memory): what binding needs to infer ranges and dtypes, for an array whose data is
    out of reach (a traced JAX value, a GPU tensor).  Python numbers pass through."""
    if isinstance(value, numbers.Number):
        return value
    key = (tuple(np.shape(value)), numpy_dtype(value))
    found = _placeholders.get(key)
    if found is None:
        if len(_placeholders) >= 512:
            _placeholders.clear()
        found = _placeholders[key] = np.broadcast_to(np.zeros((), dtype=key[1]), key[0])
    return found



def is_bfloat16(value) -> bool:
    return framework_of(value) == TORCH and str(value.dtype) == "torch.bfloat16"


def contiguous(array: np.ndarray) -> np.ndarray:
    """C-contiguous, keeping 0-d arrays 0-d (np.ascontiguousarray would make them 1-d)."""
    array = np.asarray(array)
    return array if array.flags.c_contiguous else array.copy(order="C")


def from_numpy(array: np.ndarray, framework: str, like=None):
    if framework == TORCH:
        import torch
        if isinstance(array, torch.Tensor):     # already the caller's (autograd records it)
            return array
        tensor = torch.from_numpy(contiguous(array))
        if like is not None and hasattr(like, "device"):
            tensor = tensor.to(like.device)
        return tensor
    if framework == JAX:
        import jax.numpy as jnp
        return jnp.asarray(array)
    return array


def torch_recording() -> bool:
    """Whether autograd records what runs now: grad mode on, and not inside
    ``torch.inference_mode`` (where ``torch.enable_grad()`` turns grad mode on but
    torch's own operations still record nothing and give inference tensors)."""
    found = _GRAD_MODES
    if not found:     # (called only where torch tensors are in play: torch is imported)
        import torch
        found[:] = [torch.is_grad_enabled, torch.is_inference_mode_enabled]
    return found[0]() and not found[1]()


# torch's two questions behind torch_recording, found at its first call (every repeated
# torch call asks them: no import statement and attribute lookups each time)
_GRAD_MODES: list = []
