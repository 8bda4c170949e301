"""The canonical form of a statement and of a program, before any decision about kernels
(v3.md section 1): each statement's right side brought to its fixed point under the rules
of rewrite/rules.py, then the program-level pass that computes a repeated thing once:

* a ``:=`` intermediate that defines what an earlier one defines (the same right side up
  to the names of its indices) and that the caller does not receive is dropped, its
  readers reading the earlier one;
* a reduction inside a later statement that is an earlier intermediate's whole
  definition (``max[k](X[i,k])`` after ``M[i] := max[j](X[i,j])``) reads that
  intermediate instead.

A reduction is replaced only where the intermediate holds exactly the values the
reduction has at every point it is read (the conditions of rewrite/hoist.py's hoisting:
its free indices are plain subscripts, so the intermediate spans the whole axes from 0;
its reduced indices are plain subscripts everywhere in the reading statement, so their
range is the axes'), and never under ``ranges=`` or ``pad=`` (the caller passes
``plain_ranges=False``), where ranges are not only the axes'.

Everything here works on statement text in, statement text out: the callers
(program/compile.py) compile the canonical texts as they would the written ones."""

from __future__ import annotations

import collections
import dataclasses
import itertools
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..lang.ast import (Access, Expr, IndexExpr, Reduce, Statement, accesses,
                        expression_size, map_children)
from ..lang.fresh_names import FreshNames
from ..lang.printer import format_expr, format_statement
from ..lang.rewrite import free_indices, names_in
from ..lang.sugar import is_count, rename_indices
from .hoist import canonical, only_plain, subscripts_of
from .online_softmax import inline_program
from .gathered_reads import read_gathers_at_their_points
from .inline_reductions import inline_where_rules_fire
from .rules import RULES, rewrite
from .shared_terms import share_costly_terms
from .statement_order import dataflow_order

# The largest right side the rules are applied to (nodes, nesting depth): the walks are
# recursive, and a generated statement of thousands of terms has no spelling to fix.
CANONICAL_NODES = 4000
CANONICAL_DEPTH = 120

# Free indices tried in every order when matching a reduction to an intermediate.
_MATCHED_INDICES = 4


@dataclass(frozen=True)
class CanonicalProgram:
    """A program's canonical statements, and what changed: the rules that fired (each
    statement's, in order) and the program-level steps taken."""
    statements: Tuple[Statement, ...]
    fired: Tuple[str, ...]
    shared: Tuple[str, ...]
    origins: Tuple[int, ...] = ()    # each statement's position in the program as written
    rewritten: Tuple[bool, ...] = ()  # whether a step changed each statement
    reordered: bool = False           # the run order is not the order written

    @property
    def changed(self) -> bool:
        return bool(self.fired or self.shared or self.reordered)

    @property
    def texts(self) -> Tuple[str, ...]:
        return tuple(format_statement(s) for s in self.statements)

    def __str__(self) -> str:
        return "\n".join(self.texts)


def canonical_statement(statement: Statement, rhs: Expr,
                        options: frozenset = frozenset()) -> Tuple[Statement, Tuple[str, ...]]:
    """``statement`` (whose right side with implicit reductions explicit is ``rhs``) with
    that right side rewritten to its fixed point, and the rules that fired; ``options``:
    the options that let guarded rules fire (Options.rewrite_options)."""
    nodes, depth = expression_size(rhs)
    if nodes > CANONICAL_NODES or depth > CANONICAL_DEPTH:
        return statement, ()      # (the rules' walks recurse: a giant stays as written)
    result = rewrite(rhs, RULES, taken=names_in(statement), options=options)
    if not result.fired:
        return statement, ()
    return dataclasses.replace(statement, rhs=result.expr, source=""), result.fired


