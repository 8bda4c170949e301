"""The log-sum-exp row kernel's rule (plan/row_kernel.py asks it for a C fusion group,
schedule/library.py for a statement run alone): every member computes its value from
two *row statistics* of one matrix ``X`` -- its maximum ``M[i] = max[j](X[i,j])`` and
the sum of its exponentials shifted by that maximum ``S[i] = sum[j](exp(X[i,j] -
M[i]))``, or ``logsumexp[j](X[i,j])`` -- and from values of the row alone (other
members' results, per-row inputs, gathers such as a label's logit ``X[i, t[i]]``,
numbers, elementwise functions): one value per row, or, for a member over ``[i, j]``,
a row of values from ``X[i, j]`` itself (a log-softmax, read by no later member).  A
statement run alone may also be the sum over the rows of such a value (a mean
cross-entropy ``L[] := sum[i](...) / N``: :class:`Total`; or ``mean[i](...)``, whose
count over the rows is :class:`Rows`).

That covers each way of writing a log-sum-exp, a cross-entropy or a log-softmax::

    m[i] := max[j](X[i,j])
    l[i] := m[i] + log(sum[j](exp(X[i,j] - m[i])))          (its spellings: any order,
    loss[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - X[i, t[i]]    any per-row rest)
    loss[i] := logsumexp[j](X[i,j]) - X[i, t[i]]             (one statement)
    Y[i,j] := X[i,j] - logsumexp[k](X[i,k])                  (hoisted: two members)

The kernel (backends/c/row_values.py prints it) reads each row from memory once,
computes M and S as the statements do (NaN and infinite rows included), then each
member's value while the row is in the cache; the generic fused kernel calls the
exponential per element through libmvec, and the statement ``logsumexp[j]`` alone
runs a scalar running maximum.

``logsumexp[j](X[i,j])`` is ``M + log(S)`` where M is finite; where it is not (a row of
-inf, a row holding inf, a NaN) it is M itself, which is what the one-pass running
maximum gives (backends/c/render.ef_lse).

Another sum over the columns is a :class:`RowSum`, summed as written in the cached row
(``sum[j](exp(X[i,j]))`` of ``-log(exp(X[i,t[i]]) / sum[j](exp(X[i,j])))`` among
them, which needs no row maximum), and a label picked by a comparison --
``sum[j](where(j == t[i], X[i,j], 0))``, ``sum[j](X[i,j] * (j == t[i]))`` -- a
:class:`RowPick`: one read, with the written sum's semantics.  Anything else -- another
reduction, a read along the columns outside the statistics, the row sums and ``X[i,
j]``, a parameter, the row index used as a value, a function not listed below -- is no
member of this kernel, and the group (statement) runs the generic kernel."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, FrozenSet, Optional, Tuple

from ..lang import ast
from ..lang.sugar import constant_value, is_count
from .slots import buffer_slots

# the per-row functions the row values take (backends/c/row_values.py prints them as
# the C library's, as the generic kernel does)
ROW_FUNCTIONS = ("exp", "log", "log1p", "expm1", "sqrt", "abs", "tanh")
ROW_BINARY = ("+", "-", "*", "/", "<", "<=", ">", ">=", "==", "!=", "&", "|")
BOUNDS_TAKEN = ("check", "promise")     # an index out of bounds: the statements say so


@dataclass(frozen=True)
class Stat:
    """A row statistic of the matrix: ``max`` (M), ``sum`` (S) or ``logsumexp``."""
    name: str


@dataclass(frozen=True)
class MemberValue:
    """The value of an earlier member of the group, in this row."""
    number: int


@dataclass(frozen=True)
class Read:
    """``array[subscripts]`` for each row: the array's environment key and, per axis,
    the subscript (an :class:`Subscript`)."""
    key: str
    subscripts: Tuple["Subscript", ...]


@dataclass(frozen=True)
class Subscript:
    """``constant + row * row_coefficient + sum(c * gathered)``: each gathered value a
    :class:`Read` of an integer array (a label ``t[i]``)."""
    constant: int
    row: int
    gathers: Tuple[Tuple[Read, int], ...] = ()


@dataclass(frozen=True)
class Const:
    value: float


@dataclass(frozen=True)
class Column:
    """The matrix's value at the output's column, in a member over [i, j]."""


@dataclass(frozen=True)
class ColumnIndex:
    """The column index as a value (``j`` in ``where(j == t[i], X[i,j], 0)``), inside
    a :class:`RowSum`."""


@dataclass(frozen=True)
class RowSum:
    """``sum[j](body)`` over the row's columns, computed as written: ``body`` is a row
    value of the matrix's element (:class:`Column`), the column index
    (:class:`ColumnIndex`) and per-row values, summed in one pass over the row while it
    is in the cache.  It takes the cross-entropies that pick the label's logit by a
    comparison -- ``sum[j](where(j == t[i], X[i,j], 0))``, ``sum[j](X[i,j] * (j ==
    t[i]))`` -- with exactly their semantics (an out-of-range label gives 0, a NaN
    elsewhere in the row is NaN in the product and not in the ``where``), because it
    evaluates them as written rather than as a gather."""
    body: object


@dataclass(frozen=True)
class RowPick:
    """``sum[j](where(j == at, value, 0))`` (or ``at == j``), ``at`` a per-row value:
    the written sum adds +0.0 at every column but the one ``at`` names, so it is ``0.0 +
    value`` there (a -0.0 summed is +0.0) and 0.0 where ``at`` names no column (out of
    range, not a whole number, NaN): the kernel reads that one column -- a gather with
    the written sum's semantics, which never raises for a label it does not select.

    ``dense``: the one-hot product ``sum[j](X[i,j] * (j == at))``, whose other columns
    add ``X[i,j] * 0``: ±0.0 in a finite row, NaN where the row holds an inf or a NaN
    (the kernel sums such a row as written)."""
    at: object
    value: object
    dense: bool = False


@dataclass(frozen=True)
class Total:
    """The sum over the rows of the (one) member's values."""


