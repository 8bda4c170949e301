"""Named dimensions: arrays indexed by dimensions, the leaves of a named expression.

``ef.wrap(x)`` makes a NumPy array, torch tensor or JAX array indexable; ``w[k, i]`` is a
read node whose axes are dimensions, affine expressions of them (``x[i + a]``),
integers, full slices (positional axes), tuples of dimensions (an axis split row-major)
or gathers (``E[tok[b, t], d]``).  Each axis binds its dimension's size, recorded with
the axis and the line that used it (named_checks.Use), so a disagreement later names
both uses."""

from __future__ import annotations

import math
import numbers
from typing import Dict, Optional

import numpy as np

from ..errors import (EinfuseNameError, EinfuseTypeError, IndexRuleError,
                      OutOfBoundsError, RangeError, ShapeError)
from .named_checks import (DimInfo, Records, Use, Where, caller_line, error,
                           framework_name, merge_framework, merge_info)
from .named_dims import Affine, Dim, Slot, slot
from .named_node import Named, explicit_use, new_node, read_node


class Wrapped:
    """A NumPy array, torch tensor or JAX array that dimensions index: ``w[k, i]``."""
    __slots__ = ("array", "name", "shape", "framework", "where")

    def __init__(self, array, name, framework, where):
        self.array, self.name, self.framework, self.where = array, name, framework, where
        shape = array.shape
        self.shape = shape if type(array) is np.ndarray else tuple(int(n) for n in shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, items):
        return read(self, items, caller_line())

    def described(self) -> str:
        return self.name or self.kind()

    def kind(self) -> str:
        dtype = str(getattr(self.array, "dtype", "")).replace("torch.", "")
        return f"a {self.framework} {dtype} array of shape {self.shape}"

    __str__ = described

    def __repr__(self) -> str:
        return f"<einfuse.wrap of {self.described()}>"


def wrap(array, name: Optional[str] = None) -> Wrapped:
    """``array`` made indexable by dimensions.  ``name=`` names it in the program (and in
    messages); by default arrays are named A, B, C ... in order of use."""
    framework = _FRAMEWORK_OF.get(type(array))
    if framework is not None and name is None:         # an array of a type seen before
        return Wrapped(array, None, framework, caller_line())
    if isinstance(array, Wrapped):
        return array if name is None else Wrapped(array.array, name, array.framework,
                                                  array.where)
    where = caller_line()
    if name is not None and (not isinstance(name, str) or not name.isidentifier()):
        raise error(EinfuseNameError, f"name= takes a Python identifier, not {name!r}", where)
    if isinstance(array, (Named, Dim, Affine)):
        raise error(EinfuseTypeError, "ef.wrap takes an array; this is already a named "
                    "expression", where)
    framework = framework_name(array)
    if isinstance(array, np.generic):       # a NumPy scalar: its 0-d array
        array = np.asarray(array)
    if framework is None or not hasattr(array, "shape"):
        if isinstance(array, (list, tuple, numbers.Number)):
            array, framework = np.asarray(array), "numpy"
        else:
            raise error(EinfuseTypeError, "ef.wrap takes a NumPy array, torch tensor or JAX "
                        f"array, not {type(array).__name__}", where)
    elif type(array) not in _FRAMEWORK_OF and len(_FRAMEWORK_OF) < 256:
        _FRAMEWORK_OF[type(array)] = framework
    return Wrapped(array, name, framework, where)


# the array types wrap() has taken as they are (ndarray, torch.Tensor, JAX's arrays and
# tracers), and their frameworks: the next array of the type takes no checks
_FRAMEWORK_OF: Dict[type, str] = {}


def named(array, *dimensions) -> "Named":
    """``ef.named(x, b, t, h)`` is ``ef.wrap(x)[b, t, h]``."""
    return read(wrap(array), dimensions, caller_line())


class _AxisUse(tuple):
    """(wrapped, items, axis): 'axis 0 of w[k, i]', formatted only when a message needs
    it (a tuple, made with tuple.__new__: the hot path builds one per axis)."""
    __slots__ = ()

    def __str__(self) -> str:
        wrapped, items, axis = self
        shown = ", ".join(_shown_item(item) for item in items)
        return f"axis {axis} of {wrapped.described()} indexed [{shown}]"


def _axis_use(wrapped, items, axis) -> _AxisUse:
    return _new_tuple(_AxisUse, (wrapped, items, axis))


_new_tuple = tuple.__new__      # NamedTuples without their Python-level __new__


def _shown_item(item) -> str:
    if isinstance(item, slice):
        return ":"
    if isinstance(item, (tuple, list)):
        return "(" + ", ".join(_shown_item(i) for i in item) + ")"
    if isinstance(item, Dim):
        return item.name
    if isinstance(item, Named):
        return "<index expression>"
    return repr(item)


