"""Contractions whose operands are read through affine subscripts -- convolutions and
correlations with channels, their gradients, any sum of a product of two arrays whose
subscripts are ``sum(c * index) + constant`` -- recognised from the analysed statement
as a *windowed contraction*, which BLAS computes.

The rule: an affine subscript of an array is a strided view of it.  ``x[b, c, 2*i + p -
1, 2*j + q - 1]`` reads, for each value of ``(b, c, i, j, p, q)``, the element at
``origin + sum(coefficient * index * axis stride)``: a view ``X[b, c, i, j, p, q]`` of
``x`` (NumPy's ``as_strided``) with the stride of ``i`` twice that of ``x``'s axis 2,
that of ``p`` once, and its origin at the ranges' first values.  Over the views the
statement is an ordinary contraction of plain indices (plan/contraction.py's roles:
batch, M, N, K), whatever the indices are called, in any order, of either operand, 1-D,
2-D or more, with strides, dilations, offsets, negative coefficients (the transposed
convolution a stride-1 input gradient is) and repeated indices.  ``pad=`` pads each array
by the margins its reads leave (with the pad value: what the semantics read there).

Three ways to run it (:class:`WindowMethod`), chosen per call by :func:`window_method`:
the views packed into one patch matrix (im2col) and one GEMM (an image at a time where
the GEMMs are large: :func:`chunked_patches`); a GEMM per value of the window indices
accumulated into the result (no patch matrix; the form for patches too large for
memory); or, where one operand's windows are ``k + sum(c * w) + e`` in an output index
``k`` (a transposed convolution), the product over that array as it lies with its values
added at the window positions (:class:`ScatterForm`, col2im), where those values are
fewer than the patches.  Statements that do not have this form keep the loop nest, and
:func:`windowed_refusal` says why (explain prints it)."""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, replace
from typing import Mapping, Optional, Tuple

from ..analysis.ranges import points
from ..lang import ast
from ..lang.fresh_names import FreshNames
from ..lang.printer import format_expr
from .contraction import index_groups, product_factors


class WindowMethod(enum.Enum):
    """How a windowed contraction reaches BLAS."""
    PATCHES = "the windows packed into one patch matrix (im2col), then one GEMM"
    PER_OFFSET = "one GEMM per window offset, accumulated into the result (no patch matrix)"
    SCATTER = ("the product over the array as it lies, its values added at the window's "
               "positions (col2im; no patch matrix)")


# The patch matrix is used while it stays below this many bytes (and below
# PATCH_FACTOR times what the call reads and writes anyway): on this machine's conv2d
# 8x16x64x64 * 32x16x3x3 (stride 2) it ran 1.4x faster than the nine GEMMs of the
# per-offset form (one GEMM of K = 144 against nine of K = 16, which BLAS runs at a
# lower rate); the per-offset form keeps memory at one window offset's slice.
PATCH_BYTES = 256 << 20
PATCH_FACTOR = 64
# The per-offset form pays a BLAS call per offset: offered only for this many offsets.
MAX_OFFSETS = 256
# The scatter form (ScatterForm) is chosen where its values to add are fewer than this
# times the patch elements it saves packing: per element the C col2im and the C pack
# cost about the same (0.24 against 0.31 ns here).
SCATTER_RATIO = 1.0


@dataclass(frozen=True)
class Subscript:
    """One axis of an operand: ``sum(coefficient * index) + constant``."""
    terms: Tuple[Tuple[str, int], ...]
    constant: int

    @property
    def plain(self) -> bool:
        return self.constant == 0 and len(self.terms) == 1 and self.terms[0][1] == 1


@dataclass(frozen=True)
class WindowedOperand:
    """An operand as the strided view over ``axes`` (its distinct indices, first use
    first) that its subscripts read."""
    tensor: str
    subscripts: Tuple[Subscript, ...]
    axes: Tuple[str, ...]
    text: str                       # the access as written, for explain

    def stride_of(self, index: str, axis: int) -> int:
        """The coefficient of ``index`` in the subscript of array axis ``axis``."""
        return sum(c for n, c in self.subscripts[axis].terms if n == index)


