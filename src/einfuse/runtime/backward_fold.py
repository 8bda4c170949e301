"""A faster form of a program's backward: gradient statements folded together and
rewritten to read the forward's outputs where their right sides recur.

derive differentiates each forward statement on its own, so softmax's backward reads
``e`` and ``m`` and computes ``exp`` again::

    de_1[i,j] := dP[i,j] / sum[k](e[i,k]) + sum[j2](-(dP[i,j2] * e[i,j2] / sum[k](e[i,k])**2))
    dX_1[i,j] := de_1[i,j] * exp(X[i,j] - m[i])

Two rewrites make it torch's ``P * (dP - sum(dP * P))``, for any program, not for a
pattern of softmax:

* **folding**: a gather whose result one later gather (or a ``Total``) alone reads,
  once and at plain subscripts, is substituted into it (its reduced indices renamed
  apart), so ``de_1`` disappears into ``dX_1``;
* **dividing out** (autodiff/algebra.py): in the sum-of-products form of each
  statement, a forward statement whose right side is one product (``e := exp(X - m)``,
  ``P := e / sum(e)``) is read as its output wherever that product divides a term.

The folded form is used only where it costs less (fewer transcendental functions and
forward intermediates read, or as many and fewer statements), and per call only where
it is exact (:func:`exact_ranges`): the forward program has no ``ranges=`` or ``pad=``,
every statement involved reads its arrays at plain subscripts over their whole axes,
and all float arrays have one dtype.  Anywhere else the backward runs as derived."""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass
from fractions import Fraction
from typing import Dict, FrozenSet, List, Mapping, Optional, Sequence, Set, Tuple, Union

import numpy as np

from ..lang.ast import (Access, Call, Expr, IndexExpr, Param, Reduce, Statement, accesses,
                        expression_size, map_children, sum_tree)
from ..lang.parser import parse
from ..lang.printer import format_statement
from ..lang.fresh_names import FreshNames
from ..lang.sugar import rename_indices
from ..lang.rewrite import free_indices
from ..autodiff.algebra import Algebra, Definition, Poly, Term, TooLarge, definition_of, merge
from ..autodiff.cse import EXPENSIVE
from ..autodiff.derive import GradientStatement
from ..analysis.spec import spec_of
from .gradient_reference import resolve_options
from .backward_steps import Contribution, Total


@dataclass(frozen=True)
class Combined:
    """A gather of the folded backward: ``text`` computes ``key`` (a share of the
    gradient ``target``, shaped like the forward name ``like``) from the gradient
    statements ``parts`` folded into it."""
    key: str
    target: str
    like: str
    text: str
    parts: Tuple[GradientStatement, ...]
    # (forward name, axis) giving each output axis its extent: ``like``'s own axes, or
    # for a row coefficient (below) the first axis of the statement it serves
    axes: Tuple[Tuple[str, int], ...] = ()

    def shape(self, shapes: Mapping[str, object]) -> Tuple[int, ...]:
        if not self.axes:
            return tuple(np.shape(shapes[self.like]))
        return tuple(np.shape(shapes[name])[axis] for name, axis in self.axes)


@dataclass(frozen=True)
class Folded:
    """The steps of the folded backward (Combined, and the original Contributions and
    Totals that did not fold), the forward names they read and those whose shapes the
    parts' ranges need; ``placeholders``: every gradient name of the backward as
    derived, with the forward name it is shaped like (parts' ranges may name them)."""
    steps: Tuple
    reads: FrozenSet[str]
    shaped: FrozenSet[str]
    placeholders: Tuple[Tuple[str, str], ...]


@dataclass
class _Node:
    key: str
    target: str
    like: str
    indices: Tuple[str, ...]
    rhs: Expr
    parts: Tuple[GradientStatement, ...]
    step: object                  # the step as derived
    changed: bool = False


