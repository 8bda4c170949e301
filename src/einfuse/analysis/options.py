"""Options accepted by ``ein`` and ``compile``, validated once."""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple

from ..errors import OptionError
from ..lang.parser import INT64_MAX   # index values are int64 on every backend

BOUNDS_MODES = ("check", "clip", "wrap", "fill", "promise")
BACKENDS = ("auto", "numpy", "c", "triton")
# precision="fast" lets the rewrite rules that trade exactness for speed fire (as
# torch.cdist's compute_mode): (a - b)**2 summed as a**2 - 2ab + b**2, a matrix product
# (rewrite/rules.py, docs/performance.md); "exact" (the default) keeps every value.
PRECISIONS = ("exact", "fast")
DEFAULT_MEMORY_LIMIT = 256 * 2**20
# More OpenMP threads than this only costs memory (libgomp aborts the whole process when
# it cannot allocate their stacks, as for threads=10**9).
MAX_THREADS = max(1024, 4 * (os.cpu_count() or 1))
OPTION_NAMES = ("ranges", "pad", "bounds", "fill", "dtype", "backend", "threads",
                "memory_limit", "outputs", "precision")

# An explicit range: (start, stop), stop exclusive.
RangeBounds = Tuple[int, int]


@dataclass(frozen=True)
class Options:
    ranges: Tuple[Tuple[str, RangeBounds], ...] = ()
    pad: Optional[float] = None
    bounds: str = "check"
    fill: float = 0.0
    dtype: Optional[str] = None
    backend: str = "auto"
    threads: Optional[int] = None
    memory_limit: int = DEFAULT_MEMORY_LIMIT
    precision: str = "exact"
    # 0.0 == -0.0, yet a pad or fill of -0.0 gives other results (1 / pad is -inf): the
    # caches keyed by Options must tell them apart (set from pad and fill)
    negative_zeros: Tuple[bool, bool] = field(init=False, repr=False, default=(False, False))

    def __post_init__(self):
        object.__setattr__(self, "negative_zeros", (_negative_zero(self.pad),
                                                    _negative_zero(self.fill)))

    @property
    def rewrite_options(self) -> frozenset:
        """The options rewrite rules may be guarded by (rewrite/rules.py ``Rule.option``)."""
        return frozenset({f"precision={self.precision}", f"bounds={self.bounds}"})

    @property
    def range_map(self) -> Mapping[str, RangeBounds]:
        return dict(self.ranges)


def _negative_zero(value) -> bool:
    return isinstance(value, float) and value == 0.0 and math.copysign(1.0, value) < 0


def make_options(ranges=None, pad=None, bounds="check", fill=0.0, dtype=None,
                 backend="auto", threads=None, memory_limit=None,
                 precision="exact") -> Options:
    """Validate user options into a hashable :class:`Options`."""
    return Options(ranges=_ranges(ranges), pad=_pad(pad), bounds=_choice("bounds", bounds,
                                                                           BOUNDS_MODES),
                   fill=_number("fill", fill), dtype=_dtype(dtype),
                   backend=_choice("backend", backend, BACKENDS), threads=_threads(threads),
                   memory_limit=_memory_limit(memory_limit),
                   precision=_choice("precision", precision, PRECISIONS))


def option_error(option: str, message: str) -> OptionError:
    """An OptionError that records which option is at fault (the API says so when a
    tensor of the statement has that name)."""
    error = OptionError(message)
    error.option = option
    return error


def shown(value) -> str:
    """A value as an error message shows it: an array by its type and shape, not its
    data."""
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, (numbers.Number, str)):
        return f"<{type(value).__name__} of shape {tuple(shape)}>"
    return repr(value)


def _choice(option: str, value, choices) -> str:
    # 'in' on an array compares element-wise; only strings can be choices
    if not isinstance(value, str) or value not in choices:
        raise option_error(option, f"{option}={shown(value)} is not one of "
                                   f"{', '.join(map(repr, choices))}")
    return value


def _number(option: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise option_error(option, f"{option}= takes a number, not {shown(value)}")
    return float(value)


def _pad(value) -> Optional[float]:
    return None if value is None else _number("pad", value)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _ranges(ranges) -> Tuple[Tuple[str, RangeBounds], ...]:
    if ranges is None:
        return ()
    if not isinstance(ranges, Mapping):
        raise option_error("ranges", "ranges= takes a dict such as {'i': 10} or "
                                     f"{{'i': range(2, 12)}}, not {shown(ranges)}")
    result = []
    for name, value in ranges.items():
        if not isinstance(name, str):
            raise option_error("ranges", f"ranges= keys are index names, not {name!r}")
        given = f"ranges={{{name!r}: {shown(value)}}}"
        if _is_int(value):
            if value < 0:
                raise option_error("ranges", f"{given}: an extent cannot be negative")
            bounds = (0, int(value))
        elif isinstance(value, range):
            if value.step != 1:
                raise option_error("ranges", f"{given}: only step 1 is supported")
            bounds = (value.start, max(value.start, value.stop))
        else:
            raise option_error("ranges", f"{given}: give an int extent or a range")
        if not all(-INT64_MAX <= end <= INT64_MAX for end in bounds) or \
                bounds[1] - bounds[0] > INT64_MAX:
            raise option_error("ranges", f"{given}: index values are int64, so a range must "
                                         f"lie within -{INT64_MAX}..{INT64_MAX} and hold at "
                                         f"most {INT64_MAX} values")
        result.append((name, bounds))
    return tuple(sorted(result))


def _dtype(dtype) -> Optional[str]:
    if dtype is None:
        return None
    import numpy as np
    # np.dtype() raises TypeError, ValueError or KeyError for what it cannot read (an
    # array, a malformed dict); each means the same to the caller.
    try:
        resolved = np.dtype(dtype)
    except Exception:
        name = getattr(dtype, "name", None) or str(dtype).replace("torch.", "")
        try:
            resolved = np.dtype(name) if isinstance(name, str) else None
        except Exception:
            resolved = None
    if resolved is None:
        raise option_error("dtype", f"dtype={shown(dtype)} is not a dtype einfuse knows")
    if resolved.kind not in "biuf":
        raise option_error("dtype", f"dtype={shown(dtype)}: only bool, integer and float "
                                    "results are supported")
    return resolved.name


def _threads(threads) -> Optional[int]:
    if threads is None:
        return None
    if not _is_int(threads) or not 1 <= threads <= MAX_THREADS:
        raise option_error("threads", f"threads= takes an int from 1 to {MAX_THREADS} (4 "
                                      f"per CPU core, at least 1024), not {shown(threads)}; "
                                      "leave it None to let einfuse choose")
    return int(threads)


def _memory_limit(limit) -> int:
    if limit is None:
        return DEFAULT_MEMORY_LIMIT
    if not _is_int(limit) or limit < 1024:
        raise option_error("memory_limit", f"memory_limit= takes a byte count of at least "
                                           f"1024, not {shown(limit)}")
    return int(limit)