@dataclass(frozen=True)
class Gemm:
    """The product as one (broadcast, batched) GEMM: the result's axes are ``pre`` (the
    leading output indices, each from either operand or both: the GEMM's batch axes),
    then ``rows`` (read by operand ``rows_from`` alone), then ``cols`` (the other's);
    ``order``: the product's axes to the output's (the identity where the output is in
    this order already)."""
    pre: Tuple[str, ...]
    rows: Tuple[str, ...]
    cols: Tuple[str, ...]
    k: Tuple[str, ...]              # the summed indices, in the order both operands flatten
    rows_from: int                  # 0: the left operand, 1: the right
    order: Tuple[int, ...]


@dataclass(frozen=True)
class WindowedContraction:
    left: WindowedOperand
    right: WindowedOperand
    output: Tuple[str, ...]
    batch: Tuple[str, ...]          # roles over the views (plan/contraction.index_groups)
    m: Tuple[str, ...]
    n: Tuple[str, ...]
    k: Tuple[str, ...]
    window: Tuple[str, ...]         # summed indices inside non-plain subscripts
    gemm: Gemm
    scale: Tuple[ast.Expr, ...]     # scalar factors (numbers, parameters)
    method: WindowMethod = WindowMethod.PATCHES     # chosen per call (window_method)
    # the panel form (plan/windowed_panels.PanelForm) where the schedule chose it
    # (schedule/choose.py): method PATCHES then, packed as panels
    panels: Optional[object] = None

    @property
    def operands(self) -> Tuple[WindowedOperand, WindowedOperand]:
        return self.left, self.right

    def describe(self) -> str:
        def names(group):
            return ",".join(group) or "-"
        windows = []
        for operand in self.operands:
            for axis, sub in enumerate(operand.subscripts):
                if not sub.plain:
                    windows.append(f"{operand.tensor} axis {axis}: {_subscript_text(sub)}")
        g = self.gemm
        first, second = (self.left, self.right) if g.rows_from == 0 else \
            (self.right, self.left)
        kept = [f"{names(group)} ({who})" for group, who in (
            (self.batch, "both"), (self.m, self.left.tensor), (self.n, self.right.tensor))
            if group]
        batch = f" per {names(g.pre)}" if g.pre else ""
        return (f"windowed contraction by BLAS: {self.left.text} and {self.right.text} "
                f"read as strided views ({'; '.join(windows)}); kept {', '.join(kept)}; "
                f"summed {names(g.k)} (window {names(self.window)}); GEMM{batch}: "
                f"{first.tensor} as ({names(g.rows)}) x ({names(g.k)}) times "
                f"{second.tensor} as ({names(g.k)}) x ({names(g.cols)}); "
                f"{self.method.value if self.panels is None else self.panels.describe()}")


def _subscript_text(sub: Subscript) -> str:
    parts = [(f"{c}*{n}" if c not in (1, -1) else ("-" if c < 0 else "") + n)
             for n, c in sub.terms]
    text = " + ".join(parts).replace("+ -", "- ")
    if sub.constant:
        text += f" {'+' if sub.constant > 0 else '-'} {abs(sub.constant)}"
    return text


@dataclass(frozen=True)
class _Match:
    found: Optional[WindowedContraction]
    reason: Optional[str]           # why not, where the statement reads through windows


def windowed_contraction(spec, pad_given: bool = False) -> Optional[WindowedContraction]:
    """The statement as a windowed contraction (method PATCHES), or None.  A statement
    of plain subscripts alone qualifies only with ``pad_given`` (without, it is
    plan/contraction.py's)."""
    match = _match(spec)
    if match.found is None:
        return None
    if not pad_given and all(sub.plain for o in match.found.operands
                             for sub in o.subscripts):
        return None
    return match.found


def windowed_refusal(spec) -> Optional[str]:
    """Why a statement that reads an array through a non-plain subscript is not a
    windowed contraction (the loop nest runs it), or None (it is one, or it reads
    through plain subscripts alone)."""
    return _match(spec).reason


