"""The HTML document around the drawings: self-contained (inline CSS and SVG; no
network, no script), readable at 1280 px and printable."""

from __future__ import annotations

from html import escape
from typing import List, Optional, Sequence

from ..errors import OptionError
from .svg import Drawing

STYLE = """
.einfuse-page { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; color: #222;
  max-width: 1240px; margin: 0 auto; padding: 12px 16px; background: #fff; }
.einfuse-page h1 { font-size: 20px; margin: 8px 0 4px; }
.einfuse-page h2 { font-size: 16px; margin: 18px 0 6px; border-bottom: 1px solid #ddd; }
.einfuse-page h3 { font-size: 14px; margin: 12px 0 4px; }
.einfuse-page pre { background: #f6f6f4; padding: 8px; font-size: 12px; overflow-x: auto;
  white-space: pre-wrap; }
.einfuse-page table { border-collapse: collapse; font-size: 13px; margin: 4px 0 8px; }
.einfuse-page th, .einfuse-page td { border: 1px solid #ccc; padding: 3px 8px;
  text-align: left; }
.einfuse-page td.num { text-align: right; font-variant-numeric: tabular-nums; }
.einfuse-page .note { color: #555; font-size: 13px; }
.einfuse-page .row { display: flex; flex-wrap: wrap; gap: 12px; align-items: flex-start; }
.einfuse-page svg { max-width: 100%; height: auto; }
@media print { .einfuse-page { max-width: none; } .einfuse-page h2 { break-after: avoid; }
  .einfuse-page svg { break-inside: avoid; } }
"""


class Page:
    """A page under construction: a title, then headings, drawings, tables and text."""

    def __init__(self, title: str, subtitle: Optional[str] = None):
        self.title = title
        self.parts: List[str] = []
        if subtitle:
            self.parts.append(f"<p class=\"note\">{escape(subtitle)}</p>")

    def heading(self, text: str, level: int = 2) -> None:
        self.parts.append(f"<h{level}>{escape(text)}</h{level}>")

    def drawing(self, drawing: Drawing) -> None:
        self.parts.append(drawing.svg())

    def drawings(self, drawings: Sequence[Drawing]) -> None:
        """Several drawings side by side (wrapping at the page's width)."""
        self.parts.append("<div class=\"row\">" + "".join(d.svg() for d in drawings) +
                          "</div>")

    def text(self, text: str) -> None:
        self.parts.append(f"<p class=\"note\">{escape(text)}</p>")

    def pre(self, lines: Sequence[str]) -> None:
        self.parts.append(self.pre_html(lines))

    @staticmethod
    def pre_html(lines: Sequence[str]) -> str:
        return "<pre>" + escape("\n".join(lines)) + "</pre>"

    def table(self, rows: Sequence[Sequence[str]], numeric: Sequence[int] = ()) -> None:
        """A table whose first row is the header; columns in ``numeric`` right-aligned."""
        head = "".join(f"<th>{escape(str(c))}</th>" for c in rows[0])
        body = []
        for row in rows[1:]:
            body.append("<tr>" + "".join(
                f"<td class=\"num\">{escape(str(c))}</td>" if k in numeric
                else f"<td>{escape(str(c))}</td>" for k, c in enumerate(row)) + "</tr>")
        self.parts.append(f"<table><tr>{head}</tr>{''.join(body)}</table>")

    def fragment(self) -> str:
        """The page as one ``<div>`` with its style (what Jupyter shows)."""
        return (f"<div class=\"einfuse-page\"><style>{STYLE}</style>"
                f"<h1>{escape(self.title)}</h1>{''.join(self.parts)}</div>")

    def document(self) -> str:
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
                f"<title>{escape(self.title)}</title></head><body style=\"margin:0\">"
                f"{self.fragment()}</body></html>\n")


def save_page(page: Page, path) -> None:
    """Write ``page`` as a self-contained HTML file; an OptionError naming the path where
    it cannot be written (nothing is left half-written: the page is built first)."""
    text = page.document()
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except (OSError, TypeError) as error:
        raise OptionError(f"cannot write the page to {path!r}: {error}") from None
