"""The rules seen through statements: an intermediate that is one reduction, or
element-wise, is put back into a reader where a rule of rewrite/rules.py then fires on
the reader that did not fire on it as written (issue 31: the canonical form does not
depend on how a program is cut into statements).  ``r[i] := 1 / sqrt(v[i] + eps)``
then ``(X[i,j] - m[i]) * r[i]`` is ``(X[i,j] - m[i]) / sqrt(v[i] + eps)``, the layernorm
the row kernel runs.

``L[i] := logsumexp[j](X[i,j])`` then ``P[i,j] := exp(X[i,j] - L[i])`` is softmax;
``logsumexp-as-softmax`` sees it only in ``exp(X[i,j] - logsumexp[k](X[i,k]))``.
Inlined there, the reader is the one-statement softmax, whose reductions hoisting
computes once per row (rewrite/hoist.py) and which runs the softmax row kernel; the
intermediate, read by nothing else and not an output, is dropped.

A reduction is put back only under the hoisting conditions (the reader's subscripts
of it plain, its reduced indices plain in its own statement), so the reader computes
it once per point of its free indices, as the intermediate did; its reduced indices
are renamed afresh in the reader.  Where no rule fires, nothing changes."""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Set, Tuple

from ..lang.ast import Access, Binary, Expr, Reduce, Statement, accesses, map_children
from ..lang.rewrite import free_indices, names_in
from ..lang.sugar import FreshNames, rename_indices
from .gathered_reads import fresh_binders
from .hoist import canonical, only_plain, subscripts_of
from .patterns import plain_subscripts
from .rules import RULES, Keeps, rewrite, rule_named

# what the rules that fire on a reader with a reduction put back may change of its
# values: rounding, and softmax's semantic for a row holding +inf (a logsumexp statement
# read by exp(x - L) is softmax).  Not logsumexp's: a program that writes max and
# log-sum-exp as statements keeps their NaN for a row of -inf (plan/row_statistics.py
# runs that program in one pass as written, so nothing is gained)
PUT_BACK_KEEPS = frozenset({Keeps.EXACT, Keeps.ROUNDING, Keeps.RECIPROCAL,
                            Keeps.LOG_NORMALISER, Keeps.SOFTMAX})

# statements looked at (each reader is rewritten once per intermediate it reads)
INLINED_STATEMENTS = 64


def _inlinable(statement: Statement, outputs: Set[str]) -> bool:
    """Whether ``statement`` may be put back into a reader where a rule then fires: a
    reduction, an element-wise intermediate, or an element-wise function of reductions
    over other indices (``r[i] := 1 / sum[j](E[i,j])``, a row's reciprocal), under the
    hoisting conditions (its indices plain subscripts, so that the reader computes each
    reduction once per point as the intermediate did)."""
    rhs = statement.rhs
    if statement.assign != ":=" or statement.output in outputs or \
            len(set(statement.output_indices)) != len(statement.output_indices) or \
            free_indices(rhs) != set(statement.output_indices):
        return False
    own = list(subscripts_of(rhs))
    bound = [i for node in rhs.walk() if isinstance(node, Reduce) for i in node.indices]
    return all(only_plain(i, own) for i in bound) and \
        all(only_plain(i, own) for i in statement.output_indices)


def _only_reader(definition: Statement, statements, position: int, outputs: Set[str]
                 ) -> Optional[int]:
    """The position of the one statement that reads ``definition``, where it is an
    element-wise intermediate (no reduction, its indices plain subscripts: its extents
    are its inputs' axes) with more indices than any array it reads (an outer difference
    or product), read exactly once there, inside a sum over one of its indices: put back, it is computed where it is read instead of written whole and
    read back (the same operations on the same elements)."""
    rhs = definition.rhs
    if definition.assign != ":=" or definition.output in outputs or \
            any(isinstance(n, Reduce) for n in rhs.walk()) or \
            len(set(definition.output_indices)) != len(definition.output_indices) or \
            free_indices(rhs) != set(definition.output_indices):
        return None
    own = list(subscripts_of(rhs))
    if not all(only_plain(i, own) for i in definition.output_indices) or \
            len(definition.output_indices) <= max(
                (len(a.indices) for a in accesses(rhs)), default=0):
        return None       # (not larger than what it reads: written whole, it costs little)
    readers = [k for k in range(position + 1, len(statements))
               if statements[k] is not None and any(
                   a.tensor == definition.output for a in accesses(statements[k].rhs))]
    if len(readers) != 1 or statements[readers[0]].output == definition.output:
        return None
    reads = [a for a in accesses(statements[readers[0]].rhs)
             if a.tensor == definition.output]
    written_again = any(s is not None and s.output == definition.output
                        for s in statements[position + 1:])
    if len(reads) != 1 or written_again:
        return None
    # only where the reader reduces over one of its indices: the intermediate is then
    # larger than what is made of it (a difference over i, j, k summed over k)
    bound = {i for node in statements[readers[0]].rhs.walk()
             if isinstance(node, Reduce) and node.op == "sum" for i in node.indices}
    return readers[0] if set(plain_subscripts(reads[0]) or ()) & bound else None