@dataclass(frozen=True)
class Rows:
    """The number of rows: a count over the row index (``mean[i]``'s divisor, the
    rows the total sums over), a fact of the call's shape."""


@dataclass(frozen=True)
class Apply:
    """``op`` applied to ``args``: a function of ROW_FUNCTIONS, ``where``, a binary
    operator of ROW_BINARY, ``neg``, or ``square`` (``x**2``)."""
    op: str
    args: Tuple[object, ...]


@dataclass(frozen=True)
class RowStatistics:
    """The rule's answer: the matrix's key, the other input keys the values read, and
    each member's value; which of the inputs are index arrays (read in subscripts
    only) and each input's number of axes."""
    matrix: str
    inputs: Tuple[str, ...]
    values: Tuple[object, ...]
    index_keys: FrozenSet[str] = frozenset()
    axes: Tuple[Tuple[str, int], ...] = ()
    row: str = ""                   # the row index (of a statement run alone)
    # a scalar statement's value from the sum over the rows of its one member's values
    # (a :class:`Total` in it), or None: each member's values are its output
    total: Optional[object] = None
    # per member, whether its value is a row over the columns ([i, j]: a log-softmax's
    # X[i,j] - lse[i], computed from :class:`Column`) rather than one per row
    grid: Tuple[bool, ...] = ()
    # whether the kernel needs the row's maximum and sum of shifted exponentials (a
    # member reads a :class:`Stat`, or a one-hot product asks whether the row is
    # finite); a group of row sums alone (``sum[j](exp(X[i,j]))`` as written) skips them
    maximum: bool = True

    @property
    def ndims(self) -> Dict[str, int]:
        return dict(self.axes)


def row_statistics(members) -> Optional[RowStatistics]:
    """The fusion group (schedule/fusion.Member's) as the row statistics of one matrix
    and per-row values, or None."""
    if any(m.kernel.spec.output_indices[:1] != (m.outer,) or
           len(m.kernel.spec.output_indices) > 2 for m in members):
        return None
    return _statistics([(m.kernel.spec, m.kernel.spec.rhs, m.outer, m.call.options,
                         m.plan.slots[:-1], m.reads, m.sources) for m in members])


