"""The lane tile and register block of a C loop nest, chosen from the working dtype and
the target CPU's vector width (analysis/machine.py): inputs of the lowering
(plan/lower.plan_for), so the schedule reads them without asking a backend."""

from __future__ import annotations

from typing import Tuple

import numpy as np

from ..analysis.machine import machine

# Lanes per output tile: 256 bytes of accumulators (8 AVX2 / 4 AVX-512 registers),
# enough independent chains to hide FMA latency; measured on dist/matmul.
TILE_BYTES = 256


def tile_for(working: np.dtype) -> int:
    return max(8, TILE_BYTES // working.itemsize)


# The widest vector the target CPU has (analysis/machine.py: -march=native, or EINFUSE_CPU).
_VECTOR_BYTES = machine().vector_bytes


def block_for(working: np.dtype) -> Tuple[int, int]:
    """(rows, lanes) of a register block: two vectors of lanes times 8 rows (AVX-512,
    32 registers) or 4 rows (AVX2, 16 registers) fill half the register file with
    accumulators; measured on dist, 8 x 32 float32 lanes ran 4x faster than 1 x 64."""
    lanes = 2 * _VECTOR_BYTES // working.itemsize
    return (8 if _VECTOR_BYTES == 64 else 4), max(4, lanes)