def window_method(found: WindowedContraction, ranges: Mapping[str, Tuple[int, int]],
                  itemsize: int) -> WindowMethod:
    """PATCHES while the patch matrix fits the budget (PATCH_BYTES, PATCH_FACTOR times
    the bytes the call reads and writes anyway), else PER_OFFSET where the window has
    few enough offsets."""
    patch_count = sum(points(o.axes, ranges) for o in found.operands
                      if not all(s.plain for s in o.subscripts))
    patches = patch_count * itemsize
    form = scatter_form(found)
    if form is not None and found.window and \
            _scatter_size(form, ranges) < SCATTER_RATIO * patch_count:
        # the values to add are fewer than the patches to pack: a stride-1 input
        # gradient with more output channels than input ones (a conv2d 8x32x32x32 by
        # 64 filters: 2.4 M values against 4.7 M patch elements, 2.4 ms against 4.0)
        return WindowMethod.SCATTER
    anyway = (points(found.output, ranges) +
              sum(points(o.axes, ranges) for o in found.operands
                  if all(s.plain for s in o.subscripts))) * itemsize
    if patches <= min(PATCH_BYTES, PATCH_FACTOR * max(anyway, 1 << 16)) or \
            not found.window or points(found.window, ranges) > MAX_OFFSETS:
        return WindowMethod.PATCHES
    return WindowMethod.PER_OFFSET


@dataclass(frozen=True)
class ScatterForm:
    """A windowed contraction run the other way round: where each windowed subscript of
    one operand is ``k + sum(c * w) + e`` with ``k`` an output index of coefficient +-1
    (a transposed convolution: a stride-1 input gradient ``dy[b, o, k-p, l-q]``), the
    sum over the windows equals the plain product ``values`` of that operand read at a
    fresh index ``s`` per such axis (its array as it lies, no patches) with the other
    operand, added into the result at ``k = +-(s - sum(c * w) - e)`` (col2im).  Reads
    outside the array (the pad) are the positions that fall outside the result, so the
    two agree where the pad is 0 and the other operand is finite (0 * inf is NaN in the
    gather form and absent here: the runner checks, and gathers otherwise).

    ``values``: the product over plain views, output ``product.output``; ``fresh``:
    each fresh index, the output index it stands for, the array axis it runs over and
    that subscript; ``windowed``: which operand (0 or 1) is read through windows."""
    values: WindowedContraction
    fresh: Tuple[Tuple[str, str, int, Subscript], ...]
    windowed: int


def scatter_form(found: WindowedContraction) -> Optional[ScatterForm]:
    """The contraction's :class:`ScatterForm`, or None where it has none."""
    sides = [side for side, o in enumerate(found.operands)
             if not all(sub.plain for sub in o.subscripts)]
    if len(sides) != 1:
        return None
    side = sides[0]
    windowed, other = found.operands[side], found.operands[1 - side]
    window = set(found.window)
    names = FreshNames(set(found.output) | set(windowed.axes) | set(other.axes))
    fresh, subscripts, seen = [], [], set()
    for axis, sub in enumerate(windowed.subscripts):
        if sub.plain:
            if sub.terms[0][0] in window:
                return None         # (a window index read plainly too)
            subscripts.append(sub)
            continue
        kept = [(n, c) for n, c in sub.terms if n in found.output]
        if len(kept) != 1 or abs(kept[0][1]) != 1 or kept[0][0] in other.axes or \
                kept[0][0] in seen or \
                any(n not in window for n, _ in sub.terms if n != kept[0][0]):
            return None
        name = names.primed(kept[0][0])
        seen.add(kept[0][0])
        fresh.append((name, kept[0][0], axis, sub))
        subscripts.append(Subscript(((name, 1),), 0))
    if any(sum(1 for sub in windowed.subscripts for n, _ in sub.terms if n == k) != 1
           for k in seen):
        return None
    axes = tuple(dict.fromkeys(n for sub in subscripts for n, _ in sub.terms))
    plain = WindowedOperand(windowed.tensor, tuple(subscripts), axes, windowed.text)
    views = [plain, other] if side == 0 else [other, plain]
    # the values' axes: the other output indices, the window, the fresh ones (in the
    # result's order): the col2im then walks the result's rows innermost
    by_output = {k: name for name, k, _, _ in fresh}
    out = tuple(n for n in found.output if n not in by_output) + \
        tuple(n for n in found.window) + tuple(by_output[n] for n in found.output
                                               if n in by_output)
    summed = tuple(n for n in found.k if n not in window)
    groups = index_groups(out, views[0].axes, views[1].axes, summed)
    if groups is None or not groups["m"] or not groups["n"]:
        return None
    values = WindowedContraction(views[0], views[1], out,
                                 *(tuple(groups[g]) for g in ("batch", "m", "n", "k")),
                                 (), _gemm(out, groups, views), found.scale)
    return ScatterForm(values, tuple(fresh), side)