def canonical_program(statements: Sequence[Tuple[Statement, Expr]],
                      outputs: Sequence[str], plain_ranges: bool = True,
                      options: frozenset = frozenset()) -> CanonicalProgram:
    """The canonical form of a program given as (statement, explicit right side) pairs;
    ``outputs`` are the names the caller receives."""
    written = list(statements)
    fired: List[str] = []
    shared: List[str] = []
    first = tuple(range(len(statements)))    # each statement's place in the program given
    put_back = [False] * len(statements)      # changed before the rules' pass below
    if plain_ranges and len(statements) > 1:
        # every statement at its own fixed point first: what is put back where, and what
        # is recomputed, is then decided on canonical statements, so two spellings of a
        # program take one program shape (a rule firing on an intermediate's own terms,
        # `0.5 + X` -> `X + 0.5`, is no reason to put it back into its reader)
        given, rules_fired = [], []
        for statement, rhs in statements:
            new, names = canonical_statement(statement, rhs, options)
            fired += names
            rules_fired.append(bool(names))
            given.append(new if names else dataclasses.replace(statement, rhs=rhs))
        read, gathered = read_gathers_at_their_points(given, set(outputs), options, shared)
        whole, first = inline_where_rules_fire(read, set(outputs), options, fired, shared)
        first = tuple(gathered[k] for k in first)
        put_back = [s is not given[k] or rules_fired[k] for s, k in zip(whole, first)]
        statements = [(s, s.rhs) for s in whole]
    rewritten: List[Statement] = []
    unchanged: Dict[int, Statement] = {}     # by id: the statements no step touched
    for (statement, rhs), inlined in zip(statements, put_back):
        new, names = canonical_statement(statement, rhs, options)
        fired += names
        rewritten.append(new if names else dataclasses.replace(statement, rhs=rhs))
        if not names and not inlined:
            unchanged[id(rewritten[-1])] = rewritten[-1]
    origins = first
    if plain_ranges and len(rewritten) > 1:
        rewritten, split = _split_reductions(rewritten, shared)
        origins = tuple(first[k] for k in split)
        rewritten, kept = _drop_repeated_definitions(rewritten, set(outputs), shared)
        origins = tuple(origins[k] for k in kept)
        rewritten = _read_intermediates(rewritten, shared)
        rewritten, placed = share_costly_terms(rewritten, shared)
        origins = tuple(origins[k] for k in placed)
    if not fired and not shared:
        rewritten = [s for s, _ in written]
        unchanged = {id(s): s for s in rewritten}
        origins = tuple(range(len(rewritten)))
    order = dataflow_order(rewritten)
    reordered = order != tuple(range(len(order)))
    if reordered:
        rewritten = [rewritten[k] for k in order]
        origins = tuple(origins[k] for k in order)
    if not fired and not shared and not reordered:
        return CanonicalProgram(tuple(rewritten), (), (), origins, (False,) * len(rewritten))
    return CanonicalProgram(tuple(rewritten), tuple(fired), tuple(shared), origins,
                            tuple(unchanged.get(id(s)) is not s for s in rewritten),
                            reordered)


def _split_reductions(statements: List[Statement], shared: List[str]):
    """Each intermediate of a program (a statement a later one reads) with two or more
    outermost reductions, with those computed by statements of their own before it (named
    afresh, indexed by the statement's output indices they use, in that order): the
    fusion groups see one row reduction per statement, as the program written with
    explicit sums has them (a count is not one: ``mean``'s sum and count are the
    explicit ``sum / n``), and the pass after this one shares the repeated ones
    (``var``'s mean, a count) across statements.  A reduction is split off only under
    the hoisting conditions (``_plain_in``)."""
    names = FreshNames(set().union(*(names_in(s) for s in statements)))   # h1, h2, ...
    last_read: Dict[str, int] = {}    # the last position reading each name
    for position, statement in enumerate(statements):
        for access in accesses(statement.rhs):
            last_read[access.tensor] = position
    result: List[Statement] = []
    origins: List[int] = []
    for position, statement in enumerate(statements):
        if isinstance(statement.rhs, Reduce) or statement.assign != ":=" or \
                last_read.get(statement.output, -1) <= position:
            result.append(statement)
            origins.append(position)
            continue
        whole = statement.rhs
        parts: List[Statement] = []

        def visit(node: Expr) -> Expr:
            if not isinstance(node, Reduce):
                return map_children(node, visit)
            if is_count(node):
                # a count is no pass over the data where the call knows its ranges (a
                # fused group's row kernel reads it as its value): ``mean``'s sum and
                # count stay one statement, as ``sum[j](X[i,j]) / n`` is
                return node
            free = free_indices(node)
            if not free <= set(statement.output_indices) or not _plain_in(node, whole):
                return node
            name = names.numbered("h")
            order = tuple(i for i in statement.output_indices if i in free)
            parts.append(Statement(name, order, ":=", node))
            return Access(name, tuple(IndexExpr(((i, 1),)) for i in order), span=node.span)

        rhs = visit(whole)
        if len(parts) < 2:      # one reduction and what is done with it: fused as it is
            parts, rhs = [], whole
        for part in parts:
            result.append(part)
            origins.append(position)
        result.append(dataclasses.replace(statement, rhs=rhs, source="") if parts
                      else statement)
        origins.append(position)
        if parts:
            shared.append(f"{statement.output}: {len(parts)} reductions as statements")
    return result, tuple(origins)


