"""Named dimensions: the dimension objects (``ef.dims``) and their affine arithmetic.

A :class:`Dim` is a name with a size; arithmetic on dimensions gives :class:`Affine`
expressions (``i + a``, ``2*i``, ``i // 4``), usable as subscripts and as index values,
and anything that is not affine (``i * j``, ``i / 2``, ``j <= i``) an index-value named
expression, built by ``frontends/named.py`` through ``hooks["value_op"]`` (this module
imports neither it nor the runtime)."""

from __future__ import annotations

import dis
import numbers
from typing import Dict, Optional, Tuple

from ..errors import EinfuseNameError, EinfuseTypeError, RangeError, ShapeError
from .named_checks import Where, caller_frame, caller_line, error

# Installed by frontends/named.py (value_op) and einfuse.named_api (materialise,
# describe, torch_function, array_ufunc, to_numpy, to_jax, dlpack, explain).
hooks: Dict[str, object] = {}


def _value_op(op: str, left, right):
    return hooks["value_op"](op, left, right)


def _is_named(value) -> bool:
    return getattr(type(value), "_named_expression", False)


class _IndexArithmetic:
    """Arithmetic on dimensions: affine results stay :class:`Affine` (usable as
    subscripts and as index values); anything else is an index-value expression."""
    __slots__ = ()

    def _affine(self) -> "Affine":
        raise NotImplementedError

    def __add__(self, other):
        return self._affine()._add(other, 1)

    def __radd__(self, other):
        return self._affine()._add(other, 1)

    def __sub__(self, other):
        return self._affine()._add(other, -1)

    def __rsub__(self, other):
        return (-self._affine())._add(other, 1)

    def __mul__(self, other):
        return self._affine()._mul(other)

    __rmul__ = __mul__

    def __neg__(self):
        return self._affine()._scaled(-1)

    def __pos__(self):
        return self

    def __floordiv__(self, other):
        return self._affine()._quasi("//", other)

    def __mod__(self, other):
        return self._affine()._quasi("%", other)

    def __truediv__(self, other):
        return _value_op("/", self, other)

    def __rtruediv__(self, other):
        return _value_op("/", other, self)

    def __rfloordiv__(self, other):
        return _value_op("//", other, self)

    def __rmod__(self, other):
        return _value_op("%", other, self)

    def __pow__(self, other):
        return _value_op("**", self, other)

    def __rpow__(self, other):
        return _value_op("**", other, self)

    def __lt__(self, other):
        return _value_op("<", self, other)

    def __le__(self, other):
        return _value_op("<=", self, other)

    def __gt__(self, other):
        return _value_op(">", self, other)

    def __ge__(self, other):
        return _value_op(">=", self, other)


class Dim(_IndexArithmetic):
    """A named dimension.  Its size comes from the arrays it indexes (checked to agree
    within an expression) or from ``dim.size = n``.  ``i == j`` compares the objects;
    the index values compare as ``(i - j) == 0`` or with ``<``, ``<=``, ``>``, ``>=``."""
    __slots__ = ("name", "_size", "_size_where", "_bound", "__weakref__")

    def __init__(self, name: str, size: Optional[int] = None):
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise error(EinfuseNameError, f"a dimension's name is a Python identifier not "
                        f"starting with '_', not {name!r}", caller_line())
        self.name = name
        self._size = None
        self._size_where = None
        self._bound = None
        if size is not None:
            self._set_size(size, caller_line())

    def _affine(self) -> "Affine":
        return Affine(((self, 1),), (), 0)

    @property
    def size(self) -> int:
        """The size set by ``dim.size = n``, else the one the last array indexed by this
        dimension gave it (as torchdim binds a dimension on first use)."""
        if self._size is not None:
            return self._size
        if self._bound is not None:
            return self._bound
        raise error(RangeError, f"dimension {self.name} has no size yet: no array has been "
                    f"indexed by it; set {self.name}.size = n", caller_line())

    @size.setter
    def size(self, value) -> None:
        self._set_size(value, caller_line())

    def _set_size(self, value, where: Where) -> None:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise error(EinfuseTypeError, f"{self.name}.size takes an int, not "
                        f"{type(value).__name__}", where)
        if value < 0:
            raise error(ShapeError, f"{self.name}.size must be at least 0, not {value}",
                        where)
        self._size, self._size_where = int(value), where

    @property
    def is_bound(self) -> bool:
        return self._size is not None or self._bound is not None

    def __repr__(self) -> str:
        size = self._size if self._size is not None else self._bound
        return f"Dim({self.name!r})" if size is None else f"Dim({self.name!r}, size={size})"

    __str__ = lambda self: self.name      # noqa: E731  (as subscripts print)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """A plain torch tensor indexed by dimensions (``A[i, k]``, as in torchdim); a
        torch function of a dimension is its index value's (or an error saying so)."""
        return hooks["torch_function"](func, args, kwargs or {}, caller_line())