def _scatter_size(form: ScatterForm, ranges) -> int:
    """The elements of the scatter form's values (each fresh index over the array
    positions its subscript reaches)."""
    reach = scatter_reach(form, ranges)
    total = points(tuple(n for n in form.values.output if n not in reach), ranges)
    for lo, hi in reach.values():
        total *= max(0, hi - lo)
    return total


def scatter_reach(form: ScatterForm, ranges, shapes: Optional[Mapping[str, Tuple[int, ...]]]
                  = None) -> dict:
    """Each fresh index's range: the positions its subscript reaches over ``ranges``
    (within the array's axis where ``shapes`` gives it)."""
    tensor = form.values.operands[form.windowed].tensor
    reach = {}
    for name, _, axis, sub in form.fresh:
        low = high = sub.constant
        for n, c in sub.terms:
            lo, hi = ranges[n]
            low += c * (lo if c > 0 else hi - 1)
            high += c * (hi - 1 if c > 0 else lo)
        if shapes is not None:
            low, high = max(low, 0), min(high, shapes[tensor][axis] - 1)
        reach[name] = (low, max(low, high + 1))
    return reach


# The patches are packed and multiplied one value of the GEMM's batch index (an image)
# at a time where each such GEMM has this many multiply-adds: the image's patches are
# then still in cache when BLAS reads them (a conv2d 8x16x64x64 by 32 filters, stride
# 2, 4.7 M multiply-adds an image: 0.87 ms against 1.24 ms packed whole; 8x32x32x32 by
# 64: 3.3 against 3.9 ms).  Below it the calls per image cost more than the cache
# saves: a conv1d 8x32x512 by 32 filters of 5 (stride 2), 1.3 M an image, ran its
# forward in 0.45-0.49 ms packed whole against 0.66 ms an image at a time (torch tensors,
# one thread; torch 0.39-0.43 ms), forward + backward 1.9-2.1 against 2.0-2.2 ms.
CHUNK_WORK = 1 << 21


def chunked_patches(found: WindowedContraction, ranges: Mapping[str, Tuple[int, int]]) -> bool:
    """Whether the PATCHES run packs and multiplies one value of its single batch index
    at a time (CHUNK_WORK)."""
    gemm = found.gemm
    if found.method is not WindowMethod.PATCHES or len(gemm.pre) != 1:
        return False
    return points(gemm.pre, ranges) > 1 and \
        points(gemm.rows + gemm.cols + gemm.k, ranges) >= CHUNK_WORK


# A summed index is chunked (chunked_sum) from this many multiply-adds a value: each
# value's product is added into the result, and a weight gradient's per-image GEMMs
# (K = one image's positions) ran slower than the whole one below it (conv2d 8x16x64x64
# by 32 filters, stride 2, 4.7 M an image: 1.57 against 1.43 ms) and faster above
# (8x32x32x32 by 64 filters, 19 M an image: 4.1 against 5.3 ms).
CHUNK_SUM_WORK = 1 << 23


