"""Rewrite rules kept as data: the table that brings a statement's right side to its
canonical form (v3.md section 1, "speed does not depend on spelling").

A rule is a named entry of ``RULES``: a pattern over the syntax tree (lang/ast.py), a
``build`` that makes the replacement from what the pattern captured (returning None
where the rule's guard refuses), and what the rule keeps of the values: ``EXACT`` rules
give bitwise the same result on every input, NaN, infinities and signed zeros included;
the others state the semantic they keep in ``keeps`` (docs/rewrite.md lists them all).
:func:`rewrite` applies the table bottom-up (children first, then the node, again
whenever a rule fired) until nothing fires, within a step bound, as tinygrad's
PatternMatcher applies its table.

The patterns are rewrite/patterns.py's (the one pattern language of rewrite/, which the
online-softmax recogniser uses too); the rules capture expressions as written
(``Capture``, ``Boolean``: nothing renamed), so that a ``build`` can rebuild from them,
and a capture named twice must match equal expressions (the span takes no part in
equality).  A build receives the captures as one mapping by name."""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from ..lang.ast import (Access, Binary, Call, Expr, Number, Reduce, Unary, accesses,
                        map_children)
from ..lang.rewrite import free_indices
from ..lang.sugar import FreshNames, count_points, rename_indices
from .hoist import canonical, only_plain
from .patterns import (Boolean, Capture, Compare, Const, Fn, OneOf, Op, Pattern, Reduction,
                       is_boolean, literal_value, match)


# what a rule's build receives: the captured expressions and index tuples, by name
Captures = Dict[str, object]


class Keeps(enum.Enum):
    """What a rule keeps of the values it rewrites."""
    EXACT = "bitwise the same on every input, NaN, infinities and -0.0 included"
    ROUNDING = "the same up to rounding (the order of operations changes)"
    MASK = "the mask's meaning: a masked-out position contributes 0 even where the " \
           "product would give NaN (an inf or NaN weight times False)"
    SOFTMAX = "softmax's semantic: a row holding +inf is NaN throughout (as " \
              "torch.softmax), where exp(x - logsumexp(x)) gives 0 at its finite entries"
    LOGSUMEXP = "logsumexp's semantic (notation.md): a row of -inf gives -inf and a row " \
                "holding +inf gives +inf, where the expanded form gives NaN"
    RECIPROCAL = "the quotient, correctly rounded, where the written a * (1 / b) rounds " \
                 "1 / b first: NaN, infinities and signed zeros as written, but where " \
                 "1 / b overflows (a subnormal b) a / b stays finite"
    ADDITIVE_MASK = "the mask's meaning: a masked-out score is -inf even where the " \
                    "score is +inf or NaN (the sum gives NaN there), and an unmasked " \
                    "-0.0 stays -0.0 (the sum with 0 gives +0.0)"
    LOG_NORMALISER = "the value up to rounding; where the sum of exponentials overflows " \
                     "(a weight that is itself inf) the quotient is NaN where the " \
                     "written exp(x - log(inf)) gives 0"
    CANCELLATION = "the value up to cancellation, only under precision='fast': " \
                   "a**2 - 2ab + b**2 loses the digits a**2 and b**2 share (an error " \
                   "of about eps * (|a|**2 + |b|**2), so close points may get a small " \
                   "negative distance) and an infinite a or b gives NaN, not inf"


@dataclass(frozen=True)
class Rule:
    """One named rewrite: ``pattern`` -> ``build(captures, expr, fresh)`` (None: the
    guard refuses; ``fresh`` gives index names the statement does not use, for a
    reduction the replacement nests); ``keeps`` says what of the values it keeps."""
    name: str
    pattern: Pattern
    build: Callable[[Captures, Expr, FreshNames], Optional[Expr]]
    keeps: Keeps
    doc: str
    # the option (analysis/options.Options.rewrite_options) without which the rule never
    # fires: a rule that changes values beyond rounding is the user's choice
    option: Optional[str] = None