def _definition_key(statement: Statement) -> Optional[Expr]:
    """A ``:=`` statement's right side with its output indices renamed by position
    and its reduced ones canonically: equal keys define equal arrays."""
    indices = statement.output_indices
    if statement.assign != ":=" or len(set(indices)) != len(indices):
        return None
    if free_indices(statement.rhs) != set(indices):
        return None
    names = {index: f"@{position}" for position, index in enumerate(indices)}
    return canonical(rename_indices(statement.rhs, names))


def _drop_repeated_definitions(statements: List[Statement], outputs, shared: List[str]):
    seen: Dict[Expr, str] = {}
    renamed: Dict[str, str] = {}
    written = collections.Counter(s.output for s in statements)
    kept: List[Statement] = []
    positions: List[int] = []
    # the full key (a canonical tree) is computed only for statements whose cheap
    # signature another statement shares: a long program of different statements
    # compares none
    waiting: Dict[Tuple, List[Statement]] = {}

    def remember(statement: Statement) -> None:
        key = _definition_key(statement)
        if key is not None and written[statement.output] == 1:
            seen.setdefault(key, statement.output)

    for position, statement in enumerate(statements):
        rhs = _renamed_reads(statement.rhs, renamed)
        if rhs is not statement.rhs:
            statement = dataclasses.replace(statement, rhs=rhs, source="")
        signature = (len(statement.output_indices), expression_size(rhs)[0],
                     tuple(sorted({a.tensor for a in accesses(rhs)})))
        if signature not in waiting:
            waiting[signature] = [statement]
            kept.append(statement)
            positions.append(position)
            continue
        for earlier in waiting[signature]:
            remember(earlier)
        waiting[signature] = []
        key = _definition_key(statement)
        if key is not None and key in seen and statement.output not in outputs and \
                written[statement.output] == 1:
            renamed[statement.output] = seen[key]
            shared.append(f"{statement.output} is {seen[key]}")
            continue
        remember(statement)
        kept.append(statement)
        positions.append(position)
    return kept, tuple(positions)


def _renamed_reads(expr: Expr, renamed: Dict[str, str]) -> Expr:
    if not renamed:
        return expr

    if not any(a.tensor in renamed for a in accesses(expr)):
        return expr

    def visit(node: Expr) -> Expr:
        node = map_children(node, visit)
        if isinstance(node, Access) and node.tensor in renamed:
            return dataclasses.replace(node, tensor=renamed[node.tensor])
        return node

    return visit(expr)