def chunked_sum(found: WindowedContraction, ranges: Mapping[str, Tuple[int, int]],
                work: Optional[int] = None) -> Optional[str]:
    """The summed index over whose values a PATCHES run without batch axes packs and
    multiplies one value at a time, the products added up (a weight gradient's images:
    each image's patches then meet BLAS in cache, as with chunked_patches), or None:
    an index that each operand reads as a plain subscript of an axis of its own, where
    one value's GEMM has ``work`` multiply-adds (CHUNK_SUM_WORK where None; 0 where
    each value's patches are at hand already, kept from a forward:
    backends/c/windowed.py)."""
    work = CHUNK_SUM_WORK if work is None else work
    gemm = found.gemm
    if found.method is not WindowMethod.PATCHES or gemm.pre or \
            all(all(sub.plain for sub in o.subscripts) for o in found.operands):
        return None

    def own_axis(operand, name):
        return sum(1 for sub in operand.subscripts if sub.plain and sub.terms[0][0] == name) \
            == 1 and sum(1 for sub in operand.subscripts for n, _ in sub.terms
                         if n == name) == 1
    for name in gemm.k:
        if name in found.window or not all(own_axis(o, name) for o in found.operands):
            continue
        values = points((name,), ranges)
        if values > 1 and points(gemm.rows + gemm.cols + gemm.k, ranges) // values >= work:
            return name
    return None


def with_method(found: WindowedContraction, method: WindowMethod) -> WindowedContraction:
    return found if found.method is method else replace(found, method=method)


@functools.lru_cache(maxsize=512)
def _match(spec) -> _Match:
    accesses = list(ast.accesses(spec.rhs))
    windowed = any(not sub.plain_index for a in accesses for sub in a.indices)

    def no(reason: str) -> _Match:
        return _Match(None, reason if windowed else None)

    if spec.assign != ":=" and any(a.tensor == spec.output for a in accesses):
        return no("the statement reads its own output")
    body, summed = spec.rhs, ()
    if isinstance(body, ast.Reduce):
        if body.op != "sum":
            return no(f"the reduction is {body.op}, not a sum of products")
        body, summed = body.body, body.indices
    factors = product_factors(body)
    if factors is None:
        return no("the summed term is not a product of arrays and scalar factors")
    operands = [f for f in factors if isinstance(f, ast.Access)]
    scale = tuple(f for f in factors if not isinstance(f, ast.Access))
    if len(operands) != 2:
        return no(f"the product has {len(operands)} array factors, not two")
    views = []
    for access in operands:
        subscripts = []
        for sub in access.indices:
            if sub.gathers:
                return no(f"{format_expr(access)} gathers through an index array")
            if sub.quasi:
                return no(f"{format_expr(access)} has a // or % subscript")
            coefficients = {}
            for name, c in sub.terms:
                coefficients[name] = coefficients.get(name, 0) + c
            subscripts.append(Subscript(tuple((n, c) for n, c in coefficients.items()
                                              if c), sub.constant))
        axes = tuple(dict.fromkeys(n for s in subscripts for n, _ in s.terms))
        views.append(WindowedOperand(access.tensor, tuple(subscripts), axes,
                                     format_expr(access)))
    left, right = views
    if len(set(left.axes) & set(right.axes) & set(summed)) != len(set(summed)):
        return no("a summed index is not read by both arrays")
    groups = index_groups(spec.output_indices, left.axes, right.axes, summed)
    if groups is None:
        return no("an index is used by one array alone, neither kept nor shared")
    if not groups["m"] or not groups["n"]:
        return no("one array has no output index of its own (a matrix-vector shape, "
                  "which the loop nest reads as fast as BLAS)")
    window = tuple(n for n in groups["k"]
                   if any(n in dict(s.terms) for o in views for s in o.subscripts
                          if not s.plain))
    found = WindowedContraction(left, right, tuple(spec.output_indices),
                                *(tuple(groups[g]) for g in ("batch", "m", "n", "k")),
                                window, _gemm(spec.output_indices, groups, views), scale)
    return _Match(found, None)