def _span(expr: Expr):
    return getattr(expr, "span", None)


def _mask_into_exp(c: Captures, expr: Expr, fresh: FreshNames) -> Expr:
    span = _span(expr)
    inside = Call("where", (c["c"], c["x"], Number(-math.inf, span=span)), span=span)
    return Call("exp", (inside,), span=span)


def _mask_out_into_exp(c: Captures, expr: Expr, fresh: FreshNames) -> Expr:
    span = _span(expr)
    inside = Call("where", (c["c"], Number(-math.inf, span=span), c["x"]), span=span)
    return Call("exp", (inside,), span=span)


def _product_to_where(c: Captures, expr: Expr, fresh: FreshNames) -> Expr:
    weight = Call("exp", (c["x"],), span=_span(expr))
    return Call("where", (c["c"], weight, Number(0, span=_span(expr))), span=_span(expr))


def _factors(body: Expr) -> List[Tuple[str, Expr]]:
    """``body`` as a product chain: (``*`` or ``/``, factor) pairs, the first ``*``.
    ``a * b / c`` is ``[(*, a), (*, b), (/, c)]``; a division's right side is a factor
    only there (``a / (b * c)`` keeps ``b * c`` whole)."""
    if isinstance(body, Binary) and body.op == "*":
        return _factors(body.left) + _factors(body.right)
    if isinstance(body, Binary) and body.op == "/":
        return _factors(body.left) + [("/", body.right)]
    return [("*", body)]


def _chain(factors: List[Tuple[str, Expr]], span) -> Expr:
    result = factors[0][1]
    if factors[0][0] == "/":
        result = Binary("/", Number(1, span=span), result, span=span)
    for op, factor in factors[1:]:
        result = Binary(op, result, factor, span=span)
    return result


def _factor_out_of_sum(c: Captures, expr: Expr, fresh: FreshNames) -> Optional[Expr]:
    """``sum[K](a * f / g)`` with ``f``, ``g`` free of ``K``: ``sum[K](a) * f / g``."""
    indices = set(c["k"])
    parts = _factors(c["body"])
    inner = [(op, f) for op, f in parts if free_indices(f) & indices]
    outer = [(op, f) for op, f in parts if not free_indices(f) & indices]
    if not outer or len(inner) < 2 or inner[0][0] == "/":
        # nothing to move; a sum of constants (a count) or of 1/x; or a plain sum of one
        # term (``sum[i](X[i,j] * 2)``: the column sums of schedule/fusion.py take it as
        # written, compensated; the spellings that matter are products -- a scaled dot,
        # a weighted sum normalised before or after)
        return None
    span = _span(expr)
    total = Reduce("sum", expr.indices, _chain(inner, span), span=span)
    # the factors written before the first one that moves with K stay before the sum, so
    # that the statement's tensors and scalars keep their order of first use (the
    # order of positional arguments)
    first = parts.index(inner[0])
    before = [(op, f) for op, f in parts[:first] if op == "*"]
    after = [part for part in outer if part not in before]
    return _chain(before + [("*", total)] + after, span)


def _same_up_to(value: Expr, reduced: Expr, indices: Tuple[str, ...]) -> bool:
    """Whether ``value`` is ``reduced`` with ``indices`` renamed to indices free in
    ``value``, one each (``X[i,j]`` against ``X[i,k]`` over ``k``)."""
    free = free_indices(reduced)
    targets = sorted(free_indices(value) - free)
    if len(targets) != len(indices):
        return False
    return any(rename_indices(reduced, dict(zip(indices, order))) == value
               for order in itertools.permutations(targets))


