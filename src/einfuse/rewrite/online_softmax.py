"""The online-softmax rewrite: attention in one pass over ``j``, never materialising the
scores (FlashAttention).

The rule, as data (``SOFTMAX_RULES``): a reduction

    sum[j](exp(s_j - max[k](s_k)) * v_j) / sum[j](exp(s_j - max[k](s_k)))

(or without the division), where the three ``s`` are the same expression up to the
name of the reduced index, is one reduction with the softmax-weighted-sum monoid
(rewrite/monoids.py): a running max, a running denominator and a running numerator,
rescaled whenever the max grows.  A program is first inlined into one expression
(``inline_program``), so the four-statement form (scores, row max, probabilities,
weighted sum) and the one-statement form are the same match.

Lowered: ``v`` a tensor read at ``j`` and ``s`` a (scaled) dot product of two tensors
plus additive terms, masked by comparisons of ``i`` and ``j``
(rewrite/attention_scores.py): a tensor broadcast over (batch..., i, j) such as a padding
mask ``m[b,j]`` or a bias ``bias[h,i,j]``, index terms such as ALiBi's
``slope[h] * (j - i)``, and bands of ``j - i`` from ``where(j <= i, s, -inf)``,
``where(i - j < W, s, -inf)`` and the like.  Anything else matches nothing and runs as
before (statement by statement, hoisted)."""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Set, Tuple

from ..lang.ast import (Access, Call, Expr, Number, Param, Reduce, Statement, accesses,
                        map_children)
from ..lang.sugar import rename_indices
from .attention_scores import Bound, IndexTerm, Term, TensorTerm, take_apart
from .patterns import (Any, Bindings, Boolean, Const, Fn, OneOf, Op, Red, Scalar, Tensor,
                       match, placeholder, plain_subscripts)
from ..lang.rewrite import free_indices


class MaskKind(enum.Enum):
    NONE = "none"
    CAUSAL = "j <= i"
    STRICT_CAUSAL = "j < i"
    BAND = "band"           # any other bounds on j - i (a window): Attention.upper/lower


class ScaleKind(enum.Enum):
    NONE = "none"
    MULTIPLY = "*"
    DIVIDE = "/"


def _weights(j: str, k: str):
    """exp(s_j - max[k](s_k))"""
    return Fn("exp", (Op("-", Any("s", over=(j,)), Red("max", k, Any("s", over=(k,)))),))


# The online-softmax rule: the weighted sum, normalised or not.  The weights' max must be
# the same expression under every sum (the capture 's' is compared up to its index).
SOFTMAX_RULES = (
    ("normalised", Op("/", Red("sum", "j", Op("*", _weights("j", "k"), Any("v", over=("j",)),
                                              commutative=True)),
                      Red("sum", "j2", _weights("j2", "k2")))),
    # the weights normalised first (P := softmax, then O := sum[j](P * V)): the same
    # up to where the division is rounded
    ("normalised", Red("sum", "j", Op("*", Op("/", _weights("j", "k"),
                                              Red("sum", "j2", _weights("j2", "k2"))),
                                      Any("v", over=("j",)), commutative=True))),
    ("weighted sum", Red("sum", "j", Op("*", _weights("j", "k"), Any("v", over=("j",)),
                                        commutative=True))),
)

def _masked_weights(j: str, k: str, mask: str):
    """exp(where(c_j, s_j - max[k](s_k), -inf)): the weights masked after their shift (a
    mask on the weights, rewrite/rules.py's ``mask-into-exp``)."""
    return Fn("exp", (Fn("where", (Boolean(mask), Op("-", Any("s", over=(j,)),
                                                      Red("max", k, Any("s", over=(k,)))),
                                   Const(-math.inf))),))


# The normalised weighted sum of weights masked after an unmasked shift.  The shift
# cancels in the ratio, so it is the softmax of the masked scores where(c, s, -inf),
# which the fused kernel computes with the masked row's maximum: the same values up to
# rounding wherever the written form's weights do not underflow (where the unmasked
# maximum dominates a row so far that every unmasked weight underflows, the written
# form divides 0 by 0 and the fused one gives the softmax).
MASKED_AFTER_SHIFT_RULES = (
    Op("/", Red("sum", "j", Op("*", _masked_weights("j", "k", "mask"),
                               Any("v", over=("j",)), commutative=True)),
       Red("sum", "j2", _masked_weights("j2", "k2", "mask2"))),
    Red("sum", "j", Op("*", Op("/", _masked_weights("j", "k", "mask"),
                               Red("sum", "j2", _masked_weights("j2", "k2", "mask2"))),
                       Any("v", over=("j",)), commutative=True)),
)

_DOT = Red("sum", "d", Op("*", Tensor("q"), Tensor("k"), commutative=True))
# The dot-product term of the scores attention is lowered for (the other terms and the
# masks: rewrite/attention_scores.py)
_SCALED = OneOf((Op("*", _DOT, Scalar("scale"), commutative=True),
                 Op("/", _DOT, Scalar("divisor")), _DOT))


