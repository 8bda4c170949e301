"""Named expressions spelled as einfuse programs.

Two steps, so that a training loop that rebuilds the same expression pays a dictionary
lookup, not a translation (one expression is first looked up by its root's key, built
with the nodes: frontends/named_keys.py; these steps run on a miss and for several
expressions at once):

* :func:`structure` walks the DAG (children first) and gives each node a canonical
  signature built from its operation, its dimensions' *names* and its children's
  canonical numbers; arrays are numbered by identity in order of first use, floats by
  value.  Nodes with one signature are one node (shared subexpressions are found by
  structure, not by object).  The signatures, the roots' orders and which dimensions
  have sizes form the structural key; the arrays and the floats are the call's values.
* :func:`emit` (once per key) spells the canonical DAG as statements: each root is a
  statement, and so is a node used twice that holds a reduction (computed once, read as
  an intermediate) and a gather position that is not a subscript (``x[i * j]``); the
  rest is inlined.  A reduction over a dimension that the enclosing scope already binds
  renames its index (``max[T_1](...)`` inside a statement over ``T``), since a named
  expression's reduced dimension is local to it.  Dimension names are kept as index
  names wherever the notation allows (a reserved word such as ``max`` is renamed), so
  ``shard={"b": ...}`` by dimension name is ``shard=`` by index name.

Ranges: a dimension whose size the arrays give is inferred by the notation as usual;
``ranges=`` entries are added where a statement could not infer it -- a dimension split
out of an axis (``x[(c, h2, w2)]``), or one that a statement uses without a plain
subscript (an index value, ``where(T <= t, ...)``) and whose size is known (from
``dim.size = n``, or from arrays when no shifted subscript reads it: the notation's
"valid" ranges of ``x[i + 1]`` are then left to it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import IndexRuleError
from ..lang.ast import (RESERVED, Access, Binary, Call, IndexExpr, IndexValue, Number, Param,
                        Quasi, Reduce, Statement, Unary)
from ..lang.printer import format_statement
from ..lang.fresh_names import FreshNames
from .named_dims import Dim, Slot
from .named_checks import Where, error


@dataclass
class Structure:
    """The canonical form of some roots' DAG, and this call's values."""
    key: tuple
    sigs: List[tuple]
    nodes: List[object]        # a representative node per canonical number
    roots: Tuple[Tuple[int, Tuple[str, ...]], ...]
    arrays: List[object]       # by array number
    wrapped: List[object]      # the Wrapped of each array's first use
    params: List[float]
    info: Dict[str, object]


# DAGs up to this depth are walked by recursion (faster than an explicit stack); a
# node's depth is known from its construction (frontends/named.py), so a deeper one
# takes the stack without ever reaching Python's recursion limit
_RECURSIVE_DEPTH = 200


def _depth_of(node) -> int:
    return getattr(node, "depth", _RECURSIVE_DEPTH)


def order_spec(node, items, where: Where) -> Tuple[Tuple[Dim, ...], Tuple[int, ...]]:
    """``.order(i, (j, k))``: the dimensions in order (positional axes last) and how many
    of them each result axis flattens; every dimension of ``node`` exactly once."""
    dims_ = node.dims
    if len(items) == len(dims_):            # the common case, checked at once
        for d in items:
            if type(d) is not Dim:
                break
        else:
            distinct = set(items)
            if len(distinct) == len(items) and distinct == set(dims_):
                return tuple(items), (1,) * len(items)
    flat, groups = [], []
    for item in items:
        group = tuple(item) if isinstance(item, (tuple, list)) else (item,)
        if not group:
            raise error(IndexRuleError, ".order() got an empty group ()", where)
        for d in group:
            if not isinstance(d, Dim) or isinstance(d, Slot):
                raise error(IndexRuleError, f".order() takes dimensions (or tuples of them "
                            f"to flatten), not {type(d).__name__}", where)
            if d in flat:
                raise error(IndexRuleError, f".order() lists dimension {d.name} twice; "
                            "each dimension is one axis", where)
            if d not in node.dims:
                raise error(IndexRuleError, f".order() names dimension {d.name}, which the "
                            f"expression does not have (its dimensions are "
                            f"{_names(node.dims)})", where)
            flat.append(d)
        groups.append(len(group))
    missing = [d for d in node.dims if d not in flat and not isinstance(d, Slot)]
    if missing:
        raise error(IndexRuleError, f".order() omits dimension"
                    f"{'s' if len(missing) > 1 else ''} {_names(missing)}; every dimension of "
                    f"the expression ({_names(d for d in node.dims if not isinstance(d, Slot))})"
                    " is one axis of the result (reduce the others first: .sum(k))", where)
    slots = sorted((d for d in node.dims if isinstance(d, Slot)), key=lambda s: -s.position)
    return tuple(flat) + tuple(slots), tuple(groups) + (1,) * len(slots)


def _names(found) -> str:
    return ", ".join(d.name for d in found) or "none"


def structure(roots: Sequence[Tuple[object, Tuple[Dim, ...]]], info, options_key) -> Structure:
    """Walk the DAG of ``roots`` ((node, ordered dimensions) pairs) once, children
    first (in order), numbering each distinct signature, array and float."""
    ids: Dict[int, int] = {}
    interned: Dict[tuple, int] = {}
    sigs: List[tuple] = []
    nodes: List[object] = []
    arrays: List[object] = []
    wrapped: List[object] = []
    numbered: Dict[int, int] = {}
    params: List[float] = []
    param_numbers: Dict[str, int] = {}

    def number_of(node) -> int:
        """The canonical number of ``node``, its children numbered first.  (Loops, not
        comprehensions: this runs per node per materialisation, and Python 3.11 calls
        a comprehension as a function.)"""
        children = node.children
        local = node.local
        if children:
            numbers = []
            for child in children:
                found = ids.get(id(child))
                numbers.append(number_of(child) if found is None else found)
        kind = local[0]
        if kind == "read":
            array = node.args[0].array
            number = numbered.get(id(array))
            if number is None:
                number = numbered[id(array)] = len(arrays)
                arrays.append(array)
                wrapped.append(node.args[0])
            sig = ("read", number, local, tuple(numbers) if children else ())
        elif kind == "p":
            value = node.args[0]
            text = value.hex() if isinstance(value, float) else value   # (2 != 2.0)
            number = param_numbers.get(text)
            if number is None:
                number = param_numbers[text] = len(params)
                params.append(value)
            sig = ("p", number)
        elif not children:
            sig = local
        else:
            sig = local + tuple(numbers)
        number = interned.get(sig)
        if number is None:
            number = interned[sig] = len(sigs)
            sigs.append(sig)
            nodes.append(node)
        ids[id(node)] = number
        return number

    def walk_deep(root) -> None:
        """The same numbering without Python recursion, for DAGs deeper than the
        recursion limit allows (a chain of thousands of operations)."""
        stack = [(root, False)]
        while stack:
            node, ready = stack.pop()
            if id(node) in ids:
                continue
            if not ready:
                stack.append((node, True))
                for child in reversed(node.children):
                    if id(child) not in ids:
                        stack.append((child, False))
                continue
            number_of(node)         # (its children are numbered: no recursion)

    for root, _ in roots:
        if id(root) in ids:
            continue
        if _depth_of(root) < _RECURSIVE_DEPTH:
            number_of(root)
        else:
            walk_deep(root)
    root_sigs = []
    for node, order in roots:
        root_sigs.append((ids[id(node)], tuple([d.name for d in order])))
    root_sigs = tuple(root_sigs)
    sized = []
    for name, entry in info.items():
        use = entry.use
        sized.append((name, 0 if use is None else 2 if use.explicit else 1))
    sized = frozenset(sized)
    key = (tuple(sigs), root_sigs, sized, options_key)
    return Structure(key, sigs, nodes, root_sigs, arrays, wrapped, params, info)


@dataclass(frozen=True)
class Translation:
    """A structure's program: its text, and how the call's values bind to its names."""
    text: str
    statements: Tuple[Statement, ...]
    tensors: Tuple[str, ...]            # by array number
    params: Tuple[str, ...]             # by float number
    outputs: Tuple[str, ...]            # the program's outputs, each once
    root_outputs: Tuple[int, ...]       # per root, its position in outputs
    ranged: Tuple[Tuple[str, str], ...]  # (index name, dimension name) given ranges=
    index_names: Dict[str, Tuple[str, ...]]   # dimension name -> its index names
    shifted: frozenset = frozenset()    # dimensions some shifted subscript reads


def _children(sig) -> Tuple[int, ...]:
    kind = sig[0]
    if kind == "read":
        return sig[3]
    if kind in ("u", "b", "c"):
        return sig[2:]
    if kind == "r":
        return (sig[3],)
    return ()


def emit(found: Structure) -> Translation:
    return _Emitter(found).translation()


class _Emitter:
    def __init__(self, found: Structure):
        self.sigs, self.nodes, self.info = found.sigs, found.nodes, found.info
        count = len(self.sigs)
        uses = [0] * count
        for sig in self.sigs:
            for child in _children(sig):
                uses[child] += 1
        roots = {cid for cid, _ in found.roots}
        reduces = [False] * count       # (children are numbered before their parents)
        for cid, sig in enumerate(self.sigs):
            reduces[cid] = sig[0] == "r" or any(reduces[child] for child in _children(sig))
        self.statement = [cid in roots or (uses[cid] >= 2 and reduces[cid] and
                                           self.sigs[cid][0] != "read")
                          for cid in range(count)]
        shaped = [False] * count
        for cid, sig in enumerate(self.sigs):
            shaped[cid] = self.statement[cid] or self._shaped(sig, shaped)
            if sig[0] == "read":
                for child in sig[3]:
                    if not shaped[child]:
                        self.statement[child] = shaped[child] = True
        self.roots = found.roots
        self.wrapped = found.wrapped
        self.params_count = len(found.params)
        # every name the program uses; dimensions first, as themselves where allowed
        self.taken = FreshNames({"arrays"})   # (a compiled program's keyword, never a name)
        self.index = {name: self.taken.suffixed(name, RESERVED)
                      for name in self._dimension_names()}
        self.affine_dims = self._affine_dimensions()
        self.split_dims = {name for sig in self.sigs if sig[0] == "read"
                           for sub in sig[2][2] if sub[0] == "g" for name, _ in sub[1]}
        self.aliases: Dict[str, str] = {}       # a renamed reduction index -> dimension
        self.alias_pool: Dict[str, List[str]] = {}   # dimension -> its renamed indices
        self.needs_range: set = set()            # dimension names given ranges=

    # -- names ---------------------------------------------------------------------------
    def _dimension_names(self) -> List[str]:
        names = []
        for cid, sig in enumerate(self.sigs):
            for d in self.nodes[cid].dims:
                names.append(d.name)
            if sig[0] == "r":
                names += sig[2]
        return list(dict.fromkeys(names))

    def _affine_dimensions(self) -> set:
        """Dimensions some shifted subscript reads (their ranges are the notation's)."""
        found = set()

        def visit(affine_sig):
            terms, quasi, _ = affine_sig
            found.update(name for name, _ in terms)
            for inner, _, _, _ in quasi:
                visit(inner)
        for sig in self.sigs:
            if sig[0] == "read":
                for sub in sig[2][2]:
                    if sub[0] == "a":
                        visit(sub[1])
        return found

    def _integer_factor(self, sig):
        """(n, the other child) for a product ``n * other`` with an integer literal n."""
        for mine, other in ((sig[2], sig[3]), (sig[3], sig[2])):
            literal = self.sigs[mine]
            if literal[0] == "l" and isinstance(literal[1], int):
                return literal[1], other
        return None

    def _shaped(self, sig, shaped) -> bool:
        """Can this node stand in a subscript as written (a gather, plus indices and
        integers)?"""
        kind = sig[0]
        if kind in ("read", "v") or (kind == "l" and isinstance(sig[1], int)):
            return True
        if kind == "u":
            return sig[1] == "-" and shaped[sig[2]]
        if kind == "b" and sig[1] in ("+", "-"):
            return shaped[sig[2]] and shaped[sig[3]]
        if kind == "b" and sig[1] == "*":
            factor = self._integer_factor(sig)
            return factor is not None and shaped[factor[1]]
        return False

    # -- the program ---------------------------------------------------------------------
    def translation(self) -> Translation:
        tensors = []
        letters = iter(_letters())
        for wrapped in self.wrapped:
            base = wrapped.name or next(n for n in letters if n not in self.taken)
            tensors.append(self.taken.suffixed(base, RESERVED))
        self.tensors = tuple(tensors)
        self.params = []
        for n in range(self.params_count):
            self.params.append(self.taken.suffixed(f"c{n}", RESERVED))
        self.names: Dict[int, str] = {}
        self.orders: Dict[int, Tuple[str, ...]] = {}
        for cid, order in self.roots:
            self.orders.setdefault(cid, order)
        many = len({root for root in self.roots}) > 1
        statements, outputs, root_outputs = [], [], []
        out_number = 0
        for cid in range(len(self.sigs)):
            if not self.statement[cid]:
                continue
            if cid in self.orders:
                out_number += 1
                base = f"out{out_number}" if many else "out"
            else:
                base = f"t{len(statements) + 1}"
            self.names[cid] = self.taken.suffixed(base, RESERVED)
            order = self.orders.get(cid) or self._intermediate_order(cid)
            self.orders[cid] = order
            statements.append(self._statement(self.names[cid], order,
                                              lambda ren, bound, cid=cid:
                                              self.expr(cid, ren, bound, top=True)))
        for cid, order in self.roots:
            name = self.names[cid]
            if order != self.orders[cid]:       # the same values in another order: a copy
                out_number += 1
                name = self.taken.suffixed(f"out{out_number}", RESERVED)
                statements.append(self._statement(name, order, lambda ren, bound, cid=cid:
                                                  self._read_statement(cid, ren)))
            if name not in outputs:
                outputs.append(name)
            root_outputs.append(outputs.index(name))
        ranged = []
        for index in sorted(self.needs_range):
            ranged.append((index, self.aliases.get(index, self._dimension_of(index))))
        index_names: Dict[str, List[str]] = {}
        for name, index in self.index.items():
            index_names.setdefault(name, []).append(index)
        for alias, name in self.aliases.items():
            index_names.setdefault(name, []).append(alias)
        text = "\n".join(format_statement(s) for s in statements)
        return Translation(text, tuple(statements), self.tensors, tuple(self.params),
                           tuple(outputs), tuple(root_outputs), tuple(ranged),
                           {k: tuple(v) for k, v in index_names.items()},
                           frozenset(self.affine_dims))

    def _intermediate_order(self, cid: int) -> Tuple[str, ...]:
        """An intermediate's axes: the results' dimensions in the results' order, then
        those a later reduction runs over (innermost, as a row a softmax reads)."""
        rank: Dict[str, int] = {}
        for _, order in self.roots:
            for name in order:
                rank.setdefault(name, len(rank))
        names = [d.name for d in self.nodes[cid].dims]
        return tuple(sorted(names, key=lambda n: (rank.get(n, len(rank) + names.index(n)))))

    def _dimension_of(self, index: str) -> str:
        return next(name for name, i in self.index.items() if i == index)

    def _statement(self, name: str, order: Tuple[str, ...], body) -> Statement:
        ren = dict(self.index)
        indices = tuple(ren[d] for d in order)
        statement = Statement(name, indices, ":=", body(ren, frozenset(indices)))
        self._note_ranges(statement)
        return statement

    def _note_ranges(self, statement: Statement) -> None:
        """Ranges the statement cannot infer: an index used without a plain subscript."""
        plain, used = set(), set(statement.output_indices)
        for node in statement.rhs.walk():
            if isinstance(node, Access):
                for sub in node.indices:
                    if sub.plain_index is not None:
                        plain.add(sub.plain_index)
                    used.update(sub.index_names)
            elif isinstance(node, IndexValue):
                used.add(node.name)
            elif isinstance(node, Reduce):
                used.update(node.indices)
        for index in used:
            name = self.aliases.get(index) or self._dimension_of(index)
            entry = self.info.get(name)
            use = entry.use if entry is not None else None
            if use is None:
                continue
            if name in self.split_dims or (index not in plain and (
                    use.explicit or name not in self.affine_dims)):
                self.needs_range.add(index)

    def _read_statement(self, cid: int, ren) -> Access:
        return Access(self.names[cid], tuple(IndexExpr(terms=((ren[d], 1),))
                                             for d in self.orders[cid]))

    def expr(self, cid: int, ren, bound, top: bool = False):
        if self.statement[cid] and not top:
            return self._read_statement(cid, ren)
        sig = self.sigs[cid]
        kind = sig[0]
        if kind == "read":
            return Access(self.tensors[sig[1]], tuple(self._subscript(sub, ren, bound, sig[3])
                                                      for sub in sig[2][2]))
        if kind == "p":
            return Param(self.params[sig[1]])
        if kind == "l":
            return Number(sig[1])
        if kind == "f":
            return Number(float(sig[1]))
        if kind == "v":
            return IndexValue(ren[sig[1]])
        if kind == "u":
            return Unary(sig[1], self.expr(sig[2], ren, bound))
        if kind == "b":
            return Binary(sig[1], self.expr(sig[2], ren, bound), self.expr(sig[3], ren, bound))
        if kind == "c":
            return Call(sig[1], tuple(self.expr(c, ren, bound) for c in sig[2:]))
        # a reduction: its dimensions are its own; a name the scope binds is renamed
        inner, chosen = dict(ren), []
        for name in sig[2]:
            index = self.index[name]
            if index in bound or index in chosen:
                taken = bound | set(chosen)
                pool = self.alias_pool.setdefault(name, [])
                index = next((a for a in pool if a not in taken), None)
                if index is None:       # a new one, unique in the program
                    index = self.taken.suffixed(self.index[name], RESERVED, local=taken)
                    pool.append(index)
                    self.aliases[index] = name
            inner[name] = index
            chosen.append(index)
        return Reduce(sig[1], tuple(chosen), self.expr(sig[3], inner, bound | set(chosen)))

    def _subscript(self, sub, ren, bound, children) -> IndexExpr:
        kind = sub[0]
        if kind == "d":
            return IndexExpr(terms=((ren[sub[1]], 1),))
        if kind == "i":
            return IndexExpr(constant=sub[1])
        if kind == "a":
            return self._affine(sub[1], ren)
        if kind == "g":
            terms = tuple((ren[name], stride) for name, stride in sub[1] if stride)
            return IndexExpr(terms=terms)
        return self._position(children[sub[1]], ren, bound)

    def _affine(self, affine_sig, ren) -> IndexExpr:
        terms, quasi, constant = affine_sig
        return IndexExpr(terms=tuple((ren[name], c) for name, c in terms),
                         quasi=tuple((Quasi(self._affine(inner, ren), op, divisor), c)
                                     for inner, op, divisor, c in quasi),
                         constant=constant)

    def _position(self, cid: int, ren, bound) -> IndexExpr:
        """A gather's position: reads of integer arrays plus indices and integers."""
        sig = self.sigs[cid]
        if self.statement[cid] or sig[0] == "read":
            return IndexExpr(gathers=((self.expr(cid, ren, bound), 1),))
        if sig[0] == "l":
            return IndexExpr(constant=sig[1])
        if sig[0] == "v":
            return IndexExpr(terms=((ren[sig[1]], 1),))
        if sig[0] == "u":
            return _scaled(self._position(sig[2], ren, bound), -1)
        if sig[1] == "*":
            factor, other = self._integer_factor(sig)
            return _scaled(self._position(other, ren, bound), factor)
        left, right = self._position(sig[2], ren, bound), self._position(sig[3], ren, bound)
        return _summed(left, _scaled(right, 1 if sig[1] == "+" else -1))


def _scaled(sub: IndexExpr, factor: int) -> IndexExpr:
    return IndexExpr(terms=tuple((n, c * factor) for n, c in sub.terms),
                     gathers=tuple((a, c * factor) for a, c in sub.gathers),
                     constant=sub.constant * factor)


def _summed(a: IndexExpr, b: IndexExpr) -> IndexExpr:
    terms = dict(a.terms)
    for name, c in b.terms:
        terms[name] = terms.get(name, 0) + c
    gathers = dict(a.gathers)
    for access, c in b.gathers:
        gathers[access] = gathers.get(access, 0) + c
    return IndexExpr(terms=tuple((n, c) for n, c in terms.items() if c),
                     gathers=tuple((g, c) for g, c in gathers.items() if c),
                     constant=a.constant + b.constant)


def _letters():
    round_ = 0
    while True:
        for letter in "ABCDEFGHIJKLMNOPQRSTUVWXYZ":
            yield letter + (str(round_) if round_ else "")
        round_ += 1


def range_values(translation: Translation, info) -> Tuple[Tuple[str, int], ...]:
    """This call's ``ranges=``: the sizes of the dimensions the program needs them for."""
    found = []
    for index, name in translation.ranged:
        entry = info.get(name)
        if entry is not None and entry.use is not None:
            found.append((index, entry.use.size))
    return tuple(found)


def shown_statements(translation: Translation) -> Optional[str]:
    return translation.text
