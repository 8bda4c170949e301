"""Builds and launches the one Triton kernel of an ``ef.jit`` program
(backends/triton/jit_render.py): the source imported once per text (as the statement
kernels are, backend.kernel_module), launched through launch.PreparedLaunch (observed,
stubbable, and direct after the first call on a GPU) on a grid of one program per batch
element.  Arguments are torch tensors; converting the caller's arrays is the runtime's
(runtime/jit_triton.py)."""

from __future__ import annotations

import threading
from typing import Dict, Optional, Sequence

from .backend import kernel_module
from .jit_render import RenderedJit
from .launch import PreparedLaunch

_lock = threading.Lock()


class JitKernel:
    """``rendered`` ready to launch over ``programs`` batch elements with ``num_warps``
    warps per program; one PreparedLaunch per device."""

    def __init__(self, rendered: RenderedJit, programs: int, num_warps: int):
        self.rendered = rendered
        if int(programs) < 1:
            raise ValueError("a jit kernel runs at least one program")
        self.programs = int(programs)
        self.num_warps = num_warps
        _, module = kernel_module(rendered.source)
        self.kernel = getattr(module, rendered.kernel)
        self._launches: Dict[Optional[int], PreparedLaunch] = {}

    def launcher(self, device_index: Optional[int]) -> PreparedLaunch:
        with _lock:
            found = self._launches.get(device_index)
            if found is None:
                found = PreparedLaunch(self.kernel, (self.programs,),
                                       {"num_warps": self.num_warps}, {}, device_index)
                self._launches[device_index] = found
            return found

    def __call__(self, inputs: Sequence, outputs: Sequence) -> None:
        """Runs the kernel on torch tensors (contiguous, of the program's dtypes): the
        inputs in the program's order (constants included), then the outputs and the
        scratch arrays (RenderedJit.scratch)."""
        device = outputs[0].device if outputs else None
        index = device.index if device is not None and device.type == "cuda" else None
        self.launcher(index)(*inputs, *outputs)


__all__ = ["JitKernel"]
