"""The Triton route of ``ef.jit`` (v3.md section 5): one compiled function (or its
vmapped form) run as ONE Triton kernel -- the program rendered by
backends/triton/jit_render.py, one program instance per batch element, loops and
carries inside it -- where schedule/jit_device.py's rule chooses it; else the host C
kernel runs as before, and :meth:`TritonRoute.describe` says why.

JAX arrays on a GPU reach the kernel without a copy (DLPack both ways); NumPy arrays
(a host callback's, the interpreter's) are copied to the kernel's device and the
outputs copied back.  Imported only by runtime/jit_compiled.py, jit_batch.py and
jit_ffi.py (the primitive's eager evaluation, explain's lines).

Not built (no GPU to test it): the kernel under an *outer* ``jax.jit`` on a GPU still
takes the host callback.  What jaxlib 0.10.2 offers for it, as read here:
``jaxlib.gpu_triton`` registers the custom-call targets ``triton_kernel_call`` and the
CUDA plugin's others, and exposes ``TritonKernel`` / ``TritonKernelCall`` /
``create_array_parameter``, only where the plugin (``jax_cuda12_plugin``/``13``)
provides its ``_triton`` module -- absent on a CPU-only install (``_cuda_triton`` is
None); Pallas on jaxlib <= 0.10.2 lowers instead to ``__gpu$xla.gpu.triton`` with
Triton IR built in jaxlib's own Triton dialect, which XLA compiles (IR from the pip
Triton's front end would have to match that dialect's version).  The fitting path is
the one runtime/jax_gpu.py already takes for statement kernels:
``jax_triton.triton_call`` of this kernel (pointer parameters only, a 1-D grid of
``RenderedJit.programs``), the scratch arrays as extra outputs dropped after, so XLA
launches the cubin on its own stream; failing jax_triton, ``jax.ffi`` (present:
``register_ffi_target``, ``ffi_call``, the XLA FFI headers) would take a handler of our
own that launches the cubin on the stream XLA passes."""

from __future__ import annotations

import threading
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from ..analysis.triton_facts import available, interpreted
from ..errors import EinfuseTypeError
from ..schedule.jit_device import DeviceChoice, choose

_lock = threading.Lock()


def _on_gpu(arrays) -> bool:
    """Whether the (JAX) arrays live on a GPU."""
    for array in arrays:
        devices = getattr(array, "devices", None)
        if devices is None:
            continue
        try:
            found = next(iter(devices()))
        except (TypeError, StopIteration, RuntimeError):
            continue
        return getattr(found, "platform", "cpu") in ("gpu", "cuda", "rocm")
    return False


def _can_run() -> bool:
    if not available():
        return False
    if interpreted():
        return True
    import torch
    return torch.cuda.is_available()


def _device():
    import torch
    return torch.device("cpu" if interpreted() or not torch.cuda.is_available() else "cuda")