def statement_statistics(spec, options) -> Optional[RowStatistics]:
    """The same for one statement run alone (its arrays' keys are its names): where it
    is a log-sum-exp or a cross-entropy written as one statement (``logsumexp[j]``,
    the canonical form of ``max + log(sum(exp(x - max)))``, rewrite/rules.py), or the
    sum over the rows of one (a mean cross-entropy ``L[] := sum[i](...) / N``: its
    ``total``)."""
    if spec.assign != ":=" or len(spec.output_indices) > 1:
        return None
    slots = buffer_slots(spec)[:-1]
    names = tuple(tensor for tensor, _ in slots)
    if spec.output_indices:
        return _statistics([(spec, spec.rhs, spec.output_indices[0], options, slots, {},
                             names)])
    sums = [e for e in spec.rhs.walk() if isinstance(e, ast.Reduce)]
    if not sums or sums[0].op != "sum" or len(sums[0].indices) != 1:
        return None
    summed = sums[0]
    try:
        total = _total(spec.rhs, summed)
    except _Refused:
        return None
    found = _statistics([(spec, summed.body, summed.indices[0], options, slots, {},
                          names)])
    return None if found is None else replace(found, total=total)


def _total(e, summed):
    """The scalar statement's value from its one sum over the rows (``summed``, a
    :class:`Total` here) and numbers."""
    if e is summed:
        return Total()
    if is_count(e) and e.indices == summed.indices:
        # (mean's count over the rows: how many rows, whatever they hold)
        return Apply("*", (Const(float(constant_value(e.body))), Rows()))
    if isinstance(e, ast.Number):
        return Const(float(e.value))
    if isinstance(e, ast.Unary):
        inner = _total(e.operand, summed)
        return Apply("neg", (inner,)) if e.op == "-" else inner
    if isinstance(e, ast.Binary) and e.op in "+-*/":
        return Apply(e.op, (_total(e.left, summed), _total(e.right, summed)))
    if isinstance(e, ast.Call) and e.func in ROW_FUNCTIONS and len(e.args) == 1:
        return Apply(e.func, (_total(e.args[0], summed),))
    raise _Refused


def _statistics(parts) -> Optional[RowStatistics]:
    """``parts``: per member (spec, the value per row, its row index, options, its
    input slots (tensor, role), slot -> (producer member, slot) for reads of earlier
    members, per slot the environment key read)."""
    reader = _Reader()
    values = []
    for number, (spec, rhs, outer, options, slots, reads, sources) in enumerate(parts):
        if spec.assign != ":=" or spec.params or options.pad is not None or \
                options.bounds not in BOUNDS_TAKEN:
            return None
        value = reader.member(spec, rhs, outer, slots, reads, sources, values)
        if value is None:
            return None
        values.append(value)
        reader.grids.append(len(spec.output_indices) == 2)
    if reader.matrix is None or not reader.exponentials:
        return None
    inputs = tuple(k for k in dict.fromkeys(reader.keys) if k != reader.matrix)
    indices = frozenset(k for k, role in reader.roles.items() if role == "index")
    if reader.matrix in indices:
        return None
    return RowStatistics(reader.matrix, inputs, tuple(values), indices,
                         tuple((k, reader.axes[k]) for k in inputs), parts[0][2],
                         grid=tuple(reader.grids),
                         maximum=any(_needs_maximum(v) for v in values))


