"""The hand-written library kernels, one rule per (pattern, backend) -- as JAX registers
one lowering rule per primitive per platform.  A rule says whether a call takes that
kernel, from facts of the statement and the call (plan/library_patterns.py,
rewrite/online_softmax.py); the kernel itself may still decline data it cannot take
(a dtype, a layout, too little work), and then its fallback runs.  What each rule is
asked depends on its pattern:

* a statement's pattern (attention), asked by schedule/choose.py through
  :func:`library_for` with the statement and the arrays' framework; the kernels run
  in runtime/attention.py (backends/c/attention.py, the NumPy key-block loop,
  backends/triton/attention.py);
* a bound call's prepared repeat (the row gather; a log-sum-exp's row statistics),
  asked by schedule/choose.py through :func:`prepared_library`; the kernels are
  backends/c/gather_rows.py and backends/c/rows.statement_runner;
* a gradient's scatter-add, asked by runtime/gradient_reference.py through
  :func:`scatter_library` with a :class:`ScatterCall`, per framework of the arrays
  (the backend a gradient's scatter runs on): the strided view
  (runtime/strided_scatter.py: backends/c/strided_add.py or a NumPy/torch window),
  the colliding windows of a strided convolution's input gradient (col2im,
  runtime/window_scatter.py: one C walk or view adds, by
  schedule/window_scatter.window_scatter_decision's route), whole rows (backends/c/scatter.scatter_rows, JAX's windowed scatter), else
  element by element (backends/c/scatter.scatter_flat or np.add.at, torch's
  index_put_, JAX's .at[].add).  An entry on NumPy arrays names the compiled kernel
  it runs (:attr:`LibraryRule.kernel`); :func:`kernel_route` gives one call's route
  (the compiled kernel, or its NumPy form) from that kernel's declared capability:
  backends/c/scatter.py and backends/c/strided_add.py ask it and run what it
  returned."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from ..analysis.frameworks import JAX, NUMPY, TORCH
from ..analysis.spec import spec_of
from ..plan.library_patterns import row_gather
from ..plan.row_statistics import statement_statistics
from ..rewrite.online_softmax import Attention, recognise
from .scatter_kernels import ScatterDecision, ScatterKernel, scatter_route
from .schedule import Library


@functools.lru_cache(maxsize=256)
def statement_attention(statement: str) -> Optional[Attention]:
    """The attention one statement computes, or None (cached by its text: every call
    of a kernel asks)."""
    spec = spec_of(statement)
    if spec.assign != ":=":
        return None
    # (the spec's right side has its implicit reductions explicit)
    return recognise([dataclasses.replace(spec.statement, rhs=spec.rhs)], (spec.output,))


@dataclass(frozen=True)
class LibraryRule:
    """``applies(*question)``: whether the call the question describes takes the kernel
    on ``backend`` (the question is the pattern's: see the module's text); ``kernel``:
    the compiled scatter kernel the entry runs there (its capability, declared in
    schedule/scatter_kernels.CAPABILITIES, decides each call's route:
    :func:`kernel_route`), None where the entry runs a framework's own operation or,
    for the window add, where its route is schedule/window_scatter.py's (the one C
    walk's capability is declared there: ``ONE_PASS``)."""
    library: Library
    backend: str
    applies: Callable[..., bool]
    kernel: Optional[ScatterKernel] = None


# The patterns each way of asking considers, in the order they are tried.
STATEMENT_PATTERNS = (Library.ATTENTION,)
PREPARED_PATTERNS = (Library.GATHER_ROWS, Library.ROW_STATISTICS)
SCATTER_PATTERNS = (Library.STRIDED_ADD, Library.WINDOW_ADD, Library.SCATTER_ROWS,
                    Library.SCATTER_ADD)

_RULES: Dict[Tuple[Library, str], LibraryRule] = {}


def register(library: Library, backend: str, applies: Callable[..., bool],
             kernel: Optional[ScatterKernel] = None) -> None:
    _RULES[(library, backend)] = LibraryRule(library, backend, applies, kernel)


def rules() -> Tuple[LibraryRule, ...]:
    return tuple(_RULES.values())


def _first(patterns, backend: str, *question) -> Optional[Library]:
    for library in patterns:
        rule = _RULES.get((library, backend))
        if rule is not None and rule.applies(*question):
            return library
    return None