class TritonRoute:
    """The Triton kernel of ``program`` over the batch levels ``sizes`` (none: not
    vmapped; one program per element of all levels) for ``function`` (a CompiledFunction
    or BatchedFunction: its in_avals/out_avals, name and backend), rendered when first
    asked; ``batched[i][k]``: whether the program's input ``i`` (constants included) has
    an axis for level ``k``."""

    def __init__(self, function, program, sizes: Tuple[int, ...],
                 batched: Tuple[Tuple[bool, ...], ...], backend: str, constants: Sequence,
                 block=None, epilogue=None):
        self.function = function
        # epilogue(rendered) -> the kernel as launched (a chain route's: the sums over
        # the chains in it, runtime/jit_chain_route.ChainOutputs.epilogue); None: as is
        self.epilogue = epilogue
        # block(lanes) -> (block program, its constants): the vmap of the function over
        # that many chains of the innermost level (None: not vmapped)
        self.block = block
        self.spread = ""          # how the batch lies over programs and lanes, in words
        self.program = program
        self.sizes = tuple(sizes)
        self.batch = int(np.prod(self.sizes)) if self.sizes else 1
        self.batched = batched
        self.backend = backend
        self.constants = list(constants)
        self._one_constants = list(constants)     # the one-chain program's
        self._declined: Optional[str] = None
        self._rendered = None
        self._kernel = None
        self._choices: Dict[bool, DeviceChoice] = {}
        self._succeeded = False
        # a function of a whole batch of chains: (the route of its one-chain program
        # over the chains, its ChainOutputs), or why not (runtime/jit_chains.py)
        self._chains = None
        self._spread: Dict[bool, Tuple[bool, str]] = {}

    @property
    def rendered(self):
        """The kernel's RenderedJit once decided (None: none, or declined)."""
        return self._rendered

    # -- the decision ---------------------------------------------------------------------------
    def _render(self):
        if self._rendered is not None or self._declined is not None:
            return
        from ..backends.triton.jit_render import Declined, render_jit
        try:
            self._rendered = render_jit(self.program, self.batched, self.sizes)
        except Declined as declined:
            self._declined = declined.reason
        except Exception as error:   # noqa: BLE001 -- a renderer's fault: the host runs
            self._declined = f"the Triton renderer failed ({type(error).__name__}: {error})"
        if self._rendered is not None and self.block is not None:
            self._spread_over_lanes()

    def _spread_over_lanes(self) -> None:
        """Chains per program by schedule/jit_device.lanes_for, from the one-chain
        program's tiles: the block program of that many chains rendered in its place
        (halved while its tiles exceed a program's registers); where none can be (its
        conversion or rendering declines) one program per chain stays, and ``spread``
        says why."""
        from ..backends.triton.jit_render import Declined, render_jit
        from ..schedule.jit_device import REGISTER_LIMIT, TILE_LIMIT, lanes_for
        one = self._rendered
        lanes, reason = lanes_for(self.sizes[-1], int(np.prod(self.sizes[:-1])),
                                  one.largest, one.registers)
        why = reason
        while lanes > 1:
            try:
                block, constants = self.block(lanes)
                flags = tuple(self.batched[:len(self.function.in_avals)]) + \
                    tuple(tuple(False for _ in self.sizes) for _ in constants)
                rendered = render_jit(block, flags, self.sizes, lanes)
            except Declined as declined:
                why = f"the block program of {lanes} chains declines: {declined.reason}"
                break
            except Exception as error:   # noqa: BLE001 -- its conversion: per chain
                why = (f"the block program of {lanes} chains is not converted "
                       f"({type(error).__name__}: {str(error)[:200]})")
                break
            if rendered.largest <= TILE_LIMIT and rendered.registers <= REGISTER_LIMIT:
                self._rendered, self.constants = rendered, list(constants)
                self.spread = f"{lanes} chains per program, as lanes ({reason})"
                return
            why = (f"the block program of {lanes} chains has tiles of {rendered.largest} "
                   f"elements, {rendered.registers} in all, over a program's registers")
            lanes //= 2
        self.spread = f"one program per chain ({why})"

    def choice(self, on_gpu: bool) -> DeviceChoice:
        with _lock:
            found = self._choices.get(on_gpu)
        if found is not None:
            return found
        if self.backend == "c" or (self.backend == "auto" and not on_gpu):
            made = choose(self.program, self.batch, self.backend, on_gpu, True, None)
        else:
            can_run = _can_run()
            if can_run:
                self._render()
            rendered = self._rendered
            made = choose(self.program, self.batch, self.backend, on_gpu, can_run,
                          self._declined, rendered.largest if rendered else 0,
                          rendered.registers if rendered else 0,
                          rendered.programs if rendered else None, self.spread)
            if can_run and self.block is None and not self.sizes:
                made = self._over_chains(on_gpu, made)
        with _lock:
            return self._choices.setdefault(on_gpu, made)

    # -- a function of a whole batch of chains ---------------------------------------------------
    def _chain_route(self):
        if self._chains is None:
            found = _chain_route_of(self.function)
            with _lock:
                if self._chains is None:
                    self._chains = found
        return self._chains

    def _over_chains(self, on_gpu: bool, whole: DeviceChoice) -> DeviceChoice:
        """``whole`` (the choice for the program as one), or the choice of its one-chain
        program spread over the chains where schedule/jit_device.spread_over_chains
        says so; the reason kept for explain either way."""
        from ..schedule.jit_device import serial_statements, spread_over_chains
        found = self._chain_route()
        if isinstance(found, str):
            self._spread[on_gpu] = (False, f"not spread over chains: {found}")
            return whole
        route, outputs = found
        chain = route.choice(on_gpu)
        rendered = route.rendered
        use, why = spread_over_chains(
            whole, self._rendered.largest if self._rendered else 0,
            serial_statements(route.program.steps), chain,
            rendered.programs if rendered else 1, rendered.largest if rendered else 0,
            outputs.launches,
            outputs.batch.form.chains * len(outputs.groups) if outputs.in_kernel else 0)
        form = outputs.batch.form
        if not use:
            self._spread[on_gpu] = (False, f"not spread over its {form.chains} chains ({why})")
            return whole
        self._spread[on_gpu] = (True, f"spread over {form.describe()}: {why}")
        return DeviceChoice(True, f"its one-chain program over {form.chains} chains, "
                                  f"{outputs.describe()}: {chain.reason}", chain.num_warps)

    def _run_chains(self, arrays, as_jax: bool):
        """The outputs by the one-chain kernel and the sums over the chains, or None where
        that kernel does not build (then never again: the whole program's route)."""
        route, chain_outputs = self._chains
        device = _device()
        outputs, buffers = chain_outputs.allocate(device)
        extra = chain_outputs.kernel_arguments(buffers, device)
        if route.attempt(chain_outputs.batch.arranged(arrays), None, outputs,
                         extra) is None:
            with _lock:
                reason = route._declined or "its kernel did not build"
                self._chains = f"its one-chain kernel declined ({reason})"
                self._choices.clear()
                self._spread.clear()
            return self.attempt(arrays, as_jax)
        found = chain_outputs.finish(outputs, buffers)
        self._succeeded = True
        if as_jax:
            return [_to_jax(out) for out in found]
        return tuple(out.cpu().numpy() for out in found)

    def takes(self, arrays) -> bool:
        """Whether a call on ``arrays`` runs the Triton kernel."""
        if self.backend == "c":
            return False
        return self.choice(_on_gpu(arrays)).triton

    def describe(self) -> list:
        """explain()'s lines: the choice for host arrays and for GPU arrays."""
        lines = []
        for on_gpu, where in ((False, "host arrays"), (True, "GPU arrays")):
            try:
                text = self.choice(on_gpu).describe()
            except Exception as error:       # explain describes; the call itself raises
                text = f"not decided ({type(error).__name__}: {error})"
            lines.append(f"  eager call on {where}: {text}")
            spread = self._spread.get(on_gpu)
            if spread is not None and (spread[0] or self._chains is not None):
                lines.append(f"    ({spread[1]})")
        if self.block is None and not self.sizes:
            lines += _vmapped_lines(self.function)
        return lines

    # -- the call -------------------------------------------------------------------------------
    def kernel(self):
        with _lock:
            if self._kernel is None:
                from ..backends.triton.jit_launch import JitKernel
                choice = self._choices.get(True) or self._choices.get(False)
                rendered = self._rendered if self.epilogue is None else \
                    self.epilogue(self._rendered)
                self._kernel = JitKernel(rendered, self._rendered.programs,
                                         choice.num_warps if choice else 1)
            return self._kernel

    def attempt(self, arrays, as_jax, outputs=None, extra=()):
        """The kernel's outputs on ``arrays`` where the rule chooses it, else None (the
        host kernel runs); ``as_jax`` None: torch tensors, into ``outputs`` where given.  A kernel that fails to build (Triton's compiler refusing what
        the renderer wrote) declines from then on, with that reason; the host kernel
        runs instead, so the call still gets its result.  A kernel over lanes that
        fails so gives way to one program per chain first."""
        if not self.takes(arrays):
            return None
        if self._spread.get(_on_gpu(arrays), (False,))[0]:
            return self._run_chains(arrays, as_jax)
        try:
            return self.run(arrays, as_jax, outputs, extra)
        except EinfuseTypeError:
            raise
        except Exception as error:   # noqa: BLE001 -- see above; only before a success
            if self._succeeded:
                raise
            if self._rendered is not None and self._rendered.lanes > 1:
                with _lock:
                    self._rendered, self.block, self._kernel = None, None, None
                    self.constants, self._choices = list(self._one_constants), {}
                    self._render()
                    self.spread = (f"one program per chain (its kernel over lanes did not "
                                   f"build: {type(error).__name__}: {str(error)[:200]})")
                if self._rendered is not None:
                    return self.attempt(arrays, as_jax, outputs, extra)
            with _lock:
                self._declined = (f"its Triton kernel did not build ({type(error).__name__}: "
                                  f"{str(error)[:300]})")
                self._rendered = None
                self._kernel = None
                self._choices.clear()
            return None

    def run(self, arrays, as_jax, outputs=None, extra=()):
        """The outputs of the kernel on ``arrays`` (JAX arrays when ``as_jax``, NumPy
        arrays when False, the torch tensors -- ``outputs`` where given -- when None);
        ``extra``: what the kernel takes after its scratch (its epilogue's tensors)."""
        import torch
        device = _device()
        function = self.function
        inputs = []
        for array, aval in zip(arrays, function.in_avals):
            inputs.append(_tensor(array, aval, device, function.name))
        for constant in self.constants:
            inputs.append(_tensor(np.asarray(constant), None, device, function.name))
        if outputs is None:
            outputs = [torch.empty(tuple(aval.shape), dtype=_torch_dtype(aval.dtype),
                                   device=device) for aval in function.out_avals]
        if self.batch > 0:          # (an empty batch: nothing to compute, nothing to launch)
            kernel = self.kernel()
            scratch = [torch.empty(max(1, kernel.programs * size), dtype=_torch_dtype(dtype),
                                   device=device)
                       for _, dtype, size in self._rendered.scratch]
            kernel(inputs, list(outputs) + scratch + list(extra))
        self._succeeded = True
        if as_jax is None:
            return list(outputs)
        if as_jax:
            return [_to_jax(out) for out in outputs]
        return tuple(out.cpu().numpy() for out in outputs)


