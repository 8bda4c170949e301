"""Whose BLAS computes a contraction's products (NumPy's here, torch's in
torch_blas.py): the route c_blas.py's runners call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


def _numpy_addmm(addend: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    product = np.matmul(left, right)
    np.add(product, addend, out=product)
    return product


@dataclass(frozen=True)
class BlasRoute:
    """Whose BLAS computes products: ``matmul(a, b)`` as np.matmul, and ``addmm(c, a, b)``
    = ``c + a @ b`` for 2-D ``a``, ``b`` and ``c`` broadcast to the product's shape; both
    give fresh arrays."""
    name: str
    matmul: Callable[[np.ndarray, np.ndarray], np.ndarray]
    addmm: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


NUMPY_BLAS = BlasRoute("numpy", np.matmul, _numpy_addmm)
