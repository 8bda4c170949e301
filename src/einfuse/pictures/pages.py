"""The pages: what each explanation (a statement, a program, a plan on a mesh, an
``ef.jit`` function, a named expression) and ``einfuse bench`` draw."""

from __future__ import annotations

import math
from typing import List, Sequence

from .calibration import machine_limits
from .dataflow import Flow, draw_flow, jit_flow, program_flow, statement_flow
from .loops import Block, compiled_blocks, draw_blocks, statement_blocks
from .mesh import mesh_drawings, steps_rows
from .page import Page
from .roofline import Point, draw_roofline, roofline_rows
from .svg import Drawing
from .units import count, nbytes, seconds


def _machine_line(calibration) -> str:
    return f"this machine: {calibration.describe()} (einfuse calibrate)"


def _costs(page: Page, flops, read, written) -> None:
    if flops is None:
        page.text("Pass arrays or shapes= to see the costs, the bytes on every edge and the "
                  "roofline.")
        return
    moved = (read or 0) + (written or 0)
    page.table([["FLOPs", "bytes read", "bytes written", "FLOP/byte"],
                [f"{flops:,}", f"{read:,}", f"{written:,}",
                 f"{flops / moved:.2f}" if moved else "-"]], numeric=(0, 1, 2, 3))


def _roofline(page: Page, flow: Flow, measured=None) -> None:
    """``measured``: the explanation's Measured (measure=True), the time of the whole call:
    the one kernel's, or with several kernels a point for the whole."""
    points = [Point(f"kernel {k.number}", k.flops, (k.bytes_read or 0) + (k.bytes_written or 0))
              for k in flow.kernels if k.flops is not None]
    if not points:
        return
    seconds_ = getattr(measured, "seconds", None)
    if seconds_ is not None and len(points) == 1:
        points[0].measured_seconds = seconds_
    elif seconds_ is not None:
        points.append(Point("whole call", sum(p.flops for p in points),
                            sum(p.bytes_moved for p in points), seconds_))
    calibration = machine_limits()
    page.heading("Roofline")
    page.text("Each kernel's FLOPs per byte it moves through memory (its inputs and the "
              "arrays it writes to memory; rows and tiles kept per thread are not moved), "
              "against " + _machine_line(calibration) + ". A kernel left of the ridge is "
              "bound by memory; the dot sits at the best time the roof allows" +
              ("; the orange square at the measured time (measure=True)." if seconds_ else
               "; explain(..., measure=True) adds the measured time."))
    if any(p.bytes_moved > 0 and p.flops > 0 for p in points):
        page.drawing(draw_roofline(points, calibration))
    page.table(roofline_rows(points, calibration), numeric=(1, 2, 3, 5, 6))


def _loop_section(page: Page, parts, texts: Sequence[str], kernels) -> None:
    page.heading("Loop nests")
    page.text("Each statement's loops as its index roles give them (blue: parallel, grey: "
              "serial, yellow: a reduction), then the compiled kernel as the backend plans "
              "it: darker blue the loop split across threads, purple a loop blocked in "
              "steps (tiles, register blocks), green SIMD lanes.")
    for kernel in kernels:
        if len(kernels) > 1 or len(kernel.statements) > 1:
            page.heading(f"kernel {kernel.number}: {kernel.how}", 3)
        drawings = []
        for s in kernel.statements:
            part = parts[s]
            if part.loops is None:
                continue
            drawings.append(draw_blocks(statement_blocks(part.loops, f"{s + 1}. {texts[s]}"),
                                        f"loop nest of statement {s + 1}", "loops"))
        page.drawings(drawings)
        if len(kernel.statements) > 1 and any(parts[s].compiled_loop_nest
                                              for s in kernel.statements):
            page.text("Below, each statement's own compiled kernel, as it runs alone; in "
                      "this fused kernel the statements share the one loop over rows.")
        for s in kernel.statements:
            nest = parts[s].compiled_loop_nest
            if not nest:
                continue
            page.text(f"statement {s + 1}, compiled: {parts[s].strategy or ''}")
            blocks = compiled_blocks(nest)
            if blocks is None:
                page.pre(nest)
            else:
                page.drawing(draw_blocks(blocks, f"compiled loop nest of statement {s + 1}",
                                         "compiled"))


