"""Which data the compiled scatter kernels take, declared as data, and the route each
call of one takes, decided here from the data's facts (dtype, size, layout, whether a C
compiler is there) rather than inside the kernel: backends/c/scatter.py
(``scatter_rows``, ``scatter_flat``) and backends/c/strided_add.py ask
:func:`scatter_route` and then run what it returned (the compiled loop, or the NumPy
form of the same sum).  The facts are those of a signature (no values are read), so a
prepared caller may decide once and keep the value."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import FrozenSet, Optional

import numpy as np

from ..analysis.capabilities import can_build


class ScatterKernel(enum.Enum):
    """The compiled scatter kernels whose capabilities are declared below."""
    SCATTER_ROWS = "backends/c/scatter.scatter_rows: whole rows, columns split by threads"
    SCATTER_FLAT = "backends/c/scatter.scatter_flat: element by element, np.add.at's order"
    STRIDED_ADD = "backends/c/strided_add.strided_add: one strided view of the target"


class ScatterRoute(enum.Enum):
    """How one scatter call runs."""
    COMPILED = "the compiled C kernel"
    NUMPY = "the NumPy form of the same sum"
    ADD_AT = "np.add.at, element by element (about 1 us to start, 30 ns an element)"


@dataclass(frozen=True)
class Capability:
    """What a compiled scatter kernel takes: target dtypes; the fewest elements for
    which it beats NumPy (0: any); whether the values must already be of the target's
    dtype (np.add.at would round a mixed sum differently); whether the target must be
    C-contiguous and writeable; whether it refuses empty values."""
    dtypes: FrozenSet[np.dtype]
    min_elements: int = 0
    same_dtype: bool = False
    contiguous: bool = True
    writeable: bool = False
    nonempty: bool = False


_FLOATS = frozenset((np.dtype(np.float32), np.dtype(np.float64)))

# Below 2**14 elements NumPy's own row add or view add is as fast and needs no compiler.
CAPABILITIES = {
    ScatterKernel.SCATTER_ROWS: Capability(_FLOATS, min_elements=1 << 14),
    ScatterKernel.SCATTER_FLAT: Capability(_FLOATS, same_dtype=True, writeable=True,
                                           nonempty=True),
    ScatterKernel.STRIDED_ADD: Capability(_FLOATS, min_elements=1 << 14, writeable=True),
}


@dataclass(frozen=True)
class ScatterDecision:
    """The route of one scatter call, and, where it is NUMPY, why (the first fact of
    the data the kernel does not take)."""
    kernel: ScatterKernel
    route: ScatterRoute
    reason: Optional[str] = None


def scatter_route(kernel: ScatterKernel, dtype, elements: int, contiguous: bool = True,
                  writeable: bool = True, values_dtype=None) -> ScatterDecision:
    """The route a call of ``kernel`` takes for a target of ``dtype`` (C-contiguous and
    writeable as given) and ``elements`` values (of ``values_dtype``, the target's where
    None): COMPILED where the kernel's capability takes the data and a C compiler is
    there, else NUMPY with the reason."""
    capability = CAPABILITIES[kernel]
    dtype = np.dtype(dtype)
    reason = None
    if dtype not in capability.dtypes:
        reason = f"a {dtype.name} target (the kernel takes float32 and float64)"
    elif capability.same_dtype and values_dtype is not None and \
            np.dtype(values_dtype) != dtype:
        reason = f"{np.dtype(values_dtype).name} values into a {dtype.name} target"
    elif capability.nonempty and elements == 0:
        reason = "no values"
    elif elements < capability.min_elements:
        reason = f"{elements} elements (below {capability.min_elements}, NumPy is as fast)"
    elif capability.contiguous and not contiguous:
        reason = "a target that is not C-contiguous"
    elif capability.writeable and not writeable:
        reason = "a read-only target"
    elif not can_build("c"):
        reason = "no C compiler"
    route = ScatterRoute.NUMPY if reason is not None else ScatterRoute.COMPILED
    return ScatterDecision(kernel, route, reason)


# Below this many elements a prepared backward's row scatter is one np.add.at (it starts
# fastest); above it scatter_rows' sorted or compiled row adds.
SMALL_ROW_SCATTER = 256


def prepared_rows_route(dtype, elements: int, contiguous: bool = True) -> ScatterDecision:
    """The route of a prepared torch backward's row scatter (runtime/torch_prepared.py)
    for a target of ``dtype`` and ``elements`` row values, decided once per layout:
    ADD_AT for few elements, else :func:`scatter_route`'s for the row kernel."""
    if elements < SMALL_ROW_SCATTER:
        return ScatterDecision(ScatterKernel.SCATTER_ROWS, ScatterRoute.ADD_AT,
                               f"{elements} elements (below {SMALL_ROW_SCATTER})")
    return scatter_route(ScatterKernel.SCATTER_ROWS, dtype, elements, contiguous=contiguous)