def library_for(statement: str, framework: str, backend: str) -> Optional[Library]:
    """The library kernel a call of ``statement`` from ``framework`` on ``backend`` (a
    resolved backend name) takes, or None."""
    return _first(STATEMENT_PATTERNS, backend, statement, framework)


def prepared_library(call, backend: str) -> Optional[Library]:
    """The library kernel a prepared repeat of ``call``'s loop nest on ``backend``
    takes where the data lets it, or None."""
    return _first(PREPARED_PATTERNS, backend, call)


@dataclass(frozen=True)
class ScatterCall:
    """What a gradient's scatter-add is decided from: whether its positions form one
    strided view of the target (runtime/strided_scatter.target_view, from
    plan/library_patterns.strided_view); whether it adds whole rows of the target
    (plan/library_patterns.scatters_rows) and, then, whether those rows' other axes
    all start at 0; whether it is of the window form (col2im: the route
    schedule/window_scatter.window_scatter_decision gives is not NOT_THIS_FORM; asked
    only where the positions are not one strided view, the entry tried first)."""
    strided: bool
    rows: bool
    rows_from_zero: bool = False
    window: bool = False


def scatter_library(question: ScatterCall, framework: str) -> Library:
    """The kernel a gradient's scatter-add on arrays of ``framework`` takes (the
    element-by-element scatter where no other applies)."""
    return _first(SCATTER_PATTERNS, framework, question) or Library.SCATTER_ADD


def compiled_kernel(library: Library, framework: str) -> Optional[ScatterKernel]:
    """The compiled scatter kernel the registry's entry for ``library`` on ``framework``
    runs, or None (no entry, or the framework's own operation)."""
    rule = _RULES.get((library, framework))
    return None if rule is None else rule.kernel


def kernel_route(library: Library, framework: str, dtype, elements: int,
                 contiguous: bool = True, writeable: bool = True,
                 values_dtype=None) -> Optional[ScatterDecision]:
    """The route one call of the registry's entry takes on data of these facts (a
    signature's: no values read): its compiled kernel's (scatter_kernels.scatter_route:
    COMPILED, or NUMPY with the reason), None where the entry has no compiled kernel."""
    kernel = compiled_kernel(library, framework)
    if kernel is None:
        return None
    return scatter_route(kernel, dtype, elements, contiguous=contiguous,
                         writeable=writeable, values_dtype=values_dtype)


def _attention_applies(statement: str, framework: str) -> bool:
    # NumPy arrays and torch tensors: runtime/attention.run_fused_attention takes them
    return framework in (NUMPY, TORCH) and statement_attention(statement) is not None


for _backend in ("c", "numpy", "triton"):
    register(Library.ATTENTION, _backend, _attention_applies)


@functools.lru_cache(maxsize=512)
def _row_gather(spec):
    return row_gather(spec)


def _gather_rows_applies(call) -> bool:
    # a copy per row: bounds that raise (check/promise), nothing padded
    return call.options.bounds in ("check", "promise") and call.options.pad is None and \
        _row_gather(call.spec) is not None


register(Library.GATHER_ROWS, "c", _gather_rows_applies)


@functools.lru_cache(maxsize=512)
def _statement_statistics(spec, options):
    return statement_statistics(spec, options)


def _row_statistics_applies(call) -> bool:
    # a log-sum-exp or cross-entropy statement (plan/row_statistics.py), float rows
    return call.dtypes.working.kind == "f" and call.dtypes.result == call.dtypes.working \
        and _statement_statistics(call.spec, call.options) is not None


register(Library.ROW_STATISTICS, "c", _row_statistics_applies)

# a gradient's scatter, per framework of its arrays (JAX's are immutable: no view); on
# NumPy arrays each runs a compiled kernel where its capability takes the data
register(Library.STRIDED_ADD, NUMPY, lambda q: q.strided, ScatterKernel.STRIDED_ADD)
register(Library.STRIDED_ADD, TORCH, lambda q: q.strided)
for _framework in (NUMPY, TORCH):     # (its route: schedule/window_scatter.py's)
    register(Library.WINDOW_ADD, _framework, lambda q: q.window)
register(Library.SCATTER_ROWS, NUMPY, lambda q: q.rows, ScatterKernel.SCATTER_ROWS)
register(Library.SCATTER_ROWS, JAX, lambda q: q.rows and q.rows_from_zero)
register(Library.SCATTER_ADD, NUMPY, lambda q: True, ScatterKernel.SCATTER_FLAT)
for _framework in (TORCH, JAX):
    register(Library.SCATTER_ADD, _framework, lambda q: True)
