"""Helpers for the picture tests: parse a page (HTML and every SVG), read the numbers its
SVG titles and texts carry, and the docs' example pages."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from typing import Dict, List

import einfuse as ef

SVG = "{http://www.w3.org/2000/svg}"
VOID = {"meta", "br", "img", "hr", "input", "link", "col", "wbr", "source", "area"}


class _Nesting(HTMLParser):
    """Checks that every element closes in order (SVG's self-closed ones too)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: List[str] = []
        self.problems: List[str] = []
        self.tags: List[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:]} at {self.getpos()}")
            return
        self.stack.pop()


def parse_page(text: str) -> List[ET.Element]:
    """Assert ``text`` is well-nested HTML with no external resource; return its SVGs,
    each parsed as XML."""
    parser = _Nesting()
    parser.feed(text)
    parser.close()
    assert not parser.problems, parser.problems[:3]
    assert not parser.stack, parser.stack
    assert "svg" in parser.tags
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", text), "network reference"
    assert "<script" not in text
    svgs = [ET.fromstring(chunk) for chunk in re.findall(r"<svg\b.*?</svg>", text, re.S)]
    assert svgs
    return svgs


def titles(svgs, kind: str = None) -> List[str]:
    """Every <title> and <text> string of the SVGs (of ``data-kind`` ``kind``)."""
    found = []
    for svg in svgs:
        if kind is not None and svg.get("data-kind") != kind:
            continue
        for element in svg.iter():
            if element.tag in (SVG + "title", SVG + "text") and element.text:
                found.append(element.text)
    return found


def numbers(text: str) -> Dict[str, str]:
    """``key=value`` pairs of a title (``flops=20971520; bytes_read=...``)."""
    return dict(re.findall(r"(\w+)=([^;\s]+)", text))


SOFTMAX = """M[i] := max[j](X[i,j])
E[i,j] := exp(X[i,j] - M[i])
S[i] := sum[j](E[i,j])
Y[i,j] := E[i,j] / S[i]"""

ATTENTION = """S[b,h,i,j] := sum[r](Q[b,h,i,r]*K[b,h,j,r]) * scale
M[b,h,i] := max[j](S[b,h,i,j])
P[b,h,i,j] := exp(S[b,h,i,j] - M[b,h,i])
O[b,h,i,r] := sum[j](P[b,h,i,j]*V[b,h,j,r]) / sum[j](P[b,h,i,j])"""

MLP = """h[b,f] := relu(sum[d](x[b,d]*W1[d,f]))
y[b,o] := sum[f](h[b,f]*W2[f,o])"""


def docs_examples():
    """The pages docs/pictures.md shows (name -> explanation); small shapes."""
    qkv = (2, 4, 128, 32)
    return {
        "softmax": ef.explain(SOFTMAX, shapes={"X": (4096, 1024)}),
        "attention": ef.explain(ATTENTION, shapes={"Q": qkv, "K": qkv, "V": qkv},
                                scale=32 ** -0.5),
        "megatron": ef.explain(MLP, shapes={"x": (64, 1024), "W1": (1024, 4096),
                                            "W2": (4096, 1024)},
                               mesh={"data": 2, "model": 4},
                               shard={"b": "data", "f": "model"}),
    }