class Slot(Dim):
    """A positional axis kept by a full slice ``x[:, i]``: the p-th from the right, so
    that positional axes broadcast as NumPy aligns them."""
    __slots__ = ("position",)

    def __init__(self, position: int):      # (no name check: '_p' names are internal)
        self.name, self.position = f"_{position}", position
        self._size = self._size_where = self._bound = None

    def __repr__(self) -> str:
        return f"<positional axis {self.position} from the right>"


_slots: Dict[int, Slot] = {}


def slot(position: int) -> Slot:
    found = _slots.get(position)
    if found is None:
        found = _slots[position] = Slot(position)
    return found


class Affine(_IndexArithmetic):
    """``sum(c * dim) + sum(c * (inner // d or inner % d)) + constant``: a subscript such
    as ``x[i + a]``, ``x[2*i]``, ``x[i // 4, i % 4]``, or an index value."""
    __slots__ = ("terms", "quasi", "constant")
    __hash__ = object.__hash__

    def __init__(self, terms, quasi, constant: int):
        self.terms, self.quasi, self.constant = terms, quasi, constant

    def _affine(self) -> "Affine":
        return self

    @property
    def plain(self) -> Optional[Dim]:
        if len(self.terms) == 1 and self.terms[0][1] == 1 and not self.quasi and \
                not self.constant:
            return self.terms[0][0]
        return None

    def dims(self) -> Tuple[Dim, ...]:
        found = [d for d, _ in self.terms]
        for (inner, _, _), _ in self.quasi:
            found += [d for d in inner.dims() if d not in found]
        return tuple(dict.fromkeys(found))

    def _scaled(self, factor: int) -> "Affine":
        if factor == 0:
            return Affine((), (), 0)
        return Affine(tuple((d, c * factor) for d, c in self.terms),
                      tuple((q, c * factor) for q, c in self.quasi), self.constant * factor)

    def _add(self, other, sign: int):
        if isinstance(other, bool) or not isinstance(other, (numbers.Integral, Dim, Affine)):
            if _is_named(other):
                return NotImplemented
            return _value_op("+" if sign > 0 else "-", self, other)
        if isinstance(other, numbers.Integral):
            return Affine(self.terms, self.quasi, self.constant + sign * int(other))
        other = other._affine()
        terms = dict(self.terms)
        for d, c in other.terms:
            terms[d] = terms.get(d, 0) + sign * c
        quasi = dict(self.quasi)
        for q, c in other.quasi:
            quasi[q] = quasi.get(q, 0) + sign * c
        return Affine(tuple((d, c) for d, c in terms.items() if c),
                      tuple((q, c) for q, c in quasi.items() if c),
                      self.constant + sign * other.constant)

    def _mul(self, other):
        if isinstance(other, numbers.Integral) and not isinstance(other, bool):
            return self._scaled(int(other))
        if _is_named(other):
            return NotImplemented
        return _value_op("*", self, other)

    def _quasi(self, op: str, divisor):
        positive = isinstance(divisor, numbers.Integral) and not isinstance(divisor, bool) \
            and divisor > 0
        if not positive or self.quasi:      # not a subscript: an index-value expression
            return _value_op(op, self, divisor)
        divisor = int(divisor)
        if not self.terms:
            value = self.constant // divisor if op == "//" else self.constant % divisor
            return Affine((), (), value)
        if divisor == 1:
            return self if op == "//" else Affine((), (), 0)
        return Affine((), (((self, op, divisor), 1),), 0)

    def __eq__(self, other):
        return _value_op("==", self, other)

    def __ne__(self, other):
        return _value_op("!=", self, other)

    def __repr__(self) -> str:
        parts = [f"{c}*{d.name}" if c != 1 else d.name for d, c in self.terms]
        for (inner, op, divisor), c in self.quasi:
            parts.append((f"{c}*" if c != 1 else "") + f"({inner!r} {op} {divisor})")
        if self.constant or not parts:
            parts.append(str(self.constant))
        return " + ".join(parts).replace("+ -", "- ")