def _read_intermediates(statements: List[Statement], shared: List[str]) -> List[Statement]:
    """Each statement with the reductions that earlier intermediates define read from
    them."""
    # (statement, canonical right side) by the reduction's operator and tensors, so
    # that a long program looks at the few definitions that could match
    definitions: Dict[Tuple, List[Tuple[Statement, Expr]]] = {}
    result: List[Statement] = []
    for statement in statements:
        if definitions:
            statement = _reuse(statement, definitions, shared)
        result.append(statement)
        if statement.assign == ":=" and isinstance(statement.rhs, Reduce) and \
                len(set(statement.output_indices)) == len(statement.output_indices) and \
                free_indices(statement.rhs) == set(statement.output_indices) and \
                _plain_in(statement.rhs, statement.rhs):
            definitions.setdefault(_bucket(statement.rhs), []).append(
                (statement, canonical(statement.rhs)))
    return result


def _bucket(reduce: Reduce) -> Tuple:
    return (reduce.op, tuple(sorted({a.tensor for a in accesses(reduce)})))


def _plain_in(reduce: Reduce, whole: Expr) -> bool:
    """The conditions under which ``reduce``, inside the statement's ``whole`` right
    side, has the values an intermediate defined by it holds."""
    own = list(subscripts_of(reduce))
    everywhere = list(subscripts_of(whole))
    bound = {i for node in reduce.walk() if isinstance(node, Reduce) for i in node.indices}
    return all(only_plain(i, own) for i in free_indices(reduce)) and \
        all(only_plain(i, everywhere) for i in bound)


def _reuse(statement: Statement, definitions, shared: List[str]) -> Statement:
    whole = statement.rhs
    hits: List[str] = []

    def visit(node: Expr) -> Expr:
        if isinstance(node, Reduce):
            found = _defined(node, whole, definitions, statement.output)
            if found is not None:
                hits.append(f"{statement.output}: {found.tensor}")
                return found
        return map_children(node, visit)

    rhs = visit(whole)
    if not hits:
        return statement
    shared.extend(hits)
    return dataclasses.replace(statement, rhs=rhs, source="")


def _defined(node: Reduce, whole: Expr, definitions, output: str) -> Optional[Access]:
    """The read of an earlier intermediate defined as ``node``, or None."""
    free = sorted(free_indices(node))
    if len(free) > _MATCHED_INDICES or not _plain_in(node, whole):
        return None
    key = canonical(node)
    for definition, definition_key in definitions.get(_bucket(node), ()):
        indices = definition.output_indices
        if len(indices) != len(free) or definition.output == output:
            continue
        for order in itertools.permutations(free):
            mapping = dict(zip(indices, order))
            # (its bound indices are named #1, #2 ...: the renaming captures none)
            if rename_indices(definition_key, mapping) == key:
                return Access(definition.output, tuple(IndexExpr(((mapping[i], 1),))
                                                       for i in indices), span=node.span)
    return None




def normal_form(statements: Sequence[Tuple[Statement, Expr]],
                outputs: Sequence[str]) -> Optional[str]:
    """The printed normal form of a program with one output: every intermediate inlined
    into its readers (rewrite/online_softmax.py's ``inline_program``), the rules applied
    to a fixed point, reduced indices named by position (``#1``, ``#2`` ...).  Two
    spellings of the same computation have the same normal form, whatever their
    statements and names; None where the program does not inline (an intermediate read
    with shifted subscripts, several outputs, '='/'+=' statements)."""
    whole = [dataclasses.replace(statement, rhs=rhs) for statement, rhs in statements]
    if not whole or any(s.assign != ":=" for s in whole) or \
            tuple(outputs) != (whole[-1].output,):
        return None
    # (under the default bounds="check": an intermediate read only through gathers is
    # read at its gathered points, as canonical_program does)
    whole, _ = read_gathers_at_their_points(whole, {whole[-1].output}, frozenset(
        {"bounds=check"}), [])
    inlined = inline_program(whole)
    if inlined is None:
        return None
    last = whole[-1]
    rhs = rewrite(inlined, RULES, taken=set().union(*(names_in(s) for s in whole))).expr
    positions = {index: f"@{n}" for n, index in enumerate(last.output_indices)}
    return format_expr(canonical(rename_indices(rhs, positions)))


__all__ = ["CanonicalProgram", "canonical_statement", "canonical_program", "normal_form"]