def _logsumexp_as_softmax(c: Captures, expr: Expr, fresh: FreshNames) -> Optional[Expr]:
    """``exp(x_j - logsumexp[k](x_k))`` -> ``exp(x_j - max[k](x_k)) / sum[k](exp(x_k -
    max[k](x_k)))``: the softmax the row kernels and the online reduction know."""
    lse = c["lse"]
    if len(lse.indices) > 3 or not _same_up_to(c["x"], lse.body, lse.indices):
        return None
    span = _span(expr)
    top = Reduce("max", lse.indices, lse.body, span=span)
    weights = Call("exp", (Binary("-", c["x"], top, span=span),), span=span)
    copies = {k: fresh.copy_of(k) for k in lse.indices}     # (a reduction nested in a
    inner = Reduce("max", tuple(copies.values()),           # sum binds its own names)
                   rename_indices(lse.body, copies), span=span)
    row = Reduce("sum", lse.indices, Call("exp", (Binary("-", lse.body, inner, span=span),),
                                          span=span), span=span)
    return Binary("/", weights, row, span=span)


def _expanded_logsumexp(c: Captures, expr: Expr, fresh: FreshNames) -> Optional[Expr]:
    """``max[k](x) + log(sum[k2](exp(x' - max[k3](x''))))``, the three ``x`` the same
    up to the names of their reduced indices -> ``logsumexp[k](x)``."""
    top, inner, k2 = c["top"], c["inner"], c["k2"]
    if not all(isinstance(r, Reduce) and r.op == "max" for r in (top, inner)) or \
            len(top.indices) != len(k2) or canonical_reduction(top) != \
            canonical_reduction(inner):
        return None
    if rename_indices(c["x2"], dict(zip(k2, top.indices))) != top.body or \
            set(top.indices) & free_indices(c["x2"]):
        return None
    return Reduce("logsumexp", top.indices, top.body, span=_span(expr))


def _count_by_access(c: Captures, expr: Expr, fresh: FreshNames) -> Optional[Expr]:
    """``sum[K](where(e == e, 1, 1))`` (lang/sugar.py's count of ``K``'s points) ->
    the same count written with the one access of ``e`` that uses ``K``: every access
    of ``e`` that uses an index of ``K`` is that access, so ``K``'s ranges are
    inferred from it alone either way and the count is the same number."""
    indices = set(c["k"])
    using = {a for a in accesses(c["e"]) if set(_access_indices(a)) & indices}
    if len(using) != 1:
        return None
    (access,) = using
    if access == c["e"] or not indices <= set(_access_indices(access)) or \
            not free_indices(access) <= free_indices(c["e"]):
        return None       # (an access using an index bound inside e: it would escape)
    return count_points(expr.indices, access, _span(expr))


def _access_indices(access) -> Tuple[str, ...]:
    return tuple(name for sub in access.indices for name in sub.index_names)


def canonical_reduction(reduce: Reduce) -> Expr:
    """``reduce`` with its own reduced indices renamed by position (``max[k](X[i,k])``
    and ``max[l](X[i,l])`` compare equal)."""
    names = {index: f"#{n}" for n, index in enumerate(reduce.indices)}
    return Reduce(reduce.op, tuple(names.values()), rename_indices(reduce.body, names))


def _expanded_square(c: Captures, expr: Expr, fresh: FreshNames) -> Optional[Expr]:
    """``sum[K]((a - b)**2)`` -> ``sum[K](a*a) + sum[K](b*b) - 2 * sum[K](a*b)`` where
    ``a`` and ``b`` both move with every index of ``K`` and each has a free index the
    other lacks: the cross term is then a matrix product (BLAS's, or the register-blocked
    loop nest), and the two norms are loop-invariant sums the schedule hoists."""
    a, b, indices = c["a"], c["b"], set(c["k"])
    fa, fb = free_indices(a), free_indices(b)
    if not (indices <= fa and indices <= fb) or not (fa - fb - indices) or \
            not (fb - fa - indices):
        return None
    span = _span(expr)

    def total(body: Expr) -> Expr:
        return Reduce("sum", expr.indices, body, span=span)

    norms = Binary("+", total(Binary("*", a, a, span=span)),
                   total(Binary("*", b, b, span=span)), span=span)
    cross = Binary("*", Number(2, span=span), total(Binary("*", a, b, span=span)),
                   span=span)
    return Binary("-", norms, cross, span=span)


