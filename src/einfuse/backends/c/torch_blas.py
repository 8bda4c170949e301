"""torch's BLAS as a backends/c/blas.py route: the prepared runners of calls on CPU
torch tensors (forward and gradient statements alike) hand NumPy views of the tensors
to these, which wrap them back as tensors (no copy) and call ``torch.matmul`` or
``torch.addmm``, so that a torch program's products all run on torch's own threads
(c_blas.py says why).

Imported only when the caller's arrays are torch tensors."""

from __future__ import annotations

import numpy as np
import torch

from .blas_route import BlasRoute

_from_numpy = torch.from_numpy


def _tensor_ready(*arrays: np.ndarray) -> bool:
    """Whether torch can take these arrays as they are: torch refuses negative strides,
    and warns (once per process) for a read-only array; NumPy's BLAS does those."""
    return all(array.flags.writeable and all(s >= 0 for s in array.strides)
               for array in arrays)


def _matmul(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    if not _tensor_ready(left, right):
        return np.matmul(left, right)
    return torch.matmul(_from_numpy(left), _from_numpy(right)).numpy()


def _addmm(addend: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    if not _tensor_ready(addend, left, right):
        product = np.matmul(left, right)
        np.add(product, addend, out=product)
        return product
    return torch.addmm(_from_numpy(addend), _from_numpy(left), _from_numpy(right)).numpy()


TORCH_BLAS = BlasRoute("torch", _matmul, _addmm)
