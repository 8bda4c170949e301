"""Shift invariance: names of a program whose gradient is exactly zero because every
output is invariant to them (softmax's row maximum).

A stabilising shift ``m`` enters a program only as ``exp(A - m[...])``: changing ``m``
multiplies each such exponential by a positive factor ``t = exp(-dm)`` per position of
``m``.  Where every output that depends on ``m`` is homogeneous of degree zero in those
factors (a ratio such as ``e[i,j] / sum[k](e[i,k])``), the outputs do not change with
``m`` at all, so ``d(output)/dm`` is identically zero and the backward need not carry a
gradient through ``m``: softmax's backward is then ``dX = P * (dP - sum(dP * P))``'s
cost, without the max's arg-max term, which mathematically adds zero.

The degree of an expression is tracked symbolically as a monomial in the factors
``t[s]`` (one per subscript ``s`` of ``m``): exponentials of ``A - m[s]`` have degree
``t[s]``, products add exponents, quotients subtract them, sums and ``where`` branches
must agree, and a reduction keeps its body's degree only where the factor does not vary
along the reduced indices.  Anything else that depends on ``m`` (``log``, a comparison,
``m`` read bare) makes the degree undefined, and ``m`` is then not a shift.  The rule
is exact: it never drops a gradient that is not identically zero.

The log-sum-exp form (cross-entropy's ``log(sum[j](exp(X[i,j] - m[i]))) + m[i]``) is
invariant too, additively: ``log`` of a degree-``t`` expression moves by ``log t``, and
``m`` read bare moves by ``-log t``, so their sum does not move.  Such values carry an
additive degree (``_Log``: the coefficients of ``log t[s]`` they move by), which sums and
differences add up, constants leave alone, a number scales, ``max``/``min`` keep, and
``exp`` turns back into a monomial; an additive degree of all-zero coefficients is
invariance (``ONE``).  Anything else done with one is undefined, as above."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, Optional, Sequence, Set, Tuple

from ..lang.ast import Access, Binary, Call, Expr, IndexValue, Number, Param, Reduce, Unary

# A monomial: sorted ((subscript names of a factor t[...]), exponent) pairs, no zero
# exponents.  ANY is the degree of the literal 0, homogeneous of every degree.
Monomial = Tuple[Tuple[Tuple[str, ...], int], ...]
ANY = "any"
ONE: Monomial = ()


@dataclass(frozen=True)
class _Log:
    """An additive degree: the value moves by ``sum(p * log t[f])`` over ``pairs``
    (normalised like a Monomial, never empty: no movement is ``ONE``)."""
    pairs: Monomial


def _additive(pairs):
    """The additive degree of ``pairs`` (``ONE`` where every coefficient is zero)."""
    pairs = _normal(pairs)
    return _Log(pairs) if pairs else ONE


def _pairs_of(degree) -> Optional[Monomial]:
    """The coefficients of an additive degree, of a constant (none), or None."""
    if isinstance(degree, _Log):
        return degree.pairs
    return ONE if degree in (ONE, ANY) else None


def zero_gradient_shifts(specs: Sequence, outputs: Sequence[str]) -> FrozenSet[str]:
    """The defined names of a program (its statements' analysed specs, in order) whose
    gradient is identically zero for every output in ``outputs``."""
    defined = {spec.output for spec in specs}
    candidates = []
    for spec in specs:
        for node in spec.rhs.walk():
            shift = _shift_access(node)
            if shift is not None and shift.tensor in defined and \
                    shift.tensor not in candidates:
                candidates.append(shift.tensor)
    return frozenset(m for m in candidates
                     if m not in outputs and _invariant(specs, outputs, m))


def _shift_access(node: Expr) -> Optional[Access]:
    """``m[...]`` of ``exp(A - m[...])`` (a bare scalar ``m`` as ``m[]``), or None."""
    if isinstance(node, Call) and node.func == "exp" and len(node.args) == 1:
        arg = node.args[0]
        if isinstance(arg, Binary) and arg.op == "-":
            if isinstance(arg.right, Access):
                return arg.right
            if isinstance(arg.right, Param):
                return Access(arg.right.name, ())
    return None


def _invariant(specs, outputs, shift: str) -> bool:
    """Whether every output that depends on ``shift`` has degree zero in its factors."""
    degrees: Dict[str, Tuple[Tuple[str, ...], object]] = {}   # name -> (indices, degree)
    depends: Set[str] = {shift}
    for spec in specs:
        if spec.output == shift:
            continue
        reads = {a.tensor for a in _accesses(spec.rhs)} | set(spec.params)
        if not reads & depends:
            continue
        depends.add(spec.output)
        degree = _Degree(shift, degrees).of(spec.rhs)
        degrees[spec.output] = (tuple(spec.output_indices), degree)
    for name in outputs:
        if name in depends:
            found = degrees.get(name, (None, None))[1]
            if found is None or (found != ANY and found != ONE):
                return False
    return True


def _accesses(expr: Expr):
    for node in expr.walk():
        if isinstance(node, Access):
            yield node


class _Degree:
    """The degree of expressions of one statement in the factors of one shift."""

    def __init__(self, shift: str, known):
        self.shift, self.known = shift, known

    def of(self, expr: Expr):
        """A Monomial, ANY, or None (undefined: not homogeneous)."""
        if isinstance(expr, Number):
            return ANY if expr.value == 0 else ONE
        if isinstance(expr, Param):   # a program reads a 0-d intermediate bare
            return self.access(Access(expr.name, ()))
        if isinstance(expr, IndexValue):
            return ONE
        if isinstance(expr, Access):
            return self.access(expr)
        if isinstance(expr, Unary):
            found = self.of(expr.operand)
            if isinstance(found, _Log) and expr.op == "-":
                return _additive(tuple((f, -p) for f, p in found.pairs))
            return found
        if isinstance(expr, Binary):
            return self.binary(expr)
        if isinstance(expr, Call):
            return self.call(expr)
        if isinstance(expr, Reduce):
            return self.reduce(expr)
        return None

    def constant(self, expr: Expr) -> bool:
        """Whether ``expr`` does not change with the shift at all."""
        found = self.of(expr)
        return found == ONE or found == ANY

    def access(self, access: Access):
        for sub in access.indices:
            for gather, _ in sub.gathers:
                if not self.constant(gather):
                    return None      # a position that moves with the shift
        if access.tensor == self.shift:
            # read bare: m + d, that is m - log t (t = exp(-d))
            names = tuple(sub.plain_index for sub in access.indices)
            return None if None in names else _additive(((names, -1),))
        if access.tensor not in self.known:
            return ONE
        indices, degree = self.known[access.tensor]
        if degree is None or degree == ANY or degree == ONE:
            return degree
        renamed = {}
        for index, sub in zip(indices, access.indices):
            renamed[index] = sub.plain_index
        monomial = []
        for factor, power in degree.pairs if isinstance(degree, _Log) else degree:
            names = tuple(renamed.get(n) for n in factor)
            if None in names:
                return None          # the factor's position is not a plain index here
            monomial.append((names, power))
        return _additive(monomial) if isinstance(degree, _Log) else _normal(monomial)

    def binary(self, expr: Binary):
        left, right = self.of(expr.left), self.of(expr.right)
        if left is None or right is None:
            return None
        if isinstance(left, _Log) or isinstance(right, _Log):
            return self.additive_binary(expr, left, right)
        if expr.op in ("+", "-"):
            if left == ANY:
                return right
            if right == ANY or left == right:
                return left
            return None
        if expr.op == "*":
            return ANY if ANY in (left, right) else _normal(left + right)
        if expr.op == "/":
            if right == ANY:
                return None
            return ANY if left == ANY else _normal(left + tuple((f, -p) for f, p in right))
        if expr.op == "**" and right in (ONE, ANY) and isinstance(expr.right, Number) and \
                float(expr.right.value).is_integer() and left != ANY:
            power = int(expr.right.value)
            return _normal(tuple((f, p * power) for f, p in left))
        # comparisons, logic, floor division, modulo, powers of varying exponents
        return ONE if left in (ONE, ANY) and right in (ONE, ANY) else None

    def additive_binary(self, expr: Binary, left, right):
        """``expr`` where one side has an additive degree."""
        a, b = _pairs_of(left), _pairs_of(right)
        if expr.op in ("+", "-") and a is not None and b is not None:
            sign = 1 if expr.op == "+" else -1
            return _additive(a + tuple((f, sign * p) for f, p in b))
        # scaled by a whole number: c * (v + k log t) moves by c * k log t
        if expr.op == "*" and isinstance(expr.left, Number) and b is not None:
            scale, pairs = expr.left.value, b
        elif expr.op == "*" and isinstance(expr.right, Number) and a is not None:
            scale, pairs = expr.right.value, a
        else:
            return None
        if float(scale).is_integer():
            return _additive(tuple((f, int(scale) * p) for f, p in pairs))
        return None

    def call(self, expr: Call):
        shift = _shift_access(expr)
        if shift is not None and shift.tensor == self.shift:
            names = tuple(sub.plain_index for sub in shift.indices)
            if None in names or not self.constant(expr.args[0].left):
                return None
            return _normal(((names, 1),))
        args = [self.of(a) for a in expr.args]
        if None in args:
            return None
        if expr.func == "log" and len(args) == 1 and args[0] not in (ONE, ANY) and \
                not isinstance(args[0], _Log):
            return _additive(args[0])      # log(t^k v) = log v + k log t
        if expr.func == "exp" and len(args) == 1 and isinstance(args[0], _Log):
            return _normal(args[0].pairs)  # exp(v + k log t) = t^k exp(v)
        if any(isinstance(a, _Log) for a in args):
            # where(c, a, b), max(a, b): both sides moving alike (a literal 0 does not)
            a, b = args[-2:] if len(args) >= 2 else (None, None)
            fine = expr.func in ("where", "max", "min") and len(args) in (2, 3) and \
                isinstance(a, _Log) and a == b and \
                (expr.func != "where" or args[0] in (ONE, ANY))
            return a if fine else None
        if expr.func == "where":
            if args[0] not in (ONE, ANY):
                return None
            a, b = args[1], args[2]
            return b if a == ANY else a if b == ANY or a == b else None
        if expr.func in ("max", "min") and len(args) == 2:
            # the factors are positive: max(t*a, t*b) = t*max(a, b)
            a, b = args
            return b if a == ANY else a if b == ANY or a == b else None
        return ONE if all(a in (ONE, ANY) for a in args) else None

    def reduce(self, expr: Reduce):
        body = self.of(expr.body)
        if body is None or body == ANY or body == ONE:
            return body
        if expr.op not in (("max", "min", "logsumexp") if isinstance(body, _Log) else
                           ("sum", "max", "min")):
            return None     # a sum of shifted values moves by a multiple of the shift
        if isinstance(body, _Log):
            if any(set(factor) & set(expr.indices) for factor, _ in body.pairs):
                return None
            return body
        if any(set(factor) & set(expr.indices) for factor, _ in body):
            return None              # the factor varies along the reduced indices
        return body


def _normal(pairs) -> Monomial:
    total: Dict[Tuple[str, ...], int] = {}
    for factor, power in pairs:
        total[factor] = total.get(factor, 0) + power
    return tuple(sorted((f, p) for f, p in total.items() if p != 0))


__all__ = ["zero_gradient_shifts"]
