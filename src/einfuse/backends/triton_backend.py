"""The Triton backend (``backend="triton"``): plain-style plans of the loop-nest IR
rendered by :mod:`einfuse.backends.triton_render`, run on torch tensors -- on a CUDA
GPU, or on the CPU under ``TRITON_INTERPRET=1`` (how CI checks this code path).

Statements whose working dtype is not float32/float64 run on the NumPy reference (the
Triton kernels compute in floating point).  Gathers under bounds='check'/'promise' are
verified before the launch, as in the C backend; a bad index value raises the
reference's error and nothing is read out of bounds."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
from typing import Dict

import numpy as np

from ..plan import buffer_slots, call_arguments, plan_for, unit_axis
from . import c_build

_modules: Dict[str, object] = {}
# (rows, lanes) of an output tile: 32 x 32 fp32 accumulators per program
TILE = (32, 32)
_lock = threading.Lock()


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def available() -> bool:
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
        return False
    if interpreted():
        return True
    import torch
    return torch.cuda.is_available()


def _device():
    import torch
    return torch.device("cpu" if interpreted() or not torch.cuda.is_available() else "cuda")


def _kernel_module(source: str):
    """Triton reads a kernel's source from its file: write each one into the cache
    directory (named by its hash) and import it once."""
    key = hashlib.sha256(source.encode()).hexdigest()[:32]
    with _lock:
        module = _modules.get(key)
        if module is not None:
            return module
        path = os.path.join(c_build.cache_dir(), f"einfuse_triton_{key}.py")
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as handle:
                handle.write(source)
            os.replace(tmp, path)
        spec = importlib.util.spec_from_file_location(f"einfuse_triton_{key}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _modules[key] = module
        return module


class _Layout:
    """What the planner reads of an array (shape, byte strides, item size), for tensors."""

    def __init__(self, shape, strides, itemsize):
        self.shape, self.strides, self.itemsize = shape, strides, itemsize
        self.ndim = len(shape)

    @classmethod
    def of(cls, tensor):
        size = tensor.element_size()
        return cls(tuple(tensor.shape), tuple(s * size for s in tensor.stride()), size)


def _input_tensors(call):
    """Kernel inputs as contiguous torch tensors in the working dtype (int64 for index
    arrays): the caller's own tensors, on their device, when the caller passed torch
    tensors; else tensors over the NumPy arrays."""
    import torch
    working = getattr(torch, call.dtypes.working.name)
    tensors = []
    for name, kind in buffer_slots(call.spec)[:-1]:
        dtype = torch.int64 if kind == "index" else working
        source = call.sources.get(name) if call.sources else None
        if isinstance(source, torch.Tensor):
            tensor = source.detach()
        else:
            array = np.asarray(call.arrays[name])
            # torch refuses read-only memory (a broadcast view, a JAX buffer) and
            # negative strides: those are copied
            if not array.flags.writeable or any(st < 0 for st in array.strides):
                array = np.array(array)
            tensor = torch.from_numpy(array)
            tensor = tensor.to(_device())
        tensors.append(tensor.to(dtype).contiguous())
    return tensors


def _returned(result, call):
    """The result stays a tensor (on its device) for a torch caller."""
    return result if call.framework == "torch" else result.cpu().numpy()


class TritonBackend:
    name = "triton"

    @staticmethod
    def available() -> bool:
        return available()

    @staticmethod
    def run(call):
        from ..plan.gathers import bounds_mode
        from .numpy_backend import NumpyExecutor
        working = call.dtypes.working
        if working.kind != "f" or working.itemsize < 4:
            return NumpyExecutor.for_call(call).run()
        bounds = bounds_mode(call)
        if bounds in ("check", "promise"):  # an index value is out of range: raise
            NumpyExecutor.for_call(call).run()
        import torch
        import triton
        from .triton_render import render_triton
        tensors = _input_tensors(call)
        torch_dtype = getattr(torch, working.name)
        device = tensors[0].device if tensors else _device()
        result = torch.empty(call.output_shape, dtype=torch_dtype, device=device)
        if result.numel() == 0:
            return _returned(result, call)
        shapes = [_Layout.of(t) for t in tensors + [result]]
        layouts = tuple(unit_axis(layout) for layout in shapes)
        plan = plan_for(call.spec, working.name, call.options.pad is not None, bounds,
                        layouts, TILE[1], TILE, plain=True, blocks=True)
        source, launch = render_triton(plan.program)
        module = _kernel_module(source)
        ints, doubles, _ = call_arguments(plan, call, shapes)
        total = int(result.numel())
        block = 1024 if interpreted() else 256
        kernel_ints = [int(v) for v in ints[:len(plan.int_args)]]
        params = [float(v) for v in doubles[:len(plan.params)]]
        pad = call.options.pad if call.options.pad is not None else 0.0
        arguments = (*tensors, result, *kernel_ints, *params, float(pad),
                     float(call.options.fill), total)
        if launch.tiles:
            values = dict(zip(plan.program.kernels[0].ints, kernel_ints))

            def extent(affine):
                return affine.const + sum(c * values[n] for n, c in affine.terms)
            outer = 1
            for affine in launch.outer:
                outer *= extent(affine)
            rows = extent(launch.rows) if launch.rows else 1
            grid = (triton.cdiv(rows, launch.row_tile), triton.cdiv(extent(launch.lanes),
                                                                    launch.lane_tile), outer)
            module.einfuse_kernel[grid](*arguments, ROWS=launch.row_tile,
                                        LANES=launch.lane_tile)
        else:
            module.einfuse_kernel[(triton.cdiv(total, block),)](*arguments, BLOCK=block)
        return _returned(result, call)

    @staticmethod
    def strategy(call) -> str:
        where = "the CPU (TRITON_INTERPRET=1)" if interpreted() else "the GPU"
        return (f"one Triton kernel on {where}: each program computes a block of output "
                "elements, reductions loop with accumulators in registers, masked loads")