def _reciprocal_as_division(c: Captures, expr: Expr, fresh: FreshNames) -> Expr:
    return Binary("/", c["a"], c["b"], span=_span(expr))


# a comparison of two index values and the one that holds exactly where it does not
# (integers: no NaN, so the negation of < is >=)
_NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}


def _mask_kept_where_true(c: Captures, expr: Expr, fresh: FreshNames) -> Expr:
    """``where(c, -inf, x)`` -> ``where(not c, x, -inf)`` for an index comparison c."""
    cond = c["c"]
    span = _span(expr)
    kept = Binary(_NEGATED[cond.op], cond.left, cond.right, span=_span(cond))
    return Call("where", (kept, c["x"], Number(-math.inf, span=span)), span=span)


def _additive_mask_as_where(c: Captures, expr: Expr, fresh: FreshNames) -> Expr:
    """``x + where(c, 0, -inf)`` -> ``where(c, x, -inf)`` (and with the branches the other
    way round, ``where(c, -inf, x)``)."""
    mask, span = c["mask"], _span(expr)
    kept_if_true = literal_value(mask.args[1]) == 0.0
    branches = (c["x"], Number(-math.inf, span=span)) if kept_if_true else \
        (Number(-math.inf, span=span), c["x"])
    return Call("where", (mask.args[0],) + branches, span=span)


def _nested_sums_merged(c: Captures, expr: Expr, fresh: FreshNames) -> Optional[Expr]:
    """``sum[K](sum[L](e))`` -> ``sum[K, L](e)``: one reduction over both index sets
    (the loop nest, contraction and convolution kernels see one sum)."""
    outer, inner = c["k"], c["l"]
    if set(outer) & set(inner):
        return None
    return Reduce("sum", tuple(outer) + tuple(inner), c["body"], span=_span(expr))


def _count_of(expr: Expr) -> Optional[Tuple[Tuple[str, ...], Expr]]:
    """``(K, e)`` for a count ``sum[K](where(e == e, 1, 1))`` (lang/sugar.py's), else
    None."""
    if not (isinstance(expr, Reduce) and expr.op == "sum" and isinstance(expr.body, Call)
            and expr.body.func == "where" and len(expr.body.args) == 3):
        return None
    test, one, other = expr.body.args
    if not (isinstance(test, Binary) and test.op == "==" and
            canonical(test.left) == canonical(test.right) and
            literal_value(one) == 1.0 and literal_value(other) == 1.0):
        return None
    return tuple(expr.indices), test.left


def _renamed_to(expr: Expr, names: Tuple[str, ...], targets: Tuple[str, ...],
                like: Expr) -> Optional[Expr]:
    """``expr`` with ``names`` renamed to ``targets`` in some order such that it equals
    ``like`` (reductions inside compared with their indices named by position)."""
    if len(names) != len(targets):
        return None
    for order in itertools.permutations(targets):
        renamed = rename_indices(expr, dict(zip(names, order)))
        if canonical(renamed) == canonical(like):
            return renamed
    return None


def _nested_means_merged(c: Captures, expr: Expr, fresh: FreshNames) -> Optional[Expr]:
    """``mean[H](mean[W](e))`` expanded -- ``sum[H](sum[W](e) / count[W]) / count[H]``,
    the outer count of the inner mean -> ``sum[H, W](e) / count[H, W]``, where every
    index of H and W is a whole plain subscript wherever it appears in ``e`` and in the
    inner count's expression (so W's extent is an axis's, the same at every point of H:
    the mean of equal-sized means is the mean of all)."""
    outer, inner = tuple(c["h"]), tuple(c["w"])
    if set(outer) & set(inner):
        return None
    inner_count, outer_count = _count_of(c["cw"]), _count_of(c["ch"])
    if inner_count is None or outer_count is None:
        return None
    mean = expr.left.body                      # sum[W](e) / count[W]
    counted = _renamed_to(inner_count[1], inner_count[0], inner, inner_count[1]) \
        if set(inner_count[0]) == set(inner) else None
    if counted is None:
        # (the count's own names: renamed to W's, any order that leaves it itself)
        if len(inner_count[0]) != len(inner) or set(inner) & free_indices(inner_count[1]):
            return None
        counted = rename_indices(inner_count[1], dict(zip(inner_count[0], inner)))
    if _renamed_to(outer_count[1], outer_count[0], outer, mean) is None:
        return None
    for part in (c["body"], counted):
        own = list(accesses(part))
        subs = [sub for access in own for sub in access.indices]
        if not all(_only_plain(i, subs) for i in outer + inner):
            return None
    span = _span(expr)
    both = outer + inner
    return Binary("/", Reduce("sum", both, c["body"], span=span),
                  count_points(both, counted, span), span=span)