def _gemm(out: Tuple[str, ...], groups, views) -> Gemm:
    """The GEMM's layout: the one whose product is the output in its own order
    (:func:`_in_order`), unless that copies an operand read through plain subscripts
    (a weight, an output gradient) which another layout reads in place, as its own axes
    lie (:func:`_in_place`): the result is then a transposed view, which its consumer
    reads in its memory order (a gradient's scatter walks the target's)."""
    in_order = _in_order(out, groups)
    for side, operand in enumerate(views):
        if all(s.plain for s in operand.subscripts) and \
                not _reads_in_place(in_order, operand.axes, side):
            found = _in_place(out, groups, operand.axes, side)
            if found is not None:
                return found
    return in_order


def _reads_in_place(gemm: Gemm, axes: Tuple[str, ...], side: int) -> bool:
    """Whether the operand with ``axes`` on ``side`` reaches ``gemm`` without a copy:
    its axes are the GEMM's batch axes it has, then its two groups in either order (a
    transposed matrix BLAS reads as it is)."""
    own = gemm.rows if side == gemm.rows_from else gemm.cols
    lead = tuple(n for n in gemm.pre if n in axes)
    return axes in (lead + own + gemm.k, lead + gemm.k + own)


def _in_place(out, groups, axes: Tuple[str, ...], side: int) -> Optional[Gemm]:
    """The layout that reads the operand with ``axes`` (on ``side``) as its axes lie:
    leading output indices as the batch, then its own output indices and the summed
    ones as two runs; None where its axes do not fall so."""
    own = set(groups["m"] if side == 0 else groups["n"])
    summed = set(groups["k"])
    batch = set(groups["batch"])
    for cut in range(len(axes) + 1):
        lead, rest = axes[:cut], axes[cut:]
        if not batch <= set(lead) or not set(lead) <= set(out) or not rest:
            continue
        first = [n for n in rest if n in own]
        second = [n for n in rest if n in summed]
        if len(first) + len(second) != len(rest) or not first or not second:
            continue
        if tuple(rest) not in (tuple(first + second), tuple(second + first)):
            continue
        # the other operand's own indices, in the output's order
        others = tuple(n for n in out if n not in lead and n not in own)
        if not others:
            continue
        pre = tuple(n for n in out if n in lead)       # the output's order
        if pre != tuple(lead):
            continue
        if tuple(rest) == tuple(first + second):        # (own, summed): the rows
            rows, cols, rows_from = tuple(first), others, side
        else:                                           # (summed, own): the columns
            rows, cols, rows_from = others, tuple(first), 1 - side
        grid = pre + rows + cols
        return Gemm(pre, rows, cols, tuple(second), rows_from,
                    tuple(grid.index(n) for n in out))
    return None


def _in_order(out: Tuple[str, ...], groups) -> Gemm:
    """The GEMM whose result is the output in its own order where one exists: the
    shortest run of leading output indices as batch, then the rows of one operand and
    the columns of the other; else batch, M, N and a transpose at the end."""
    side = {n: 0 for n in groups["m"]}
    side.update({n: 1 for n in groups["n"]})
    batch = set(groups["batch"])
    k = tuple(groups["k"])
    for start in range(len(out)):
        rest = out[start:]
        if batch & set(rest):
            continue
        runs = [side[rest[0]]]
        for name in rest[1:]:
            if side[name] != runs[-1]:
                runs.append(side[name])
        if len(runs) == 2:
            cut = next(n for n, name in enumerate(rest) if side[name] != runs[0])
            return Gemm(tuple(out[:start]), tuple(rest[:cut]), tuple(rest[cut:]), k,
                        runs[0], tuple(range(len(out))))
    grid = tuple(groups["batch"]) + tuple(groups["m"]) + tuple(groups["n"])
    return Gemm(tuple(groups["batch"]), tuple(groups["m"]), tuple(groups["n"]), k, 0,
                tuple(grid.index(n) for n in out))