def read(wrapped: Wrapped, items, where: Where) -> "Named":
    """The leaf ``wrapped[items]``: one item per axis (``...`` standing for full slices)."""
    if not isinstance(items, tuple):
        items = (items,)
    if len(items) == len(wrapped.shape):
        fast = _plain_read(wrapped, items, where)
        if fast is not None:
            return fast
    if any(item is Ellipsis for item in items):
        if sum(item is Ellipsis for item in items) > 1:
            raise error(IndexRuleError, "an index may hold one '...'", where)
        at = next(n for n, item in enumerate(items) if item is Ellipsis)
        fill = max(0, wrapped.ndim - (len(items) - 1))
        items = items[:at] + (slice(None),) * fill + items[at + 1:]
    if len(items) != wrapped.ndim:
        few = "few" if len(items) < wrapped.ndim else "many"
        raise error(IndexRuleError, f"{wrapped.described()} has {wrapped.ndim} axes but is "
                    f"indexed with {len(items)} ([{', '.join(map(_shown_item, items))}]): "
                    f"too {few}; index each axis once (':' keeps an axis positional, '...' "
                    "the rest)", where)
    slices = sum(isinstance(item, slice) for item in items)
    info: Dict[str, DimInfo] = {}
    found = []          # the read's dimensions, in order
    subs = []
    children = []

    def bind(d: Dim, size: int, what) -> None:
        use = Use(size, what, where)
        given = explicit_use(d)
        if given is not None and given.size != size:
            raise error(ShapeError, f"dimension {d.name} has size {given.size} "
                        f"({given.what}) but {what} has {size}", given.where, where)
        entry = info.get(d.name)
        if entry is not None and entry.use is not None and entry.use.size != size:
            raise error(ShapeError, f"dimension {d.name} indexes axes of different sizes: "
                        f"{entry.use.size} ({entry.use.what}) and {size} ({what})", where)
        if entry is None or entry.use is None:
            info[d.name] = DimInfo(d, given or use)
        if d not in found:
            found.append(d)
        if not isinstance(d, Slot):
            d._bound = size

    def mention(d: Dim) -> None:
        if d.name not in info:
            info[d.name] = DimInfo(d, explicit_use(d))
        elif info[d.name].dim is not d:
            raise error(EinfuseNameError, f"two different dimension objects are both named "
                        f"{d.name!r} in one index", where)
        if d not in found:
            found.append(d)

    for axis, item in enumerate(items):
        length = wrapped.shape[axis]
        if isinstance(item, Affine) and item.plain is not None:
            item = item.plain
        if isinstance(item, Dim):
            if item.name in info and info[item.name].dim is not item:
                raise error(EinfuseNameError, f"two different dimension objects are both "
                            f"named {item.name!r} in one index", where)
            bind(item, length, _axis_use(wrapped, items, axis))
            subs.append(("d", item))
        elif isinstance(item, slice):
            if item != slice(None):
                raise error(IndexRuleError, f"only full slices ':' index a wrapped array "
                            f"(axis {axis} is given {item}); write a shift as x[i + a] with "
                            "a dimension", where)
            slices -= 1
            position = slot(slices)
            bind(position, length, _axis_use(wrapped, items, axis))
            subs.append(("d", position))
        elif isinstance(item, numbers.Integral) and not isinstance(item, bool):
            value = int(item) + (length if item < 0 else 0)
            if not 0 <= value < length:
                raise error(OutOfBoundsError, f"position {int(item)} is outside axis {axis} "
                            f"(length {length}) of {wrapped.described()}", where)
            subs.append(("i", value))
        elif isinstance(item, Affine):
            for d in item.dims():
                mention(d)
            subs.append(("a", item))
        elif isinstance(item, (tuple, list)):
            subs.append(("g", _group(wrapped, items, axis, item, bind, where)))
        elif isinstance(item, Named):
            if item.framework is not None and item.framework[0] != wrapped.framework:
                merge_framework((wrapped.framework, wrapped, wrapped.where),
                                item.framework, where)
            info = dict(merge_info((info, item.info), where))    # (bind() writes to it)
            for d in item.dims:
                if d not in found:
                    found.append(d)
            subs.append(("x", item))
            children.append(item)
        else:
            hint = " (an index array is indexed by dimensions too: " \
                   "W[ef.wrap(idx)[b], d])" if hasattr(item, "shape") else ""
            raise error(EinfuseTypeError, f"axis {axis} of {wrapped.described()} is indexed "
                        f"by {type(item).__name__}; index with dimensions, affine "
                        f"expressions of them, integers, ':' or gathers{hint}", where)
    static = tuple(_static_sub(kind, item, children) for kind, item in subs)
    return new_node("read", (wrapped, tuple(subs), static), tuple(children), tuple(found), where,
                 info, (wrapped.framework, wrapped, wrapped.where))


