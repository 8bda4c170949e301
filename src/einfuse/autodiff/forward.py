"""Forward mode: the tangent of a statement as one statement (``jax.jvp``, and JAX's
reverse mode, which transposes it).

The tangent of ``OUT[out] := rhs`` with respect to inputs ``W`` (each with a tangent
input ``tW`` of its shape) is ``tOUT[out] := d(rhs)``, where ``d`` is the differential:
``d(W[s]) = tW[s]``, and every inner node adds its children's differentials weighted
by its local derivatives -- the same rules as reverse mode (rules.py ``partials``,
called with the weight 1, or with the body's differential for a reduction).  Unlike
reverse mode nothing moves to another frame: the tangent statement has the forward's
own grid, subscripts, gathers and options, so it runs wherever the forward runs.

It is linear in the tangents, so its reverse-mode derivation (``derive`` with respect to
``tW``) is the forward statement's gradient.

    tangent("D[i,j] := (w[k,i] - x[k,j])**2", ["w"]).text
    # 'tD[i, j] := sum[k](2 * (w[k, i] - x[k, j]) * tw[k, i])'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple

from ..analysis.spec import analyse
from ..errors import EinfuseError, NoGradientError
from ..lang import parse
from ..lang.ast import (POSITION_REDUCTIONS, Access, Binary, Expr, Param, Reduce, Unary,
                        accesses)
from ..lang.printer import format_expr
from .exprs import Names, add, freshen, mentions, mul, num
from .derive import check_gradient_passes, used_names
from .rules import occurrences, partials


@dataclass(frozen=True)
class Tangent:
    """A tangent statement: ``text`` reads the forward's inputs and ``tangents[W]`` for
    each differentiated ``W``; run it with ``options`` (the forward's own, with the
    user's ranges also given to the copies of their indices)."""
    text: str
    output: str
    tangents: Mapping[str, str]
    options: Dict[str, object]


def tangent(statement: str, wrt: Sequence[str],
            options: Optional[Mapping[str, object]] = None) -> Optional[Tangent]:
    """The tangent statement of ``statement`` for a change in the inputs ``wrt``, or
    None when the result does not change with them (reads through comparisons,
    ``floor``, index arrays only).  ``options`` are the forward's ``ranges=``, ``pad=``,
    ``bounds=`` and ``fill=``."""
    options = dict(options or {})
    try:
        spec = analyse(parse(statement))
        return _Tangent(spec, tuple(wrt), options).run()
    except EinfuseError as error:
        if error.source is None:
            error.source = statement
        raise


class _Tangent:
    def __init__(self, spec, wrt: Tuple[str, ...], options):
        self.spec, self.options = spec, options
        st = spec.statement
        self.names = Names(used_names(spec))
        values = {t.name for t in spec.tensors if t.as_value} | set(spec.params)
        for name in wrt:
            if name == st.output or name not in values:
                raise NoGradientError(f"{name} is not an input the statement reads for its "
                                      "value; it has no tangent")
        self.tangents = {name: self.names.underscored("t" + name) for name in wrt}
        self.output = self.names.underscored("t" + st.output)

    def run(self) -> Optional[Tangent]:
        self.check_options()
        for name in self.tangents:   # as reverse mode: none through sign, // or % alone
            names = Names(used_names(self.spec))
            if next(occurrences(self.spec.rhs, name, num(1), names), None) is None:
                check_gradient_passes(self.spec.rhs, name)
        rhs = self.differential(self.spec.rhs)
        if rhs is None:
            return None
        outputs = self.spec.statement.output_indices
        rhs = freshen(rhs, set(outputs), self.names)
        lhs = f"{self.output}[{', '.join(outputs)}]" if outputs else self.output
        text = f"{lhs} := {format_expr(rhs)}"
        spec = analyse(parse(text))   # the text must be a legal statement
        return Tangent(text, self.output, dict(self.tangents), self.run_options(spec))

    def check_options(self):
        """Reads outside an array give ``pad`` (and failed gathers ``fill``) for the
        tangent too; only 0 is the tangent of a constant."""
        pad = self.options.get("pad")
        if pad not in (None, 0, 0.0):
            raise NoGradientError(f"derivatives support pad=0 or no pad, not pad={pad!r}")
        fill = self.options.get("fill", 0.0)
        if self.options.get("bounds") == "fill" and fill != 0 and any(
                a.tensor in self.tangents and any(s.gathers for s in a.indices)
                for a in accesses(self.spec.rhs)):
            raise NoGradientError(f"forward-mode derivatives of a gather with bounds='fill' "
                                  f"support fill=0 only, not fill={fill!r}: a filled read "
                                  "is a constant, its tangent 0")

    def run_options(self, spec) -> Dict[str, object]:
        """The forward's options; a range the user gave an index also goes to the
        copies of that index that the rules made (``j2`` in a re-evaluated max)."""
        given = dict(self.options.get("ranges") or {})
        ranges = {index: given[self.names.root(index)] for index in spec.all_indices
                  if self.names.root(index) in given}
        result = {key: self.options[key] for key in ("pad", "bounds", "fill")
                  if self.options.get(key) is not None}
        if ranges:
            result["ranges"] = ranges
        return result

    def differential(self, expr: Expr) -> Optional[Expr]:
        """``d(expr)``, or None where it is 0."""
        if not any(mentions(expr, name) for name in self.tangents):
            return None
        if isinstance(expr, Access):   # subscripts are integers: no tangent through them
            tangent = self.tangents.get(expr.tensor)
            return Access(tangent, expr.indices) if tangent else None
        if isinstance(expr, Param):
            tangent = self.tangents.get(expr.name)
            return Param(tangent) if tangent else None
        if isinstance(expr, Reduce) and expr.op in POSITION_REDUCTIONS:
            return None      # integer positions carry no tangent
        if isinstance(expr, Reduce):
            # d(op[K](e)) = sum[K](dR/de * de): reverse mode's weight for the body, with
            # the body's differential (which lives inside K) as the multiplier
            body = self.differential(expr.body)
            if body is None:
                return None
            ((_, weighted),) = partials(expr, body, self.names)
            return Reduce("sum", expr.indices, weighted)
        total = None
        for child, local in partials(expr, num(1), self.names):
            change = self.differential(child)
            if change is None:
                continue
            term = mul(local, change)
            if total is None:
                total = term
            elif isinstance(term, Unary) and term.op == "-":
                total = Binary("-", total, term.operand)
            else:
                total = add(total, term)
        return total
