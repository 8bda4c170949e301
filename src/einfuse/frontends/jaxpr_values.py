"""The vocabulary every jaxpr rule speaks: a converted value (Value), the conversion's
error (JaxprConversionError, unsupported), scalar types, reads, constants and index
arithmetic on the typed IR (ir/typed.py).  frontends/jaxpr.py's Converter and the rule
modules (jaxpr_rules, _control, _structural, _windows, _random) build on it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

from ..errors import EinfuseError
from ..ir import INDEX, Apply, Buffer, Cast, Const, Expr, Read, ScalarType


class JaxprConversionError(EinfuseError, NotImplementedError):
    """A jaxpr equation that ``ef.jit`` cannot convert (a primitive or a parameter of it
    that is not supported); the message names the primitive and the user's source line."""


@dataclass
class Value:
    """A jaxpr variable's elements: ``at(subscripts)`` is the expression of one element."""
    shape: Tuple[int, ...]
    dtype: ScalarType
    at: Callable[[Tuple[Expr, ...]], Expr]
    level: int
    compound: bool              # an element costs more than a read to compute
    buffer: Optional[str] = None
    var: Optional[str] = None   # the jaxpr variable it is the value of (for explain)
    # equations composed into ``at`` since the last buffer (Converter.equation)
    depth: int = 1

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))


def source_line(eqn) -> str:
    """The user's line that produced ``eqn`` ("file.py:12 (fn)"), or ''.  JAX skips its
    own frames; einfuse's are skipped too (a gradient is traced inside ``runtime/jit.py``:
    its equations named einfuse's line, not the user's)."""
    try:
        import os
        from jax._src import source_info_util
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
        for frame in source_info_util.user_frames(eqn.source_info.traceback):
            if not os.path.abspath(frame.file_name).startswith(package):
                return source_info_util._summarize_frame(frame)
        return ""
    except Exception:    # noqa: BLE001 - source info is a nicety, never a failure
        return ""


def unsupported(eqn, why: str = "") -> JaxprConversionError:
    where = source_line(eqn)
    text = f"ef.jit cannot convert the JAX primitive '{eqn.primitive.name}'"
    if why:
        text += f" ({why})"
    if where:
        text += f", used at {where}"
    error = JaxprConversionError(text + ADVICE)
    error.located = bool(where)
    return error


ADVICE = ("; rewrite that part with supported operations (docs/jit.md lists them), or "
           "use ef.jit(fn, fallback=True) to run it in JAX")


def scalar_type(aval, eqn=None) -> ScalarType:
    found = ScalarType.of(aval.dtype)
    if found is None:
        name = getattr(aval.dtype, "name", str(aval.dtype))
        if eqn is not None:
            raise unsupported(eqn, f"dtype {name}")
        raise JaxprConversionError(f"ef.jit does not support arrays of dtype {name}")
    return found


def read_value(buffer: Buffer, level: int) -> Value:
    return Value(buffer.shape, buffer.dtype,
                 lambda subs, b=buffer: Read(b.name, tuple(subs), b.dtype), level, False,
                 buffer.name)


def constant_value(value, dtype: ScalarType, shape=()) -> Value:
    const = Const(_python_number(value, dtype), dtype)
    return Value(tuple(shape), dtype, lambda subs: const, 0, False)


def _python_number(value, dtype: ScalarType):
    import numpy as np
    value = np.asarray(value).item()
    if dtype.is_float:
        return float(value)
    if dtype is ScalarType.BOOL:
        return bool(value)
    return int(value)


def index_add(*parts: Expr) -> Expr:
    """The sum of integer subscript parts, constants folded."""
    constant = 0
    rest = []
    for part in parts:
        if isinstance(part, Const):
            constant += int(part.value)
        else:
            rest.append(part)
    if not rest:
        return Const(constant, INDEX)
    total = rest[0]
    for part in rest[1:]:
        total = Apply("add", (total, part), INDEX)
    if constant:
        total = Apply("add", (total, Const(constant, INDEX)), INDEX)
    return total


def index_mul(part: Expr, factor: int) -> Expr:
    if factor == 1:
        return part
    if factor == 0:
        return Const(0, INDEX)
    if isinstance(part, Const):
        return Const(int(part.value) * factor, INDEX)
    return Apply("mul", (part, Const(factor, INDEX)), INDEX)


def as_index(node: Expr) -> Expr:
    return node if node.dtype is INDEX else Cast(node, INDEX)
