"""Nothing written when a program raises: the caller's arrays that its '='/'+='
statements write into hold their contents again when a later statement fails.

A statement computes its result into a fresh array and writes it into the caller's
only once it has succeeded (runtime/kernel.py's ``deliver``), so one statement alone
keeps the promise.  In a program, a statement after a write can still fail: a shape
that disagrees, an index value out of bounds (also one computed from an
intermediate, found only while the kernel runs), an allocation, a compile.  Checking
everything up front cannot see the last kinds, so the program keeps a copy of each
array that a statement writes into and that another statement follows, runs as
before (in place: a later statement reads the new values, under the written name or
any other name of the same memory, exactly as it did), and on any exception copies
the contents back.  An array written only by the last statement needs no copy; a
program without '='/'+=' pays nothing."""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from ..errors import AllocationError
from ..analysis.frameworks import TORCH, framework_of


def guarded_names(kernels: Sequence) -> Tuple[str, ...]:
    """The arrays that '='/'+=' statements of ``kernels`` write into while a statement
    is still to follow (in order of their first write, each once)."""
    names: List[str] = []
    for kernel in kernels[:-1]:
        spec = kernel.spec
        if spec.assign != ":=" and spec.output not in names:
            names.append(spec.output)
    return tuple(names)


def keep_contents(env: Dict[str, object], names: Sequence[str]) -> List[Tuple[object, object]]:
    """(array, copy of its contents) for each of ``names`` that can be written (a
    writable ndarray, a torch tensor); the statement itself refuses anything else."""
    kept = []
    for name in names:
        value = env.get(name)
        try:
            if type(value) is np.ndarray or isinstance(value, np.ndarray):
                if value.flags.writeable:
                    kept.append((value, value.copy()))
            elif framework_of(value) == TORCH and hasattr(value, "detach"):
                kept.append((value, value.detach().clone()))
        except Exception as error:
            if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
                raise AllocationError(
                    f"{name} ({np.prod(np.shape(value), dtype=np.int64)} elements) cannot be "
                    "copied: a program keeps a copy of each array a statement writes into "
                    "while others follow, to restore it if one of them fails") from None
            raise
    return kept


def restore_contents(kept: List[Tuple[object, object]]) -> None:
    """Copy the kept contents back (all copied before the first write: arrays that
    share memory agree on it)."""
    for array, contents in kept:
        if isinstance(array, np.ndarray):
            array[...] = contents
        else:
            import torch
            with torch.no_grad():
                array.copy_(contents)