def _recomputed(definition: Statement, statements, position: int, outputs: Set[str]
                ) -> Optional[List[Tuple[int, Expr]]]:
    """(position, right side with the intermediate recomputed) of every reader of
    ``definition`` where it is one operation (``+ - *``) of an array read whole and a
    value broadcast along some of its indices (a read with fewer of them) -- a centred,
    shifted or scaled row, ``C[i,j] := X[i,j] - m[i]`` -- and every reader can take
    it; else None.  Recomputed, each reader reads the one whole array instead of the
    intermediate, and the broadcast value once per row or column, and does one
    operation more: less than writing the intermediate (or a row of it) and reading it
    back, with the same operations on the same elements (the same values, NaN and inf
    included).  (An array times a number, ``T[i,k] := A[i,k] * 2``, stays the
    program's statement: it is no value of the program broadcast.)"""
    rhs = definition.rhs
    indices = definition.output_indices
    if definition.assign != ":=" or definition.output in outputs or \
            not (isinstance(rhs, Binary) and rhs.op in ("+", "-", "*")) or \
            len(set(indices)) != len(indices) or free_indices(rhs) != set(indices):
        return None
    reads = (rhs.left, rhs.right)
    if not all(isinstance(a, Access) and plain_subscripts(a) is not None for a in reads) \
            or sorted(len(a.indices) == len(indices) for a in reads) != [False, True]:
        return None
    found: List[Tuple[int, Expr]] = []
    for at in range(position + 1, len(statements)):
        reader = statements[at]
        if reader is None:
            continue
        if reader.output == definition.output:
            return None       # (written again: its readers read other values)
        if definition.output not in {a.tensor for a in accesses(reader.rhs)}:
            continue
        if contraction_operand(reader, definition.output):
            return None       # (a matmul's operand stays an array for BLAS)
        inlined = _put_back(reader, definition, [])
        if inlined is None:
            return None
        found.append((at, inlined))
    return found or None


def _factors(expr: Expr) -> List[Expr]:
    if isinstance(expr, Binary) and expr.op in ("*", "/"):
        return _factors(expr.left) + ([expr.right] if expr.op == "/" else
                                      _factors(expr.right))
    return [expr]


def contraction_operand(reader: Statement, name: str) -> bool:
    """Whether ``reader`` reads ``name`` as an operand of a contraction: a factor of a
    sum's body beside another array read that walks the summed index too (a matmul's
    operand).  Such an intermediate stays a statement: put back, its elementwise work
    would sit inside the sum's body and the product would no longer reach BLAS (an MLP's
    normalised input, its activation)."""
    for node in reader.rhs.walk():
        if not (isinstance(node, Reduce) and node.op == "sum"):
            continue
        summed = set(node.indices)
        reads = [f for f in _factors(node.body) if isinstance(f, Access)]
        mine = [f for f in reads if f.tensor == name
                and summed & set(plain_subscripts(f) or ())]
        others = [f for f in reads if f.tensor != name
                  and summed & {i for sub in f.indices for i, _ in sub.terms}]
        if mine and others:
            return True
    return False