def _only_plain(index: str, subscripts) -> bool:
    """``index`` occurs in ``subscripts`` only as whole plain subscripts, at least once,
    and never inside an index array (a value read there is not an axis's extent)."""
    return only_plain(index, subscripts) and not any(
        index in sub2.index_names for sub in subscripts for access, _ in sub.gathers
        for node in access.walk() if hasattr(node, "indices") and
        not isinstance(node, Reduce) for sub2 in node.indices)


def _gain_after_quotient(c: Captures, expr: Expr, fresh: FreshNames) -> Optional[Expr]:
    """``g * n / d`` -> ``n / d * g`` for an array read ``g`` with fewer indices than
    ``n`` (a per-column gain written first: the layernorm the row kernel runs)."""
    gain, numerator = c["g"], c["n"]
    if not isinstance(gain, Access) or not free_indices(gain) < free_indices(numerator):
        return None
    span = _span(expr)
    return Binary("*", Binary("/", numerator, c["d"], span=span), gain, span=span)


def _negation_as_difference(c: Captures, expr: Expr, fresh: FreshNames) -> Optional[Expr]:
    """``-a + b`` (or ``b + -a``) -> ``b - a``: IEEE's b + (-a) is b - a, bit for bit."""
    negated, other = c["a"], c["b"]
    if not isinstance(negated, Unary) or negated.op != "-":
        return None
    return Binary("-", other, negated.operand, span=_span(expr))


def _wider_addend_first(c: Captures, expr: Expr, fresh: FreshNames) -> Optional[Expr]:
    """``b + a`` -> ``a + b`` where ``b``'s free indices are a strict subset of ``a``'s
    (a bias, a number, an epsilon written first: ``b[j] + Y[i,j]``, ``sqrt(1e-05 +
    v[i])``): one order for one computation; addition commutes bit for bit."""
    left, right = expr.left, expr.right
    if not free_indices(left) < free_indices(right):
        return None
    return Binary("+", right, left, span=_span(expr))


def _wider_factor_first(c: Captures, expr: Expr, fresh: FreshNames) -> Optional[Expr]:
    """``g * a`` -> ``a * g`` where ``g`` is an array read with a strict subset of
    ``a``'s free indices and ``a`` a quotient (a gain written before a normalised value
    in parentheses, ``g[j] * ((X[i,j] - m[i]) / s[i])``): multiplication commutes bit
    for bit.  Only an array read: a number or scalar written first stays first (the
    order of first use), and a reciprocal ``1 / b`` is never moved next to a product
    it would become a quotient with (its overflow for a subnormal ``b`` is the
    written form's)."""
    gain, value = expr.left, expr.right
    if not isinstance(gain, Access) or not gain.indices or \
            not isinstance(value, Binary) or value.op != "/" or \
            (isinstance(value.left, Number) and value.left.value == 1):
        return None
    if not free_indices(gain) < free_indices(value):
        return None
    return Binary("*", value, gain, span=_span(expr))


