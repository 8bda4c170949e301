"""The dataflow of a statement or program: statements as boxes grouped into the kernels
that run them, each array as a lane (an edge from the statement that writes it to the
statements that read it) labelled with its bytes and where it lives.

Reads the explanation objects' public data only: a program's ``statements``, ``parts``
(each statement's explanation, whose ``inputs`` and ``output`` name the arrays with
their bytes), ``groups`` (the kernels), ``materialised`` and ``attention``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .svg import Drawing, text_width
from .units import count, nbytes, shape

LIVES_WORDS = {"input": "input (in memory)", "output": "result (written to memory)",
               "memory": "materialised (in memory)",
               "row": "one row per thread (registers/cache), never in memory whole",
               "tile": "blocks per thread (registers/tile), never in memory"}
COLOURS = {"input": "#6b7280", "output": "#111827", "memory": "#2563eb", "row": "#059669",
           "tile": "#059669"}
KERNEL_FILLS = ("#fef3c7", "#e0f2fe", "#ede9fe", "#fce7f3", "#dcfce7", "#ffedd5")


@dataclass
class Lane:
    """One array of the dataflow."""
    name: str
    shape: tuple
    dtype: str
    nbytes: int
    lives: str                    # a key of LIVES_WORDS
    producer: Optional[int] = None      # statement (0-based) that writes it; None: input
    readers: List[int] = field(default_factory=list)
    live_bytes: Optional[int] = None    # bytes per thread where it lives as a row

    def label(self) -> str:
        if self.lives == "row":
            return f"{nbytes(self.live_bytes)}/thread"
        if self.lives == "tile":
            return "tile only"
        return nbytes(self.nbytes)

    def title(self) -> str:
        where = LIVES_WORDS[self.lives]
        extra = f"; {self.live_bytes} bytes per thread instead" if self.lives == "row" else ""
        return (f"{self.name}: {self.dtype} {shape(self.shape)}, {self.nbytes} bytes; "
                f"{where}{extra}")


@dataclass
class KernelBox:
    number: int                   # 1-based
    statements: List[int]         # 0-based
    how: str
    flops: Optional[int]
    bytes_read: Optional[int]
    bytes_written: Optional[int]
    detail: str = ""

    @property
    def intensity(self) -> Optional[float]:
        moved = (self.bytes_read or 0) + (self.bytes_written or 0)
        return None if self.flops is None or not moved else self.flops / moved

    def title(self) -> str:
        which = ", ".join(str(s + 1) for s in self.statements)
        return (f"kernel {self.number}: statements {which}; {self.how}; flops={self.flops}; "
                f"bytes_read={self.bytes_read}; bytes_written={self.bytes_written}")


@dataclass
class Flow:
    statements: List[str]
    kernels: List[KernelBox]
    lanes: List[Lane]
    flops: Optional[int]
    bytes_read: Optional[int]
    bytes_written: Optional[int]


def _group_how(group) -> str:
    if len(group.statements) == 1:
        return "alone"
    if group.row_kernel == "triton":
        return "fused: one Triton kernel, whole rows in registers"
    if group.row_kernel is not None:
        return f"fused: the {group.row_kernel} row kernel"
    how = "fused: one loop over rows"
    if group.column_sums:
        how += ", column sums as rows pass"
    return how


def statement_flow(explanation) -> Flow:
    """The flow of one statement's explanation: one kernel."""
    text = explanation.statement.splitlines()[0]
    kernel = KernelBox(1, [0], (explanation.strategy or "shapes not given"),
                       explanation.flops, explanation.bytes_read, explanation.bytes_written)
    return _build([text], [explanation], [kernel], set(), {}, None,
                  (explanation.flops, explanation.bytes_read, explanation.bytes_written))