def dims(spec=None, *, sizes=None):
    """``ef.dims("i j k")`` (or ``ef.dims(3)``, or ``i, j = ef.dims()``, the names then
    taken from the variables assigned) makes dimension objects; one name gives one
    :class:`Dim`, several a tuple.  ``sizes=[3, None, 4]`` sets sizes."""
    frame = caller_frame()
    assigned, unpacked = _assigned_names(frame) if frame is not None else (None, False)
    where = caller_line()
    if isinstance(spec, str):
        names = spec.replace(",", " ").split()
    elif spec is None or (isinstance(spec, numbers.Integral) and not isinstance(spec, bool)):
        if spec is not None and spec < 1:
            raise error(EinfuseTypeError, f"ef.dims({spec}) makes no dimensions; give a "
                        "positive count or names", where)
        if assigned is not None and (spec is None or len(assigned) == spec):
            names = list(assigned)
        elif spec is None:
            raise error(EinfuseNameError, "ef.dims() without names must be assigned to "
                        "variables (i, j = ef.dims()); or give the names: ef.dims('i j')",
                        where)
        else:
            names = [f"d{n}" for n in range(spec)]
    else:
        raise error(EinfuseTypeError, "ef.dims takes names ('i j k') or a count, not "
                    f"{type(spec).__name__}", where)
    if not names:
        raise error(EinfuseNameError, "ef.dims('') names no dimension", where)
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise error(EinfuseNameError, f"ef.dims names {', '.join(repeated)} twice; each "
                    "dimension gets its own name", where)
    if sizes is not None and len(sizes) != len(names):
        raise error(ShapeError, f"sizes= gives {len(sizes)} sizes for {len(names)} "
                    "dimensions", where)
    made = tuple(Dim(name) for name in names)
    for d, size in zip(made, sizes or ()):
        if size is not None:
            d._set_size(size, where)
    return made[0] if len(made) == 1 and not unpacked else made


_assigned: Dict[Tuple[object, int], Tuple[Optional[Tuple[str, ...]], bool]] = {}


def _assigned_names(frame):
    """The variable names the caller's line assigns ef.dims(...)'s result to, read from
    its bytecode once per call site: (names or None, whether the result is unpacked)."""
    key = (frame.f_code, frame.f_lasti)
    found = _assigned.get(key)
    if found is None:
        following = (i for i in dis.get_instructions(frame.f_code) if i.offset > frame.f_lasti)
        first = next(following, None)
        found = (None, False)
        stores = ("STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF")
        if first is not None and first.opname == "UNPACK_SEQUENCE":
            names = []
            for instruction in following:
                if instruction.opname not in stores or len(names) == first.argval:
                    break
                names.append(instruction.argval)
            found = (tuple(names) if len(names) == first.argval else None, True)
        elif first is not None and first.opname in stores:
            found = ((first.argval,), False)
        _assigned[key] = found
    return found