def attention_blocks(fused) -> List[Block]:
    """The online-softmax kernel's loops, from the FusedAttention's extents."""
    a = fused.attention
    batch = ", ".join(a.batch) or "one batch"
    inner = [Block(f"scores tile s = scaled Q·K over {fused.dot} (registers)", "body",
                   f"dot extent={fused.dot}"),
             Block("running max m, denominator l, accumulator rescaled by exp(m_old - m)",
                   "body", "the softmax-weighted-sum monoid"),
             Block(f"acc += exp(s - m) · V over {fused.features} features", "body",
                   f"features={fused.features}")]
    key = a.key_index if a.key_index.isidentifier() else "j"
    keys = Block(f"for key blocks of {key} < {fused.keys}   "
                 "(serial: one pass, online softmax)", "reduction",
                 f"keys={fused.keys}", inner)
    rows = Block(f"for blocks of rows {a.row} < {fused.rows}   (parallel)", "parallel",
                 f"rows={fused.rows}",
                 [keys, Block(f"{a.output} = acc / l" if a.normalised else f"{a.output} = acc",
                              "body", "the row's result, written once")])
    return [Block(f"for {batch}: {fused.groups} groups   (parallel)", "parallel",
                  f"groups={fused.groups}", [rows])]


def _text(page: Page, text: str) -> None:
    page.heading("The explanation as text")
    page.pre(text.splitlines())


def statement_page(explanation) -> Page:
    page = Page(explanation.statement.splitlines()[0], "einfuse explain: one statement")
    flow = statement_flow(explanation)
    page.heading("Dataflow")
    page.drawing(draw_flow(flow))
    _costs(page, explanation.flops, explanation.bytes_read, explanation.bytes_written)
    if explanation.hoisted:
        page.heading("Computed once (hoisted)", 3)
        page.pre(explanation.hoisted)
    _roofline(page, flow, explanation.measured)
    _loop_section(page, [explanation], [explanation.statement.splitlines()[0]], flow.kernels)
    _text(page, str(explanation))
    return page


def program_page(explanation) -> Page:
    n = len(explanation.statements)
    page = Page(f"Program of {n} statement{'s' if n != 1 else ''}",
                "einfuse explain: " + "; ".join(explanation.statements))
    flow = program_flow(explanation)
    page.heading("Dataflow")
    page.text(f"{len(flow.kernels)} kernel{'s' if len(flow.kernels) != 1 else ''}; "
              "each array is a lane: a disc where a statement writes it, an arrowhead where "
              "one reads it; blue: in memory, green dashed: kept per thread (a row, or "
              "blocks), grey: inputs, black: results.")
    page.drawing(draw_flow(flow))
    page.table([["kernel", "statements", "how", "FLOPs", "bytes read", "bytes written"]] +
               [[str(k.number), ", ".join(str(s + 1) for s in k.statements), k.how,
                 count(k.flops), nbytes(k.bytes_read), nbytes(k.bytes_written)]
                for k in flow.kernels], numeric=(3, 4, 5))
    page.heading("Cost of the whole program", 3)
    _costs(page, explanation.flops, explanation.bytes_read, explanation.bytes_written)
    _roofline(page, flow, explanation.measured)
    if explanation.attention is not None:
        page.heading("Loop nest of the fused attention kernel")
        page.drawing(draw_blocks(attention_blocks(explanation.attention),
                                 "loop nest of the fused attention", "loops"))
        page.pre(explanation.attention.lines())
    else:
        _loop_section(page, explanation.parts, explanation.statements, flow.kernels)
    _text(page, str(explanation))
    return page


def sharding_page(explanation) -> Page:
    plan = explanation.plan
    mesh = plan.mesh
    how = {"given": "as given by shard=", "default": "each index named like a mesh axis",
           "auto": "shard='auto': the cheapest by the cost model"}[explanation.choice.how]
    page = Page(f"Plan on mesh {mesh} ({mesh.size()} devices)",
                f"einfuse explain with mesh=: assignment {plan.assignment} ({how})")
    arrays, collectives, cards = mesh_drawings(explanation)
    page.heading("Each array's block on each device")
    page.text("One cell per device (the first mesh axis down, the others across); the "
              "filled part is the block the device holds; orange: a partial result still "
              "to be reduced.")
    page.drawings(arrays)
    page.heading("Steps, in order")
    page.table(steps_rows(plan))
    page.heading("Collectives")
    if collectives:
        page.text("Arrows run around each group's ring (devices that differ only along the "
                  "collective's mesh axes); the label gives the bytes each device sends.")
        page.drawings(collectives)
    else:
        page.text("None: every device computes its part from the blocks it holds.")
    page.heading("Alternatives (the model's time per device; blue: compute, red: "
                 "communication)")
    search = explanation.choice.search
    if explanation.choice.how == "auto":
        page.text(f"shard='auto' tried {search.tried} assignments "
                  f"({'every one' if search.exhaustive else 'greedy search'}) and kept "
                  "the one with the least modelled time (ties: fewer collectives, then "
                  "fewer input bytes per device).")
    page.drawings(cards)
    model = explanation.model
    page.text(f"Cost model: FLOPs / {model.flops_per_second:.3g} FLOP/s + per collective "
              f"{seconds(model.latency_seconds)} + bytes sent / "
              f"{model.bytes_per_second:.3g} B/s (cost_model= to change).")
    _text(page, str(explanation))
    return page