@dataclass(frozen=True)
class Attention:
    """A recognised attention: ``out[...] := sum_j softmax_j(s) * value[..., j, e]``.
    Index names are the final statement's; ``key_index`` is the canonical name of the
    reduced ``j`` as it appears in ``key_indices`` and ``value_indices``."""
    output: str
    output_indices: Tuple[str, ...]
    query: str
    query_indices: Tuple[str, ...]
    key: str
    key_indices: Tuple[str, ...]
    value: str
    value_indices: Tuple[str, ...]
    batch: Tuple[str, ...]          # in the output's order
    row: str                        # i
    key_index: str                  # j
    dot_index: str                  # d (summed in the scores)
    feature: str                    # e (of the value and the output)
    mask: MaskKind
    scale: ScaleKind
    scale_param: Optional[str]      # the scalar parameter, or None for a literal
    scale_value: Optional[float]    # the literal, or None
    normalised: bool
    statements: int                 # how many statements it replaces
    # the scores' additive terms, and the bounds on j - i their masks set (the key j is
    # seen by row i where max(lower) <= j - i <= min(upper)); ``mask`` names the usual
    # upper bounds, BAND any other band
    terms: Tuple[Term, ...] = ()
    upper: Tuple[Bound, ...] = ()
    lower: Tuple[Bound, ...] = ()

    @property
    def term_tensors(self) -> Tuple[str, ...]:
        """The tensors the additive terms read (a padding mask, a bias, ALiBi slopes)."""
        names = [t.tensor for t in self.terms if isinstance(t, TensorTerm)] + \
            [t.coefficient.tensor for t in self.terms
             if isinstance(t, IndexTerm) and t.coefficient.tensor is not None]
        return tuple(dict.fromkeys(names))

    @property
    def term_params(self) -> Tuple[str, ...]:
        """The scalar parameters the terms and bounds read."""
        names = [t.coefficient.param for t in self.terms
                 if isinstance(t, IndexTerm) and t.coefficient.param is not None] + \
            [p for b in self.upper + self.lower for p, _ in b.params]
        return tuple(dict.fromkeys(names))

    @property
    def plain(self) -> bool:
        """A scaled dot product masked causally or not at all: the form every kernel
        (Triton's too) takes."""
        return not self.terms and self.mask is not MaskKind.BAND


def recognise(statements: Sequence[Statement], outputs: Tuple[str, ...]) -> Optional[Attention]:
    """The attention ``statements`` (each with its implicit reductions explicit) compute,
    or None.  A program is recognised only as a whole: its one output is the last
    statement's, and every earlier statement is an intermediate of that chain (an
    intermediate the caller asked for would have to be materialised: the statements
    then run as written)."""
    if not statements or any(s.assign != ":=" for s in statements):
        return None
    last = statements[-1]
    if tuple(outputs) != (last.output,):
        return None
    rhs = inline_program(statements)
    if rhs is None:
        return None
    for name, rule in SOFTMAX_RULES:
        for bound in match(rule, rhs):
            found = _attention(last, bound, name == "normalised", len(statements))
            if found is not None:
                return found
    for rule in MASKED_AFTER_SHIFT_RULES:
        for bound in match(rule, rhs):
            masked = _masked_scores(bound)
            found = None if masked is None else \
                _attention(last, masked, True, len(statements))
            if found is not None:
                return found
    return None


def _masked_scores(bound: Bindings) -> Optional[Bindings]:
    """``bound`` with its scores ``s`` masked as its two sums' weights are (the same
    comparison, up to the name of each sum's index), or None."""
    j = placeholder(0)
    first = rename_indices(bound.expr("mask"), {bound.index("j"): j})
    second = rename_indices(bound.expr("mask2"), {bound.index("j2"): j})
    if first != second:
        return None
    scores = Call("where", (first, bound.expr("s"), Number(-math.inf)))
    return dataclasses.replace(bound, exprs=tuple(
        (name, scores if name == "s" else expr) for name, expr in bound.exprs))


# The most nodes an inlined program may have (the attention forms have about 50): a
# longer program cannot be attention, and inlining it would copy each intermediate into
# every reader, growing without bound (a chain of 500 statements is one expression 500
# deep, which no recursive walk survives).
INLINED_NODES = 200