def _put_back(reader: Statement, definition: Statement, sites: List[Tuple[Expr, Access]]
              ) -> Optional[Expr]:
    """``reader``'s right side with each read of ``definition`` replaced by its
    reduction (each put in ``sites`` with the read it replaced), or None where a read is
    not by distinct plain subscripts."""
    in_reader = names_in(reader)
    fresh = FreshNames(in_reader | names_in(definition))
    failed = [False]

    def visit(node: Expr) -> Expr:
        if isinstance(node, Access) and node.tensor == definition.output:
            names = plain_subscripts(node)
            if names is None or len(set(names)) != len(names):
                failed[0] = True
                return node
            if not isinstance(definition.rhs, Reduce):     # element-wise: renamed only
                return rename_indices(fresh_binders(definition.rhs, fresh, in_reader),
                                      dict(zip(definition.output_indices, names)))
            # a reduced index keeps its name where the reader has none like it (the
            # user's name: shard= and ranges= may name it), else a fresh copy
            bound = {k: fresh.copy_of(k) if k in in_reader else k
                     for k in definition.rhs.indices}
            body = rename_indices(definition.rhs.body, {**bound, **dict(zip(
                definition.output_indices, names))})
            reduce = Reduce(definition.rhs.op,
                            tuple(bound[k] for k in definition.rhs.indices), body,
                            span=node.span)
            sites.append((canonical(reduce), node))
            return reduce
        if isinstance(node, Access) and any(a.tensor == definition.output
                                            for a in accesses(node)):
            failed[0] = True       # read as an index array
            return node
        return map_children(node, visit)

    rhs = visit(reader.rhs)
    return None if failed[0] else rhs


def _read_again(expr: Expr, sites: List[Tuple[Expr, Access]]) -> Expr:
    """``expr`` with each reduction put back that the rules left as it was read from the
    intermediate again (``exp(x - log(Z))`` became ``exp(x) / Z``: Z is still a row
    value, computed once by its own statement)."""
    def visit(node: Expr) -> Expr:
        if isinstance(node, Reduce):
            key = canonical(node)
            for put, read in sites:
                if put == key:
                    return read
        return map_children(node, visit)

    return visit(expr)


def inline_where_rules_fire(statements: List[Statement], outputs: Set[str],
                            options: frozenset, fired: List[str], shared: List[str]
                            ) -> Tuple[List[Statement], Tuple[int, ...]]:
    """The statements with reduction intermediates put back where a rule then fires
    (the rules' names added to ``fired``), those no longer read dropped; and each kept
    statement's position in the given list."""
    if len(statements) > INLINED_STATEMENTS or len(statements) < 2:
        return statements, tuple(range(len(statements)))
    result = list(statements)
    for position in range(len(result)):
        definition = result[position]
        reader_at = _only_reader(definition, result, position, outputs)
        if reader_at is not None:
            inlined = _put_back(result[reader_at], definition, [])
            if inlined is not None:
                reader = result[reader_at]
                result[reader_at] = dataclasses.replace(reader, rhs=inlined, source="")
                result[position] = None
                shared.append(f"{reader.output}: {definition.output} put back (read once)")
                continue
        recomputed = None if definition is None else \
            _recomputed(definition, result, position, outputs)
        if recomputed is not None:
            for at, inlined in recomputed:
                result[at] = dataclasses.replace(result[at], rhs=inlined, source="")
            result[position] = None
            shared.append(f"{definition.output}: one operation, recomputed in its "
                          f"{len(recomputed)} reader(s)")
            continue
        if definition is None or not _inlinable(definition, outputs):
            continue
        put_back = False
        elementwise = not isinstance(definition.rhs, Reduce)
        for reader_at in range(position + 1, len(result)):
            reader = result[reader_at]
            if reader.output == definition.output:
                break      # (written again: later readers read the new values)
            if definition.output not in {a.tensor for a in accesses(reader.rhs)}:
                continue
            if elementwise and contraction_operand(reader, definition.output):
                continue
            sites: List[Tuple[Expr, Access]] = []
            inlined = _put_back(reader, definition, sites)
            if inlined is None:
                continue
            taken = names_in(reader) | names_in(definition)
            before = set(rewrite(reader.rhs, RULES, taken=taken, options=options).fired)
            after = rewrite(inlined, RULES, taken=taken, options=options)
            if not set(after.fired) - before or \
                    any(rule_named(name).keeps not in PUT_BACK_KEEPS for name in after.fired):
                continue
            fired.extend(after.fired)
            shared.append(f"{reader.output}: {definition.output} put back for "
                          f"{', '.join(sorted(set(after.fired) - before))}")
            result[reader_at] = dataclasses.replace(reader, rhs=_read_again(after.expr, sites),
                                                    source="")
            put_back = True
        if put_back and not any(s is not None and definition.output in {a.tensor for a in accesses(s.rhs)}
                   for s in result[position + 1:]):
            result[position] = None
    kept = tuple(k for k, s in enumerate(result) if s is not None)
    return [result[k] for k in kept], kept
