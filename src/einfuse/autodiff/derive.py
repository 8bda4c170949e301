"""``derive``: reverse-mode gradients of one statement, as statements (docs/gradients.md).

Each read ``W[s0, s1, ...]`` of the differentiated tensor contributes ``g`` (see
rules.py) on the grid of the forward output indices and the reductions around it.  The
contribution is moved into the gradient's own frame ``dW[f0, f1, ...]`` when every
subscript can be solved for a grid index:

* a plain index ``v`` becomes the frame index itself (renamed);
* an affine subscript ``i + a - 1`` is solved for a forward *output* index with unit
  coefficient (``i = f - a + 1``): the gradient then reads ``dOUT`` shifted, and
  ``pad=0`` makes the reads that fall outside ``dOUT`` (no such forward point) zero.

The remaining grid indices are summed in the gradient.  Every contribution that moves
is added into one ``:=`` statement (kind "gather", race-free).  The others (strides,
constants, gathers, ``//`` and ``%`` parts, repeated indices, reduction indices whose
range an affine use may narrow) become kind "scatter": a values statement in the
forward's own frame, added into ``dW`` at the forward's subscripts (``np.add.at``;
atomics or privatisation on a parallel backend).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

from ..analysis.options import OPTION_NAMES
from ..analysis.spec import Spec, analyse
from ..errors import (EinfuseError, EinfuseTypeError, GradientBlockedError, NoGradientError,
                      attach_statement, unexpected_keywords)
from ..lang import parse
from ..lang.ast import Access, Binary, Call, Expr, IndexExpr, IndexValue, Param, Reduce, \
    Unary, accesses
from ..lang.printer import format_expr, format_statement
from .exprs import Affine, Names, affine, affine_expr, any_of, cmp, contains_reduce, \
    freshen, mentions, num, subst, where
from ..analysis.spec import spec_of
from ..lang.split import split_program

# Operations that pass no gradient by definition: a gradient asked for a name that reaches
# the result only through them is an error naming them (floor, ceil and comparisons pass
# none either, but quietly: theirs is zero wherever it is defined).
NO_GRADIENT = ("sign", "//", "%", "argmax", "argmin")


@dataclass(frozen=True)
class AxisOf:
    """Range source: ``range(0, tensor.shape[axis])``."""
    tensor: str
    axis: int


@dataclass(frozen=True)
class ExtentOf:
    """Range source: the one value ``tensor.shape[axis]`` (an index that stands for an
    extent in a comparison, summed over that single value)."""
    tensor: str
    axis: int


@dataclass(frozen=True)
class RangeOf:
    """Range source: the range ``index`` has in the forward statement for the call."""
    index: str


@dataclass
class GradientStatement:
    """One statement of a gradient.  ``text`` parses and runs with ``ef.ein`` under
    :meth:`resolve_options`; for kind "scatter" it computes the values that
    ``scatter`` (one subscript per axis of the target, over ``text``'s output indices)
    says where to add (``description`` shows it as ``dW[2*i + a] += ...``)."""
    text: str
    target: str
    kind: str                                   # "gather" or "scatter"
    wrt: str
    forward: str                                # the statement it differentiates
    options: Dict[str, object]                  # pad, bounds, fill, ranges (symbolic)
    forward_options: Dict[str, object] = field(default_factory=dict)
    parent: Optional["GradientStatement"] = None   # when ``forward`` is itself a gradient
    scatter: Optional[Tuple[IndexExpr, ...]] = None
    description: str = ""
    output_grad: str = ""                       # the name of dOUT
    # (forward reduction index, tensor, axis): a frame index that stands for a forward
    # reduction index must cover the whole axis; checked when options are resolved
    range_checks: Tuple[Tuple[str, str, int], ...] = ()
    # run these instead when covers() is False (only for gathers with range_checks)
    fallback: List["GradientStatement"] = field(default_factory=list)
    # indices whose values the statement computes with as numbers (the position of the
    # first maximum in a max/min gradient): checked exact in the working dtype per call
    positions: Tuple[str, ...] = ()
    # its place among the statements derive returned for (forward, wrt): a forward
    # whose output ranges do not start at 0 for a call is derived again for those
    # starts (autodiff/rebase.py), and the first statement stands for all of them
    part: int = 0
    # (output index, first value) where the forward's output starts elsewhere than 0:
    # dOUT's position p is then index value first + p (notation.md 6.3)
    starts: Tuple[Tuple[str, int], ...] = ()

    @property
    def statement(self):
        return parse(self.text)

    @property
    def spec(self) -> Spec:
        return spec_of(self.text)

    @property
    def inputs(self) -> Tuple[str, ...]:
        return self.spec.arg_order

    def __str__(self) -> str:
        return self.description or self.text


def check_derive_call(statement, wrt, output_grad_name, options, unknown) -> bool:
    """``derive()``'s arguments checked (an EinfuseError naming the wrong one); whether
    ``statement`` is a program's text (whose gradient is a program)."""
    if unknown:     # (an EinfuseError, a TypeError as Python's own would be)
        error = unexpected_keywords("derive()", unknown, ("wrt", "output_grad_name",
                                                          "options", "outputs"))
        raise attach_statement(error, statement) if isinstance(statement, str) else error
    if isinstance(options, dict) and any(key not in OPTION_NAMES for key in options):
        wrong = [key for key in options if key not in OPTION_NAMES]
        error = unexpected_keywords("derive()'s options=", wrong, OPTION_NAMES)
        raise attach_statement(error, statement) if isinstance(statement, str) else error
    if not isinstance(wrt, str):
        raise EinfuseTypeError(f"derive(wrt=) takes one input's name as a str, not "
                               f"{type(wrt).__name__} {wrt!r}: derive once per input")
    if isinstance(statement, str) and len(split_program(statement)) > 1:
        if output_grad_name is not None:
            raise NoGradientError("output_grad_name= is for one statement; a program's "
                                  "output gradients are named d<output>",
                                  source=statement, span=(0, len(statement)))
        return True
    return False


def derive(statement: Union[str, GradientStatement], wrt: str, *,
           output_grad_name: Optional[str] = None,
           options: Optional[Dict[str, object]] = None, outputs=None, **unknown):
    """Gradient statements of ``statement`` with respect to tensor or scalar ``wrt``.

    The gradient of the output is an input named ``d<OUT>`` (or ``output_grad_name``)
    with the output's indices; the result is ``d<wrt>`` with ``wrt``'s shape: the sum
    of the returned statements (a "gather" creates it, each "scatter" adds into it;
    zeros when there is no gather).  ``options`` are the forward's own options
    (``ranges=``, ``pad=``, ``bounds=``, ``fill=``); a GradientStatement brings its own,
    so gradients can be derived again.

    For a program (several statements) the result is a
    :class:`~einfuse.program.gradient.ProgramGradient` (from ``einfuse.derive``), the gradient as a program (its
    output gradients are ``d<output>`` for each output, or for ``outputs=``); run it
    with its ``run`` method or :func:`run_reference`.

    Example::

        grads = ef.derive("C[i,j] := A[i,k] * B[k,j]", "A")
        grads[0].text                   # 'dA[i, k] := dC[i, j] * B[k, j]'
        ef.run_reference(grads, {"A": A, "B": B, "dC": dC})["dA"]"""
    if check_derive_call(statement, wrt, output_grad_name, options, unknown):
        raise NoGradientError("a program's gradient is a program: einfuse.derive derives "
                              "it (program/gradient.py)", source=statement,
                              span=(0, len(statement)))
    parent = None
    if isinstance(statement, GradientStatement):
        if statement.kind != "gather":
            raise NoGradientError(f"cannot derive the scatter statement for "
                                  f"{statement.target} again; derive its forward instead")
        parent, options, statement = statement, statement.options, statement.text
    options = dict(options or {})
    try:
        spec = analyse(parse(statement))
        return Deriver(spec, wrt, output_grad_name, options, parent).run()
    except EinfuseError as error:
        if error.source is None:
            error.source = statement
        raise


@dataclass
class _Contribution:
    leaf: Expr
    term: Expr
    grid: Tuple[str, ...]


def used_names(spec: Spec) -> set:
    """Every name a statement uses (indices, reduced indices, tensors, scalars, its
    output): names generated for its derivatives must avoid them."""
    used = set(spec.all_indices) | {t.name for t in spec.tensors} | set(spec.params) | \
        {spec.statement.output}
    for node in spec.rhs.walk():
        if isinstance(node, Reduce):
            used |= set(node.indices)
    return used


class Deriver:
    def __init__(self, spec: Spec, wrt: str, dout: Optional[str], options, parent,
                 starts: Optional[Dict[str, int]] = None):
        self.spec, self.wrt, self.options, self.parent = spec, wrt, options, parent
        self.starts = dict(starts or {})
        st = spec.statement
        self.names = Names(used_names(spec))
        self.check_wrt()
        self.dout = self.names.take(dout) if dout else self.names.underscored("d" + st.output)
        self.target = self.names.underscored("d" + wrt)
        self.outputs = st.output_indices
        pad = options.get("pad")
        if pad not in (None, 0, 0.0):
            raise NoGradientError(f"derivation supports pad=0 or no pad, not pad={pad!r}")
        self.forward_pad = pad is not None
        self.rank = next((len(a.indices) for a in accesses(spec.rhs) if a.tensor == wrt), 0)

    def check_wrt(self):
        spec, wrt = self.spec, self.wrt
        if wrt == spec.output:
            raise NoGradientError(f"{wrt} is the statement's output; derive with respect "
                                  "to an input")
        info = next((t for t in spec.tensors if t.name == wrt), None)
        if info is not None and info.as_index:
            raise NoGradientError(f"{wrt} is an integer index array (a gather's "
                                  "subscript); it has no gradient")
        if info is None and wrt not in spec.params:
            raise NoGradientError(f"{wrt} is not read by the statement (it reads "
                                  f"{', '.join(spec.arg_order) or 'nothing'})")

    def run(self) -> List[GradientStatement]:
        # dOUT at the position of each output index value (its value less its start)
        seed = Access(self.dout, tuple(IndexExpr(((i, 1),), (), -self.starts.get(i, 0))
                                       for i in self.outputs))
        self.seed = seed
        found = [_Contribution(leaf, g, self.outputs + bound) for leaf, g, bound
                 in _occurrences(self.spec.rhs, self.wrt, seed, self.names)]
        gathers, scatters = [], []
        for c in found:
            (gathers if self.movable(c) else scatters).append(c)
        result = []
        if gathers:
            result.append(self.gather_statement(gathers))
        for n, c in enumerate(scatters):
            result.append(self.scatter_statement(c, n))
        if gathers and result[0].range_checks:
            # a forward reduction index used as a frame index may turn out, for some
            # shapes, to cover only part of wrt's axis (s := sum[i](x[i]*z[i+1])); the
            # same contributions as scatters are then the answer
            result[0].fallback = [self.scatter_statement(c, len(scatters) + n)
                                  for n, c in enumerate(gathers)]
        if not result:  # the statement reads wrt only through piecewise-constant parts
            check_gradient_passes(self.spec.rhs, self.wrt)
            result.append(self.zero_statement())
        for n, g in enumerate(result):
            g.part = n
        return result

    # -- which contributions move into the gradient's frame ------------------------------
    def movable(self, c: _Contribution) -> bool:
        if isinstance(c.leaf, Param):
            return True
        subs = c.leaf.indices
        for axis, s in enumerate(subs):
            if s.gathers or s.quasi or not s.terms:
                return False                        # scattered: x[idx[i]], x[i // 4]
            others = {n for t, o in enumerate(subs) if t != axis for n in o.index_names}
            if others & set(s.index_names):
                return False                        # repeated index: A[i, i], x[i, i+1]
            v = s.plain_index
            if v is not None:
                if v not in self.outputs and self.user_range(v):
                    return False                    # its range may be narrower than the axis
                continue
            if self.pivot(s) is None:
                return False
        return not (self.widened(subs) & _unpadded_reads(c.term))

    def widened(self, subs) -> set:
        """The forward indices whose values in the gradient's frame may lie outside
        their forward range: those solved from an affine subscript (``x[j+1]``: ``j =
        k - 1`` runs over -1..) and plain output indices that an affine use narrows.  A
        read of another array at them is 0 under ``pad=0``, but an index array's read
        (``w[idx[k - 1]]``) and a gathered read are not padded: such a contribution
        is a scatter from the forward's own frame instead (``dx[j + 1] += ...``)."""
        found = set()
        for s in subs:
            v = s.plain_index
            if v is None:
                found.add(self.pivot(s)[0])
            elif v in self.outputs and self.affine_use(v):
                found.add(v)
        return found

    def affine_use(self, index: str) -> bool:
        """May the index's range be narrower than the axes it indexes plainly?  Yes with
        an affine use or a range given by the user; ranges that derivation itself set
        (AxisOf, ExtentOf, RangeOf) are checked when they are resolved instead."""
        given = dict(self.options.get("ranges") or {}).get(index)
        return any(u.subscript.plain_index is None for u in self.spec.uses(index)) \
            or (given is not None and not isinstance(given, (AxisOf, ExtentOf, RangeOf)))

    def user_range(self, index: str) -> bool:
        given = dict(self.options.get("ranges") or {}).get(index)
        return given is not None and not isinstance(given, (AxisOf, ExtentOf, RangeOf))

    def pivot(self, s: IndexExpr) -> Optional[Tuple[str, int]]:
        for name, coeff in s.terms:
            if name in self.outputs and abs(coeff) == 1:
                return name, coeff
        return None

    def frame(self, contributions: List[_Contribution]) -> Tuple[str, ...]:
        """Frame index names: the first plain index seen on each axis, else fresh."""
        chosen: List[Optional[str]] = [None] * self.rank
        for c in contributions:
            if isinstance(c.leaf, Access):
                for axis, s in enumerate(c.leaf.indices):
                    v = s.plain_index
                    if chosen[axis] is None and v is not None and v not in chosen:
                        chosen[axis] = v
        return tuple(v if v is not None else self.names.fresh() for v in chosen)

    def move(self, c: _Contribution, frame: Tuple[str, ...]):
        """The contribution's term in the frame, and the grid indices left to sum."""
        if isinstance(c.leaf, Param):
            return c.term, self.seed, list(c.grid)
        m: Dict[str, Affine] = {}
        eliminated = {}
        for axis, s in enumerate(c.leaf.indices):
            v = s.plain_index
            if v is not None:
                eliminated[v] = (axis, 1, IndexExpr())
            else:
                name, coeff = self.pivot(s)
                rest = IndexExpr(tuple((n, k) for n, k in s.terms if n != name), (),
                                 s.constant)
                eliminated[name] = (axis, coeff, rest)
        # grid indices that keep living but carry a frame name move out of the way
        renames = {v: self.names.fresh(v) for v in c.grid
                   if v in frame and v not in eliminated}
        for v, new in renames.items():
            m[v] = affine(new)
        for v, (axis, coeff, rest) in eliminated.items():
            # coeff*v + rest = f  ->  v = coeff*(f - rest), coeff = +-1
            terms = [(frame[axis], coeff)] + [(renames.get(n, n), -coeff * k)
                                              for n, k in rest.terms]
            m[v] = (tuple(terms), -coeff * rest.constant)
        term = subst(c.term, m, self.names)
        seed = subst(self.seed, m, self.names)
        summed = [renames.get(v, v) for v in c.grid if v not in eliminated]
        return term, seed, summed

    # -- statements ---------------------------------------------------------------------
    def gather_statement(self, contributions: List[_Contribution]) -> GradientStatement:
        frame = self.frame(contributions)
        for f in frame:
            self.names.take(f)
        moved = [self.move(c, frame) for c in contributions]
        # dOUT read at a solved subscript (i = f - a), or at an output index whose range
        # an affine use may make shorter than wrt's axis: reads outside dOUT must be 0
        shifted = any(s.plain_index is None for _, seed, _ in moved for s in seed.indices)
        frame_outputs = any(s.plain_index in self.outputs and self.affine_use(s.plain_index)
                            for c in contributions if isinstance(c.leaf, Access)
                            for s in c.leaf.indices)
        # (a forward output starting elsewhere than 0 has dOUT read at positions that
        # a frame over wrt's axis may pass: self.starts, autodiff/rebase.py)
        pad = 0.0 if (shifted or frame_outputs or self.forward_pad or self.starts) \
            else None
        parts, extents = [], {}
        for term, seed, summed in moved:
            if pad is not None and _risky(term, frame, self.wrt):
                term, sizes = self.gate(term, seed, frame)
                extents.update(sizes)
            parts.append((term, summed))
        implicit = len(parts) == 1 and _implicit_sum(*parts[0])
        rhs = None
        for term, summed in parts:
            part = term if implicit or not summed else Reduce("sum", tuple(summed), term)
            if rhs is None:
                rhs = part
            elif isinstance(part, Unary) and part.op == "-":
                rhs = Binary("-", rhs, part.operand)
            else:
                rhs = Binary("+", rhs, part)
        rhs = freshen(rhs, set(frame), self.names)
        text = self.format(self.target, frame, rhs)
        ranges = {f: AxisOf(self.wrt, axis) for axis, f in enumerate(frame)}
        ranges.update(extents)
        g = self.make(text, "gather", pad, ranges, frame)
        g.range_checks = tuple(sorted({(s.plain_index, self.wrt, axis) for c in contributions
                                       if isinstance(c.leaf, Access)
                                       for axis, s in enumerate(c.leaf.indices)
                                       if s.plain_index not in (None,) + self.outputs}))
        return g

    def gate(self, term: Expr, seed: Access, frame) -> Tuple[Expr, Dict[str, "ExtentOf"]]:
        """``where(<every dOUT subscript inside dOUT>, term, 0)``: the term outside the
        forward's grid, where padded reads give 0 but a function of one may not (log(0)).
        A gate on the position, not on ``dOUT != 0``, so that the term's derivative
        with respect to dOUT is right where dOUT is 0 (second derivatives).  dOUT's
        extent on an axis is an index with the one value ``dOUT.shape[axis]``
        (:class:`ExtentOf`), summed over: the statement needs no extra input."""
        conditions, sizes = [], {}
        for axis, s in enumerate(seed.indices):
            plain = s.plain_index
            if plain is not None and (plain not in frame or
                                      not self.affine_use(self.outputs[axis])):
                continue   # a forward grid index, or one as long as dOUT's axis
            n = self.names.underscored(f"size{axis}")
            sizes[n] = ExtentOf(self.dout, axis)
            value = affine_expr((s.terms, s.constant))
            if plain is None:
                conditions.append(cmp(">=", value, num(0)))
            conditions.append(cmp("<", value, IndexValue(n)))
        if not conditions:
            return term, {}
        # an explicit sum: a name not in any subscript would read as a scalar parameter
        return Reduce("sum", tuple(sizes), where(any_of(conditions, "&"), term, num(0))), \
            sizes

    def scatter_statement(self, c: _Contribution, n: int) -> GradientStatement:
        subs = c.leaf.indices
        in_subs = {name for s in subs for node in _sub_exprs(s) for name in node}
        keep = tuple(v for v in c.grid if v in in_subs)
        summed = tuple(v for v in c.grid if v not in in_subs)
        term = c.term
        if summed and not _implicit_sum(term, summed):
            term = Reduce("sum", summed, term)
        rhs = freshen(term, set(keep), self.names)
        values = self.names.underscored(f"{self.target}_at{n}" if n else
                                        f"{self.target}_at")
        text = self.format(values, keep, rhs)
        shown = Reduce("sum", summed, c.term) if summed and term is c.term else rhs
        where_to = f"{self.target}[{', '.join(str(s) for s in subs)}]"
        g = self.make(text, "scatter", 0.0 if self.forward_pad else None, {}, keep)
        g.scatter = subs
        g.description = f"{where_to} += {format_expr(shown)}"
        return g

    def zero_statement(self) -> GradientStatement:
        frame = tuple(self.names.fresh() for _ in range(self.rank))
        ranges = {f: AxisOf(self.wrt, axis) for axis, f in enumerate(frame)}
        return self.make(self.format(self.target, frame, num(0.0)), "gather", None, ranges,
                         frame)

    def format(self, out: str, indices, rhs: Expr) -> str:
        lhs = f"{out}[{', '.join(indices)}]" if indices else out
        return f"{lhs} := {format_expr(rhs)}"

    def make(self, text, kind, pad, ranges, frame) -> GradientStatement:
        spec = analyse(parse(text))          # the text must be a legal statement
        for index in spec.all_indices:
            if index not in ranges:
                root = self.names.root(index)
                ranges[index] = RangeOf(root)
        opts = {"pad": pad, "ranges": ranges}
        for key in ("bounds", "fill"):
            if key in self.options:
                opts[key] = self.options[key]
        return GradientStatement(text=text, target=self.target, kind=kind, wrt=self.wrt,
                                 forward=self.spec.source or format_statement(
                                     self.spec.statement),
                                 options=opts, forward_options=dict(self.options),
                                 parent=self.parent, description=text,
                                 output_grad=self.dout,
                                 positions=position_indices(spec.rhs),
                                 starts=tuple(sorted(self.starts.items())))


def position_indices(rhs):
    from .rules import position_indices as found
    return found(rhs)


def check_gradient_passes(rhs: Expr, wrt: str) -> None:
    """For a name no gradient reaches (through none of ``rhs``'s differentiable parts): the
    error naming the operations of NO_GRADIENT that read it, if any do."""
    blocked = []
    for node in rhs.walk():
        op = node.func if isinstance(node, Call) else \
            node.op if isinstance(node, (Binary, Reduce)) else None
        if op in NO_GRADIENT and mentions(node, wrt):
            blocked.append((op, node))
    if not blocked:
        return
    ops = list(dict.fromkeys(f"'{op}'" if op in ("//", "%") else op for op, _ in blocked))
    what = ops[0] if len(ops) == 1 else ", ".join(ops[:-1]) + " and " + ops[-1]
    raise GradientBlockedError(
        f"{wrt} has no gradient: it reaches the result only through {what}, which "
        f"pass{'es' if len(ops) == 1 else ''} none; ask for no gradient of {wrt} (torch: "
        "requires_grad=False or .detach(); JAX: jax.lax.stop_gradient)",
        span=blocked[0][1].span)


def _occurrences(rhs, wrt, seed, names):
    from .rules import occurrences
    return occurrences(rhs, wrt, seed, names)


def _sub_exprs(s: IndexExpr):
    """Index names of a subscript, gathers' subscripts included (one set per level)."""
    yield s.index_names
    for access, _ in s.gathers:
        for inner in access.indices:
            yield from _sub_exprs(inner)


def _unpadded_reads(term: Expr) -> set:
    """The indices that ``term`` reads arrays at where ``pad=`` does not apply: in an
    index array's subscripts, and in any subscript holding a gather (its value
    follows ``bounds=``)."""
    found = set()
    for access in accesses(term):
        for sub in access.indices:
            if sub.gathers:
                found.update(sub.index_names)
                for inner, _ in sub.gathers:
                    found.update(n for s in inner.indices for level in _sub_exprs(s)
                                 for n in level)
    return found


def _implicit_sum(term: Expr, summed) -> bool:
    """May ``term`` sum over ``summed`` implicitly?  Not when it has reductions of its
    own, nor when an index to sum appears in no subscript (only in a comparison, as
    ``j`` in ``where(j < i, dy[i], 0)``): the statement would read it as a scalar
    parameter."""
    subscripted = {name for access in accesses(term) for sub in access.indices
                   for name in sub.index_names}
    return not contains_reduce(term) and all(v in subscripted for v in summed)


def _risky(term: Expr, frame, wrt: str) -> bool:
    """Could a read outside its array (pad=0) make the term inf/nan?  Only a read whose
    subscript moves with the frame (other than ``wrt``'s own, which the frame keeps
    inside) under a function, a divisor, a power or a reduction: sums and products of
    reads, and ``where``, stay finite."""
    def leaves(node: Expr) -> bool:
        if isinstance(node, IndexValue):
            return node.name in frame
        if not isinstance(node, Access):
            return False
        return any(set(sub.index_names) & set(frame) and
                   not (node.tensor == wrt and sub.plain_index == frame[axis])
                   for axis, sub in enumerate(node.indices))

    def visit(node: Expr, under: bool) -> bool:
        if under and leaves(node):
            return True
        if isinstance(node, Binary) and node.op in ("/", "//", "%"):   # x / 0 is not 0
            return visit(node.left, under) or visit(node.right, True)
        under = under or isinstance(node, Reduce) or \
            (isinstance(node, Call) and node.func != "where") or \
            (isinstance(node, Binary) and node.op == "**")
        return any(visit(child, under) for child in node.children())
    return visit(term, False)
