"""``explain(..., measure=True)``: the statement or program timed on this machine, for
the roofline's measured point (docs/pictures.md).

The call runs on the arrays given; for arrays given only by ``shapes=``, on zero-filled
arrays of the explained shapes and dtypes (zeros keep every gathered index inside its
array; the time of arithmetic does not depend on the values, except where denormals or
NaNs would enter, which zeros do not produce).  One untimed call first (it compiles),
then the median of repeated calls within a small budget."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Optional

import numpy as np

# zero-filled inputs beyond this are not made: explaining a huge shape must not allocate it
MEASURE_BYTES = 1 << 30
BUDGET_SECONDS = 1.0
MAX_RUNS = 50


@dataclass(frozen=True)
class Measured:
    seconds: Optional[float]      # median per call; None where not measured
    runs: int
    note: str                     # how (or why not)

    def line(self) -> str:
        if self.seconds is None:
            return f"  not measured: {self.note}"
        shown = f"{self.seconds * 1e3:.3f} ms" if self.seconds >= 1e-3 else \
            f"{self.seconds * 1e6:.1f} us"
        return f"  {shown} per call (median of {self.runs} calls after one untimed " \
               f"call; {self.note})"


def zero_inputs(operands: Iterable, given: Dict[str, object],
                wanted: Iterable[str]) -> Optional[Dict[str, np.ndarray]]:
    """Zero-filled arrays for the ``operands`` (name, shape, dtype) named in ``wanted``
    that ``given`` lacks; None where they would take more than MEASURE_BYTES."""
    wanted = set(wanted)
    missing = {o.name: o for o in operands if o.name in wanted and o.name not in given}
    if sum(o.nbytes for o in missing.values()) > MEASURE_BYTES:
        return None
    return {name: np.zeros(o.shape, _numpy_dtype(o.dtype)) for name, o in missing.items()}


def _numpy_dtype(name: str):
    try:
        return np.dtype(name)
    except TypeError:          # bfloat16 (torch only): its bytes in float32
        return np.dtype(np.float32)


def measure(run: Callable[[], object], zero_filled: bool) -> Measured:
    run()
    times = []
    deadline = time.perf_counter() + BUDGET_SECONDS
    while len(times) < 3 or (len(times) < MAX_RUNS and time.perf_counter() < deadline):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return Measured(statistics.median(times), len(times),
                    "zero-filled inputs of the explained shapes" if zero_filled
                    else "the arrays given")


def too_large(operands) -> Measured:
    total = sum(o.nbytes for o in operands)
    return Measured(None, 0, f"zero-filled inputs would take {total / 1e9:.2f} GB "
                             f"(more than {MEASURE_BYTES / 1e9:.2f} GB)")


def measure_compiled(compiled, parts, given, wanted) -> Measured:
    """``compiled`` timed on the arrays ``given`` (by name) and zero-filled arrays of the
    explained shapes for the names in ``wanted`` not given."""
    operands = [o for part in parts for o in list(part.inputs or ()) + [part.output]
                if o is not None]
    if not given and not operands:
        return Measured(None, 0, "pass arrays or shapes= to measure")
    zeros = zero_inputs(operands, given, wanted)
    if zeros is None:
        return too_large([o for o in operands if o.name in set(wanted) and o.name not in given])
    named = {**zeros, **given}
    return measure(lambda: compiled(**named), bool(zeros))