def inline_program(statements: Sequence[Statement]) -> Optional[Expr]:
    """The last statement's right side with every intermediate replaced by its
    definition, or None where an intermediate is read other than with distinct plain
    subscripts, or is read by nothing, or where the result would exceed
    ``INLINED_NODES`` nodes."""
    if len(statements) > INLINED_NODES:
        return None
    definitions: Dict[str, Tuple[Tuple[str, ...], Expr, int]] = {}
    used: Set[str] = set()
    fresh = [0]
    nodes = [0]         # of the statement being inlined

    def count(how_many: int) -> None:
        nodes[0] += how_many
        if nodes[0] > INLINED_NODES:
            raise _NotInlinable

    def substitute(expr: Expr) -> Optional[Expr]:
        if isinstance(expr, Access) and expr.tensor in definitions:
            names = plain_subscripts(expr)
            indices, body, size = definitions[expr.tensor]
            if names is None or len(names) != len(indices):
                raise _NotInlinable
            count(size)
            used.add(expr.tensor)
            return rename_indices(body, dict(zip(indices, names)))
        count(1)
        if isinstance(expr, Access):
            if any(a.tensor in definitions for a in accesses(expr)):
                raise _NotInlinable       # an intermediate used as an index array
            return expr
        if isinstance(expr, Reduce):
            # bound indices get names no statement can use, so that substituting an
            # intermediate's indices can never capture them
            names = {}
            for index in expr.indices:
                fresh[0] += 1
                names[index] = f"~{fresh[0]}"
            body = substitute(rename_indices(expr.body, names))
            return dataclasses.replace(expr, indices=tuple(names[i] for i in expr.indices),
                                       body=body)
        return map_children(expr, substitute)

    try:
        for statement in statements:
            if statement.output in definitions:
                return None
            nodes[0] = 0
            rhs = substitute(statement.rhs)
            definitions[statement.output] = (tuple(statement.output_indices), rhs, nodes[0])
    except _NotInlinable:
        return None
    if used != set(s.output for s in statements[:-1]):
        return None
    return definitions[statements[-1].output][1]


class _NotInlinable(Exception):
    pass


def _attention(last: Statement, bound: Bindings, normalised: bool,
               count: int) -> Optional[Attention]:
    j = placeholder(0)
    scores = take_apart(bound.expr("s"))
    for position, candidate in scores.candidates():
        for dot in match(_SCALED, candidate):
            found = _lowerable(last, bound, scores, position, dot, j, normalised, count)
            if found is not None:
                return found
    return None


def _lowerable(last, bound, scores, position: int, dot_product: Bindings, j: str,
               normalised: bool, count: int) -> Optional[Attention]:
    query, key, value = dot_product.expr("q"), dot_product.expr("k"), bound.expr("v")
    if not isinstance(value, Access) or plain_subscripts(value) is None:
        return None
    q_idx, k_idx, v_idx = (plain_subscripts(a) for a in (query, key, value))
    dot = dot_product.index("d")
    if dot not in q_idx or dot not in k_idx or j in q_idx or j not in k_idx:
        return None     # (a product written k*q is matched the other way round too)
    batch = set(q_idx) & set(k_idx) - {dot}
    rows = set(q_idx) - set(k_idx)
    if len(rows) != 1 or set(k_idx) - batch - {dot} != {j}:
        return None
    (row,) = rows
    features = set(v_idx) - batch - {j}
    if len(features) != 1 or not batch | {j} <= set(v_idx):
        return None
    (feature,) = features
    if feature == row or set(last.output_indices) != batch | {row, feature} or \
            len(last.output_indices) != len(batch) + 2:
        return None
    if free_indices(bound.expr("s")) != batch | {row, j}:
        return None
    terms = scores.others(position, row, j)
    bands = scores.bands(row, j)
    if terms is None or bands is None or not _terms_fit(terms, batch, row, j):
        return None
    upper, lower = bands
    mask = MaskKind.BAND if lower else {(): MaskKind.NONE, (Bound(0),): MaskKind.CAUSAL,
                                        (Bound(-1),): MaskKind.STRICT_CAUSAL}.get(
                                            upper, MaskKind.BAND)
    scale, param, literal = ScaleKind.NONE, None, None
    for capture, kind in (("scale", ScaleKind.MULTIPLY), ("divisor", ScaleKind.DIVIDE)):
        if not dot_product.has(capture):
            continue
        factor, scale = dot_product.expr(capture), kind
        if isinstance(factor, Param):
            param = factor.name
        elif isinstance(factor, Number):
            literal = float(factor.value)
    found = Attention(
        output=last.output, output_indices=tuple(last.output_indices),
        query=query.tensor, query_indices=q_idx, key=key.tensor, key_indices=k_idx,
        value=value.tensor, value_indices=v_idx,
        batch=tuple(i for i in last.output_indices if i in batch), row=row, key_index=j,
        dot_index=dot, feature=feature, mask=mask, scale=scale, scale_param=param,
        scale_value=literal, normalised=normalised, statements=count, terms=terms,
        upper=upper, lower=lower)
    names = {query.tensor, key.tensor, value.tensor, *found.term_tensors}
    if last.output in names:
        return None
    return found


def _terms_fit(terms, batch: Set[str], row: str, j: str) -> bool:
    """Whether each term's tensor is read at batch indices, the row and the key only."""
    for term in terms:
        if isinstance(term, TensorTerm):
            if not set(term.indices) <= batch | {row, j}:
                return False
        elif term.coefficient.tensor is not None and \
                not set(term.coefficient.indices) <= batch:
            return False
    return True
