"""Per-call binding: the ranges of every index for concrete array shapes.

Rules (docs/notation.md, "Ranges"):

* an index used only plainly gets one extent from every use, or a ShapeError;
* an index with any affine use takes the intersection of the valid ranges of
  all its uses, plain ones included; a use inside ``inner // d`` bounds it through
  ``inner`` (``0 <= inner // d < n`` is ``0 <= inner < d*n``), a use under ``%`` (or in
  two places of one subscript) bounds nothing and is only checked;
* ``ranges=`` and the output array of ``=``/``+=`` are binding: the accesses
  must then fit, or (without ``pad=``) a RangeError names the access;
* the output array counts as one more plain use of its indices: an output index
  used only plainly must get exactly the output's extent from every (unpadded)
  use, or a ShapeError names the use;
* a reduced index is never shrunk to fit an output index: it takes its range
  from its plain uses, ``ranges=`` and the accesses it shares with other
  reduced indices, and from accesses involving an output index only when
  nothing else gives it one; the output index then intersects (the 'valid'
  convolution), or, when its range is bound, the access is checked;
* with ``pad=`` affine subscripts do not limit ranges;
* finally every subscript without a gather is checked to stay inside its axis
  over the whole ranges (with ``pad=`` the executor reads the pad value
  instead), so no backend can read out of bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import RangeError, ShapeError
from ..lang.ast import Access, IndexExpr, Quasi, accesses
from .missing_ranges import unranged_error, unsized_error
from .options import Options
from .spec import IndexUse, Spec

Range = Tuple[int, int]  # (lo, hi), hi exclusive; lo may be negative


def points(names, ranges: Mapping[str, Tuple[int, int]]) -> int:
    """The points of the indices ``names`` under ``ranges`` (index -> (start, stop)):
    the product of their extents, 0 where one is empty."""
    total = 1
    for name in names:
        lo, hi = ranges[name]
        total *= max(0, hi - lo)
    return total


@dataclass(frozen=True)
class Bounds:
    """Index ranges for one set of shapes, and where each came from."""
    ranges: Tuple[Tuple[str, Range], ...]
    sources: Tuple[Tuple[str, str], ...]

    @property
    def range_map(self) -> Dict[str, Range]:
        return dict(self.ranges)

    def extent(self, index: str) -> int:
        lo, hi = self.range_map[index]
        return max(0, hi - lo)

    def source(self, index: str) -> str:
        return dict(self.sources)[index]

    @property
    def points(self) -> int:
        """Points of the iteration space (an empty range counted as one), the work
        measure that thread and fusion thresholds compare with."""
        work = 1
        for _, (lo, hi) in self.ranges:
            work *= max(1, hi - lo)
        return work


def _fmt(rng: Range) -> str:
    lo, hi = rng
    return f"{lo}..{hi - 1}" if hi > lo else "empty"


def subscript_span(sub: IndexExpr, ranges: Mapping[str, Range]) -> Range:
    """Smallest and largest value of a subscript's index part (gathers excluded), as an
    inclusive (min, max) pair; None-free because every index has a range.  Exact for an
    affine subscript; for ``//``/``%`` parts it bounds each part on its own (interval
    arithmetic), so it may be wider than the values actually reached, never narrower."""
    low = high = sub.constant
    for name, coeff in sub.terms:
        lo, hi = ranges[name]
        ends = (coeff * lo, coeff * (hi - 1))
        low += min(ends)
        high += max(ends)
    for part, coeff in sub.quasi:
        ends = tuple(coeff * v for v in quasi_span(part, ranges))
        low += min(ends)
        high += max(ends)
    return low, high


def quasi_span(part: Quasi, ranges: Mapping[str, Range]) -> Range:
    """(min, max) of ``inner // d`` or ``inner % d`` over the ranges: floor division is
    monotonic; a modulo is the whole 0..d-1 unless inner stays within one block of d."""
    low, high = subscript_span(part.inner, ranges)
    d = part.divisor
    if part.op == "//":
        return low // d, high // d
    if low // d == high // d:
        return low % d, high % d
    return 0, d - 1


def solve_linear(coeff: int, low: int, high: int) -> Range:
    """The integers x with ``low <= coeff*x <= high`` (coeff != 0), as an inclusive
    (first, last) pair (first > last when there are none)."""
    if coeff > 0:
        return -((-low) // coeff), high // coeff
    return -((-high) // coeff), low // coeff


def solvable(sub: IndexExpr, index: str):
    """How a subscript bounds ``index``: "affine" when it is an affine term only, the
    (part, coefficient) of the one ``//`` part it is inside of, or None (under ``%``, or
    in two places, as in ``i + i // 4``: such a use bounds nothing, check_accesses still
    keeps every read inside the array)."""
    direct = dict(sub.terms).get(index, 0)
    inside = [(q, c) for q, c in sub.quasi if index in q.inner.index_names]
    if direct and not inside:
        return "affine"
    if not direct and len(inside) == 1 and inside[0][0].op == "//":
        return inside[0]
    return None


def solve(sub: IndexExpr, index: str, form, size: int, ranges: Mapping[str, Range]) -> Range:
    """The values of ``index`` for which ``sub`` stays in ``0 .. size-1`` for every value
    of its other indices (their ``ranges``), inclusive; ``form`` from :func:`solvable`."""
    if form == "affine":
        rest = IndexExpr(tuple(t for t in sub.terms if t[0] != index), (), sub.constant,
                         sub.quasi)
        rest_min, rest_max = subscript_span(rest, ranges)
        return solve_linear(dict(sub.terms)[index], -rest_min, size - 1 - rest_max)
    # sub = rest + q * ((a*index + e) // d): need 0 <= rest + q*F <= size-1
    part, q = form
    rest = IndexExpr(sub.terms, (), sub.constant, tuple(p for p in sub.quasi if p[0] != part))
    rest_min, rest_max = subscript_span(rest, ranges)
    f_lo, f_hi = solve_linear(q, -rest_min, size - 1 - rest_max)
    d = part.divisor   # F = floor(v / d) in f_lo..f_hi  <=>  v in d*f_lo .. d*f_hi + d-1
    inner = part.inner
    e_min, e_max = subscript_span(IndexExpr(tuple(t for t in inner.terms if t[0] != index),
                                            (), inner.constant), ranges)
    return solve_linear(dict(inner.terms)[index], d * f_lo - e_min, d * f_hi + d - 1 - e_max)


def infer_ranges(spec: Spec, shapes: Mapping[str, Sequence[int]], options: Options,
                 output_shape: Optional[Sequence[int]] = None) -> Bounds:
    return _Inference(spec, shapes, options, output_shape).run()


class _Inference:
    def __init__(self, spec: Spec, shapes, options: Options, output_shape):
        self.spec = spec
        self.shapes = shapes
        self.options = options
        self.output_shape = output_shape
        self.source = spec.source
        self.ranges: Dict[str, Range] = {}
        self.sources: Dict[str, str] = {}
        self.from_output: Dict[str, int] = {}   # index -> output axis whose length it took

    def error(self, cls, message, span=None):
        return cls(message, source=self.source, span=span)

    def dim(self, access: Access, axis: int) -> int:
        return int(self.shapes[access.tensor][axis])

    def run(self) -> Bounds:
        self.check_ranks()
        binding = self.binding_ranges()
        pending: List[str] = []
        unsized: List[str] = []
        for index in self.spec.all_indices:
            if index in binding:
                self.ranges[index], self.sources[index] = binding[index]
            elif self.affine_uses(index):
                pending.append(index)
            elif not self.plain_uses(index):
                unsized.append(index)   # reported together, once the others are checked
            else:
                self.settle_plain(index, self.plain_uses(index))
        if unsized:
            raise unsized_error(self.spec, unsized, self.options.pad is not None,
                                self.index_span(unsized[0]))
        self.check_output_extents()
        self.settle_affine(pending)
        self.check_accesses()
        order = self.spec.all_indices
        return Bounds(tuple((i, self.ranges[i]) for i in order),
                      tuple((i, self.sources[i]) for i in order))

    def check_ranks(self):
        for info in self.spec.tensors:
            shape = self.shapes[info.name]
            if len(shape) != info.rank:
                raise self.error(ShapeError, f"{info.name} has {len(shape)} axes (shape "
                                 f"{tuple(shape)}) but the statement gives it {info.rank} "
                                 "subscript(s)", self.accesses_of(info.name)[0].span)

    def binding_ranges(self) -> Dict[str, Tuple[Range, str]]:
        """Ranges fixed by ranges= and by the output array of '='/'+='."""
        binding: Dict[str, Tuple[Range, str]] = {}
        explicit = self.options.range_map
        known = set(self.spec.all_indices)
        for name in explicit:
            if name not in known:
                raise self.error(RangeError, f"ranges= names {name!r}, which is not an index "
                                 f"of the statement (its indices: {', '.join(sorted(known))})")
            binding[name] = (explicit[name], "ranges=")
        if self.output_shape is not None:
            st = self.spec.statement
            if len(self.output_shape) != len(st.output_indices):
                raise self.error(ShapeError, f"the output {st.output} has shape "
                                 f"{tuple(self.output_shape)} but the statement gives it "
                                 f"{len(st.output_indices)} index(es)", st.output_span)
            for axis, name in enumerate(st.output_indices):
                size = int(self.output_shape[axis])
                span = st.index_spans[axis] if axis < len(st.index_spans) else None
                if name in binding:
                    lo, hi = binding[name][0]
                    if hi - lo != size:
                        raise self.error(ShapeError, f"index {name}: ranges= gives {hi - lo} "
                                         f"values but the output {st.output} has {size} on "
                                         f"axis {axis}", span)
                else:
                    binding[name] = ((0, size), f"output {st.output} axis {axis}")
                    self.from_output[name] = axis
        return binding

    def limits(self, use: IndexUse) -> bool:
        """Whether a use bounds its index: with pad= only reads of index arrays do."""
        return self.options.pad is None or use.in_gather

    def plain_uses(self, index: str) -> List[IndexUse]:
        return [u for u in self.spec.uses(index) if u.subscript.plain_index == index]

    def affine_uses(self, index: str) -> List[IndexUse]:
        return [u for u in self.spec.uses(index) if u.subscript.plain_index != index
                and not u.subscript.gathers and self.limits(u)]

    def check_output_extents(self):
        """The output array of '='/'+=' is one more plain use of its indices.  An index
        used only plainly gets one extent from every use, so a plain read of another
        length is an error, never a silent slice of it (or of the output); an index with
        a shifted use takes the intersection instead, which check_accesses enforces."""
        st = self.spec.statement
        for index, axis in self.from_output.items():
            if self.affine_uses(index):
                continue
            size = int(self.output_shape[axis])
            for use in self.plain_uses(index):
                if not self.limits(use) or use.access.tensor == st.output:
                    continue
                other = self.dim(use.access, use.axis)
                if other != size:
                    hint = f"; to read only part of {use.access.tensor}, give ranges=" \
                        if other > size else ""
                    raise self.error(ShapeError, f"index {index}: the output {st.output} "
                                     f"has {size} (axis {axis}) but {use.access.tensor} "
                                     f"gives {other} (axis {use.axis}); extents must agree "
                                     f"exactly{hint}", use.access.span)

    def settle_plain(self, index: str, plain: List[IndexUse]):
        """One extent from every plain use (``plain`` is not empty)."""
        first = plain[0]
        size = self.dim(first.access, first.axis)
        for use in plain[1:]:
            other = self.dim(use.access, use.axis)
            if other != size:
                raise self.error(ShapeError, f"index {index}: {first.access.tensor} gives "
                                 f"{size} (axis {first.axis}) but {use.access.tensor} gives "
                                 f"{other} (axis {use.axis}); extents must agree exactly",
                                 use.access.span)
        self.ranges[index] = (0, size)
        self.sources[index] = f"{first.access.tensor} axis {first.axis}"

    def index_span(self, index: str):
        st = self.spec.statement
        if index in st.output_indices:
            return st.index_spans[st.output_indices.index(index)]
        reduce = self.spec.reduction_of(index)
        return reduce.span if reduce is not None else None

    def settle_affine(self, pending: List[str]):
        """Intersect affine constraints, settling first the indices whose affine uses
        involve only indices already settled.

        A reduced index is never shrunk to fit an output index: until nothing else is
        left, it ignores the accesses it shares with one (in ``y[i] = x[i+a]*k[a]``,
        ``a`` takes 0..len(k)-1 from ``k`` whatever the length of ``y``, and a ``y`` too
        long for it is then an error at ``x[i+a]``, not a silently narrower sum).  Only
        an index with no other source, ``a`` in ``y[i] = x[i+a]``, takes its range from
        them."""
        while pending:
            for via_outputs in (False, True):
                # First the indices whose affine uses are all computable; then, to break
                # a cycle of affine uses, the first one that has a plain use or a
                # computable affine one, from what is known so far.
                if self.settle_pass(pending, via_outputs, force=False) or \
                        self.settle_pass(pending, via_outputs, force=True):
                    break
            else:
                for index in pending:
                    if any(solvable(u.subscript, index) for u in self.affine_uses(index)):
                        continue
                    use = self.affine_uses(index)[0]
                    raise self.error(RangeError, f"index {index}: its range cannot be "
                                     f"inferred: {use.access} uses it only under '%' (or "
                                     "twice in one subscript), which does not bound it; "
                                     f"give ranges={{{index!r}: ...}}", use.access.span)
                # Each index left shares every subscript with another one left (a pooling
                # window and its output index): say which extent the user has to give.
                raise unranged_error(self.spec, pending)

    def settle_pass(self, pending: List[str], via_outputs: bool, force: bool) -> bool:
        """Settle what can be settled (only the first one when ``force``: reduced indices
        before output ones, so that an output index forced from its plain uses alone
        does not miss the intersection with a reduced index's shifted reads)."""
        progress = False
        order = sorted(pending, key=lambda n: n in self.spec.output_indices) if force \
            else list(pending)
        for index in order:
            if self.try_settle(index, via_outputs, force):
                pending.remove(index)
                progress = True
                if force:
                    break
        return progress

    def try_settle(self, index: str, via_outputs: bool, force: bool) -> bool:
        plain = self.plain_uses(index)
        lo, hi, parts = None, None, []
        if plain:
            self.settle_plain(index, plain)
            lo, hi = self.ranges.pop(index)
            parts.append(self.sources.pop(index))
        ignored = set() if via_outputs or index in self.spec.output_indices \
            else set(self.spec.output_indices)
        computable = 0
        for use in self.affine_uses(index):
            sub = use.subscript
            form = solvable(sub, index)
            if form is None:
                continue   # bounds nothing (under %): check_accesses checks the reads
            others = [n for n in sub.index_names if n != index]
            if ignored.intersection(others):
                continue  # a reduced index is not shrunk to fit an output index
            if any(n not in self.ranges for n in others):
                if not force:
                    return False
                continue
            computable += 1
            a_lo, a_hi = solve(sub, index, form, self.dim(use.access, use.axis), self.ranges)
            lo = a_lo if lo is None else max(lo, a_lo)
            hi = a_hi + 1 if hi is None else min(hi, a_hi + 1)
            parts.append(f"{use.access.tensor} axis {use.axis} ({use.subscript})")
        if lo is None or (force and not plain and not computable):
            return False
        hi = max(hi, lo)
        self.ranges[index] = (lo, hi)
        self.sources[index] = parts[0] if len(parts) == 1 else \
            "intersection of " + ", ".join(parts)
        return True

    def check_accesses(self):
        """Every subscript without a gather stays inside its axis (unless pad=)."""
        if any(hi <= lo for lo, hi in self.ranges.values()):
            return  # nothing is read at all
        pad = self.options.pad is not None
        for index, uses in self.spec.index_uses:
            for use in uses:
                if use.access.tensor == self.spec.output:
                    continue  # an update reads exactly the element it writes
                self.check_subscript(use.access, use.axis, use.subscript, pad and not use.in_gather)
        # Subscripts with no index at all (X[i, 5]) are not in index_uses.
        for info in self.spec.tensors:
            for access in self.accesses_of(info.name):
                for axis, sub in enumerate(access.indices):
                    if not sub.index_names and not sub.gathers:
                        self.check_subscript(access, axis, sub, pad and info.as_value
                                             and not info.as_index)

    def accesses_of(self, tensor: str):
        return [a for a in accesses(self.spec.rhs) if a.tensor == tensor]

    def check_subscript(self, access: Access, axis: int, sub: IndexExpr, padded: bool):
        if sub.gathers or padded:
            return
        low, high = subscript_span(sub, self.ranges)
        size = self.dim(access, axis)
        if low < 0 or high > size - 1:
            which = low if low < 0 else high
            ranges = ", ".join(f"{n} in {_fmt(self.ranges[n])} ({self.sources[n]})"
                               for n in sub.index_names)
            fixed = [n for n in sub.index_names if n in self.from_output]
            hint = f"; pass a smaller {self.spec.output}, or give pad=" if fixed and low >= 0 \
                else "; shrink the range or give pad="
            raise self.error(RangeError, f"{access}: subscript {sub} reaches {which} but "
                             f"{access.tensor} has {size} element(s) on axis {axis}"
                             + (f" [{ranges}]" if ranges else "") + hint,
                             sub.span or access.span)


def check_positions_defined(spec: Spec, bounds: "Bounds") -> None:
    """argmax/argmin over an empty range have no position to give (NumPy raises too):
    an error for the call, on every backend, before anything runs."""
    from ..lang.ast import POSITION_REDUCTIONS, reductions
    if not spec.has_position_reductions or any(
            bounds.extent(n) <= 0 for n in spec.output_indices):
        return
    for node in reductions(spec.rhs):
        if node.op in POSITION_REDUCTIONS:
            empty = [n for n in node.indices if bounds.extent(n) <= 0]
            if empty:
                raise no_position(node, empty[0])


def no_position(node, index: str) -> RangeError:
    """The error for an argmax/argmin ``node`` whose index ``index`` has no values."""
    return RangeError(f"{node.op}[{', '.join(node.indices)}](...) has no position to give: "
                      f"the range of {index} is empty", span=node.span)