def _chain_route_of(function):
    """(the TritonRoute of ``function``'s one-chain program over its chains, its
    ChainOutputs), or why there is none: ``function`` (a CompiledFunction) is not a
    batch of chains that runtime/jit_chains.py recovers, or its one-chain program is
    not converted."""
    closed = getattr(function, "closed", None)
    if closed is None:
        return "no jaxpr to look into"
    from .jit_chain_route import ChainBatch, ChainOutputs
    from .jit_chains import find_chains
    try:
        form, why = find_chains(closed)
        if form is None:
            return why
        batch = ChainBatch(function, form)
    except Exception as error:   # noqa: BLE001 -- a form not converted: the whole program
        return f"its one-chain program is not converted ({type(error).__name__}: " \
               f"{str(error)[:200]})"
    flags = tuple(batch.batched) + tuple((False,) for _ in batch.constants)
    outputs = ChainOutputs(batch)
    route = TritonRoute(batch, batch.program, batch.sizes, flags, function.backend,
                        batch.constants, block=batch.block, epilogue=outputs.epilogue)
    return route, outputs


def _torch_dtype(dtype):
    import torch
    return getattr(torch, np.dtype(dtype).name)


def _tensor(array, aval, device, name: str):
    """``array`` as a contiguous torch tensor on ``device`` (of ``aval``'s dtype and
    shape): a JAX GPU array through DLPack, anything else through NumPy."""
    import torch
    if device.type == "cuda" and _on_gpu([array]):
        tensor = torch.from_dlpack(array)
        if aval is not None:
            tensor = tensor.to(_torch_dtype(aval.dtype))
        return tensor.contiguous()
    host = np.asarray(array)
    if aval is not None:
        host = np.asarray(host, dtype=aval.dtype)
        if host.shape != tuple(aval.shape):
            raise EinfuseTypeError(f"{name} takes an argument of shape {tuple(aval.shape)}, "
                                   f"not {host.shape}")
    if not host.flags.c_contiguous or not host.flags.writeable or not host.dtype.isnative:
        host = np.array(host, order="C", dtype=host.dtype.newbyteorder("="))
    return torch.from_numpy(host).to(device)


