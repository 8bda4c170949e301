"""JAX arrays on a GPU: einfuse's Triton kernels called from XLA through
``jax_triton.triton_call``, so that forward and derivatives run on the device, under
``jax.jit``, ``jax.grad``, ``jax.jvp`` and ``jax.vmap``, with no host round trip.

The kernel, its scalar arguments, grid and block sizes are the ones the torch launcher
uses (:class:`einfuse.backends.triton.backend.Prepared`), built here from shapes and
dtypes alone (placeholders: under jit the data is traced).  What differs:

* scalar parameters travel as a small array (``qv``), since under jit they are traced;
* gathers under ``bounds='check'``/``'promise'`` take the host path
  (:mod:`einfuse.runtime.jax_adapter`): checking index values needs them on the host, and
  a jitted function cannot raise on data; ``clip``, ``wrap`` and ``fill`` gathers are
  safe inside the kernel and stay on the device;
* transformations are those of the ``einfuse`` primitive
  (:mod:`einfuse.runtime.jax_adapter`), whose lowering launches the kernel here: a
  batched call is the statement with one more index, one kernel, as on the host path;
  tangent and gradient statements run the same way; scatters add with ``.at[].add``
  (:func:`einfuse.runtime.gradient_reference.run_reference` in JAX).

Block sizes: the tuner's cached choice for the kernel and shape bucket (made by a torch
call on the same GPU), else the GPU default; XLA gives no place to time candidates."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from ..analysis.frameworks import placeholder
from ..schedule.triton_blocks import launch_blocks


def on_gpu(values) -> bool:
    """Whether these JAX values live on a GPU (traced ones: JAX's default backend)."""
    import jax
    for value in values:
        try:
            return any(d.platform == "gpu" for d in value.devices())
        except Exception:   # a tracer has no devices: it will run on the default one
            continue
    return jax.default_backend() == "gpu"


def launches_in_cpu_lowering() -> bool:
    """Whether :func:`launch_kernel` may be emitted where XLA lowers for the CPU: never
    (jax_triton's call has no CPU lowering: a jit placed on the CPU of a GPU machine
    runs the C kernel); the tests' interpreted launch, a host callback, replaces this."""
    return False


def jax_triton_installed() -> bool:
    return importlib.util.find_spec("jax_triton") is not None and \
        importlib.util.find_spec("triton") is not None


@dataclass
class DeviceCall:
    """One statement's kernel for fixed shapes and dtypes, ready for triton_call."""
    prepared: object                     # triton_backend.Prepared
    slots: Tuple[Tuple[str, str], ...]   # (tensor, "value"|"index") per input buffer
    working: str
    out_shape: Tuple[int, ...]
    out_dtype: str


def device_call(kernel, names: Sequence[str], values) -> Optional[DeviceCall]:
    """The Triton launch for these inputs, or None when the statement takes the host
    path (see the module's notes)."""
    from ..backends.triton import backend as triton_backend
    from ..plan import buffer_slots
    spec, options = kernel.spec, kernel.options
    if options.backend not in ("auto", "triton") or not triton_backend.available():
        return None
    gathers = any(t.as_index for t in spec.tensors)
    if gathers and options.bounds in ("check", "promise"):
        return None
    call = kernel.bind(**{name: placeholder(v) for name, v in zip(names, values)})
    if triton_backend.host_fallback(call) or call.bfloat16 or \
            any(n == 0 for n in call.output_shape):
        return None
    working = call.dtypes.working.name
    slots = buffer_slots(spec)[:-1]
    by_name = dict(zip(names, values))
    layouts = [triton_backend._Layout.row_major(np.shape(by_name[tensor]),
                                                _slot_dtype(by_name[tensor], kind, working))
               for tensor, kind in slots]
    result = call.dtypes.result
    out_dtype = result.name if result.kind == "f" and \
        result.itemsize < call.dtypes.working.itemsize else working
    layouts.append(triton_backend._Layout.row_major(call.output_shape, out_dtype))
    bounds = "verified" if options.bounds in ("check", "promise") else options.bounds
    prepared = triton_backend.prepare(call, layouts, bounds, native_dot=True)
    return DeviceCall(prepared, slots, working, tuple(call.output_shape), out_dtype)


def _slot_dtype(value, kind: str, working: str) -> str:
    """The dtype a buffer is passed in: floats as they are, other values converted to
    the working dtype, index arrays as int32/int64."""
    dtype = np.dtype(value.dtype)
    if kind == "index":
        return dtype.name if dtype.name in ("int32", "int64") else "int64"
    return dtype.name if dtype.kind == "f" else working


def kernel_inputs(device: DeviceCall, values: Dict[str, object]):
    """The kernel's array arguments in order (``values``: the inputs by name), converted
    as :func:`_slot_dtype` says, then the parameter array."""
    import jax.numpy as jnp
    inputs = []
    for tensor, kind in device.slots:
        value = jnp.asarray(values[tensor])
        wanted = _slot_dtype(value, kind, device.working)
        inputs.append(value if value.dtype == wanted else value.astype(wanted))
    if device.prepared.params:
        inputs.append(jnp.stack([jnp.asarray(values[p], device.working).reshape(())
                                 for p in device.prepared.params]))
    return inputs


def import_jax_triton():
    """jax_triton, imported without breaking Triton for the rest of the process:
    jax_triton 0.3 sets TRITON_CACHE_DIR to "" when imported, after which any later
    Triton compile or driver start in the process (einfuse's torch path,
    torch.compile) fails with "Could not create or locate cache dir" (seen on an H100).
    Its own compile path keeps its own cache and does not need the setting."""
    before = os.environ.get("TRITON_CACHE_DIR")
    import jax_triton
    if before is not None:
        os.environ["TRITON_CACHE_DIR"] = before
    elif os.environ.get("TRITON_CACHE_DIR") == "":
        del os.environ["TRITON_CACHE_DIR"]
    return jax_triton


def launch_kernel(device: DeviceCall, inputs):
    """One triton_call (the only line that needs jax_triton and a GPU)."""
    import jax
    from ..backends.triton import tuning as triton_tuning
    from ..backends.triton.backend import kernel_shape
    jax_triton = import_jax_triton()
    prepared = device.prepared
    # inside JAX's program no search can time candidates: the cached or default blocks
    config = launch_blocks(kernel_shape(prepared), on_gpu=True,
                           tuned=triton_tuning.lookup(prepared.tuning_key),
                           can_search=False).config
    return jax_triton.triton_call(
        *inputs, *prepared.scalars, kernel=prepared.kernel,
        out_shape=jax.ShapeDtypeStruct(device.out_shape, device.out_dtype),
        grid=prepared.grid(config), num_warps=config.num_warps,
        num_stages=config.num_stages, **prepared.constexprs(config))