def _difference_squared_wider_first(c: Captures, expr: Expr,
                                    fresh: FreshNames) -> Optional[Expr]:
    """``(a - b)**2`` -> ``(b - a)**2`` where ``a``'s free indices are a strict subset of
    ``b``'s (a variance written ``(m[i] - X[i,j])**2``): a - b is -(b - a) exactly, so the
    squares are the same bits."""
    a, b = c["a"], c["b"]
    if not free_indices(a) < free_indices(b):
        return None
    span = _span(expr)
    return Binary("**", Binary("-", b, a, span=span), expr.right, span=span)


def _log_normaliser_as_division(c: Captures, expr: Expr, fresh: FreshNames) -> Optional[Expr]:
    """``exp(a_j - log(sum[k](exp(a_k))))`` -> ``exp(a_j) / sum[k](exp(a_k))``, the two
    ``a`` the same up to the reduced indices (a normalised weight: never above 1)."""
    total = c["total"]
    # (the reductions inside the two compared with their own indices named by position)
    if not _same_up_to(canonical(c["a"]), canonical(c["e"]), total.indices):
        return None
    span = _span(expr)
    return Binary("/", Call("exp", (c["a"],), span=span), total, span=span)


def _product_as_square(c: Captures, expr: Expr, fresh: FreshNames) -> Optional[Expr]:
    """``e * e`` -> ``e**2`` (not for a boolean or a literal ``e``)."""
    e = c["e"]
    if is_boolean(e) or literal_value(e) is not None:
        return None
    span = _span(expr)
    return Binary("**", e, Number(2, span=span), span=span)


_NEG_INF = Const(-math.inf)
_MASK_TERM = OneOf((Fn("where", (Boolean("c"), Const(0.0), _NEG_INF)),
                    Fn("where", (Boolean("c"), _NEG_INF, Const(0.0)))))


_EXPANDED_LSE = Op("+", Capture("top"), Fn("log", (Reduction("sum", "k2", Fn("exp", (
    Op("-", Capture("x2"), Capture("inner")),))),)), commutative=True)