def fold(backward, specs: Sequence, options: Mapping[str, object]) -> Optional[Folded]:
    """The folded form of ``backward`` (autodiff/backward.py) of the program whose
    analysed statements are ``specs``, or None where it would not cost less."""
    if options.get("ranges") or options.get("pad") is not None:
        return None
    ranks = _ranks(specs)
    seeded = frozenset(backward.seeds) | {s.key for s in backward.steps
                                          if isinstance(s, Contribution)} | \
        {s.target for s in backward.steps}
    nodes: List[Union[_Node, object]] = []
    for step in backward.steps:
        if isinstance(step, Contribution) and _eligible(step.statement):
            spec = step.statement.spec
            nodes.append(_Node(step.key, step.target, step.like, tuple(spec.output_indices),
                               spec.rhs, (step.statement,), step))
        elif isinstance(step, Total) and ranks.get(step.like, 0) > 0:
            indices = tuple(backward.index_names[:ranks[step.like]])
            nodes.append(_Node(step.target, step.target, step.like, indices,
                               _sum_of(step.parts, indices), (), step))
        else:
            nodes.append(step)
    results = {name for name in backward.results if name is not None}
    taken = FreshNames(backward.taken)
    _fold(nodes, results, taken)
    definitions = _definitions(specs, seeded)
    steps = []
    for node in nodes:
        if not isinstance(node, _Node):
            steps.append(node)
            continue
        found = _simplified(node, seeded, definitions)
        if found is None and not node.changed:
            steps.append(node.step)
            continue
        if found is None:
            steps.append(Combined(node.key, node.target, node.like, format_statement(
                Statement(node.key, node.indices, ":=", node.rhs)), node.parts))
            continue
        try:
            steps += _with_row_coefficients(node, *found, taken)
        except TooLarge:
            steps.append(Combined(node.key, node.target, node.like, format_statement(
                Statement(node.key, node.indices, ":=", node.rhs)), node.parts))
    forward = {n for spec in specs for n in spec.arg_order + (spec.output,)}
    defined = {spec.output for spec in specs}
    if _cost(steps, forward, defined, backward.outputs) >= \
            _cost(backward.steps, forward, defined, backward.outputs):
        return None
    reads = frozenset(n for step in steps for n in _inputs(step) if n in forward)
    shaped = {n for step in steps if isinstance(step, Combined) for g in step.parts
              for n in _forward_names(g)}
    placeholders = tuple((s.key, s.like) if isinstance(s, Contribution) else
                         (s.target, s.like) for s in backward.steps)
    shaped |= {like for _, like in placeholders}
    return Folded(tuple(steps), reads, frozenset(shaped) - reads, placeholders)


def _eligible(g: GradientStatement) -> bool:
    """A gather without positions or ``pad=``.  (One with range checks and a fallback
    is folded too: exact_ranges requires every index to cover its axes; ``bounds=`` and
    ``fill=`` concern gathers, which exact_ranges refuses.)"""
    return g.kind == "gather" and g.parent is None and not g.positions and \
        g.options.get("pad") is None


def _ranks(specs) -> Dict[str, int]:
    ranks: Dict[str, int] = {}
    for spec in specs:
        ranks[spec.output] = len(spec.output_indices)
        for access in accesses(spec.rhs):
            ranks.setdefault(access.tensor, len(access.indices))
    return ranks


def _sum_of(parts: Tuple[str, ...], indices: Tuple[str, ...]) -> Expr:
    return sum_tree([Access(p, tuple(IndexExpr(((i, 1),)) for i in indices)) for p in parts])


# The largest right side folding may build (nodes, nesting depth); the folds of softmax's
# and layernorm's backwards are about 130 nodes, 16 deep.  Beyond it a gather stays its
# own step: folding a chain of 1,000 statements into one gather gave an expression too
# deep for any recursive walk, and each fold walked the growing expression again.
FOLDED_NODES = 512
FOLDED_DEPTH = 48


def _fold(nodes: List, results: Set[str], taken: FreshNames) -> None:
    """Substitute each node that exactly one later node reads (and nothing else), at
    plain distinct subscripts, into that reader; again until nothing folds (layernorm's
    ``dv`` folds once its two readers have folded into one).  The first foldable node
    folds first, as a rescan from the start after each fold would find; a fold can make
    foldable only the nodes producing what the folded node read, so only those are
    looked at again (a rescan of every node after each fold was quadratic)."""
    inputs = [set(_inputs(node)) for node in nodes]
    sizes = [expression_size(node.rhs) if isinstance(node, _Node) else (0, 0)
             for node in nodes]
    readers: Dict[str, Set[int]] = {}
    producers: Dict[str, List[int]] = {}
    for position, node in enumerate(nodes):
        for name in inputs[position]:
            readers.setdefault(name, set()).add(position)
        if isinstance(node, _Node):
            producers.setdefault(node.key, []).append(position)
    alive = [True] * len(nodes)
    waiting = list(range(len(nodes)))         # a heap of positions to look at
    while waiting:
        position = heapq.heappop(waiting)
        node = nodes[position]
        if not alive[position] or not isinstance(node, _Node) or node.key in results:
            continue
        later = [r for r in readers.get(node.key, ()) if r > position]
        if len(later) != 1 or not isinstance(nodes[later[0]], _Node):
            continue
        target = later[0]
        reader = nodes[target]
        found = [a for a in accesses(reader.rhs) if a.tensor == node.key]
        subscripts = [tuple(sub.plain_index for sub in a.indices) for a in found]
        if not found or any(None in s or len(set(s)) != len(s) or
                            len(s) != len(node.indices) for s in subscripts):
            continue
        (size, depth), (reader_size, reader_depth) = sizes[position], sizes[target]
        grown = (reader_size + len(found) * size, reader_depth + depth)
        if grown[0] > FOLDED_NODES or grown[1] > FOLDED_DEPTH:
            continue
        for access, names in zip(found, subscripts):
            body = rename_indices(_fresh_bound(node.rhs, taken),
                                  dict(zip(node.indices, names)))
            reader.rhs = _replace_access(reader.rhs, access, body)
        reader.parts = reader.parts + node.parts
        reader.changed = True
        sizes[target] = expression_size(reader.rhs)
        alive[position] = False
        readers[node.key].discard(target)
        inputs[target].discard(node.key)
        for name in inputs[position]:
            readers[name].discard(position)
            readers[name].add(target)
            inputs[target].add(name)
            for producer in producers.get(name, ()):
                heapq.heappush(waiting, producer)
    nodes[:] = [node for node, kept in zip(nodes, alive) if kept]