def _static_sub(kind, item, children):
    """A subscript's signature: dimensions by name, gathers by child position."""
    if kind == "d":
        return ("d", item.name)
    if kind == "x":
        return ("x", next(n for n, c in enumerate(children) if c is item))
    if kind == "a":
        return ("a", affine_sig(item))
    if kind == "g":
        return ("g", tuple((d.name, stride) for d, stride in item))
    return (kind, item)


def affine_sig(affine) -> tuple:
    return (tuple((d.name, c) for d, c in affine.terms),
            tuple((affine_sig(inner), op, divisor, c)
                  for (inner, op, divisor), c in affine.quasi),
            affine.constant)


def _plain_read(wrapped, items, where):
    """``w[k, i]``: each axis a different dimension without a set size (the common case,
    taken without the general path's bookkeeping); None for anything else."""
    ids = tuple(map(id, items))     # (by identity: items compare as expressions)
    parts = _PLAIN_PARTS.get(ids)
    if parts is None:
        names = set()
        for d in items:
            if type(d) is not Dim or d.name in names:
                return None
            names.add(d.name)
        if len(_PLAIN_PARTS) >= 1024:        # (it holds the dimension objects)
            _PLAIN_PARTS.clear()
        parts = _PLAIN_PARTS[ids] = (tuple([("d", d) for d in items]),
                                       tuple([("d", d.name) for d in items]))
    for d in items:
        if d._size is not None:
            return None
    shape = wrapped.shape
    known = (ids, shape, wrapped.name, wrapped.framework, wrapped.array.dtype, where)
    info = _READ_INFO.get(known)
    if info is None:
        info = Records()
        axis = 0
        for d in items:
            # (the axis' description formatted now, once per entry: an entry holds no
            # array, and any array of this kind and shape read here is described alike)
            what = str(_new_tuple(_AxisUse, (wrapped, items, axis)))
            info[d.name] = _new_tuple(DimInfo, (d, _new_tuple(Use, (shape[axis], what,
                                                                    where, False))))
            axis += 1
        if len(_READ_INFO) >= 1024:
            _READ_INFO.clear()
        _READ_INFO[known] = info
    axis = 0
    for d in items:             # (torchdim's binding on use: d.size reads it)
        d._bound = shape[axis]
        axis += 1
    return read_node((wrapped,) + parts, items, where, info,
                     (wrapped.framework, wrapped, wrapped.where),
                     ("read", wrapped.name, parts[1]))


# a plain index (the ids of distinct dimensions, which its entry keeps alive, so that no
# other object has their ids) -> its subscripts and their signature
_PLAIN_PARTS: Dict[tuple, tuple] = {}
# (those ids, the shape, the array's name, framework and dtype, the line) -> the read's
# dimension records (shared by the reads it describes: no node writes to its info; the
# records hold the dimension objects, so the ids stay theirs)
_READ_INFO: Dict[tuple, dict] = {}


def _group(wrapped, items, axis, group, bind, where):
    """``x[(c, h2, w2)]``: one axis split into dimensions, row-major; every size but one
    known (``h2.size = 2``), the other the axis' length divided by them."""
    group = tuple(d.plain if isinstance(d, Affine) and d.plain is not None else d
                  for d in group)
    if not group or not all(isinstance(d, Dim) and not isinstance(d, Slot) for d in group):
        raise error(EinfuseTypeError, f"axis {axis} of {wrapped.described()} is split into "
                    "a tuple that must hold dimensions only", where)
    length = wrapped.shape[axis]
    sizes = [d._size if d._size is not None else d._bound for d in group]
    unknown = [n for n, s in enumerate(sizes) if s is None]
    if len(unknown) > 1:
        raise error(RangeError, f"splitting axis {axis} (length {length}) of "
                    f"{wrapped.described()} into {', '.join(d.name for d in group)} needs the "
                    f"sizes of all but one; set {group[unknown[1]].name}.size", where)
    known = math.prod(s for s in sizes if s is not None)
    if unknown:
        if known == 0 or length % known:
            raise error(ShapeError, f"axis {axis} of {wrapped.described()} has length "
                        f"{length}, not a multiple of {known} (the sizes of "
                        f"{', '.join(d.name for d in group if d is not group[unknown[0]])})",
                        where)
        sizes[unknown[0]] = length // known
    elif known != length:
        raise error(ShapeError, f"axis {axis} of {wrapped.described()} has length {length}, "
                    f"but {', '.join(d.name for d in group)} have sizes "
                    f"{' x '.join(map(str, sizes))}", where)
    strides, stride = [], 1
    for d, size in zip(reversed(group), reversed(sizes)):
        bind(d, size, f"{_axis_use(wrapped, items, axis)}, split as "
                      f"({', '.join(g.name for g in group)})")
        strides.append(stride)
        stride *= size
    return tuple(zip(group, reversed(strides)))