class _Reader:
    """The members' right sides as row values, one after another."""

    def __init__(self):
        self.matrix: Optional[str] = None     # the key of the matrix X
        self.column: Optional[str] = None     # (per member: its column index)
        self.keys = []                        # input keys, in order of first use
        self.roles: Dict[str, str] = {}       # key -> "value" or "index" (one of them)
        self.axes: Dict[str, int] = {}        # key -> its number of axes
        self.exponentials = False             # a sum of exponentials or a logsumexp seen
        self.grids = []                       # per member so far: whether over [i, j]
        self.summing = False                  # inside a RowSum's body (over self.column)

    def member(self, spec, rhs, outer: str, slots, reads, sources, values):
        names: Dict[str, object] = {}
        for slot, (tensor, role) in enumerate(slots):
            if slot in reads:
                if role != "value":
                    return None
                names[tensor] = MemberValue(reads[slot][0])
            else:
                key = sources[slot] if slot < len(sources) else None
                if key is None:
                    return None
                names[tensor] = key
        self.row, self.column = outer, None
        # a member over the row's columns too ([i, j]): its column index
        self.grid_column = spec.output_indices[1] if len(spec.output_indices) == 2 else None
        self.names, self.values = names, values
        try:
            return self.value(rhs)
        except _Refused:
            return None

    def value(self, e):
        if isinstance(e, ast.Number):
            return Const(float(e.value))
        if isinstance(e, ast.Reduce):
            return self.statistic(e)
        if isinstance(e, ast.IndexValue) and self.summing and e.name == self.column:
            return ColumnIndex()
        if isinstance(e, ast.Access):
            if self.summing and len(e.indices) == 2 and \
                    tuple(s.plain_index for s in e.indices) == (self.row, self.column):
                self.row_of_matrix(e)       # X[i, j] in a row sum's body
                return Column()
            if self.grid_column is not None and len(e.indices) == 2 and \
                    tuple(s.plain_index for s in e.indices) == (self.row, self.grid_column):
                self.column = self.grid_column
                self.row_of_matrix(e)       # X[i, j] itself, in a member over [i, j]
                self.column = None
                return Column()
            return self.read(e, "value")
        if isinstance(e, ast.Unary):
            inner = self.value(e.operand)
            return Apply("neg", (inner,)) if e.op == "-" else inner
        if isinstance(e, ast.Binary):
            if e.op == "**" and isinstance(e.right, ast.Number) and e.right.value == 2:
                return Apply("square", (self.value(e.left),))
            if e.op not in ROW_BINARY:
                raise _Refused
            return Apply(e.op, (self.value(e.left), self.value(e.right)))
        if isinstance(e, ast.Call) and (e.func in ROW_FUNCTIONS and len(e.args) == 1 or
                                        e.func == "where" and len(e.args) == 3):
            return Apply(e.func, tuple(self.value(a) for a in e.args))
        raise _Refused

    def statistic(self, e: ast.Reduce) -> Stat:
        """max[j](X[i,j]), logsumexp[j](X[i,j]) or sum[j](exp(X[i,j] - M)) with M the
        row maximum (a member holding it, or the reduction written out)."""
        if len(e.indices) != 1 or e.indices[0] in (self.row, self.grid_column) or \
                self.column is not None:
            raise _Refused      # (over the row index, the output's column, or nested)
        self.column = e.indices[0]
        try:
            return self.reduction(e)
        finally:
            self.column = None

    def reduction(self, e: ast.Reduce) -> Stat:
        if e.op in ("max", "logsumexp"):
            self.row_of_matrix(e.body)
            self.exponentials |= e.op == "logsumexp"
            return Stat(e.op)
        body = e.body
        if e.op != "sum":
            raise _Refused
        if self.shifted_exponentials(body):
            self.exponentials = True
            return Stat("sum")
        return self.row_sum(body)

    def shifted_exponentials(self, body) -> bool:
        """Whether ``body`` is ``exp(X[i,j] - M)``, M the row maximum."""
        if not (isinstance(body, ast.Call) and body.func == "exp" and len(body.args) == 1):
            return False
        shifted = body.args[0]
        if not (isinstance(shifted, ast.Binary) and shifted.op == "-"):
            return False
        saved = (self.matrix, list(self.keys), dict(self.roles), dict(self.axes))
        try:
            self.row_of_matrix(shifted.left)
            if self.is_maximum(shifted.right):
                return True
        except _Refused:
            pass
        # (not this form: what the attempt recorded is undone, for the row sum's turn)
        self.matrix, self.keys, self.roles, self.axes = saved
        return False

    def row_sum(self, body):
        """Any other sum over the columns, as written (a member over [i, j] takes none:
        its own column would be the sum's)."""
        if self.grid_column is not None or self.summing:
            raise _Refused
        self.summing = True
        try:
            summed = self.value(body)
        finally:
            self.summing = False
        # (the row's sum of exponentials as written, sum[j](exp(X[i,j])): the kernel's
        # vector pass of exponentials; any other row sum joins a kernel that has one)
        self.exponentials |= summed == Apply("exp", (Column(),))
        return _picked(summed) or RowSum(summed)

    def is_maximum(self, e) -> bool:
        """Whether ``e`` is the row maximum of the matrix (read or written out)."""
        if isinstance(e, ast.Reduce):
            saved = self.column
            try:
                if len(e.indices) != 1 or e.op != "max" or \
                        e.indices[0] in (self.row, self.grid_column):
                    return False
                self.column = e.indices[0]
                self.row_of_matrix(e.body)
                return True
            finally:
                self.column = saved
        if isinstance(e, ast.Access):
            found = self.read(e, "value")
            return isinstance(found, MemberValue) and \
                self.values[found.number] == Stat("max")
        return False

    def row_of_matrix(self, e) -> None:
        """``e`` must be ``X[i, j]`` (the row index, the column index) of the one
        matrix of the group, an input."""
        if not isinstance(e, ast.Access) or len(e.indices) != 2 or \
                tuple(s.plain_index for s in e.indices) != (self.row, self.column):
            raise _Refused
        key = self.names.get(e.tensor)
        if not isinstance(key, str) or self.matrix not in (None, key):
            raise _Refused
        self.matrix = key
        self.keys.append(key)
        self.role(key, "value", 2)

    def role(self, key: str, role: str, axes: int) -> None:
        if self.roles.setdefault(key, role) != role or self.axes.setdefault(key, axes) != axes:
            raise _Refused      # (an array read both as values and as indices)

    def read(self, e: ast.Access, role: str):
        """A read of the row's values (no column index in it); ``role``: "value", or
        "index" for a gather's index array."""
        source = self.names.get(e.tensor)
        if source is None:
            raise _Refused
        subscripts = tuple(self.subscript(s) for s in e.indices)
        if isinstance(source, MemberValue):
            if subscripts != (Subscript(0, 1),) or self.grids[source.number]:
                raise _Refused      # (a member over [i, j] is read by nothing after it)
            return source
        self.keys.append(source)
        self.role(source, role, len(subscripts))
        return Read(source, subscripts)

    def subscript(self, s: ast.IndexExpr) -> Subscript:
        if s.quasi or any(name != self.row for name, _ in s.terms):
            raise _Refused      # the column index, another index, // or %
        row = sum(c for _, c in s.terms)
        gathers = []
        for access, coefficient in s.gathers:
            found = self.read(access, "index")
            if not isinstance(found, Read):
                raise _Refused      # (a member's result as an index: not an index array)
            gathers.append((found, coefficient))
        return Subscript(s.constant, row, tuple(gathers))