def _replace_access(expr: Expr, target: Access, value: Expr) -> Expr:
    if expr == target:
        return value
    return map_children(expr, lambda child: _replace_access(child, target, value))


def _fresh_bound(expr: Expr, taken: FreshNames) -> Expr:
    """``expr`` with every reduction's indices renamed to names not in ``taken``."""
    if isinstance(expr, Reduce):
        names = {index: taken.counted("r") for index in expr.indices}
        body = rename_indices(expr.body, names)
        return dataclasses.replace(expr, indices=tuple(names[i] for i in expr.indices),
                                   body=_fresh_bound(body, taken), implicit=False)
    return map_children(expr, lambda child: _fresh_bound(child, taken))


def _definitions(specs, seeded) -> Tuple[Definition, ...]:
    """The forward statements whose right side is one product read at plain subscripts,
    in program order."""
    algebra = Algebra(seeded)
    found = []
    for spec in specs:
        if spec.assign != ":=" or any(t.as_index for t in spec.tensors) or not all(
                _plain(a) for a in accesses(spec.rhs)):
            continue
        definition = definition_of(algebra, spec.output, tuple(spec.output_indices),
                                   spec.rhs)
        if definition is not None:
            found.append(definition)
    return tuple(found)


def _plain(access: Access) -> bool:
    names = [sub.plain_index for sub in access.indices]
    return None not in names and len(set(names)) == len(names)


def _simplified(node: _Node, seeded, definitions) -> Optional[Tuple[Algebra, Poly]]:
    """The node's right side in normal form with the definitions divided out, or None
    where nothing divides and nothing was folded in (or the form would be too large)."""
    algebra = Algebra(seeded)
    try:
        poly = algebra.poly(node.rhs)
        divided = algebra.divide_out(poly, definitions)
    except TooLarge:
        return None
    if divided == poly and not node.changed:
        return None
    return algebra, divided


def _with_row_coefficients(node: _Node, algebra: Algebra, poly: Poly,
                           taken: FreshNames) -> List[Combined]:
    """The node as Combined steps: each sum of the terms' factors that vary along its
    first index alone (``-sum(dP*P)``; layernorm's ``1/s``, ``-h/(N s**3)``) computed
    first into a row coefficient ``key_r<n>[i]``, so that the statement itself reads
    one value per row for each distinct rest (``P*dP + P*c[i]``): the rows' kernel
    then walks the long axis innermost and joins the row sums in one pass."""
    row = node.indices[0] if len(node.indices) >= 2 else None
    groups: Dict[Tuple, List[Term]] = {}
    for term in poly:
        fixed = tuple((k, p) for k, p in term.factors if row is not None and
                      set(algebra.atoms[k].free) <= {row})
        rest = tuple((k, p) for k, p in term.factors if (k, p) not in fixed)
        groups.setdefault(rest, []).append(Term(term.coefficient, fixed))
    steps: List[Combined] = []
    sums: Dict[str, str] = {}          # a row sum's atom -> the atom reading its temporary
    for coefficients in groups.values():
        for term in coefficients:
            for key, _ in term.factors:
                if key not in sums and algebra.sum_parts(key) is not None:
                    name = taken.counted(f"{node.key}_s")
                    rhs = _fresh_bound(algebra.atoms[key].expr, taken)
                    steps.append(Combined(name, name, node.like, format_statement(
                        Statement(name, (row,), ":=", rhs)), node.parts, ((node.like, 0),)))
                    sums[key] = algebra.atom(Access(name, (IndexExpr(((row, 1),)),)))
    groups = {rest: [Term(t.coefficient, merge(tuple((sums.get(k, k), p)
                                                      for k, p in t.factors)))
                     for t in coefficients] for rest, coefficients in groups.items()}
    terms: List[Term] = []
    for rest, coefficients in groups.items():
        single = len(coefficients) == 1 and abs(coefficients[0].coefficient) == 1 and \
            (not coefficients[0].factors or
             (len(coefficients[0].factors) == 1 and coefficients[0].factors[0][1] == 1))
        if row is None or single:
            terms += [Term(c.coefficient, tuple(sorted(c.factors + rest)))
                      for c in coefficients]
            continue
        name = taken.counted(f"{node.key}_r")
        rhs = _fresh_bound(algebra.expr(tuple(coefficients)), taken)
        text = format_statement(Statement(name, (row,), ":=", rhs))
        steps.append(Combined(name, name, node.like, text, node.parts, ((node.like, 0),)))
        read = Access(name, (IndexExpr(((row, 1),)),))
        terms.append(Term(Fraction(1), tuple(sorted(rest + ((algebra.atom(read), 1),)))))
    rhs = _fresh_bound(algebra.expr(tuple(terms)), taken)
    if not free_indices(rhs) <= set(node.indices):
        return [Combined(node.key, node.target, node.like, format_statement(
            Statement(node.key, node.indices, ":=", node.rhs)), node.parts)]
    text = format_statement(Statement(node.key, node.indices, ":=", rhs))
    return steps + [Combined(node.key, node.target, node.like, text, node.parts)]


