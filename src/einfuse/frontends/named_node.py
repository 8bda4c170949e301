"""Named dimensions: the expression node and its builder.

A :class:`Named` expression is a node of a DAG: its operation and arguments, its
children, its dimensions (a set, kept in order of first use), the bookkeeping of
named_checks.py (per dimension name, the object and the first use that gave it a size),
its framework and the Python line that built it, and its structural key
(named_keys.py).  ``new_node`` builds every node; ``combine`` and ``pair`` merge the
operands' dimensions by name and check one size and one object per name, so misuse is
an error at the line that did it.  Reductions and the one-operand functions are methods
here (they take only named expressions); the operators, which also take numbers,
dimensions and arrays, are attached by named.py, and reads of arrays by
named_reads.py."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from ..errors import EinfuseTypeError, IndexRuleError
from ..lang.ast import UNARY_FUNCTIONS
from .named_checks import (DimInfo, Records, Use, Where, caller_line, error, merge_framework,
                           merge_info, merged)
from .named_dims import Affine, Dim, hooks
from .named_keys import counting, keyed, keys as _keys

REDUCTION_METHODS = ("sum", "prod", "max", "min", "logsumexp", "mean", "var", "argmax",
                     "argmin")


class Named:
    """A named expression: a set of dimensions and the DAG that computes its values.
    Combine with operators, ``ef.where`` and the notation's functions; reduce with the
    methods; materialise with :meth:`order`, ``np.asarray`` or ``ef.evaluate``."""
    __slots__ = ("op", "args", "children", "dims", "info", "framework", "line", "local",
                 "depth", "key", "arrays", "params", "_value", "__weakref__")
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
        self._value = None          # (kept only from __dlpack_device__ to here; unset
        #                             until then: getattr(node, "_value", None))
        return value.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return hooks["dlpack"](self, caller_line()).__dlpack_device__()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return hooks["torch_function"](func, args, kwargs or {}, caller_line())

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return hooks["array_ufunc"](ufunc, method, inputs, kwargs, caller_line())

    def __neg__(self):
        return combine("un", ("-",), (self,), caller_line())

    def __pos__(self):
        return self

    def __abs__(self):
        return combine("call", ("abs",), (self,), caller_line())

    def __invert__(self):
        raise error(EinfuseTypeError, "the notation has no '~'; write (c) == 0 for "
                    "the negation of a condition", caller_line())

    # reductions
    def _reduced(self, kind: str, dimensions, where: Where) -> "Named":
        if len(dimensions) == 1 and type(dimensions[0]) is Dim:     # .sum(k)
            chosen = dimensions if type(dimensions) is tuple else tuple(dimensions)
        else:
            chosen = dimension_list(dimensions, f".{kind}()", where) or self.dims
        known = (kind, self.dims, chosen)
        parts = _REDUCED.get(known)
        if parts is None:
            parts = _reduction_parts(self, kind, chosen, where)
            if len(_REDUCED) >= 1024:
                _REDUCED.clear()
            _REDUCED[known] = parts
        return new_node("reduce", (kind, chosen), (self,), parts[0], where, self.info,
                        self.framework, parts[1])

    def softmax(self, *dimensions):
        """``exp(x - max) / sum(exp(x - max))`` over ``dimensions``, which it keeps."""
        where = caller_line()
        chosen = dimension_list(dimensions, ".softmax()", where)
        if not chosen:
            raise error(IndexRuleError, ".softmax() needs the dimension(s) to normalise "
                        "over: x.softmax(k)", where)
        weights = combine("call", ("exp",), (pair(
            ("-",), ("b", "-"), self, self._reduced("max", chosen, where), where),), where)
        return pair(("/",), ("b", "/"), weights, weights._reduced("sum", chosen, where),
                    where)

    def log_softmax(self, *dimensions):
        """``x - logsumexp(x)`` over ``dimensions``, which it keeps."""
        where = caller_line()
        chosen = dimension_list(dimensions, ".log_softmax()", where)
        if not chosen:
            raise error(IndexRuleError, ".log_softmax() needs the dimension(s): "
                        "x.log_softmax(k)", where)
        return pair(("-",), ("b", "-"), self, self._reduced("logsumexp", chosen, where),
                    where)


def _reduction_method(kind: str):
    def method(self, *dimensions):
        return self._reduced(kind, dimensions, caller_line())
    method.__name__ = kind
    method.__doc__ = f"The {kind} over the dimensions given (all of them when none is)."
    return method


def _unary_method(name: str):
    def method(self):
        return combine("call", (name,), (self,), caller_line())
    method.__name__ = name
    return method



for _kind in REDUCTION_METHODS:
    setattr(Named, _kind, _reduction_method(_kind))
for _name in UNARY_FUNCTIONS:
    if _name != "abs":
        setattr(Named, _name, _unary_method(_name))


def _reduction_parts(node, kind, chosen, where):
    """(the dimensions kept, the local signature) of ``node``'s reduction over
    ``chosen``, or the error naming a dimension it does not have."""
    # (sets: a tuple's `in` would compare dimensions through their rich comparison)
    present_dims = set(node.dims)
    for d in chosen:
        if d not in present_dims:
            present = node.info.get(d.name)
            how = " (it is reduced already inside)" if present is not None and \
                present.dim is d else ""
            raise error(IndexRuleError, f".{kind}({d.name}): dimension {d.name} is not "
                        f"a dimension of the expression{how}; its dimensions are "
                        f"{_names(node.dims)}", where)
    reduced = set(chosen)
    kept = tuple(d for d in node.dims if d not in reduced)
    return kept, ("r", kind, tuple(d.name for d in chosen))


# (kind, the dimensions, those reduced) -> _reduction_parts (it holds dimension objects
# only)
_REDUCED: Dict[tuple, tuple] = {}


def _names(found) -> str:
    return ", ".join(d.name for d in found) or "none"


def dimension_list(dimensions, what: str, where: Where) -> Tuple[Dim, ...]:
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


def new_node(op, args, children, found, where, info, framework, local=None) -> Named:
    """The node ``op(args)`` over ``children``, with its dimensions, sizes and framework
    already merged by the caller, and its structural key."""
    if local is None:
        local = _local_of(op, args)
    if len(children) == 2:          # (the operators' nodes, the most built)
        return binary_node(op, args, children, found, where, info, framework, local)
    node = _new(Named)
    node.op = op
    node.args = args
    node.children = children
    node.dims = found
    node.info = info
    node.framework = framework
    node.line = where
    node.local = local
    if len(children) == 1:
        child = children[0]
        node.depth = child.depth + 1
        if op != "read":            # (keyed()'s case, inlined)
            node.arrays = child.arrays
            node.params = child.params
            key = _keys.get((local, child.key))
            if key is not None:
                node.key = key
                return node
    elif not children:
        node.depth = 1
        if op != "param":           # (keyed()'s case, inlined)
            node.arrays = (args[0].array,) if op == "read" else ()
            node.params = ()
            key = _keys.get(local)
            if key is not None:
                node.key = key
                return node
    else:
        depth = 0
        for child in children:      # (the walk's choice of recursion: named_program)
            if child.depth > depth:
                depth = child.depth
        node.depth = depth + 1
    keyed(node, op, args, children)
    return node


def binary_node(op, args, children, found, where, info, framework, local) -> Named:
    """``new_node`` of two children (one statement per attribute: cheaper than tuple
    assignments of four)."""
    node = _new(Named)
    node.op = op
    node.args = args
    node.children = children
    node.dims = found
    node.info = info
    node.framework = framework
    node.line = where
    node.local = local
    first, second = children
    node.depth = (first.depth if first.depth > second.depth else second.depth) + 1
    if not first.params and not second.params:   # (keyed()'s commonest cases,
        one, two = first.arrays, second.arrays  # inlined: the signatures it builds)
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
                node.arrays = one
                node.params = ()
                node.key = key
                return node
    found = _pair_signature(local, first, second)     # (the other common ones)
    if found is not None:
        key = _keys.get(found[0])
        if key is not None:
            node.arrays, node.params, node.key = found[1], found[2], key
            return node
    keyed(node, op, args, children)
    return node


def read_node(args, found, where, info, framework, local) -> Named:
    """``new_node`` of a read without gathers (named_reads.py's common case)."""
    node = _new(Named)
    node.op = "read"
    node.args = args
    node.children = ()
    node.dims = found
    node.info = info
    node.framework = framework
    node.line = where
    node.local = local
    node.depth = 1
    node.arrays = (args[0].array,)
    node.params = ()
    key = _keys.get(local)
    if key is None:
        keyed(node, "read", args, ())
    else:
        node.key = key
    return node


_new = object.__new__

def _pair_signature(local, first, second):
    """(signature, arrays, parameters) of a binary node as named_keys.keyed() builds
    them, for its common cases (each part joined to an empty one, or the same tuple on
    both sides, or arrays that are all new); None for the rest (keyed() then)."""
    one, two, pa, pb = first.arrays, second.arrays, first.params, second.params
    if pa and pb:
        if pa is not pb:
            return None
        if one and one is two:          # x - max(x), e / sum(e): all shared
            shared = counting(len(one))
            return (local, first.key, None, None, second.key, shared,
                    counting(len(pa))), one, pa
    elif pa and one and two and len(two) == 1 and len(one) < 8:   # s * v: the other's
        new = two[0]                                               # array new
        for m in one:
            if m is new:        # (by identity: arrays compare elementwise)
                break
        else:
            return (local, first.key, None, None, second.key, None), one + two, pa
    parts = [local, first.key]
    if one:
        parts.append(None)
    if pa:
        parts.append(None)
    parts.append(second.key)
    arrays = one
    if two:
        if not one:
            parts.append(None)
            arrays = two
        elif two is one:
            parts.append(counting(len(one)))
        elif len(one) + len(two) <= 8:
            for v in two:
                for m in one:
                    if v is m:
                        return None
            parts.append(None)
            arrays = one + two
        else:
            return None
    if pb:
        parts.append(counting(len(pb)) if pa else None)
    return tuple(parts), arrays, pa or pb


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


def pair(args, local, first, second, where) -> Named:
    """The binary node over two named expressions (``combine``'s case, unrolled)."""
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
        found = _UNIONS.get((da, db))
        if found is None:
            found, seen = da, set(da)
            for d in db:
                if d not in seen:
                    found = found + (d,)
            if len(_UNIONS) >= 1024:
                _UNIONS.clear()
            _UNIONS[(da, db)] = found
    ia, ib = first.info, second.info
    if ia is ib or not ib:
        info = ia
    elif not ia:
        info = ib
    elif type(ia) is Records and type(ib) is Records:
        info = merged(ia, ib, where)
    else:
        info = merge_info((ia, ib), where)
    return binary_node("bin", args, (first, second), found, where, info, framework, local)


# (two nodes' dimensions) -> their union, in order of first use (dimension objects only)
_UNIONS: Dict[tuple, tuple] = {}


def combine(op, args, operands, where) -> Named:
    """A node over ``operands`` (named expressions): dimensions by name, one size each."""
    if len(operands) == 1:      # (a function of one operand: its dimensions and sizes)
        o = operands[0]
        return new_node(op, args, operands, o.dims, where, o.info, o.framework,
                        (op[0], args[0]))
    info = None
    framework = None
    found = ()
    for o in operands:
        mine = o.info           # (merge_info's left fold, records remembered: merged)
        if mine and mine is not info:
            if info is None:
                info = mine
            elif type(info) is Records and type(mine) is Records:
                info = merged(info, mine, where)
            else:
                info = merge_info((info, mine), where)
        if o.framework is not None and o.framework is not framework:
            framework = merge_framework(framework, o.framework, where)
        if not found:
            found = o.dims
        elif o.dims and o.dims != found:
            seen = set(found)
            for d in o.dims:
                if d not in seen:
                    found = found + (d,)
    return new_node(op, args, operands, found, where, info if info is not None else {},
                    framework, (op[0], args[0]))


def leaf(op, value, where) -> Named:
    if op != "lit":
        return new_node(op, (value,), (), (), where, {}, None)
    # a literal built again on the same line is the same node (nodes are immutable;
    # the line is kept, so that an error still names the one that built it)
    known = (type(value), value, where)
    found = LITERALS.get(known)
    if found is None:
        found = new_node(op, (value,), (), (), where, {}, None)
        if value == value:      # (nan is not found again by value)
            if len(LITERALS) >= 256:
                LITERALS.clear()
            LITERALS[known] = found
    return found


LITERALS: Dict[tuple, Named] = {}


def index_value(d: Dim, where) -> Named:
    return new_node("index", (d,), (), (d,), where,
                    Records({d.name: DimInfo(d, explicit_use(d))}), None)


def affine_value(affine: Affine, where) -> Named:
    """An affine expression of dimensions used as a value: its index values' sum."""
    total = leaf("lit", affine.constant, where) if affine.constant or \
        not (affine.terms or affine.quasi) else None
    parts = [(index_value(d, where), c) for d, c in affine.terms]
    parts += [(combine("bin", (op,), (affine_value(inner, where),
                                       leaf("lit", divisor, where)), where), c)
              for (inner, op, divisor), c in affine.quasi]
    for value, coeff in parts:
        if coeff != 1:
            value = combine("bin", ("*",), (leaf("lit", coeff, where), value), where)
        total = value if total is None else combine("bin", ("+",), (total, value), where)
    return total


def explicit_use(d: Dim) -> Optional[Use]:
    if d._size is None:
        return None
    return Use(d._size, f"{d.name}.size = {d._size}", d._size_where, True)