class _Refused(Exception):
    """A part of a member that is no row value."""


def _uses_column(value) -> bool:
    if isinstance(value, (Column, ColumnIndex)):
        return True
    return isinstance(value, Apply) and any(_uses_column(a) for a in value.args)


def _column_named(test) -> Optional[object]:
    """``at`` of ``j == at`` or ``at == j`` (``at`` free of the column), or None."""
    if not (isinstance(test, Apply) and test.op == "=="):
        return None
    left, right = test.args
    at = right if left == ColumnIndex() else left if right == ColumnIndex() else None
    return None if at is None or _uses_column(at) else at


def _picked(body) -> Optional[RowPick]:
    """``body`` (a row sum's) as a :class:`RowPick`, or None."""
    if not isinstance(body, Apply):
        return None
    if body.op == "where" and body.args[2] == Const(0.0):
        at = _column_named(body.args[0])
        return None if at is None else RowPick(at, body.args[1])
    if body.op == "*":
        for test, value in (body.args, body.args[::-1]):
            at = _column_named(test)
            if at is not None and value == Column():
                return RowPick(at, value, dense=True)
    return None


def _needs_maximum(value) -> bool:
    if isinstance(value, Stat) or isinstance(value, RowPick) and value.dense:
        return True
    parts = value.args if isinstance(value, Apply) else \
        (value.at, value.value) if isinstance(value, RowPick) else \
        (value.body,) if isinstance(value, RowSum) else ()
    return any(_needs_maximum(p) for p in parts)