def _inputs(step) -> Tuple[str, ...]:
    if isinstance(step, _Node):
        return tuple(dict.fromkeys(a.tensor for a in accesses(step.rhs))) + tuple(
            n.name for n in step.rhs.walk() if isinstance(n, Param))
    if isinstance(step, Combined):
        return spec_of(step.text).arg_order
    if isinstance(step, Contribution):
        return step.statement.inputs + (step.like,)
    if isinstance(step, Total):
        return step.parts
    return ()


def _forward_names(g: GradientStatement) -> Tuple[str, ...]:
    spec = spec_of(g.forward)
    return spec.arg_order + (spec.output,)


def _cost(steps, forward: Set[str], defined: Set[str], outputs) -> Tuple[int, int]:
    """(transcendental calls + forward intermediates read, statements)."""
    calls = 0
    intermediates: Set[str] = set()
    for step in steps:
        if isinstance(step, Combined):
            text = step.text
        elif isinstance(step, Contribution):
            text = step.statement.text
        else:
            continue
        statement = parse(text)
        calls += sum(1 for n in statement.rhs.walk()
                     if isinstance(n, Call) and n.func in EXPENSIVE)
        intermediates |= {a.tensor for a in accesses(statement.rhs)
                          if a.tensor in defined and a.tensor not in outputs}
    return calls + len(intermediates), len(steps)


def exact_ranges(step: Combined, shapes: Mapping[str, object]) -> Optional[Dict[str, range]]:
    """The ranges of ``step``'s statement for arrays shaped like ``shapes``, where
    folding is exact for them: every part, and the statement itself, reads each array
    at plain subscripts over its whole axes, and the float arrays share one dtype.
    None otherwise (the backward then runs as derived)."""
    from ..errors import EinfuseError
    for g in step.parts:
        try:
            ranges = resolve_options(g, shapes)["ranges"]
        except (EinfuseError, KeyError):
            return None
        if g.wrt not in shapes or \
                _full_ranges(spec_of(g.text), shapes, np.shape(shapes[g.wrt])) != ranges:
            return None
    spec = spec_of(step.text)
    found = _full_ranges(spec, shapes, step.shape(shapes))
    if found is None or set(found) != set(spec.all_indices):
        return None
    dtypes = {np.dtype(getattr(shapes[n], "dtype", np.float64)) for n in spec.arg_order
              if not isinstance(shapes[n], (int, float))}
    if len({d for d in dtypes if d.kind == "f"}) > 1 or any(d.kind != "f" for d in dtypes):
        return None
    return found


def _full_ranges(spec, shapes, output: Tuple[int, ...]) -> Optional[Dict[str, range]]:
    """index -> range(0, n) from the axes each index subscripts plainly (the output's
    indices: the axes ``output``), or None where a subscript is not plain, or two axes
    an index runs over differ."""
    if len(output) != len(spec.output_indices):
        return None
    ranges: Dict[str, range] = {i: range(0, n) for i, n in zip(spec.output_indices, output)}
    for access in accesses(spec.rhs):
        if not _plain(access) or access.tensor not in shapes:
            return None
        shape = np.shape(shapes[access.tensor])
        if len(shape) != len(access.indices):
            return None
        for sub, n in zip(access.indices, shape):
            found = range(0, n)
            if ranges.setdefault(sub.plain_index, found) != found:
                return None
    return ranges


__all__ = ["Combined", "Folded", "exact_ranges", "fold"]