def _to_jax(tensor):
    import jax
    import jax.numpy as jnp
    if tensor.device.type == "cuda":
        return jax.dlpack.from_dlpack(tensor)
    return jnp.asarray(tensor.numpy())


def route_of(function) -> TritonRoute:
    """The Triton route of a CompiledFunction, made once."""
    found = function.__dict__.get("_triton_route")
    if found is None:
        program = function.program
        constants = [array for _, array in program.constants]
        found = TritonRoute(function, program, (), tuple(() for _ in program.inputs),
                            function.backend, constants)
        with _lock:
            found = function.__dict__.setdefault("_triton_route", found)
    return found


def batched_route_of(batched) -> TritonRoute:
    """The Triton route of a BatchedFunction: its base program once per batch element
    (of every vmap level: a nested vmap too)."""
    found = batched.__dict__.get("_triton_route")
    if found is None:
        base = batched.base
        program = base.program
        constants = [array for _, array in program.constants]
        sizes = tuple(int(n) for n in batched.sizes)
        flags = tuple(tuple(bool(b) for b in f) for f in batched.batched) + \
            tuple(tuple(False for _ in sizes) for _ in constants)
        found = TritonRoute(batched, program, sizes, flags, base.backend, constants,
                            block=lambda lanes: _block_program(batched, lanes))
        with _lock:
            found = batched.__dict__.setdefault("_triton_route", found)
    return found


def _vmapped_lines(function) -> list:
    """explain()'s lines on the vmaps of ``function`` (a CompiledFunction) made so far:
    how each batch lies over programs and lanes, on GPU arrays."""
    lines, pending = [], list(getattr(function, "_batched", {}).values())
    while pending:
        batched = pending.pop(0)
        pending += list(getattr(batched, "_nested", {}).values())
        route = batched_route_of(batched)
        try:
            text = route.choice(True).describe()
        except Exception as error:       # explain describes; the call itself raises
            text = f"not decided ({type(error).__name__}: {error})"
        lines.append(f"  vmapped over {' x '.join(map(str, batched.sizes))} (GPU arrays): "
                     f"{text}")
    return lines


def _block_program(batched, lanes: int):
    """The program of ``jax.vmap`` of ``batched``'s function over ``lanes`` chains of
    its innermost batch level (JAX's batching rules: a per-chain loop condition becomes
    a masked loop until every lane is done, a per-chain branch both branches and a
    select), converted; and its constants."""
    from .jit_support import vmapped_program
    base = batched.base
    inner = tuple(bool(flags[-1]) for flags in batched.batched)
    return vmapped_program(base.flat_fn, base.in_avals, inner, lanes)


__all__ = ["TritonRoute", "batched_route_of", "route_of"]
