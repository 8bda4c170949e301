"""The Triton backend (``backend="triton"``): plain-style plans of the loop-nest IR
rendered by :mod:`einfuse.backends.triton.render`, run on torch tensors -- on a CUDA
GPU, or on the CPU under ``TRITON_INTERPRET=1`` (how CI checks this code path).

Statements whose working dtype is not float32/float64 run on the NumPy reference (the
Triton kernels compute in floating point).  Gathers under bounds='check'/'promise' are
verified before the launch, as in the C backend; a bad index value raises the
reference's error and nothing is read out of bounds.

Block sizes are the schedule's (:mod:`einfuse.schedule.triton_blocks`, which consults
the tuning cache and search of :mod:`einfuse.backends.triton.tuning`); :class:`Prepared` (the
kernel, its scalars and grid) is what both the torch launcher here and the JAX one
(:mod:`einfuse.runtime.jax_triton`) launch."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import sys
import threading
from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

import numpy as np

from ...errors import BackendError
from ...plan import buffer_slots, call_arguments, unit_axis
from .. import disk_cache
from . import tuning as tuning
from ...analysis.triton_facts import available, host_fallback, interpreted, result_dtype
from ...schedule.loop_choice import TRITON_TILE, triton_choice
from ...schedule.schedule import Route, TritonChoice
from ...schedule.triton_blocks import BlockSource, Config, KernelShape, launch_blocks
from .launch import PreparedLaunch, launch_once
from .render import Launch

_modules: Dict[str, object] = {}
# (rows, lanes) the planner tiles by (the schedule's TritonChoice carries it); the
# launch's ROWS/LANES are the schedule's choice too (schedule/triton_blocks.py)
TILE = TRITON_TILE
_lock = threading.Lock()
_launch_lock = threading.RLock()
launch_turns = _launch_lock    # (held by interpreted launches: rows.py takes it too)






def _device():
    import torch
    return torch.device("cpu" if interpreted() or not torch.cuda.is_available() else "cuda")


def _kernel_device(call):
    """Where the kernel runs: the GPU of the caller's CUDA tensors; else the default GPU
    (NumPy arrays and CPU tensors are copied there and the result copied back, as a
    caller who names backend='triton' on a GPU machine expects); the CPU under the
    interpreter."""
    import torch
    device = _device()
    if device.type == "cuda":
        for source in (call.sources or {}).values():
            if isinstance(source, torch.Tensor) and source.is_cuda:
                return source.device
    return device


def _caller_device(call):
    """The device of a torch caller's tensors (the first one's), or None."""
    import torch
    for source in (call.sources or {}).values():
        if isinstance(source, torch.Tensor):
            return source.device
    return None


def kernel_module(source: str):
    """(source hash, module): Triton reads a kernel's source from its file, so each one
    is written into the cache directory (named by its hash) and imported once."""
    key = hashlib.sha256(source.encode()).hexdigest()[:32]
    with _lock:
        module = _modules.get(key)
        if module is not None:
            return key, module
        path = os.path.join(disk_cache.cache_dir(), f"einfuse_triton_{key}.py")
        if not _holds(path, source):
            _write_module(path, source)
        spec = importlib.util.spec_from_file_location(f"einfuse_triton_{key}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _modules[key] = module
        return key, module


def _holds(path: str, source: str) -> bool:
    """Whether the file ``path`` is ``source`` (not damaged, not something else)."""
    try:
        with open(path) as handle:
            return handle.read() == source
    except (OSError, UnicodeDecodeError):
        return False


def _write_module(path: str, source: str) -> None:
    """``source`` into ``path``, whole (a temporary renamed into place); a BackendError
    naming ``path`` where it cannot be written (a directory in the way, say)."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "w") as handle:
            handle.write(source)
        os.replace(tmp, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise BackendError(f"the cached Triton kernel {path} cannot be written "
                           f"({error.strerror or error}); remove what is in its way, or "
                           "set EINFUSE_CACHE_DIR to another directory") from None


class _Layout:
    """What the planner reads of an array (shape, byte strides, item size, dtype name),
    for torch tensors and for JAX's row-major buffers alike."""

    def __init__(self, shape, strides, itemsize, dtype: str):
        self.shape, self.strides, self.itemsize, self.dtype = shape, strides, itemsize, dtype
        self.ndim = len(shape)

    @classmethod
    def of(cls, tensor):
        size = tensor.element_size()
        return cls(tuple(tensor.shape), tuple(s * size for s in tensor.stride()), size,
                   str(tensor.dtype).rsplit(".", 1)[-1])

    @classmethod
    def row_major(cls, shape, dtype):
        dtype = np.dtype(dtype) if str(dtype) != "bfloat16" else None
        itemsize = dtype.itemsize if dtype is not None else 2
        strides, step = [], itemsize
        for extent in reversed(shape):
            strides.append(step)
            step *= max(1, int(extent))
        name = dtype.name if dtype is not None else "bfloat16"
        return cls(tuple(shape), tuple(reversed(strides)), itemsize, name)


def _torch_dtype_name(tensor) -> str:
    return str(tensor.dtype).rsplit(".", 1)[-1]


def _input_tensors(call, device):
    """Kernel inputs as torch tensors on ``device``: a caller's tensor as it is when it
    is there -- in its own float dtype (float16/bfloat16 are converted in registers, not
    copied to float32 first) and with its own strides; integer index arrays as they
    are; NumPy arrays (and tensors on another device) copied to ``device``."""
    import torch
    working = getattr(torch, call.dtypes.working.name)
    tensors = []
    for name, kind in buffer_slots(call.spec)[:-1]:
        source = call.sources.get(name) if call.sources else None
        if isinstance(source, torch.Tensor):
            tensor = source.detach().to(device)
            if tensor.is_neg():    # a lazily negated view (z.conj().imag): its values
                tensor = tensor.resolve_neg()
        else:
            array = np.asarray(call.arrays[name])
            # torch refuses read-only memory (a broadcast view, a JAX buffer), negative
            # strides and non-native byte order: those are copied
            if not array.dtype.isnative:
                array = array.astype(array.dtype.newbyteorder("="))
            if not array.flags.writeable or any(st < 0 for st in array.strides):
                array = np.array(array)
            tensor = torch.from_numpy(array).to(device)
        if kind == "index":
            if tensor.dtype not in (torch.int32, torch.int64):
                tensor = tensor.to(torch.int64)
        elif not tensor.dtype.is_floating_point:   # bool/int values: computed as floats
            tensor = tensor.to(working)
        tensors.append(tensor)
    return tensors




@dataclass
class Prepared:
    """A rendered, imported kernel and everything one launch of it needs except the
    arrays and the block sizes: shared by the torch launcher and the JAX one."""
    kernel: object                # the @triton.jit function
    launch: Launch
    scalars: Tuple                # runtime ints, pad, fill, total: in order
    params: Tuple[str, ...]       # scalar parameters, in the order of the ``qv`` array
    int_values: Dict[str, int]    # the kernel's int arguments by name (grid extents)
    tuning_key: str
    total: int
    work: int                     # points of the iteration space: whether to autotune

    def grid(self, config: Config):
        import triton
        if not self.launch.tiles:
            return (triton.cdiv(self.total, config.block),)

        def extent(affine):
            return affine.const + sum(c * self.int_values[n] for n, c in affine.terms)
        outer = 1
        for affine in self.launch.outer:
            outer *= extent(affine)
        rows = extent(self.launch.rows) if self.launch.rows is not None else 1
        sizes = config.constexprs(True, self.launch.rows is not None)
        return (triton.cdiv(rows, sizes["ROWS"]),
                triton.cdiv(extent(self.launch.lanes), sizes["LANES"]), outer)

    def constexprs(self, config: Config) -> Dict[str, int]:
        return config.constexprs(self.launch.tiles, self.launch.rows is not None,
                                 self.launch.reduce_block)


@functools.lru_cache(maxsize=256)
def _compiled(choice: TritonChoice, dtypes: Tuple[str, ...], native_dot: bool):
    """(plan, @triton.jit kernel, launch, source hash) for one choice of the schedule
    (schedule/loop_choice.triton_choice: statement, layouts, nest) and the buffers'
    dtypes: planned, rendered, hashed and imported once, not per call."""
    from .render import render_triton
    plan = choice.plan()
    source, launch = render_triton(plan.program, dtypes, native_dot)
    source_hash, module = kernel_module(source)
    return plan, module.einfuse_kernel, launch, source_hash


def prepare(call, layouts: Sequence[_Layout], bounds: str, native_dot: bool) -> Prepared:
    """The kernel for these buffer layouts (the inputs' and the output's) and this
    call's scalar arguments."""
    dtypes = tuple(layout.dtype for layout in layouts)
    choice = triton_choice(call, [unit_axis(layout) for layout in layouts], bounds)
    plan, kernel, launch, source_hash = _compiled(choice, dtypes, native_dot)
    ints, _, _ = call_arguments(plan, call, layouts)
    kernel_ints = [int(v) for v in ints[:len(plan.int_args)]]
    pad = call.options.pad if call.options.pad is not None else 0.0
    total = int(np.prod(call.output_shape, dtype=np.int64))
    scalars = (*kernel_ints, float(pad), float(call.options.fill), total)
    work = 1
    for index in call.bounds.range_map:
        work *= max(1, call.bounds.extent(index))
    return Prepared(kernel, launch, scalars, tuple(plan.params),
                    dict(zip(plan.program.kernels[0].ints, kernel_ints)),
                    tuning.tuning_key(source_hash, dtypes, kernel_ints), total, work)


def choose_config(prepared: Prepared, launch_with, on_gpu: bool) -> Config:
    """The blocks the schedule's rule (schedule/triton_blocks.launch_blocks) gives this
    kernel signature; where the rule asks for a search, the search runs here (a
    measurement on the caller's arrays) and its winner goes into the tuning cache."""
    choice = launch_blocks(kernel_shape(prepared), on_gpu,
                           tuning.lookup(prepared.tuning_key))
    if choice.source is not BlockSource.SEARCH:
        return choice.config
    best = tuning.search(choice.candidates, launch_with, on_gpu)
    tuning.remember(prepared.tuning_key, best)
    return best


def kernel_shape(prepared: Prepared) -> KernelShape:
    launch = prepared.launch
    return KernelShape(launch.tiles, launch.rows is not None, bool(launch.reduce_block),
                       bool(launch.dot), prepared.work)


def _returned(result, call):
    """The result stays a tensor for a torch caller, on its tensors' device; others get
    NumPy (their results are never bfloat16, which only torch callers' inputs can be)."""
    if call.framework == "torch":
        where = _caller_device(call)
        return result if where is None or where == result.device else result.to(where)
    return result.cpu().numpy()




@dataclass(frozen=True)
class _Ready:
    """Everything a repeated launch needs beyond the arrays and scalar parameters."""
    prepared: Prepared
    config: Config
    grid: Tuple[int, ...]
    constexprs: Dict[str, int]
    launcher: PreparedLaunch      # the kernel with this grid and these options


def ready_launch(prepared: Prepared, config: Config, device) -> _Ready:
    """The prepared launch of ``prepared`` with ``config`` on ``device``."""
    grid, constexprs = prepared.grid(config), prepared.constexprs(config)
    index = device.index if getattr(device, "type", None) == "cuda" else None
    launcher = PreparedLaunch(prepared.kernel, grid, dict(
        num_warps=config.num_warps, num_stages=config.num_stages), constexprs, index)
    return _Ready(prepared, config, grid, constexprs, launcher)


# (statement, options, dtypes, ranges, bounds mode, buffer layouts, tuning setting) ->
# the launch chosen for them: a repeated call skips planning, argument building and the
# tuning look-up, which cost about 0.15 ms of host time per call on an H100 machine
_launches: Dict[tuple, _Ready] = {}
_LAUNCHES_KEPT = 4096


def _launch_key(call, layouts, bounds: str) -> tuple:
    return (call.spec, call.options, call.dtypes, call.bounds, bounds,
            tuple((l.shape, l.strides, l.dtype) for l in layouts), interpreted(),
            os.environ.get("EINFUSE_TRITON_AUTOTUNE"), os.environ.get("EINFUSE_CACHE_DIR"))


def _remember_launch(key: tuple, ready: _Ready) -> None:
    with _lock:
        if len(_launches) >= _LAUNCHES_KEPT:
            _launches.clear()
        _launches[key] = ready


# launch keys whose kernel has compiled and run once in this process (a statement's
# tuning key, a row group's kernel, dtypes and strides)
_warm = set()
warm_launches = _warm      # (read by rows.py: a warm kernel's launch takes no turn)
_WARM_KEPT = 4096
# first launches of a kernel in this process (each compiles it, or loads it from Triton's
# disk cache, and may tune it): bench reports them beside the first call's time
first_launches = 0


@contextlib.contextmanager
def launch_guard(key):
    """Calls from several threads: Triton's interpreter swaps module-level state while
    it runs a kernel, so interpreted launches take turns; on a GPU only a kernel's first
    launch for ``key`` does (its compile and tuning search), later ones run
    concurrently."""
    if not interpreted() and key in _warm:
        yield
        return
    global first_launches
    with _launch_lock:
        yield
        if key not in _warm:
            first_launches += 1
            if len(_warm) >= _WARM_KEPT:
                _warm.clear()
            _warm.add(key)


def _launch_guard(prepared: Prepared):
    return launch_guard(prepared.tuning_key)


class TritonBackend:
    name = "triton"

    @staticmethod
    def available() -> bool:
        return available()

    @staticmethod
    def run(call, schedule=None):
        # the schedule's route: a Triton kernel, or the NumPy reference for what no Triton
        # kernel computes (schedule/choose.as_written; asked here only without one)
        from ...plan.gathers import bounds_mode
        from ..numpy.backend import NumpyExecutor
        if (schedule.route is Route.HOST) if schedule is not None else host_fallback(call):
            return NumpyExecutor.for_call(call).run()
        bounds = bounds_mode(call)
        if bounds in ("check", "promise"):  # an index value may be out of range: raise
            NumpyExecutor.for_call(call).run()
        import torch
        device = _kernel_device(call)
        tensors = _input_tensors(call, device)
        result = torch.empty(call.output_shape, dtype=result_dtype(call), device=device)
        if result.numel() == 0:
            return _returned(result, call)
        on_gpu = device.type == "cuda" and not interpreted()
        layouts = [_Layout.of(t) for t in tensors + [result]]
        key = _launch_key(call, layouts, bounds)
        ready = _launches.get(key)
        prepared = ready.prepared if ready is not None else \
            prepare(call, layouts, bounds, native_dot=not interpreted())

        params = [torch.tensor([float(call.params[p]) for p in prepared.params],
                               dtype=getattr(torch, call.dtypes.working.name),
                               device=device)] if prepared.params else []

        def launch_with(config: Config):
            launch_once(prepared.kernel, prepared.grid(config),
                        (*tensors, *params, *prepared.scalars, result),
                        dict(num_warps=config.num_warps, num_stages=config.num_stages,
                             **prepared.constexprs(config)))
            return result
        with _launch_guard(prepared):
            if ready is None:
                config = choose_config(prepared, launch_with, on_gpu)
                ready = ready_launch(prepared, config, device)
                _remember_launch(key, ready)
            # (the first call too: its launch is the prepared one, which keeps Triton's
            # compiled kernel for the direct launch of the calls after it)
            ready.launcher(*tensors, *params, *prepared.scalars, result)
        return _returned(result, call)

    @staticmethod
    def source(call) -> str:
        """The Triton source for this call, its arrays taken row-major."""
        from ...plan.gathers import bounds_mode
        from .render import render_triton
        if host_fallback(call):
            return "# no generated source: the NumPy reference runs this statement"
        dtypes = [np.dtype(np.int64).name if kind == "index" else
                  call.dtypes.result.name if kind == "output" else call.dtypes.working.name
                  for _, kind in buffer_slots(call.spec)]
        names = [name for name, _ in buffer_slots(call.spec)]
        layouts = [_Layout.row_major(call.output_shape if n == len(names) - 1 else
                                     np.shape(call.arrays[name]), dtype)
                   for n, (name, dtype) in enumerate(zip(names, dtypes))]
        plan = triton_choice(call, [unit_axis(layout) for layout in layouts],
                             bounds_mode(call)).plan()
        return render_triton(plan.program, tuple(dtypes), not interpreted())[0]

    @staticmethod
    def strategy(call) -> str:
        where = "the CPU (TRITON_INTERPRET=1)" if interpreted() else "the GPU"
        return (f"one Triton kernel on {where}: each program computes a block of output "
                "elements, reductions loop with accumulators in registers, masked loads")