RULES: Tuple[Rule, ...] = (
    Rule("mask-into-exp", Fn("where", (Boolean("c"), Fn("exp", (Capture("x"),)), Const(0.0))),
         _mask_into_exp, Keeps.EXACT,
         "where(c, exp(x), 0) -> exp(where(c, x, -inf)): a mask on the weights is a mask "
         "on the scores (exp(-inf) is +0.0, whatever x holds where c is false)"),
    Rule("mask-out-into-exp",
         Fn("where", (Boolean("c"), Const(0.0), Fn("exp", (Capture("x"),)))),
         _mask_out_into_exp, Keeps.EXACT,
         "where(c, 0, exp(x)) -> exp(where(c, -inf, x))"),
    Rule("boolean-product-to-where",
         Op("*", Fn("exp", (Capture("x"),)), Boolean("c"), commutative=True),
         _product_to_where, Keeps.MASK,
         "exp(x) * (c) -> where(c, exp(x), 0) for a boolean c: a weight times a mask is "
         "the masked weight (exp is never negative, so no -0.0 appears either way)"),
    Rule("logsumexp-as-softmax",
         Fn("exp", (Op("-", Capture("x"), Capture("lse")),)),
         lambda c, e, fresh: _logsumexp_as_softmax(c, e, fresh)
         if isinstance(c["lse"], Reduce) and c["lse"].op == "logsumexp" else None,
         Keeps.SOFTMAX,
         "exp(x_j - logsumexp[k](x_k)) -> exp(x_j - max[k](x_k)) / sum[k](exp(x_k - "
         "max[k](x_k))): softmax as max, exp and sum"),
    Rule("logsumexp-from-parts", _EXPANDED_LSE, _expanded_logsumexp, Keeps.LOGSUMEXP,
         "max[k](x) + log(sum[k](exp(x - max[k](x)))) -> logsumexp[k](x): one pass"),
    Rule("count-by-access", Reduction("sum", "k", Fn("where", (
        Op("==", Capture("e"), Capture("e")), Const(1.0), Const(1.0)))), _count_by_access, Keeps.EXACT,
         "sum[k](where(e == e, 1, 1)) -> sum[k](where(A == A, 1, 1)), A the one access "
         "of e that uses k: the count of mean/var written one way whatever was averaged"),
    Rule("factor-out-of-sum", Reduction("sum", "k", Capture("body")), _factor_out_of_sum,
         Keeps.ROUNDING,
         "sum[k](a * b * f / g) -> sum[k](a * b) * f / g for f, g free of k and a product "
         "a * b of terms that move with k: scales and normalisers (a weighted sum "
         "normalised after) outside a contraction"),
    Rule("reciprocal-product-as-division",
         Op("*", Capture("a"), Op("/", Const(1.0), Capture("b"))),
         _reciprocal_as_division, Keeps.RECIPROCAL,
         "a * (1 / b) -> a / b: x * rsqrt(v) is x / sqrt(v), a weighted sum times the "
         "reciprocal of its normaliser is the sum divided by it"),
    Rule("mask-kept-where-true",
         Fn("where", (Compare("c"), _NEG_INF, Capture("x"))), _mask_kept_where_true,
         Keeps.EXACT,
         "where(j > i, -inf, x) -> where(j <= i, x, -inf) for a comparison of index "
         "values: a mask names the positions it keeps (integers have no NaN, so the "
         "negated comparison holds exactly where the written one does not)"),
    Rule("additive-mask-as-where",
         Op("+", Capture("x"), Capture("mask"), commutative=True),
         lambda c, e, fresh: _additive_mask_as_where(c, e, fresh)
         if any(True for _ in match(_MASK_TERM, c["mask"])) else None,
         Keeps.ADDITIVE_MASK,
         "x + where(c, 0, -inf) -> where(c, x, -inf): an additive -inf mask is a mask "
         "(c a comparison or &/| of them)"),
    Rule("product-as-square", Op("*", Capture("e"), Capture("e")), _product_as_square,
         Keeps.EXACT,
         "e * e -> e**2: a variance written (x - m) * (x - m) is the one written "
         "(x - m)**2 (pow(x, 2) is correctly rounded, as the product is: the same bits, "
         "NaN, infinities and -0.0 squared to +0.0 included)"),
    Rule("nested-sums-merged",
         Reduction("sum", "k", Reduction("sum", "l", Capture("body"))),
         _nested_sums_merged, Keeps.ROUNDING,
         "sum[k](sum[l](e)) -> sum[k,l](e): one sum over both, the same terms added in "
         "another order"),
    Rule("nested-means-merged",
         Op("/", Reduction("sum", "h", Op("/", Reduction("sum", "w", Capture("body")),
                                          Capture("cw"))), Capture("ch")),
         _nested_means_merged, Keeps.ROUNDING,
         "mean[h](mean[w](e)) -> mean[h,w](e), as sum[h,w](e) / count[h,w], where h and w "
         "are plain subscripts of e (every inner mean counts the same points): one sum "
         "and one division, the same terms added in another order"),
    Rule("gain-after-quotient",
         Op("/", Op("*", Capture("g"), Capture("n"), commutative=True), Capture("d")),
         _gain_after_quotient, Keeps.ROUNDING,
         "g * n / d (or n * g / d) -> n / d * g for an array g with fewer indices than n: "
         "a gain written before the normalised value is applied after it (a product "
         "chain in one order)"),
    Rule("negation-as-difference", Op("+", Capture("a"), Capture("b"), commutative=True),
         _negation_as_difference, Keeps.EXACT,
         "-a + b -> b - a (and b + -a): a negated addend is a subtraction (b + (-a) is "
         "b - a in IEEE arithmetic, bit for bit)"),
    Rule("wider-addend-first", Op("+", Capture("b"), Capture("a")), _wider_addend_first,
         Keeps.EXACT,
         "b + a -> a + b where b's indices are a strict subset of a's: a bias, number or "
         "epsilon written first is added last (addition commutes bit for bit)"),
    Rule("wider-factor-first", Op("*", Capture("g"), Capture("a")), _wider_factor_first,
         Keeps.EXACT,
         "g * (n / d) -> (n / d) * g for an array g read with fewer indices than the "
         "quotient: a gain written before a normalised value in parentheses is applied "
         "after it (multiplication commutes bit for bit)"),
    Rule("difference-squared-wider-first",
         Op("**", Op("-", Capture("a"), Capture("b")), Const(2.0)),
         _difference_squared_wider_first, Keeps.EXACT,
         "(a - b)**2 -> (b - a)**2 where a's indices are a strict subset of b's: a "
         "variance written (m - x)**2 is the one written (x - m)**2 (a - b is -(b - a) "
         "exactly)"),
    Rule("log-normaliser-as-division",
         Fn("exp", (Op("-", Capture("a"), Fn("log", (Capture("total"),))),)),
         lambda c, e, fresh: _log_normaliser_as_division(
             {**c, "e": c["total"].body.args[0]}, e, fresh)
         if isinstance(c["total"], Reduce) and c["total"].op == "sum" and
         isinstance(c["total"].body, Call) and c["total"].body.func == "exp" else None,
         Keeps.LOG_NORMALISER,
         "exp(a_j - log(sum[k](exp(a_k)))) -> exp(a_j) / sum[k](exp(a_k)): a weight "
         "normalised in the log domain is the weight over its row's sum"),
    Rule("square-of-difference-expanded",
         Reduction("sum", "k", Op("**", Op("-", Capture("a"), Capture("b")), Const(2.0))),
         _expanded_square, Keeps.CANCELLATION,
         "sum[k]((a - b)**2) -> sum[k](a*a) + sum[k](b*b) - 2*sum[k](a*b), a and b each "
         "with an index of its own: a squared distance as norms and a matrix product "
         "(torch.cdist's GEMM mode); only with precision='fast'",
         option="precision=fast"),
)

