"""The routes a Kernel's call takes before it is bound (there is no BoundCall, so no
:class:`~einfuse.schedule.schedule.Schedule`, yet): decided here from the arguments'
kinds alone, run by ``runtime/kernel.Kernel.__call__``.  In order:

* torch DTensors: the sharded run (sharding/dtensor.py, through runtime/distributed.py);
* a recognised attention on torch tensors that the Triton kernel may take (torch CUDA
  tensors under ``auto``, or ``backend='triton'``, with Triton available): the kernel
  checks the layouts itself (backends/triton/attention.route) and may decline, and the
  call is then bound as any other -- binding costs more than a short kernel;
* JAX arrays: the JAX adapter (runtime/jax_adapter.py).

torch.compile's tracing is not decided here: ``Kernel.__call__`` asks it before even
the repeat fast path's lookup (a traced call must never run a prepared runner).
Nothing here runs or imports a framework the arguments do not belong to."""

from __future__ import annotations

import enum
from typing import Dict, Optional, Tuple

from ..analysis.binding import bind_names
from ..analysis.frameworks import JAX, common_framework, framework_of, has_dtensor
from ..analysis.triton_facts import available as triton_available
from .library import statement_attention


class Early(enum.Enum):
    DTENSORS = "torch DTensors: the sharded run"
    ATTENTION = "attention on torch tensors: the Triton kernel, before binding"
    JAX = "JAX arrays: the JAX adapter"


def before_binding(kernel, args, kwargs) -> Tuple[Optional[Early], Optional[Dict[str, object]]]:
    """(the route, the arguments by name where it needs them) of a call of ``kernel``
    (statement, spec, options) before it is bound; (None, None): bind it."""
    if has_dtensor(args, kwargs):     # torch.distributed.tensor: docs/sharding.md
        return Early.DTENSORS, None
    attention = statement_attention(kernel.statement)
    if attention is not None and kernel.options.backend in ("auto", "triton"):
        named = bind_names(kernel.spec, args, kwargs)
        if all(type(named.get(n)).__module__.startswith("torch")
               for n in (attention.query, attention.key, attention.value)) and \
                triton_may_take(attention, named, kernel.options):
            return Early.ATTENTION, named
    if any(framework_of(v) == JAX for v in (*args, *kwargs.values())):
        named = bind_names(kernel.spec, args, kwargs)
        if common_framework(named) == JAX:
            return Early.JAX, named
    return None, None


def triton_may_take(attention, named: Dict[str, object], options) -> bool:
    """Whether the fused Triton attention kernel is the one to ask about this call:
    the backend ``triton``, or ``auto`` with torch CUDA tensors for the query, keys and
    values; and Triton available here (the kernel then checks the rest itself)."""
    if options.backend not in ("auto", "triton"):
        return False
    arrays = [named.get(n) for n in (attention.query, attention.key, attention.value)]
    if options.backend == "auto" and not all(
            type(a).__module__.startswith("torch") and getattr(a, "is_cuda", False)
            for a in arrays):
        return False
    return triton_available()
