"""Shape-independent analysis of a statement into a :class:`Spec`.

The Spec is what every later stage reads: which indices are output indices and
which are reduced (and by what), which names are tensors, index arrays and
scalar parameters, the order positional arguments bind in, and which loops may
run in parallel without write races.  Sizes are not known here; they are bound
per call by :mod:`einfuse.analysis.ranges`.
"""

from __future__ import annotations

import functools

from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple

from ..errors import EinfuseNameError, EinfuseSyntaxError, IndexRuleError
from ..lang.ast import (Access, Binary, COMPARISON_OPS, LOGICAL_OPS, POSITION_REDUCTIONS,
                        Expr, IndexExpr, IndexValue, Param, Reduce, Statement, Unary, accesses,
                        has_position_reduction, reductions)
from ..lang.parser import parse
from ..lang.printer import format_expr
from .spec_key import statement_key


@dataclass(frozen=True)
class TensorInfo:
    name: str
    rank: int
    as_value: bool        # read for its values somewhere
    as_index: bool        # read as a gather's index array somewhere


@dataclass(frozen=True)
class IndexUse:
    """One subscript position where an index occurs."""
    access: Access
    axis: int
    subscript: IndexExpr
    coefficient: int      # of the index's affine term; 0 when it is only under // or %
    in_gather: bool       # the access is an index array (read inside another's subscript)


# Compared and hashed by identity: one Spec exists per statement text (runtime.kernel
# caches them), and hashing the whole tree on every call would cost more than the call;
# what is compiled for it is shared by its structural ``key`` (analysis/spec_key.py).
@dataclass(frozen=True, eq=False)
class Spec:
    statement: Statement
    rhs: Expr                               # implicit reductions made explicit
    output_indices: Tuple[str, ...]
    reduction_indices: Tuple[str, ...]      # every reduced index, outermost first
    tensors: Tuple[TensorInfo, ...]
    params: Tuple[str, ...]
    arg_order: Tuple[str, ...]              # positional binding: first appearance on the right
    index_uses: Tuple[Tuple[str, Tuple[IndexUse, ...]], ...]
    result_is_bool: bool
    race_free_indices: Tuple[str, ...]      # loops that may run in parallel as they stand
    # (message, span) pairs for legal but suspicious constructs; the API emits them
    warnings: Tuple[Tuple[str, Tuple[int, int]], ...] = ()

    @property
    def source(self) -> str:
        return self.statement.source

    @property
    def result_is_position(self) -> bool:
        """The right side is an argmax/argmin: the result is int64 positions."""
        return isinstance(self.rhs, Reduce) and self.rhs.op in POSITION_REDUCTIONS

    @functools.cached_property
    def key(self) -> tuple:
        """The statement's structural key (analysis/spec_key.py): equal for two
        spellings that differ only in their index names, exact in their constants.
        A Spec itself still compares by identity (its messages name its own indices
        and spans); the caches of compiled kernels compare by this."""
        return statement_key(self)

    @functools.cached_property
    def has_position_reductions(self) -> bool:
        # cached: a backend asks on every call (frozen dataclasses allow this: the
        # value goes into the instance's __dict__ directly)
        return has_position_reduction(self.rhs)

    @property
    def output(self) -> str:
        return self.statement.output

    @property
    def assign(self) -> str:
        return self.statement.assign

    @property
    def all_indices(self) -> Tuple[str, ...]:
        return self.output_indices + self.reduction_indices

    @property
    def implicit_reduction(self) -> bool:
        return isinstance(self.rhs, Reduce) and self.rhs.implicit

    def tensor(self, name: str) -> TensorInfo:
        for info in self.tensors:
            if info.name == name:
                return info
        raise KeyError(name)

    def uses(self, index: str) -> Tuple[IndexUse, ...]:
        return dict(self.index_uses).get(index, ())

    def reduction_of(self, index: str) -> Optional[Reduce]:
        for node in reductions(self.rhs):
            if index in node.indices:
                return node
        return None


def analyse(statement: Statement) -> Spec:
    """Check the statement's index rules and build its Spec (``spec.warnings`` lists
    what the API should warn about)."""
    return _Analyser(statement).run()


