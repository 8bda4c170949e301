"""What changes when the mesh spans several processes (a multi-process JAX job, one
``jax.distributed.initialize`` per process; docs/sharding.md).

Each process holds only its own devices' blocks of a global ``jax.Array``, so nothing
may fetch a whole array on the host: the eager error path of execute.py, which reruns a
failed call unsharded to name the global position of a bad index, cannot run there.
A failure is then reported from JAX's own message: a collective that lost its peers (a
process of the job died or was killed: gloo closes its connections, and every process
waiting in that collective fails at once) or a kernel's error on one of this process's
devices.  No JAX import here: the arrays are read by duck typing."""

from __future__ import annotations

import sys
from typing import Iterable

from ..errors import BackendError, EinfuseError, OutOfBoundsError, attach_statement

# words of the errors JAX's CPU collectives (gloo) and its coordination service give
# when a peer process is gone
_LOST_PEER = ("gloo", "connection", "peer", "socket", "unavailable", "heartbeat",
              "closed", "timed out", "timeout", "barrier")
_OUT_OF_RANGE = ("out_of_range", "out of range", "valid range", "out of bounds")


def spans_processes(arrays: Iterable[object]) -> bool:
    """Whether any of ``arrays`` is a global array with blocks on other processes."""
    return any(getattr(a, "is_fully_addressable", True) is False for a in arrays)


def process_text() -> str:
    jax = sys.modules.get("jax")
    if jax is None:                    # pragma: no cover - only called with JAX arrays
        return "this process"
    return f"process {jax.process_index()} of {jax.process_count()}"


def lost_peer(error: BaseException) -> bool:
    """Whether ``error`` (a collective's) says a peer process is gone."""
    return any(word in str(error).lower() for word in _LOST_PEER)


def failure(error: BaseException, source: str, where: str = None) -> EinfuseError:
    """The EinfuseError for a sharded call on global arrays that failed with JAX's (or
    torch.distributed's) runtime ``error``, on ``where`` (this process of the job)."""
    where = where or process_text()
    message = str(error).strip()
    first = message.splitlines()[0] if message else type(error).__name__
    lower = message.lower()
    if any(word in lower for word in _OUT_OF_RANGE) and "gloo" not in lower:
        # the kernel's own message (runtime/jax_ffi.py's reporter), for a position in
        # the device's block: the unsharded rerun that names the global position would
        # need the whole arrays, which span several processes
        return attach_statement(OutOfBoundsError(
            f"the sharded call failed on a device of {where}: {first} (positions "
            "are in that device's block of the arrays)"), source)
    if lost_peer(error):
        return attach_statement(BackendError(
            f"a collective across the job's processes failed on {where}: "
            f"another process of the job probably exited or was killed, so the sharded "
            f"call cannot finish ({first})"), source)
    return attach_statement(BackendError(
        f"the sharded call failed on {where} (a mesh across processes; a "
        f"collective or a kernel on one of this process's devices): {first}"), source)