def program_flow(explanation) -> Flow:
    """The flow of a program's explanation: its kernels, in order."""
    parts = explanation.parts
    statements = len(explanation.statements)
    materialised = {m.name: m for m in explanation.materialised or ()}
    attention = explanation.attention
    if attention is not None:
        kernels = [KernelBox(1, list(range(statements)), "fused attention (online softmax)",
                             attention.flops, attention.bytes_read, attention.bytes_written)]
    else:
        groups = explanation.groups
        if groups is None:
            from_groups = [([i], "alone") for i in range(statements)]
        else:
            from_groups = [(list(g.statements), _group_how(g)) for g in groups]
        kernels = [KernelBox(n, members, how, None, None, None)
                   for n, (members, how) in enumerate(from_groups, 1)]
    totals = (explanation.flops, explanation.bytes_read, explanation.bytes_written)
    return _build(list(explanation.statements), parts, kernels, set(explanation.outputs),
                  materialised, attention, totals)


def jit_flow(explanation) -> Flow:
    """An ``ef.jit`` function's flow: one kernel (the generated C function) running its
    top-level steps; every buffer a lane (the function's temporaries live in memory)."""
    steps = list(explanation.flow_steps)
    lanes = []
    for array in explanation.flow_arrays:
        lives = {"input": "input", "output": "output"}.get(array.role, "memory")
        producer = None if array.role == "input" or not array.writers else array.writers[0]
        readers = [r for r in array.readers if r != producer]
        if producer is None and not readers and array.role != "input":
            continue
        lanes.append(Lane(array.name, array.shape, array.dtype, array.nbytes, lives,
                          producer, readers))
    read = sum(a.nbytes for a in explanation.flow_arrays if a.role == "input")
    written = sum(a.nbytes for a in explanation.flow_arrays if a.role == "output")
    kernel = KernelBox(1, list(range(len(steps))), "one generated C function (ef.jit)",
                       explanation.operations, read, written)
    return Flow(steps, [kernel], lanes, explanation.operations, read, written)


def _build(texts, parts, kernels, outputs, materialised, attention, totals) -> Flow:
    lanes: Dict[str, Lane] = {}
    for position, part in enumerate(parts):
        for operand in part.inputs or ():
            lane = lanes.get(operand.name)
            if lane is None:
                lane = lanes[operand.name] = Lane(operand.name, operand.shape, operand.dtype,
                                                  operand.nbytes, "input")
            if position not in lane.readers and lane.producer != position:
                lane.readers.append(position)
        result = part.output
        if result is None:
            continue
        lane = lanes.get(result.name)
        if lane is None or lane.lives == "input":
            lives = "output" if result.name in outputs or not outputs else "memory"
            found = materialised.get(result.name)
            if lives == "memory" and attention is not None:
                lives = "tile"
            elif lives == "memory" and found is not None and found.row_bytes is not None:
                lives = "row"
            lanes[result.name] = Lane(result.name, result.shape, result.dtype,
                                      result.nbytes, lives, position,
                                      live_bytes=found.row_bytes if found else None)
    flow = Flow(texts, kernels, list(lanes.values()), *totals)
    if attention is None:
        for kernel in kernels:
            _kernel_costs(kernel, flow, parts)
    return flow


def _kernel_costs(kernel: KernelBox, flow: Flow, parts) -> None:
    """A kernel's FLOPs (its statements') and the bytes it moves through memory: each array
    it reads that it does not write itself (inputs, other kernels' results) once, and each
    array it writes that lives in memory."""
    flops = [parts[s].flops for s in kernel.statements]
    if any(f is None for f in flops):
        return
    kernel.flops = int(sum(flops))
    inside = set(kernel.statements)
    read = written = 0
    for lane in flow.lanes:
        made_here = lane.producer in inside
        if not made_here and inside & set(lane.readers):
            read += lane.nbytes
        if made_here and lane.lives in ("memory", "output"):
            written += lane.nbytes
    kernel.bytes_read, kernel.bytes_written = read, written


# -- drawing -------------------------------------------------------------------------------
ROW = 34
LANE = 124
HEADER = 64
TEXT_LIMIT = 64