def jit_page(explanation) -> Page:
    page = Page(f"ef.jit of {explanation.name}", "einfuse explain: one generated C kernel "
                "for the whole function; loops run inside it")
    if explanation.blocks is not None:
        flow = jit_flow(explanation)
        page.heading("Dataflow")
        page.text("The function's top-level steps in order, inside its one kernel; each "
                  "buffer a lane (a disc where a step first writes it, arrowheads where "
                  "steps read it; a loop reads and writes what its body does).")
        page.drawing(draw_flow(flow))
        page.heading("The program (loops drawn as loops; green: hoisted, computed once)")
        page.drawing(draw_blocks(explanation.blocks, f"program of {explanation.name}",
                                 "loops"))
        page.text("For the roofline, the kernel's operations are counted as the text counts "
                  "them (a while loop's body once) and its bytes as the inputs read and the "
                  "outputs written once (the temporaries are the function's scratch "
                  "buffers).")
        _roofline(page, flow)
    _text(page, str(explanation))
    return page


def front_end_page(inner, lead: str, whole_text: str) -> Page:
    """An einsum string's or einops pattern's page: the statement's (``inner``) with the
    call it stands for first; a text page where no kernel runs (``inner`` None)."""
    if inner is None:
        page = Page(lead.splitlines()[0], "no kernel runs")
        _text(page, whole_text)
        return page
    page = inner.page()
    page.parts.insert(0, Page.pre_html(lead.splitlines()))
    return page


def named_page(explanation, legend: List[str]) -> Page:
    page = explanation.page()
    page.heading("Names in the program")
    page.pre(legend)
    return page


def bench_page(results, table: List[List[str]], machine: str) -> Page:
    """``einfuse bench --html``: per case, each implementation's median time (bars, log
    scale) and its ratio to einfuse's; the table below."""
    page = Page("einfuse bench", machine)
    cases = list(dict.fromkeys(m.case for m in results))
    page.heading("Times per case (median; log scale) and peer / einfuse")
    drawings = []
    for case in cases:
        drawings.append(_bench_chart(case, [m for m in results if m.case == case]))
    page.drawings(drawings)
    page.heading("Table")
    page.table(table, numeric=(2, 3))
    return page


def _bench_chart(case: str, measurements) -> Drawing:
    drawing = Drawing(f"bench case {case}", "bench")
    drawing.text(2, 14, case if len(case) <= 60 else case[:59] + "…", size=12,
                 font_weight="bold", title=case)
    base = next((m.median_s for m in measurements if m.implementation == "einfuse"), None)
    timed = [m.median_s for m in measurements if m.median_s]
    if not timed:
        drawing.text(2, 34, "nothing timed", size=11)
        return drawing
    lo, hi = math.log10(min(timed)) - 0.5, math.log10(max(timed)) + 0.2
    for k, m in enumerate(measurements):
        y = 24 + k * 20
        drawing.text(120, y + 12, m.implementation[:16], size=11, anchor="end")
        if not m.median_s:
            drawing.text(126, y + 12, "not timed", size=10, fill="#888")
            continue
        width = 8 + 260 * (math.log10(m.median_s) - lo) / max(hi - lo, 1e-9)
        ratio = m.median_s / base if base else None
        title = (f"{case} · {m.implementation}: median_seconds={m.median_s:.6g}" +
                 (f"; ratio={ratio:.4g}" if ratio is not None else ""))
        drawing.rect(126, y + 2, width, 14, fill="#2563eb" if m.implementation == "einfuse"
                     else "#9ca3af", title=title)
        label = seconds(m.median_s) + ("" if ratio is None or m.implementation == "einfuse"
                                       else f" · {ratio:.2f}x")
        drawing.text(132 + width, y + 13, label, size=10, title=title)
    drawing.width = max(drawing.width, 460)
    return drawing