# Steps (rules fired) one statement may take: every rule but the two mask rules makes
# the tree smaller or moves work outward, so a canonical form takes a handful; the
# bound stops a table that would cycle instead of hanging the compile.
STEP_BOUND = 200


@dataclass(frozen=True)
class Rewritten:
    """A canonical expression and the names of the rules that fired, in order."""
    expr: Expr
    fired: Tuple[str, ...]


def rewrite(expr: Expr, rules: Tuple[Rule, ...] = RULES, step_bound: int = STEP_BOUND,
            taken: Iterable[str] = (), options: Iterable[str] = ()) -> Rewritten:
    """``expr`` with ``rules`` applied bottom-up to a fixed point (at most
    ``step_bound`` firings); ``taken``: names of the statement that fresh indices must
    avoid (those in ``expr`` are avoided anyway); ``options``: the options given
    (``"precision=fast"``), without which a rule guarded by one never fires."""
    given = frozenset(options)
    rules = tuple(rule for rule in rules if rule.option is None or rule.option in given)
    fired: List[str] = []
    fresh = FreshNames(set(taken) | _names(expr))

    def visit(node: Expr) -> Expr:
        node = map_children(node, visit)
        while len(fired) < step_bound:
            replaced = _first(rules, node, fresh)
            if replaced is None:
                return node
            name, new = replaced
            fired.append(name)
            node = map_children(new, visit)
        return node

    return Rewritten(visit(expr), tuple(fired))


def _names(expr: Expr) -> set:
    found = set()
    for node in expr.walk():
        if isinstance(node, Reduce):
            found.update(node.indices)
        found.update(free_indices(node))
    return found


def _first(rules, node: Expr, fresh: FreshNames) -> Optional[Tuple[str, Expr]]:
    for rule in rules:
        for bindings in match(rule.pattern, node):
            new = rule.build(bindings.as_dict(), node, fresh)
            if new is not None and new != node:
                return rule.name, new
    return None


def rule_named(name: str) -> Rule:
    return next(rule for rule in RULES if rule.name == name)


__all__ = ["RULES", "Rule", "Keeps", "Rewritten", "rewrite", "rule_named", "STEP_BOUND"]