def draw_flow(flow: Flow) -> Drawing:
    """Statements top to bottom inside their kernels' boxes; arrays as vertical lanes to the
    right: a disc where a statement writes the array, an arrowhead where one reads it."""
    drawing = Drawing("dataflow: statements grouped into kernels, arrays as lanes with "
                      "their bytes and where they live", "dataflow")
    longest = max((min(len(t), TEXT_LIMIT) + 4 for t in flow.statements), default=20)
    headers = {k.number: _header(k) for k in flow.kernels}
    box_width = max([300.0, text_width("x" * longest) + 40] +
                    [text_width(h, 11) + 20 for h in headers.values()])
    left = 10.0
    lanes_x = left + box_width + 30
    top = HEADER + 10
    # rows: each kernel a title row, then its statements
    rows: Dict[int, float] = {}
    y = top
    kernel_spans = []
    for kernel in flow.kernels:
        start = y
        y += 22
        for s in kernel.statements:
            rows[s] = y + ROW / 2
            y += ROW
        kernel_spans.append((kernel, start, y))
        y += 10
    bottom = y
    for k, (kernel, start, end) in enumerate(kernel_spans):
        drawing.rect(left, start, box_width, end - start, title=kernel.title(), rx=6,
                     fill=KERNEL_FILLS[k % len(KERNEL_FILLS)], stroke="#999")
        drawing.text(left + 8, start + 15, headers[kernel.number], size=11,
                     font_weight="bold", title=kernel.title())
        for s in kernel.statements:
            drawing.rect(left + 14, rows[s] - ROW / 2 + 3, box_width - 28, ROW - 6,
                         rx=4, fill="#fff", stroke="#bbb",
                         title=f"statement {s + 1}: {flow.statements[s]}")
            drawing.text(left + 22, rows[s] + 4, _clip(f"{s + 1}. {flow.statements[s]}",
                                                       TEXT_LIMIT),
                         title=f"statement {s + 1}: {flow.statements[s]}")
    for s, row in rows.items():            # faint guides from each box across the lanes
        drawing.line(left + box_width, row, lanes_x + LANE * len(flow.lanes) - LANE / 2, row,
                     stroke="#eee")
    for k, lane in enumerate(flow.lanes):
        _draw_lane(drawing, lane, lanes_x + LANE * k, rows, top, bottom)
    drawing.height = max(drawing.height, bottom)
    return drawing


def _draw_lane(drawing: Drawing, lane: Lane, x: float, rows, top: float,
               bottom: float) -> None:
    colour = COLOURS[lane.lives]
    title = lane.title()
    drawing.text(x, 16, lane.name, size=13, anchor="middle", font_weight="bold", title=title)
    drawing.text(x, 32, _clip(f"{lane.dtype} {shape(lane.shape)}", 20), size=9.5,
                 anchor="middle", title=title)
    drawing.text(x, 48, lane.label(), size=11, anchor="middle", fill=colour, title=title)
    if lane.lives in ("row", "tile"):
        drawing.text(x, 60, "never in memory" if lane.lives == "tile" else "row per thread",
                     size=9, anchor="middle", fill=colour)
    start = top if lane.producer is None else rows[lane.producer]
    points = [rows[r] for r in lane.readers if r in rows]
    end = max(points + [start]) if lane.lives != "output" else bottom
    dash = "5,4" if lane.lives in ("row", "tile") else None
    drawing.line(x, start, x, end, title=title, stroke=colour, stroke_width=3 if
                 lane.lives != "input" else 2, stroke_dasharray=dash)
    if lane.producer is not None:
        drawing.circle(x, rows[lane.producer], 6, fill=colour,
                       title=f"statement {lane.producer + 1} writes {lane.name}")
    for r in lane.readers:
        if r in rows:
            y = rows[r]
            head = f"M{x - 6:.0f},{y - 7:.0f} L{x + 6:.0f},{y - 7:.0f} L{x:.0f},{y:.0f} z"
            drawing.path(head, fill=colour, title=f"statement {r + 1} reads {lane.name}")


def _header(kernel: KernelBox) -> str:
    head = _clip(f"kernel {kernel.number}: {kernel.how}", 60)
    if kernel.flops is None:
        return head
    moved = (kernel.bytes_read or 0) + (kernel.bytes_written or 0)
    return f"{head} · {count(kernel.flops)} FLOPs · {nbytes(moved)} moved"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:max(limit - 1, 1)] + "…"
