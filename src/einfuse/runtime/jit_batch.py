"""``jax.vmap`` of an ``ef.jit`` function: the unbatched function's kernel run over the
batch inside one C function (``backends/c/loops_batch.py``), the batch elements shared
among OpenMP threads, the loops of the function inside each element.

The ``custom_vmap`` rule of :class:`~einfuse.runtime.jit.CompiledFunction` builds a
:class:`BatchedFunction` per (which arguments are batched, their shapes); a ``vmap`` of
that adds one more batch level (nested ``vmap``), still one kernel.  Gradients need
nothing here: ``jax.vmap`` of the ``custom_jvp`` batches its forward, its forward-mode
and its backward kernels, each of which comes through this rule.  Imported only by
``runtime/jit.py``."""

from __future__ import annotations

import ctypes
import threading
from typing import Dict, Tuple

import jax
import numpy as np

from ..errors import AllocationError, EinfuseTypeError
from ..frontends.jaxpr_values import JaxprConversionError
from .jit_support import allocate_outputs, vmapped_program

_lock = threading.Lock()


class BatchedFunction:
    """``base`` (a CompiledFunction) over batch levels ``sizes``; ``batched[i][k]``:
    whether argument ``i`` has an axis for level ``k`` (its leading axes, outermost
    level first).  Every output has all the levels."""

    def __init__(self, base, sizes: Tuple[int, ...], batched: Tuple[Tuple[bool, ...], ...]):
        from ..backends.c import loops_batch as c_loops_batch
        self.base = base
        self.sizes = sizes
        self.batched = batched
        self.name = f"the vmapped {base.name}"
        self.in_avals = tuple(
            jax.core.ShapedArray(tuple(n for n, b in zip(sizes, flags) if b) + a.shape,
                                 a.dtype)
            for a, flags in zip(base.in_avals, batched))
        self.out_avals = tuple(jax.core.ShapedArray(tuple(sizes) + a.shape, a.dtype)
                               for a in base.out_avals)
        self.blocks = None
        if len(sizes) == 1 and sizes[0] >= 2 and getattr(base, "batch_in_blocks", True):
            try:
                self.blocks = _blocks(base, sizes[0], tuple(flags[0] for flags in batched))
            except JaxprConversionError:
                pass   # a batched form JAX writes that is not converted: per element
        if self.blocks is not None:
            self.constants = [array for part in (self.blocks.full, self.blocks.rest)
                              if part is not None for _, array in part.constants]
            self.entry = c_loops_batch.build_blocks(self.blocks)
        else:
            # nested vmap (or a batch of one): the unbatched program per element
            self.constants = [array for _, array in base.program.constants]
            unbatched = tuple(False for _ in sizes)
            flags = tuple(batched) + tuple(unbatched for _ in base.program.constants)
            self.entry = c_loops_batch.build(base.program,
                                             c_loops_batch.Batch(sizes, flags))
        self._nested: Dict[object, BatchedFunction] = {}
        self.kernel = self._kernel_call()

    def host(self, *arrays):
        """Runs the kernel on NumPy arrays; returns a tuple of NumPy arrays."""
        if self.base.backend != "c":
            from .jit_triton import batched_route_of
            found = batched_route_of(self).attempt(arrays, as_jax=False)
            if found is not None:
                return found
        inputs = []
        for array, aval in zip(arrays, self.in_avals):
            # (np.require keeps a 0-d array 0-d; ascontiguousarray makes it 1-d)
            array = np.require(array, dtype=aval.dtype, requirements="C")
            if array.shape != aval.shape:
                raise EinfuseTypeError(f"{self.name} takes an argument of shape "
                                       f"{aval.shape}, not {array.shape}")
            inputs.append(array)
        outputs = allocate_outputs(self.out_avals, self.name)
        arrays = self.entry_arguments(inputs, outputs)
        pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        if self.entry(pointers, 0) != 0:
            raise AllocationError(f"the kernel of {self.name} could not allocate its "
                                  "intermediates")
        return tuple(outputs)

    def entry_arguments(self, inputs, outputs) -> list:
        """The entry's arguments in order (the XLA handler lays them out by this too)."""
        constants = [np.ascontiguousarray(array) for array in self.constants]
        # blocks: arguments, outputs, constants; elements: arguments, constants, outputs
        return list(inputs) + list(outputs) + constants if self.blocks is not None else \
            list(inputs) + constants + list(outputs)

    def _kernel_call(self):
        from .jit_ffi import kernel_call
        return kernel_call(self, self.nested)

    def nested(self, size: int, in_batched: Tuple[bool, ...]) -> "BatchedFunction":
        """This function vmapped once more: a new outermost batch level."""
        return batched_function(self.base, (size,) + self.sizes,
                                tuple((b,) + flags for b, flags in zip(in_batched,
                                                                       self.batched)),
                                self._nested)


def batched_function(base, sizes, batched, cache: Dict) -> BatchedFunction:
    """The BatchedFunction of ``base`` over ``sizes``, made once per ``cache``."""
    key = (tuple(sizes), tuple(batched))
    with _lock:
        found = cache.get(key)
    if found is not None:
        return found
    made = BatchedFunction(base, tuple(sizes), tuple(batched))
    with _lock:
        return cache.setdefault(key, made)


BLOCK = 8      # batch elements per block: the statements of a block span 8 elements, so
               # a contraction loads each weight once for 8 of them; enough blocks
               # remain to share among threads


def _blocks(base, count: int, batched: Tuple[bool, ...]):
    """The programs of ``jax.vmap(base's function)`` over blocks of BLOCK elements (and
    over the remainder), converted from their jaxprs."""
    from ..backends.c.loops_batch import Blocks
    block = min(BLOCK, count)

    def program(size):
        return vmapped_program(base.flat_fn, base.in_avals, batched, size)[0]
    rest = count % block
    return Blocks(count, block, program(block), program(rest) if rest else None, batched,
                  tuple(int(np.prod(a.shape)) for a in base.in_avals),
                  tuple(int(np.prod(a.shape)) for a in base.out_avals))