def _rhs_indices(expr: Expr) -> List[str]:
    """Indices used anywhere in ``expr`` (subscripts, gathers, values), first use first."""
    seen: Dict[str, None] = {}
    for node in expr.walk():
        if isinstance(node, Access):
            for sub in node.indices:
                for name in sub.index_names:
                    seen.setdefault(name)
        elif isinstance(node, IndexValue):
            seen.setdefault(node.name)
        elif isinstance(node, Reduce):
            for name in node.indices:
                seen.setdefault(name)
    return list(seen)


def _signed_terms(expr: Expr, sign: int = 1) -> List[Tuple[int, Expr]]:
    """``expr`` as a signed sum of terms: a - (b + c) -> [(+1, a), (-1, b), (-1, c)]."""
    if isinstance(expr, Binary) and expr.op in ("+", "-"):
        right_sign = sign if expr.op == "+" else -sign
        return _signed_terms(expr.left, sign) + _signed_terms(expr.right, right_sign)
    if isinstance(expr, Unary):
        return _signed_terms(expr.operand, -sign)
    return [(sign, expr)]


def _format_sum(terms: List[Tuple[int, Expr]]) -> str:
    text = ""
    for sign, term in terms:
        printed = format_expr(term)
        if isinstance(term, Binary) and term.op not in ("*", "/", "**"):
            printed = f"({printed})"
        if not text:
            text = printed if sign > 0 else "-" + printed
        else:
            text += (" + " if sign > 0 else " - ") + printed
    return text


