"""The panel form of a windowed contraction (plan/windowed_contraction.py): a 2-D
convolution's GEMMs over patch panels a third of im2col's, no col2im.

Where the windowed operand's outer windowed axis reads ``i + s*p + e`` (an index ``i``
of coefficient 1, a window index ``p``), the patches of all values of ``p`` are one
matrix shifted: pack the *panel* ``X[(c, q), (r, t)]`` -- the window indices of the
other windowed axes folded into the rows beside the channels, ``r`` over every row any
``i + s*p`` reaches, ``t`` over the inner positions -- and the patches of window row
``p`` are the columns ``(r, t)`` from ``(shift(p) + i) * T + t``: a plain column window
of the panel (BLAS reads it in place, leading dimension the panel's).  So

* a forward ``y[b, o, i, j] = sum_{c,p,q} x[b, c, i+s*p+e, 2*j+q+f] w[o, c, p, q]`` is
  ``y_b = sum_p W_p @ panel_b[:, shift(p) T : shift(p) T + I T]`` (``kh`` GEMMs of
  K = C*kw accumulated into the image's result, which they write in place);
* a weight gradient ``dw[o, c, p, q] = sum_{b,i,j} dy[b, o, i, j] x[b, c, i+s*p+e, ..]``
  is ``dW_p = sum_b dy_b @ panel_b[:, shift(p) T : ...]^T``, over the same panels (a
  torch node's forward keeps them: backends/c/window_pack.PackMemo);
* a stride-1 input gradient ``dx[b, c, k, l] = sum dy[b, o, k-p+1, l-q+1] w[o, c, p, q]``
  is the forward's form with ``s = -1`` (the transposed convolution, gathered);
* a 1-D convolution has nothing to fold: its panel is the padded image, one GEMM of
  K = C per window offset (no patches at all).

Every read of a panel column is a read of the statement (the pad value outside the
array), no extra columns: the values are the gather's, summed in another order.

:func:`panel_form` finds the form from the index expressions alone; whether a call
uses it is schedule/choose.py's rule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from .windowed_contraction import WindowedContraction


@dataclass(frozen=True)
class PanelForm:
    """The roles of a windowed contraction in the panel form.

    ``windowed``: which operand (0, 1) is read through windows (X), the other (Y) reads
    plain subscripts; ``gradient``: the window indices are output indices and the
    positions summed (a weight gradient) rather than the reverse.  ``images``: X's
    plain index of its own (output in a forward, summed and read by Y in a gradient),
    at most one; ``channels``: X's plain indices shared with Y (summed in a forward,
    X's own output indices in a gradient); ``own``: Y's indices X lacks besides the
    positions (output).  ``row``: (X axis, position index, window index, window
    coefficient) of the looped axis; ``folded``: the same for each other windowed axis
    (their window indices packed beside the channels)."""
    windowed: int
    gradient: bool
    images: Tuple[str, ...]
    channels: Tuple[str, ...]
    own: Tuple[str, ...]
    row: Tuple[int, str, str, int]
    folded: Tuple[Tuple[int, str, str, int], ...]

    @property
    def positions(self) -> Tuple[str, ...]:
        return (self.row[1],) + tuple(f[1] for f in self.folded)

    @property
    def offsets(self) -> Tuple[str, ...]:
        return (self.row[2],) + tuple(f[2] for f in self.folded)

    def describe(self) -> str:
        folded = ",".join(self.offsets[1:]) or "no window index"
        return (f"panels: one GEMM per value of {self.row[2]} over shifted column windows "
                f"of one panel an image ({folded} packed beside "
                f"{','.join(self.channels) or '-'}: 1/{self.row[2]}'s extent of the "
                f"patches, no col2im)")


def panel_form(found: WindowedContraction, ranges=None) -> Optional[PanelForm]:
    """The contraction's panel form, or None where it has none: one operand read
    through windows, one or more of its axes ``pos + s*win + e`` (each index in that
    subscript alone, the first axis's ``pos`` of coefficient 1), every other subscript
    of either operand one plain index used once.

    ``y[o,i] := x[c,i+a] * w[o,c,a]`` reads both ways: a forward (a GEMM per window
    offset ``a``) and, the terms' roles swapped, a weight gradient's form (a GEMM per
    ``i``); so does a weight gradient.  Where both fit, the form with fewer GEMMs (the
    smaller extent of the looped window index, by ``ranges``: name -> (lo, hi)) is
    the one, the forward's on a tie or without ranges."""
    readings = [form for form in (_reading(found, False), _reading(found, True))
                if form is not None]
    if len(readings) < 2 or ranges is None:
        return readings[0] if readings else None

    def gemms(form: PanelForm) -> int:
        lo, hi = ranges[form.row[2]]
        return hi - lo
    return min(readings, key=gemms)


def _reading(found: WindowedContraction, gradient: bool) -> Optional[PanelForm]:
    """The panel form that reads the window subscripts as a forward's or (``gradient``)
    as a weight gradient's, or None."""
    sides = [side for side, o in enumerate(found.operands)
             if not all(sub.plain for sub in o.subscripts)]
    if len(sides) != 1:
        return None
    side = sides[0]
    x, y = found.operands[side], found.operands[1 - side]
    if len(set(y.axes)) != len(y.subscripts) or not all(s.plain for s in y.subscripts):
        return None
    output, summed = set(found.output), set(found.k)
    windowed, plain = [], []
    for axis, sub in enumerate(x.subscripts):
        if sub.plain:
            plain.append(sub.terms[0][0])
            continue
        if len(sub.terms) != 2:
            return None
        (a, ca), (b, cb) = sub.terms
        # the position: the index of the output (forward) or summed with Y reading it
        # plainly (gradient) whose partner is a window index of Y; a subscript fits one
        # pattern one way round exactly where it fits the other the other way round,
        # so ``gradient`` (the reading asked for) decides, not the terms' order
        for pos, cp, win, cw in ((a, ca, b, cb), (b, cb, a, ca)):
            # (one index an output index X alone reads, its partner summed with Y)
            own, shared = (win, pos) if gradient else (pos, win)
            if own in output and own not in y.axes and shared in y.axes and \
                    shared in summed:
                windowed.append((axis, pos, win, cw, cp))
                break
        else:
            return None
    if not windowed or windowed[0][4] != 1:
        return None
    names = [n for w in windowed for n in (w[1], w[2])] + plain
    if len(set(names)) != len(names):
        return None             # (an index read twice by X)
    if gradient:
        images = tuple(n for n in plain if n in y.axes)
        channels = tuple(n for n in plain if n not in y.axes)
        if any(n not in summed for n in images) or any(n not in output for n in channels):
            return None
    else:
        images = tuple(n for n in plain if n not in y.axes)
        channels = tuple(n for n in plain if n in y.axes)
        if any(n not in output for n in images) or any(n not in summed for n in channels):
            return None
    if len(images) > 1:
        return None
    positions = {w[1] for w in windowed}
    own = tuple(n for n in y.axes if n not in x.axes)
    if any(n not in output for n in own) or set(y.axes) & positions and not gradient:
        return None
    expected = set(images) | set(own) | positions if not gradient else \
        set(own) | set(channels) | {w[2] for w in windowed}
    if set(found.output) != expected:
        return None
    # (a folded axis keeps its position's coefficient, a stride: the pack reads it)
    row = windowed[0][:4]
    folded = tuple(w[:4] for w in windowed[1:])
    return PanelForm(side, gradient, images, channels, own, row, folded)
