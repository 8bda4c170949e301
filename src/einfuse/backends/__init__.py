"""Backends: each one runs a :class:`~einfuse.analysis.binding.BoundCall`.

A backend is a small object with ``name``, ``available()``, ``run(call, schedule)``
returning the result in the working dtype as a NumPy array (``schedule``: the call's
as-written schedule, schedule/schedule.Schedule, whose decisions it renders and runs),
``strategy(call)`` describing, for ``explain``, how it will run, and
``source(call)``, the code it generates for the call.
"""

from __future__ import annotations

from ..analysis.capabilities import register_probe
from ..errors import OptionError
from .c.backend import CBackend
from .numpy.backend import NumpyExecutor
from .triton.backend import TritonBackend


class NumpyBackend:
    name = "numpy"

    @staticmethod
    def available() -> bool:
        return True

    @staticmethod
    def run(call, schedule=None):
        return NumpyExecutor.for_call(call).run()

    @staticmethod
    def strategy(call) -> str:
        return NumpyExecutor.for_call(call).describe()

    @staticmethod
    def source(call) -> str:
        return "# no generated source: the NumPy reference interprets the statement"


_BACKENDS = {"numpy": NumpyBackend, "c": CBackend, "triton": TritonBackend}
# the schedule asks analysis/capabilities.py whether C kernels can be built here
register_probe("c", CBackend.available)


def get_backend(name: str):
    """The backend for ``backend=name``; ``auto`` picks the fastest one available."""
    if name == "auto":
        for candidate in ("c", "numpy"):
            backend = _BACKENDS.get(candidate)
            if backend is not None and backend.available():
                return backend
    backend = _BACKENDS.get(name)
    if backend is None:
        raise OptionError(f"backend={name!r} is not available in this build of einfuse "
                          f"(available: {', '.join(sorted(_BACKENDS))})")
    return backend