class _Analyser:
    def __init__(self, statement: Statement):
        self.statement = statement
        self.source = statement.source
        self.warnings: List[Tuple[str, Tuple[int, int]]] = []

    def error(self, cls, message: str, span):
        return cls(message, source=self.source, span=span)

    def run(self) -> Spec:
        st = self.statement
        rhs = st.rhs
        self.check_output_reads(rhs)
        explicit = list(reductions(rhs))
        if not explicit:
            free = [name for name in _rhs_indices(rhs) if name not in st.output_indices]
            if free:
                self.warn_bias_terms(rhs, free)
                rhs = Reduce("sum", tuple(free), rhs, span=rhs.span, implicit=True)
        else:
            self.check_scopes(rhs, set(st.output_indices))
        reduction_indices = tuple(name for node in reductions(rhs) for name in node.indices)
        tensors, params, order = self.names(rhs)
        return Spec(statement=st, rhs=rhs, output_indices=st.output_indices,
                    reduction_indices=reduction_indices, tensors=tensors, params=params,
                    arg_order=order, index_uses=self.index_uses(rhs),
                    result_is_bool=_is_logical(st.rhs),
                    race_free_indices=st.output_indices, warnings=tuple(self.warnings))

    def check_output_reads(self, rhs: Expr):
        st = self.statement
        wanted = tuple(IndexExpr(((name, 1),)) for name in st.output_indices)
        for access in accesses(rhs):
            if access.tensor != st.output:
                continue
            if st.assign == ":=":
                raise self.error(IndexRuleError, f"{st.output} is created by ':=' and cannot "
                                 "be read on its own right side; use '=' or '+=' with an "
                                 "existing array", access.span)
            if access.indices != wanted:
                lhs = f"{st.output}[{', '.join(st.output_indices)}]"
                raise self.error(IndexRuleError, f"the output may be read on the right only "
                                 f"as {lhs} (an elementwise update), not as {access}",
                                 access.span)
        for node in rhs.walk():
            if isinstance(node, Param) and node.name == st.output:
                raise self.error(EinfuseNameError, f"{st.output} is the output; it cannot "
                                 "also be a scalar parameter", node.span)

    def check_scopes(self, expr: Expr, bound: Set[str]):
        """With explicit reductions, every index must be an output index or bound by an
        enclosing reduction; a reduction may not rebind an index already in scope."""
        if isinstance(expr, Reduce):
            for name in expr.indices:
                if name in self.statement.output_indices:
                    raise self.error(IndexRuleError, f"index {name} is an output index and "
                                     f"cannot also be reduced by {expr.op}[...]", expr.span)
                if name in bound:
                    raise self.error(IndexRuleError, f"index {name} is already reduced by an "
                                     f"enclosing reduction", expr.span)
            self.check_scopes(expr.body, bound | set(expr.indices))
            return
        if isinstance(expr, Access):
            for sub in expr.indices:
                for name in sub.index_names:
                    if name not in bound:
                        raise self.unbound(name, sub.span or expr.span)
        if isinstance(expr, IndexValue) and expr.name not in bound:
            raise self.unbound(expr.name, expr.span)
        for child in expr.children():
            self.check_scopes(child, bound)

    def unbound(self, name: str, span):
        return self.error(IndexRuleError, f"index {name} is neither on the left side nor "
                          "reduced by an enclosing sum[...]/max[...]/...; with explicit "
                          "reductions there is no implicit sum", span)

    def warn_bias_terms(self, rhs: Expr, free: List[str]):
        terms = _signed_terms(rhs)
        if len(terms) < 2:
            return
        lonely = [(s, t) for s, t in terms if not set(free) <= set(_rhs_indices(t))]
        if not lonely:
            return
        st = self.statement
        using = [(s, t) for s, t in terms if not any(t is u for _, u in lonely)]
        names = ", ".join(free)
        lhs = f"{st.output}[{', '.join(st.output_indices)}]" if st.output_indices \
            else st.output
        hint = ""
        if using:
            rest = _format_sum(lonely)
            tail = f" - {rest[1:]}" if rest.startswith("-") else f" + {rest}"
            hint = f"; if that is not meant, write {lhs} {st.assign} " \
                   f"sum[{names}]({_format_sum(using)}){tail}"
        shown = ", ".join(format_expr(t) for _, t in lonely)
        self.warnings.append((f"implicit sum over {names} also adds {shown} once for every "
                              f"value of {names}{hint}", lonely[0][1].span))

    def names(self, rhs: Expr):
        ranks: Dict[str, int] = {}
        as_value: Set[str] = set()
        as_index: Set[str] = set()
        order: Dict[str, None] = {}
        params: Dict[str, None] = {}
        output = self.statement.output

        def visit(expr: Expr, in_gather: bool):
            if isinstance(expr, Access):
                if expr.tensor != output:  # the output is passed by keyword, never by position
                    order.setdefault(expr.tensor)
                rank = ranks.setdefault(expr.tensor, len(expr.indices))
                if rank != len(expr.indices):
                    raise self.error(IndexRuleError, f"{expr.tensor} is used with {rank} "
                                     f"subscript(s) elsewhere but {len(expr.indices)} "
                                     f"here", expr.span)
                (as_index if in_gather else as_value).add(expr.tensor)
                for sub in expr.indices:
                    for access, _ in sub.gathers:
                        visit(access, True)
                return
            if isinstance(expr, Param):
                order.setdefault(expr.name)
                params.setdefault(expr.name)
            for child in expr.children():
                visit(child, in_gather)

        visit(rhs, False)
        tensors = tuple(TensorInfo(name, ranks[name], name in as_value, name in as_index)
                        for name in ranks)
        return tensors, tuple(params), tuple(order)

    def index_uses(self, rhs: Expr):
        uses: Dict[str, List[IndexUse]] = {}

        def visit(expr: Expr, in_gather: bool):
            if isinstance(expr, Access):
                for axis, sub in enumerate(expr.indices):
                    direct = dict(sub.terms)   # 0: only inside a // or % part
                    for name in sub.index_names:
                        uses.setdefault(name, []).append(
                            IndexUse(expr, axis, sub, direct.get(name, 0), in_gather))
                    for access, _ in sub.gathers:
                        visit(access, True)
                return
            for child in expr.children():
                visit(child, in_gather)

        visit(rhs, False)
        return tuple((name, tuple(found)) for name, found in uses.items())


def _is_logical(expr: Expr) -> bool:
    return isinstance(expr, Binary) and (expr.op in COMPARISON_OPS or expr.op in LOGICAL_OPS)


@functools.lru_cache(maxsize=512)
def spec_of(statement: str) -> Spec:
    """The shape-independent stage, cached by the statement's text."""
    try:
        return analyse(parse(statement))
    except RecursionError:
        raise EinfuseSyntaxError("the statement nests too deeply to analyse",
                                 span=(0, len(statement))) from None


def first_span(spec: Spec, name: str):
    """The span of ``name``'s first occurrence in the statement (the output's own)."""
    if name == spec.output:
        return spec.statement.output_span
    return next((node.span for node in spec.rhs.walk()
                 if getattr(node, "tensor", getattr(node, "name", None)) == name), None)
