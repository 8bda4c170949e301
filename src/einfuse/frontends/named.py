"""Named dimensions (v3 section 2): index notation written as Python expressions.

    i, j, k = ef.dims("i j k")
    D = ((ef.wrap(w)[k, i] - ef.wrap(x)[k, j]) ** 2).sum(k)    # nothing runs yet
    D.order(i, j)                                              # one fused kernel

A :class:`Named` expression is a program under construction: a DAG whose leaves are
arrays indexed by dimensions (:class:`Dim`), affine expressions of them (:class:`Affine`),
integers, full slices and gathers, and whose inner nodes are the notation's operators,
functions and reductions.  Its axes are a set of dimensions, with no order; broadcasting
is by name.  Nothing is computed here: ``named_program`` spells the DAG as an einfuse
program, and ``einfuse.named_api`` compiles and runs it (``order``, ``np.asarray``,
``ef.evaluate``), through hooks it installs (this module imports no runtime).

Each node remembers the Python line that built it and, per dimension name, the
dimension object and the first use that gave it a size (named_checks.py), so misuse is
reported where it happens, naming the dimension and the line."""

from __future__ import annotations

import math
import numbers
from typing import Dict, Optional, Tuple

import numpy as np

from ..errors import (EinfuseNameError, EinfuseTypeError, IndexRuleError,
                      OutOfBoundsError, RangeError, ShapeError)
from ..lang.ast import UNARY_FUNCTIONS
from .named_checks import (DimInfo, Use, Where, caller_line, error, framework_name,
                           merge_framework, merge_info)
from .named_dims import Affine, Dim, Slot, dims, hooks, slot   # noqa: F401 (re-exported)
from .named_keys import keyed, keys as _keys

SMALL_INT = 16          # ints up to this magnitude are literals, larger ones parameters
REDUCTION_METHODS = ("sum", "prod", "max", "min", "logsumexp", "mean", "var", "argmax",
                     "argmin")


# -- arrays --------------------------------------------------------------------------------

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


