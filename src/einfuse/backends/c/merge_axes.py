"""A call of the C backend in fewer, longer loops: adjacent indices that every access
reads together -- the same two indices, next to each other, in the same order, as plain
subscripts over whole axes whose memory is one run (``stride[a] == shape[a+1] *
stride[a+1]``) -- are one index over the product of their extents, as NumPy coalesces
axes.  A mean over H, W of ``X[b,c,h,w]`` becomes a sum over ``hw`` of
``X[bc,hw]``: one contiguous vectorised reduction of H*W per row instead of H short
rows of W (at 32x64x28x28 float32, one thread: 0.75 ms -> about the time of a row sum
of 784).  The merge is per call signature (strides are part of it), on views: no copy.

A reduction whose body is a constant (``mean``'s count, ``sum[K](where(e == e, 1, 1))``
as lang/sugar.py writes it so that hoisting can infer its ranges) is its value times the
number of points of its ranges, which the call knows: it becomes a scalar parameter of
the merged statement, so the count costs no pass over the data and one compiled kernel
serves every size.

Only ``:=`` statements without gathers, ``pad=``, explicit ranges, index values or
position reductions (argmax), in a float working dtype; anything else runs as it is
(None)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ...errors import EinfuseError
from ...analysis.binding import BoundCall, bind_call
from ...analysis.spec import spec_of
from ...lang import ast
from ...lang.fresh_names import FreshNames
from ...lang.printer import format_statement
from ...lang.sugar import count_value, is_count

Named = Mapping[str, object]


@dataclass(frozen=True)
class MergedCall:
    """The call in merged form: ``call`` (bound on stand-ins of the merged shapes) and
    ``adapt(named)``, the caller's arrays by name as that call's (views, counts)."""
    call: BoundCall
    adapt: Callable[[Named], Dict[str, object]]


def merged_call(call: BoundCall) -> Optional[MergedCall]:
    """``call`` with constant reductions as parameters and mergeable indices merged, or
    None where nothing changes (or the rules above exclude the call)."""
    spec, options = call.spec, call.options
    if spec.assign != ":=" or options.pad is not None or options.ranges or \
            call.dtypes.working.kind != "f" or any(t.as_index for t in spec.tensors) or \
            any(isinstance(node, ast.IndexValue) for node in spec.rhs.walk()) or \
            ast.has_position_reduction(spec.rhs) or any(
                sub.quasi for access in ast.accesses(spec.rhs) for sub in access.indices):
        # (a position reduction counts positions row-major over its indices as listed:
        # a merged index would count them in another order; a subscript under // or %
        # splits an index into digits that a merge would join again)
        return None
    ranges = call.bounds.range_map
    counts: Dict[str, float] = {}
    taken = FreshNames(set(spec.all_indices) | set(spec.arg_order) | {spec.output})
    rhs = _constant_reductions(spec.rhs, ranges, counts, taken)
    statement = dataclasses.replace(spec.statement, rhs=rhs)
    shapes = {name: tuple(call.arrays.shapes[name]) for name in spec.arg_order
              if name not in spec.params}
    strides = {name: _element_strides(call.arrays[name]) for name in shapes}
    groups, reshaped = _mergeable(statement, shapes, strides, ranges)
    if not groups and not counts:
        return None
    for first, second in groups:
        statement = _merge(statement, first, second)
    text = format_statement(statement)
    try:
        merged_spec = spec_of(text)
    except EinfuseError:     # (a statement this module made: never the user's error)
        return None
    if set(merged_spec.params) != set(spec.params) | set(counts):
        return None
    # the call's own arrays as views of the merged shapes: the kernel's layouts (which
    # axis has unit stride) are read from them
    read = set(merged_spec.arg_order)      # (a count replaced the only read of some)
    stand_ins = {name: np.asarray(call.arrays[name]).reshape(reshaped[name])
                 for name in shapes if name in read}
    stand_ins.update({name: call.params[name] for name in spec.params})
    stand_ins.update(counts)
    try:
        merged = bind_call(merged_spec, options, (), stand_ins)
    except EinfuseError:     # (a statement this module made: the call runs as it is)
        return None
    if merged.dtypes.working != call.dtypes.working or \
            merged.dtypes.result != call.dtypes.result:
        return None
    changed = tuple((name, shape) for name, shape in reshaped.items()
                    if shape != shapes[name] and name in read)
    fixed = tuple(counts.items())

    def adapt(named: Named) -> Dict[str, object]:
        found = dict(named)
        for name, shape in changed:
            found[name] = named[name].reshape(shape)
        for name, value in fixed:
            found[name] = value
        return found
    return MergedCall(merged, adapt)


def _element_strides(array) -> Tuple[int, ...]:
    item = np.dtype(array.dtype).itemsize
    return tuple(s // item for s in np.asarray(array).strides)


def _constant_reductions(expr: ast.Expr, ranges, counts: Dict[str, float], taken) -> ast.Expr:
    """``expr`` with each sum whose body is a constant as a parameter holding its value
    (recorded in ``counts``)."""
    if is_count(expr):
        name = taken.suffixed("count", bare=False)
        counts[name] = float(count_value(expr, ranges))
        return ast.Param(name, span=expr.span)
    return ast.map_children(expr, lambda child: _constant_reductions(child, ranges,
                                                                     counts, taken))


def _access_indices(statement: ast.Statement) -> List[Tuple[str, Tuple[Optional[str], ...]]]:
    """(tensor, each subscript's plain index or None) of every access, the output's
    included (as its own name)."""
    found = [(a.tensor, tuple(sub.plain_index for sub in a.indices))
             for a in ast.accesses(statement.rhs)]
    found.append(("", tuple(statement.output_indices)))
    return found


def _scopes(statement: ast.Statement) -> Dict[str, Optional[ast.Reduce]]:
    """Each index's binder: the reduction that reduces it, or None for an output index
    (an index reduced by two reductions maps to a marker that matches nothing)."""
    scopes: Dict[str, object] = {i: None for i in statement.output_indices}
    for node in statement.rhs.walk():
        if isinstance(node, ast.Reduce):
            for index in node.indices:
                scopes[index] = node if index not in scopes else object()
    return scopes


def _mergeable(statement, shapes, strides, ranges):
    """(pairs (first, second) of indices to merge, in order, and each array's shape
    once merged): a chain b, c, h, w merges pair by pair, each on the arrays as the
    merges before it left them."""
    pairs: List[Tuple[str, str]] = []
    shapes, strides, ranges = dict(shapes), dict(strides), dict(ranges)
    while True:
        pair = _one_pair(statement, shapes, strides, ranges)
        if pair is None:
            return pairs, shapes
        first, second = pair
        pairs.append(pair)
        done = set()
        for tensor, names in _access_indices(statement):
            if tensor and first in names and tensor not in done:
                done.add(tensor)
                axis = names.index(first)
                shape, stride = shapes[tensor], strides[tensor]
                inner = stride[axis] if shape[axis + 1] == 1 else stride[axis + 1]
                shapes[tensor] = shape[:axis] + (shape[axis] * shape[axis + 1],) + \
                    shape[axis + 2:]
                strides[tensor] = stride[:axis] + (inner,) + stride[axis + 2:]
        ranges[first] = (0, ranges[first][1] * ranges[second][1])
        statement = _merge(statement, first, second)


def _one_pair(statement, shapes, strides, ranges) -> Optional[Tuple[str, str]]:
    uses = _access_indices(statement)
    scopes = _scopes(statement)
    candidates = []
    for _, names in uses:
        for first, second in zip(names, names[1:]):
            if first and second and first != second and (first, second) not in candidates:
                candidates.append((first, second))
    for first, second in candidates:
        if scopes.get(first, 0) is not scopes.get(second, 1) or \
                ranges[first][0] != 0 or ranges[second][0] != 0:
            continue
        axes: Dict[str, set] = {}
        for tensor, names in uses:
            if first in names:
                axes.setdefault(tensor, set()).add(names.index(first))
        # each array's accesses merge the same two of its axes (its view has one shape)
        if all(len(found) == 1 for found in axes.values()) and \
                all(_together(tensor, names, first, second, shapes, strides, ranges)
                    for tensor, names in uses):
            return first, second
    return None


def _together(tensor, names, first, second, shapes, strides, ranges) -> bool:
    """Whether this access reads ``first`` and ``second`` as one run of memory (or reads
    neither): adjacent, in order, over whole axes, the first axis's stride the second's
    extent times its stride (any stride where an axis has length 1)."""
    if first not in names and second not in names:
        return True
    if names.count(first) != 1 or names.count(second) != 1:
        return False
    axis = names.index(first)
    if axis + 1 >= len(names) or names[axis + 1] != second:
        return False
    if tensor == "":       # the output: made C-contiguous by the kernel's caller
        return True
    shape, stride = shapes[tensor], strides[tensor]
    if len(shape) != len(names):      # another access of it merged other indices
        return False
    if shape[axis] != ranges[first][1] or shape[axis + 1] != ranges[second][1]:
        return False
    return shape[axis] == 1 or shape[axis + 1] == 1 or \
        stride[axis] == shape[axis + 1] * stride[axis + 1]


def _merge(statement: ast.Statement, first: str, second: str) -> ast.Statement:
    """``statement`` with ``second`` dropped where it follows ``first`` (``first`` now
    stands for both), in accesses, the output and the reductions."""
    def subscripts(indices):
        kept, skip = [], False
        for position, sub in enumerate(indices):
            if skip:
                skip = False
                continue
            kept.append(sub)
            if sub.plain_index == first and position + 1 < len(indices) and \
                    indices[position + 1].plain_index == second:
                skip = True
        return tuple(kept)

    def visit(expr):
        expr = ast.map_children(expr, visit)
        if isinstance(expr, ast.Access):
            return dataclasses.replace(expr, indices=subscripts(expr.indices))
        if isinstance(expr, ast.Reduce) and second in expr.indices:
            return dataclasses.replace(expr, indices=tuple(i for i in expr.indices
                                                           if i != second))
        return expr
    outs = tuple(i for i in statement.output_indices if i != second)
    return dataclasses.replace(statement, rhs=visit(statement.rhs), output_indices=outs,
                               index_spans=(), source="")
