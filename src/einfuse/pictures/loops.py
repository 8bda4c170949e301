"""Loop nests as nested boxes: a statement's loops (parallel, serial, reductions) and an
``ef.jit`` function's program (loops drawn as loops, hoisted work outside them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from .svg import Drawing, text_width

KIND_COLOURS = {"parallel": "#dbeafe", "threads": "#bfdbfe", "blocked": "#ede9fe",
                "serial": "#f3f4f6", "vector": "#dcfce7",
                "reduction": "#fef3c7", "loop": "#ede9fe", "branch": "#fce7f3",
                "hoisted": "#dcfce7", "body": "#ffffff"}


@dataclass
class Block:
    """A box of the drawing: a loop (holding its body) or one line of work."""
    label: str
    kind: str                        # a key of KIND_COLOURS
    title: str
    children: List["Block"] = field(default_factory=list)


def statement_blocks(loops, body: str) -> List[Block]:
    """A statement's loop nest (``Explanation.loops``) as blocks: each output loop holds
    the next; the reductions' loops innermost, holding the statement's update."""
    root: List[Block] = []
    stack: List[Block] = []
    for level in loops:
        del stack[level.depth:]
        extent = "?" if level.extent is None else str(level.extent)
        kind = level.kind if level.kind in ("parallel", "serial") else "reduction"
        what = level.kind if kind != "reduction" else f"{level.kind} reduction"
        block = Block(f"for {level.index} < {extent}   ({what})", kind,
                      f"loop {level.index}: extent={level.extent}; {what}")
        (stack[-1].children if stack else root).append(block)
        stack.append(block)
    innermost = stack[-1].children if stack else root
    innermost.append(Block(body, "body", body))
    return root


def compiled_blocks(lines) -> Optional[List[Block]]:
    """A compiled kernel's pseudo-code (``Explanation.compiled_loop_nest``) as blocks: each
    loop line (the renderer's LoopLine, which says what kind of loop it is: threads,
    vector lanes, blocked by a tile, serial, reduction) holds the lines indented under it.
    None where no line says (a backend without that data): the text is shown instead."""
    if not any(hasattr(line, "kind") for line in lines):
        return None
    root: List[Block] = []
    stack: List[tuple] = []
    for line in lines:
        loop = hasattr(line, "kind")
        depth = line.depth if loop else (len(line) - len(line.lstrip(" "))) // 2
        while stack and stack[-1][0] >= depth:
            stack.pop()
        into = stack[-1][1].children if stack else root
        text = line.strip()
        if not loop:
            into.append(Block(text, "body", text))
            continue
        what = line.kind + (f" by {line.tile}" if line.tile else "") + \
            (", threads" if line.threads and line.kind != "threads" else "")
        block = Block(text, line.kind if line.kind in KIND_COLOURS else "serial",
                      f"compiled loop: kind={line.kind}; tile={line.tile}; {what}")
        into.append(block)
        stack.append((depth, block))
    return root


PAD = 10
LINE = 22


def draw_blocks(blocks: List[Block], title: str, kind: str,
                width: Optional[float] = None) -> Drawing:
    drawing = Drawing(title, kind)
    wanted = max((_width(b) for b in blocks), default=200)
    inner = max(width or 0, wanted)
    y = 4.0
    for block in blocks:
        y = _draw(drawing, block, 4.0, y, inner) + 6
    return drawing


def _width(block: Block) -> float:
    own = text_width(block.label) + 2 * PAD
    if not block.children:
        return own
    return max(own, max(_width(c) for c in block.children) + 2 * PAD)


def _draw(drawing: Drawing, block: Block, x: float, y: float, width: float) -> float:
    """Draw ``block`` at (x, y), ``width`` wide; return the y below it."""
    if not block.children:
        drawing.rect(x, y, width, LINE, rx=3, fill=KIND_COLOURS[block.kind], stroke="#ccc",
                     title=block.title)
        drawing.text(x + PAD, y + 15, block.label, title=block.title)
        return y + LINE
    start = y
    inner_y = y + LINE
    body = []
    for child in block.children:
        body.append((child, inner_y))
        inner_y = _measure(child, inner_y) + 4
    height = inner_y - start + 2
    drawing.rect(x, start, width, height, rx=5, fill=KIND_COLOURS[block.kind],
                 stroke="#888", title=block.title)
    drawing.text(x + PAD, start + 15, block.label, font_weight="bold", title=block.title)
    for child, child_y in body:
        _draw(drawing, child, x + PAD, child_y, width - 2 * PAD)
    return start + height


def _measure(block: Block, y: float) -> float:
    if not block.children:
        return y + LINE
    inner = y + LINE
    for child in block.children:
        inner = _measure(child, inner) + 4
    return inner + 2
