"""A small SVG writer: elements as escaped strings, one drawing per ``Drawing``.

Every number a drawing shows is also in a ``<title>`` (the hover text) or a ``<text>``
element, written by ``label``/``titled``, so tests and readers can read it back."""

from __future__ import annotations

from html import escape
from typing import List, Optional

FONT = "font-family:ui-monospace,Menlo,Consolas,monospace"
CHAR_WIDTH = 7.2        # of the 12 px monospace font, for sizing boxes around text


def attributes(**values) -> str:
    """``key="value"`` pairs, escaped; ``class_`` is written ``class``, ``_`` in other names
    ``-`` (stroke_width -> stroke-width); None values are left out."""
    parts = []
    for key, value in values.items():
        if value is None:
            continue
        name = "class" if key == "class_" else key.replace("_", "-")
        if isinstance(value, float):
            value = f"{value:.2f}".rstrip("0").rstrip(".")
        parts.append(f'{name}="{escape(str(value), quote=True)}"')
    return " ".join(parts)


def text_width(text: str, size: float = 12) -> float:
    return len(text) * CHAR_WIDTH * size / 12


class Drawing:
    """One ``<svg>``: elements appended in order, the size given at the end (``svg()``),
    so a caller may grow it while laying things out."""

    def __init__(self, title: str, kind: str):
        self.title = title
        self.kind = kind          # data-kind: which drawing this is (dataflow, loops, ...)
        self.items: List[str] = []
        self.width = 0.0
        self.height = 0.0

    def grow(self, x: float, y: float) -> None:
        self.width = max(self.width, x)
        self.height = max(self.height, y)

    def rect(self, x, y, w, h, title: Optional[str] = None, **style) -> None:
        self.grow(x + w, y + h)
        shape = attributes(x=float(x), y=float(y), width=float(w), height=float(h), **style)
        self.items.append(titled(f"<rect {shape}", title))

    def line(self, x1, y1, x2, y2, title: Optional[str] = None, **style) -> None:
        self.grow(max(x1, x2), max(y1, y2))
        shape = attributes(x1=float(x1), y1=float(y1), x2=float(x2), y2=float(y2), **style)
        self.items.append(titled(f"<line {shape}", title))

    def path(self, d: str, title: Optional[str] = None, **style) -> None:
        self.items.append(titled(f"<path {attributes(d=d, **style)}", title))

    def circle(self, cx, cy, r, title: Optional[str] = None, **style) -> None:
        self.grow(cx + r, cy + r)
        shape = attributes(cx=float(cx), cy=float(cy), r=float(r), **style)
        self.items.append(titled(f"<circle {shape}", title))

    def text(self, x, y, content: str, size: float = 12, anchor: str = "start",
             title: Optional[str] = None, **style) -> None:
        width = text_width(content, size)
        left = {"start": x, "middle": x - width / 2, "end": x - width}[anchor]
        self.grow(left + width, y + 4)
        style.setdefault("fill", "#222")
        body = escape(content, quote=False)
        head = "<text " + attributes(x=float(x), y=float(y), font_size=size,
                                     text_anchor=anchor, **style) + ">"
        if title:
            body += f"<title>{escape(title, quote=False)}</title>"
        self.items.append(f"{head}{body}</text>")

    def raw(self, element: str) -> None:
        self.items.append(element)

    def svg(self, margin: float = 8) -> str:
        width, height = self.width + margin, self.height + margin
        head = attributes(xmlns="http://www.w3.org/2000/svg", width=float(width),
                          height=float(height), viewBox=f"0 0 {width:.0f} {height:.0f}",
                          role="img", data_kind=self.kind, style=FONT)
        return (f"<svg {head}><title>{escape(self.title, quote=False)}</title>" +
                "".join(self.items) + "</svg>")


def titled(opening: str, title: Optional[str]) -> str:
    """An element from its opening tag (without '>'): self-closed, or holding a title."""
    if title is None:
        return opening + "/>"
    name = opening[1:].split(" ", 1)[0]
    return f"{opening}><title>{escape(title, quote=False)}</title></{name}>"


def arrow_marker(drawing: Drawing, name: str, colour: str) -> None:
    """An arrowhead ``url(#name)`` for lines of this drawing."""
    drawing.raw(f'<defs><marker id="{name}" viewBox="0 0 10 10" refX="9" refY="5" '
                f'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
                f'<path d="M0,0 L10,5 L0,10 z" fill="{colour}"/></marker></defs>')
