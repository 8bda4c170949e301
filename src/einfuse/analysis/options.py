"""Options accepted by ``ein`` and ``compile``, validated once."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

from ..errors import OptionError

BOUNDS_MODES = ("check", "clip", "wrap", "fill", "promise")
BACKENDS = ("auto", "numpy", "c", "triton")
DEFAULT_MEMORY_LIMIT = 256 * 2**20

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

    @property
    def range_map(self) -> Mapping[str, RangeBounds]:
        return dict(self.ranges)


def make_options(ranges=None, pad=None, bounds="check", fill=0.0, dtype=None,
                 backend="auto", threads=None, memory_limit=None) -> Options:
    """Validate user options into a hashable :class:`Options`."""
    return Options(ranges=_ranges(ranges), pad=_pad(pad), bounds=_choice("bounds", bounds,
                                                                           BOUNDS_MODES),
                   fill=_number("fill", fill), dtype=_dtype(dtype),
                   backend=_choice("backend", backend, BACKENDS), threads=_threads(threads),
                   memory_limit=_memory_limit(memory_limit))


def _choice(option: str, value, choices) -> str:
    if value not in choices:
        raise OptionError(f"{option}={value!r} is not one of {', '.join(map(repr, choices))}")
    return value


def _number(option: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise OptionError(f"{option}= takes a number, not {value!r}")
    return float(value)


def _pad(value) -> Optional[float]:
    return None if value is None else _number("pad", value)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _ranges(ranges) -> Tuple[Tuple[str, RangeBounds], ...]:
    if ranges is None:
        return ()
    if not isinstance(ranges, Mapping):
        raise OptionError("ranges= takes a dict such as {'i': 10} or {'i': range(2, 12)}")
    result = []
    for name, value in ranges.items():
        if not isinstance(name, str):
            raise OptionError(f"ranges= keys are index names, not {name!r}")
        if _is_int(value):
            if value < 0:
                raise OptionError(f"ranges={{{name!r}: {value}}}: an extent cannot be negative")
            result.append((name, (0, int(value))))
        elif isinstance(value, range):
            if value.step != 1:
                raise OptionError(f"ranges={{{name!r}: {value}}}: only step 1 is supported")
            result.append((name, (value.start, max(value.start, value.stop))))
        else:
            raise OptionError(f"ranges={{{name!r}: {value!r}}}: give an int extent or a range")
    return tuple(sorted(result))


def _dtype(dtype) -> Optional[str]:
    if dtype is None:
        return None
    import numpy as np
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        name = getattr(dtype, "name", None) or str(dtype).replace("torch.", "")
        try:
            resolved = np.dtype(name)
        except TypeError:
            raise OptionError(f"dtype={dtype!r} is not a dtype einfuse knows") from None
    if resolved.kind not in "biuf":
        raise OptionError(f"dtype={dtype!r}: only bool, integer and float results are "
                          "supported")
    return resolved.name


def _threads(threads) -> Optional[int]:
    if threads is None:
        return None
    if not _is_int(threads) or threads < 1:
        raise OptionError(f"threads= takes a positive int, not {threads!r}")
    return int(threads)


def _memory_limit(limit) -> int:
    if limit is None:
        return DEFAULT_MEMORY_LIMIT
    if not _is_int(limit) or limit < 1024:
        raise OptionError(f"memory_limit= takes a byte count of at least 1024, not {limit!r}")
    return int(limit)