def _explicit(d: Dim) -> Optional[Use]:
    if d._size is None:
        return None
    return Use(d._size, f"{d.name}.size = {d._size}", d._size_where, True)


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
        given = _explicit(d)
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
            info[d.name] = DimInfo(d, _explicit(d))
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
    return _node("read", (wrapped, tuple(subs), static), tuple(children), tuple(found), where,
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
    info = {}
    shape = wrapped.shape
    axis = 0
    for d in items:
        size = shape[axis]
        use = _new_tuple(Use, (size, _new_tuple(_AxisUse, (wrapped, items, axis)), where,
                               False))
        info[d.name] = _new_tuple(DimInfo, (d, use))
        d._bound = size
        axis += 1
    return _node("read", (wrapped,) + parts, (), items, where, info,
                 (wrapped.framework, wrapped, wrapped.where),
                 ("read", wrapped.name, parts[1]))


# a plain index (the ids of distinct dimensions, which its entry keeps alive, so that no
# other object has their ids) -> its subscripts and their signature
_PLAIN_PARTS: Dict[tuple, tuple] = {}


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


# -- expressions ---------------------------------------------------------------------------

class Named:
    """A named expression: a set of dimensions and the DAG that computes its values.
    Combine with operators, ``ef.where`` and the notation's functions; reduce with the
    methods; materialise with :meth:`order`, ``np.asarray`` or ``ef.evaluate``."""
    __slots__ = ("op", "args", "children", "dims", "info", "framework", "line", "reduces",
                 "local", "depth", "key", "arrays", "params", "_value", "__weakref__")
    __array_priority__ = 1000           # NumPy defers binary operators to ours
    __hash__ = object.__hash__
    _named_expression = True            # (what named_dims' arithmetic defers to)

    @property
    def sizes(self) -> Dict[Dim, Optional[int]]:
        """Each dimension of the expression and the size its arrays give it (None where
        only the program's ranges will tell: a dimension read only through shifted
        subscripts; a shifted read may also narrow a given size, as in the notation)."""
        return {d: (self.info[d.name].use.size if self.info[d.name].use else None)
                for d in self.dims}

    def order(self, *dimensions, **options):
        """The values as an array of the inputs' framework, axes in this order (a tuple
        of dimensions is one axis, flattened row-major); every dimension exactly once.
        Options are ``ef.compile``'s (``backend=``, ``dtype=``, ``threads=`` ...)."""
        return hooks["materialise"]([(self, dimensions)], options, caller_line())[0]

    def item(self):
        return self.order().item()

    def __repr__(self) -> str:
        return hooks["describe"](self)

    def __bool__(self):
        raise error(EinfuseTypeError, "a named expression has no truth value (it is an "
                    "array); use ef.where(c, a, b) or materialise it with .order(...)",
                    caller_line())

    def __iter__(self):
        raise error(EinfuseTypeError, "a named expression has no order to iterate in; "
                    "materialise it with .order(...)", caller_line())

    def __array__(self, dtype=None, copy=None):
        return hooks["to_numpy"](self, dtype, caller_line())

    def __jax_array__(self):
        return hooks["to_jax"](self, caller_line())

    def __dlpack__(self, **kwargs):
        value = hooks["dlpack"](self, caller_line())
        self._value = None          # (kept only from __dlpack_device__ to here)
        return value.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return hooks["dlpack"](self, caller_line()).__dlpack_device__()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return hooks["torch_function"](func, args, kwargs or {}, caller_line())

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return hooks["array_ufunc"](ufunc, method, inputs, kwargs, caller_line())

    def __neg__(self):
        return _node_of("un", ("-",), (self,), caller_line())

    def __pos__(self):
        return self

    def __abs__(self):
        return _node_of("call", ("abs",), (self,), caller_line())

    def __invert__(self):
        raise error(EinfuseTypeError, "the notation has no '~'; write (c) == 0 for "
                    "the negation of a condition", caller_line())

    # reductions
    def _reduced(self, kind: str, dimensions, where: Where) -> "Named":
        chosen = _dimension_list(dimensions, f".{kind}()", where)
        if not chosen:
            chosen = self.dims
        # (sets: a tuple's `in` compares dimensions through their Python-level rich
        # comparison, slower than hashing them)
        present_dims = set(self.dims)
        for d in chosen:
            if d not in present_dims:
                present = self.info.get(d.name)
                how = " (it is reduced already inside)" if present is not None and \
                    present.dim is d else ""
                raise error(IndexRuleError, f".{kind}({d.name}): dimension {d.name} is not "
                            f"a dimension of the expression{how}; its dimensions are "
                            f"{_names(self.dims)}", where)
        reduced = set(chosen)
        kept = []
        for d in self.dims:
            if d not in reduced:
                kept.append(d)
        return _node("reduce", (kind, chosen), (self,), tuple(kept), where, self.info,
                     self.framework, ("r", kind, tuple([d.name for d in chosen])))

    def softmax(self, *dimensions):
        """``exp(x - max) / sum(exp(x - max))`` over ``dimensions``, which it keeps."""
        where = caller_line()
        chosen = _dimension_list(dimensions, ".softmax()", where)
        if not chosen:
            raise error(IndexRuleError, ".softmax() needs the dimension(s) to normalise "
                        "over: x.softmax(k)", where)
        weights = _node_of("call", ("exp",), (_node_of(
            "bin", ("-",), (self, self._reduced("max", chosen, where)), where),), where)
        return _node_of("bin", ("/",), (weights, weights._reduced("sum", chosen, where)),
                        where)

    def log_softmax(self, *dimensions):
        """``x - logsumexp(x)`` over ``dimensions``, which it keeps."""
        where = caller_line()
        chosen = _dimension_list(dimensions, ".log_softmax()", where)
        if not chosen:
            raise error(IndexRuleError, ".log_softmax() needs the dimension(s): "
                        "x.log_softmax(k)", where)
        return _node_of("bin", ("-",), (self, self._reduced("logsumexp", chosen, where)),
                        where)

    def pow(self, exponent):
        return _node_of("call", ("pow",), (self, exponent), caller_line())

    def where(self, a, b):
        """``ef.where(self, a, b)``."""
        return _node_of("call", ("where",), (self, a, b), caller_line())


def _reduction_method(kind: str):
    def method(self, *dimensions):
        return self._reduced(kind, dimensions, caller_line())
    method.__name__ = kind
    method.__doc__ = f"The {kind} over the dimensions given (all of them when none is)."
    return method


def _unary_method(name: str):
    def method(self):
        return _node_of("call", (name,), (self,), caller_line())
    method.__name__ = name
    return method


def _binary_operator(op: str, reflected: bool = False):
    args, local = (op,), ("b", op)

    def method(self, other):
        where = caller_line()
        operand = other if type(other) is Named else _operand(other, where)
        if operand is None:
            return NotImplemented
        if reflected:
            return _pair(args, local, operand, self, where)
        return _pair(args, local, self, operand, where)
    return method


for _kind in REDUCTION_METHODS:
    setattr(Named, _kind, _reduction_method(_kind))
for _name in UNARY_FUNCTIONS:
    if _name != "abs":
        setattr(Named, _name, _unary_method(_name))
for _op, _dunder in (("+", "add"), ("-", "sub"), ("*", "mul"), ("/", "truediv"),
                     ("//", "floordiv"), ("%", "mod"), ("**", "pow"), ("&", "and"),
                     ("|", "or")):
    setattr(Named, f"__{_dunder}__", _binary_operator(_op))
    setattr(Named, f"__r{_dunder}__", _binary_operator(_op, reflected=True))
for _op, _dunder in (("<", "lt"), ("<=", "le"), (">", "gt"), (">=", "ge"), ("==", "eq"),
                     ("!=", "ne")):
    setattr(Named, f"__{_dunder}__", _binary_operator(_op))


def _names(found) -> str:
    return ", ".join(d.name for d in found) or "none"


def _dimension_list(dimensions, what: str, where: Where) -> Tuple[Dim, ...]:
    if len(dimensions) == 1 and type(dimensions[0]) is Dim:     # .sum(k)
        return tuple(dimensions)
    flat = []
    for item in dimensions:
        for d in (item if isinstance(item, (tuple, list)) else (item,)):
            if isinstance(d, Affine) and d.plain is not None:
                d = d.plain
            if not isinstance(d, Dim):
                raise error(EinfuseTypeError, f"{what} takes dimensions, not "
                            f"{type(d).__name__}", where)
            if d in flat:
                raise error(IndexRuleError, f"{what} lists dimension {d.name} twice", where)
            flat.append(d)
    return tuple(flat)


def _node(op, args, children, found, where, info, framework, local=None) -> Named:
    node = Named.__new__(Named)
    node.op, node.args, node.children, node.dims = op, args, children, found
    node.info, node.framework, node.line, node._value = info, framework, where, None
    if local is None:
        local = _local_of(op, args)
    node.local = local
    if len(children) == 2:          # (the operators' nodes, the most built)
        first, second = children
        node.reduces = op == "reduce" or first.reduces or second.reduces
        node.depth = (first.depth if first.depth > second.depth else second.depth) + 1
        if not first.params and not second.params:   # (keyed()'s common cases, inlined:
            one, two = first.arrays, second.arrays  # the same signatures as it builds)
            if not two:
                sig = (local, first.key, None, second.key) if one else \
                    (local, first.key, second.key)
            elif not one:
                one, sig = two, (local, first.key, second.key, None)
            elif len(one) == 1 and len(two) == 1 and one[0] is not two[0]:
                one, sig = one + two, (local, first.key, None, second.key, None)
            else:
                sig = None
            if sig is not None:
                key = _keys.get(sig)
                if key is not None:
                    node.arrays, node.params, node.key = one, (), key
                    return node
    else:
        reduces = op == "reduce"
        depth = 0
        for child in children:      # (the walk's choice of recursion: named_program)
            if child.reduces:
                reduces = True
            if child.depth > depth:
                depth = child.depth
        node.reduces, node.depth = reduces, depth + 1
        if len(children) == 1 and op != "read":     # (keyed()'s cases, inlined)
            child = children[0]
            node.arrays, node.params = child.arrays, child.params
            key = _keys.get((local, child.key))
            if key is not None:
                node.key = key
                return node
        elif not children and op != "param":
            node.arrays = (args[0].array,) if op == "read" else ()
            node.params = ()
            key = _keys.get(local)
            if key is not None:
                node.key = key
                return node
    keyed(node, op, args, children)
    return node


def _local_of(op, args) -> tuple:
    """The node's part of its structural signature (named_program.structure)."""
    if op == "bin" or op == "call" or op == "un":
        return (op[0], args[0])
    if op == "read":
        return ("read", args[0].name, args[2])
    if op == "param":
        return ("p",)
    if op == "lit":
        value = args[0]
        return ("l", value) if isinstance(value, int) else ("f", repr(value))
    if op == "index":
        return ("v", args[0].name)
    if op == "reduce":
        return ("r", args[0], tuple(d.name for d in args[1]))
    return (op[0], args[0])


def _pair(args, local, first, second, where) -> Named:
    """The binary node over two named expressions (``_combine``'s case, unrolled)."""
    fa, fb = first.framework, second.framework
    if fb is None or fa is fb:
        framework = fa
    elif fa is None:
        framework = fb
    elif fa[0] == fb[0]:
        framework = fa
    else:
        framework = merge_framework(fa, fb, where)
    da, db = first.dims, second.dims
    if da == db or not db:
        found = da
    elif not da:
        found = db
    else:
        found, seen = da, set(da)
        for d in db:
            if d not in seen:
                found = found + (d,)
    ia, ib = first.info, second.info
    info = ia if ia is ib or not ib else ib if not ia else merge_info((ia, ib), where)
    return _node("bin", args, (first, second), found, where, info, framework, local)


def _combine(op, args, operands, where) -> Named:
    """A node over ``operands`` (named expressions): dimensions by name, one size each."""
    infos = []
    framework = None
    found = ()
    for o in operands:
        infos.append(o.info)
        if o.framework is not None and o.framework is not framework:
            framework = merge_framework(framework, o.framework, where)
        if not found:
            found = o.dims
        elif o.dims and o.dims != found:
            seen = set(found)
            for d in o.dims:
                if d not in seen:
                    found = found + (d,)
    return _node(op, args, operands, found, where, merge_info(infos, where), framework,
                 (op[0], args[0]))


def _node_of(op, args, operands, where) -> Named:
    converted = []
    for value in operands:
        operand = _operand(value, where)
        if operand is None:
            raise error(EinfuseTypeError, f"{args[0]}() takes named expressions, dimensions "
                        f"and numbers, not {type(value).__name__}", where)
        converted.append(operand)
    return _combine(op, args, tuple(converted), where)


def _leaf(op, value, where) -> Named:
    if op != "lit":
        return _node(op, (value,), (), (), where, {}, None)
    # a literal built again on the same line is the same node (nodes are immutable;
    # the line is kept, so that an error still names the one that built it)
    known = (type(value), value, where)
    found = _LITERALS.get(known)
    if found is None:
        found = _node(op, (value,), (), (), where, {}, None)
        if value == value:      # (nan is not found again by value)
            if len(_LITERALS) >= 256:
                _LITERALS.clear()
            _LITERALS[known] = found
    return found


_LITERALS: Dict[tuple, Named] = {}


def _index_value(d: Dim, where) -> Named:
    return _node("index", (d,), (), (d,), where, {d.name: DimInfo(d, _explicit(d))}, None)


def _affine_value(affine: Affine, where) -> Named:
    """An affine expression of dimensions used as a value: its index values' sum."""
    total = _leaf("lit", affine.constant, where) if affine.constant or \
        not (affine.terms or affine.quasi) else None
    parts = [(_index_value(d, where), c) for d, c in affine.terms]
    parts += [(_combine("bin", (op,), (_affine_value(inner, where),
                                       _leaf("lit", divisor, where)), where), c)
              for (inner, op, divisor), c in affine.quasi]
    for value, coeff in parts:
        if coeff != 1:
            value = _combine("bin", ("*",), (_leaf("lit", coeff, where), value), where)
        total = value if total is None else _combine("bin", ("+",), (total, value), where)
    return total


def _operand(value, where) -> Optional[Named]:
    """``value`` as a node: named expressions as they are, dimensions and affine
    expressions as index values; Python floats and ints as scalar parameters, so that a
    new value (a step count, a batch size, a temperature) is not a new program -- except
    small ints (|n| <= 16: exponents, the 0 and 1 of masks) and inf and nan, which are
    literals the program's rewrites recognise (NumPy scalars count as Python numbers, as
    torch and JAX take them); 0-d arrays as 0-d reads; None for what the notation cannot
    take (the operator then says so)."""
    if isinstance(value, Named):
        return value
    if isinstance(value, Dim):
        return _index_value(value, where)
    if isinstance(value, Affine):
        return _affine_value(value, where)
    if isinstance(value, numbers.Integral):
        value = int(value)
        return _leaf("lit" if -SMALL_INT <= value <= SMALL_INT else "param", value, where)
    if isinstance(value, numbers.Real):
        value = float(value)
        return _leaf("param" if math.isfinite(value) else "lit", value, where)
    if isinstance(value, Wrapped):
        if value.ndim:
            raise error(EinfuseTypeError, f"{value.described()} is used without dimensions; "
                        "index it (w[i, j]) to combine it with a named expression", where)
        return read(value, (), where)
    if framework_name(value) is not None and hasattr(value, "shape"):
        if len(value.shape):
            raise error(EinfuseTypeError, f"an unnamed {framework_name(value)} array of "
                        f"shape {tuple(value.shape)} meets a named expression; index it "
                        "with dimensions (ef.wrap(x)[i, j]) so that its axes have names",
                        where)
        return read(wrap(value), (), where)
    return None


def _value_op(op: str, left, right) -> Named:
    """An index-value expression: dimensions used as numbers (``j <= i``, ``i * j``)."""
    where = caller_line()
    a, b = _operand(left, where), _operand(right, where)
    if a is None or b is None:
        bad = right if b is None else left
        raise error(EinfuseTypeError, f"dimension arithmetic takes dimensions, numbers and "
                    f"named expressions, not {type(bad).__name__}", where)
    return _combine("bin", (op,), (a, b), where)


hooks["value_op"] = _value_op


def as_named(value, where: Where) -> Optional[Named]:
    """``value`` (a number, dimension, 0-d array or named expression) as a named
    expression; None where the notation cannot take it."""
    return _operand(value, where)


def apply_op(op: str, args, operands, where: Where) -> Named:
    """The node ``op`` ("bin", "un", "call") over ``operands`` converted by
    :func:`as_named` (an error naming a value it cannot take)."""
    return _node_of(op, args, operands, where)


# -- the notation's functions --------------------------------------------------------------

def _function(name: str, arity: int):
    notation = {"minimum": "min", "maximum": "max"}.get(name, name)

    def function(*args):
        where = caller_line()
        if len(args) != arity:
            raise error(EinfuseTypeError, f"ef.{name} takes {arity} argument"
                        f"{'s' if arity > 1 else ''}, not {len(args)}", where)
        if not any(isinstance(a, (Named, Dim, Affine)) for a in args):
            raise error(EinfuseTypeError, f"ef.{name} builds a named expression: give it "
                        "one (an array indexed by dimensions), not only "
                        f"{', '.join(type(a).__name__ for a in args)}", where)
        return _node_of("call", (notation,), args, where)
    function.__name__ = name
    function.__doc__ = f"The notation's {notation}() on named expressions."
    return function


FUNCTIONS = {name: _function(name, 1) for name in UNARY_FUNCTIONS}
FUNCTIONS.update({name: _function(name, 2) for name in ("minimum", "maximum", "pow",
                                                        "atan2")})
FUNCTIONS["where"] = _function("where", 3)
where = FUNCTIONS["where"]


def softmax(expression, *dimensions, dim=None):
    """``ef.softmax(x, k)`` is ``x.softmax(k)`` (``dim=k`` as torchdim's softmax)."""
    if not isinstance(expression, Named):
        raise error(EinfuseTypeError, "ef.softmax takes a named expression", caller_line())
    return expression.softmax(*dimensions, *(() if dim is None else (dim,)))


def is_named(value) -> bool:
    return isinstance(value, Named)
