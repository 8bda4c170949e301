"""torch's BLAS (MKL) for a windowed contraction's products (backends/c/windowed.py):
the operands are NumPy views of arrays; they are wrapped as tensors without a copy and
multiplied by ``torch.mm`` or ``torch.bmm``, the broadcast batch axes (a weight shared
by every image) expanded as zero steps rather than copied.

``torch.matmul`` itself is not used for a broadcast batch: it copies the broadcast
operand out per batch element and then ran a conv2d's 8 x (32x144 by 144x1024) in 4.8
ms at one thread, where ``torch.bmm`` over the expanded weight takes 0.49 ms (NumPy's
OpenBLAS: 0.85 ms).

Imported only when the caller's arrays are torch tensors."""

from __future__ import annotations

import math

import numpy as np
import torch

from .blas_route import BlasRoute

_from_numpy = torch.from_numpy


def _ready(array: np.ndarray) -> bool:
    """Whether torch takes ``array`` as it is (no negative steps; writeable, or torch
    warns once per process)."""
    return array.flags.writeable and all(s >= 0 for s in array.strides)


def _row_major(matrix: np.ndarray) -> bool:
    return matrix.strides[1] == matrix.itemsize and \
        matrix.strides[0] >= matrix.shape[1] * matrix.itemsize


def _product(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``np.matmul(left, right)`` (broadcast batch axes) by torch's BLAS."""
    if not (_ready(left) and _ready(right)) or left.ndim < 2 or right.ndim < 2:
        return np.matmul(left, right)
    a, b = _from_numpy(left), _from_numpy(right)
    if a.ndim == 2 and b.ndim == 2:
        if _row_major(left) and _row_major(right.T) and left.shape[0] < right.shape[1]:
            # (both operands with the summed axis innermost, fewer rows than columns: a
            # weight gradient dy (o x bij) by patches (bij x cpq)) the transposed
            # product is the one MKL and OpenBLAS run fast: 32x8192 by 8192x144 in
            # 0.64 ms against 1.2 ms
            return torch.mm(b.t(), a.t()).numpy().T
        return torch.mm(a, b).numpy()
    # (the batch in plain Python: NumPy's broadcast_shapes and prod here, a few µs
    # alone, cost a strided conv1d's forward 60 µs of its 0.66 ms, measured, likely
    # their small allocations moving the heap under torch's result buffer)
    batch = _broadcast(left.shape[:-2], right.shape[:-2])
    if batch is None:
        return np.matmul(left, right)
    a = a.expand(*batch, *a.shape[-2:])
    b = b.expand(*batch, *b.shape[-2:])
    count = math.prod(batch)
    # (one batch axis: the flattening is a view whatever the steps; more may copy)
    product = torch.bmm(a.reshape(count, *a.shape[-2:]), b.reshape(count, *b.shape[-2:]))
    return product.reshape(*batch, *product.shape[-2:]).numpy()


def _broadcast(first, second):
    """The broadcast of two batch shapes, None where they do not broadcast."""
    rank = max(len(first), len(second))
    first = (1,) * (rank - len(first)) + tuple(first)
    second = (1,) * (rank - len(second)) + tuple(second)
    if any(x != y and x != 1 and y != 1 for x, y in zip(first, second)):
        return None
    return tuple(y if x == 1 else x for x, y in zip(first, second))


def product_into(left: np.ndarray, right: np.ndarray, out: np.ndarray) -> None:
    """``out[...] = left @ right`` (2-D) by torch's BLAS, NumPy's where torch cannot
    take the arrays as they are."""
    if _ready(left) and _ready(right) and _ready(out):
        torch.mm(_from_numpy(left), _from_numpy(right), out=_from_numpy(out))
    else:
        np.matmul(left, right, out=out)


def _addmm(addend: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    product = _product(left, right)
    np.add(product, addend, out=product)
    return product


TORCH_WINDOWED_BLAS = BlasRoute("torch", _product, _addmm)
