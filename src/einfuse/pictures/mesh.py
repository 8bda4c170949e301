"""Pictures of a plan on a device mesh: the grid of devices, each array's block on each
device, every collective as arrows between the devices of its groups with the bytes
each sends, and the alternatives side by side with the cheapest marked.

Reads a ShardingExplanation's public data (``plan``, ``collectives``, ``cheapest``,
``alternatives()``, ``cost(plan)``, ``choice.how``) by duck typing: a plan's steps are
statements (they have ``split``) or moves (they have ``kind``)."""

from __future__ import annotations

import itertools
from typing import Dict, List, Optional, Tuple

from .svg import Drawing, arrow_marker
from .units import count, nbytes, seconds, shape

Coordinates = Dict[str, int]
BLOCK = "#2563eb"
PARTIAL = "#f59e0b"


def devices(mesh) -> List[Coordinates]:
    """Every device's coordinates, in the mesh's row-major order."""
    names = [n for n, _ in mesh.axes]
    return [dict(zip(names, c)) for c in itertools.product(*(range(s) for _, s in mesh.axes))]


def grid_position(mesh, device: Coordinates) -> Tuple[int, int]:
    """(row, column) of a device in the drawn grid: the first mesh axis down, the others
    across (row-major), one row for a one-axis mesh."""
    axes = list(mesh.axes)
    if len(axes) == 1:
        return 0, device[axes[0][0]]
    column = 0
    for name, size in axes[1:]:
        column = column * size + device[name]
    return device[axes[0][0]], column


def grid_shape(mesh) -> Tuple[int, int]:
    axes = list(mesh.axes)
    if len(axes) == 1:
        return 1, axes[0][1]
    columns = 1
    for _, size in axes[1:]:
        columns *= size
    return axes[0][1], columns


def block_of(layout, shape_, mesh, device: Coordinates):
    """For each array axis, (first, stop) of the block ``device`` holds."""
    sizes = dict(mesh.axes)
    spans = []
    for extent, axes in zip(shape_, layout):
        parts, index = 1, 0
        for name in axes:
            index = index * sizes[name] + device[name]
            parts *= sizes[name]
        size = extent // parts if parts else extent
        spans.append((index * size, index * size + size))
    return spans


def device_text(device: Coordinates) -> str:
    return ", ".join(f"{k}={v}" for k, v in device.items())


def _drawn_axes(layout) -> Tuple[Optional[int], Optional[int]]:
    """Which array axes the block drawing shows down and across: split axes first."""
    rank = len(layout)
    if rank == 0:
        return None, None
    if rank == 1:
        return None, 0
    split = [a for a in range(rank) if layout[a]]
    if len(split) >= 2:
        return split[0], split[1]
    if split and split[0] != 0:
        return 0, split[0]
    return 0, rank - 1


CELL_W, CELL_H, GAP = 58, 40, 6


def draw_placement(name: str, dtype: str, shape_, placement, mesh, role: str) -> Drawing:
    """One array on the mesh: each device's cell shows the whole array's outline and, filled,
    the block that device holds (orange: a partial value still to be reduced)."""
    drawing = Drawing(f"{role} {name}: {dtype} {shape(shape_)} at {placement}", "placement")
    rows, columns = grid_shape(mesh)
    local = placement.local_shape(tuple(shape_), mesh)
    drawing.text(2, 14, f"{name} ({role})  {shape(shape_)} {dtype}", size=12,
                 font_weight="bold",
                 title=f"{name}: {role}; shape={shape(shape_)}; placement={placement}")
    drawing.text(2, 30, f"{placement}  · {shape(local)} per device", size=10)
    pending = getattr(placement, "pending", None)
    down, across = _drawn_axes(placement.layout)
    for device in devices(mesh):
        row, column = grid_position(mesh, device)
        x, y = 2 + column * (CELL_W + GAP), 40 + row * (CELL_H + GAP)
        spans = block_of(placement.layout, shape_, mesh, device)
        drawing.rect(x, y, CELL_W, CELL_H, fill="#f9fafb", stroke="#9ca3af",
                     title=f"device ({device_text(device)})")
        inner = [(x + 4, CELL_W - 8), (y + 4, CELL_H - 8)]
        box = []
        for axis, (start, size) in ((across, inner[0]), (down, inner[1])):
            if axis is None or shape_[axis] == 0:
                box.append((start, size))
            else:
                lo, hi = spans[axis]
                box.append((start + size * lo / shape_[axis],
                            max(size * (hi - lo) / shape_[axis], 1.5)))
        held = ", ".join(f"axis {a}: {lo}..{hi - 1}" for a, (lo, hi) in enumerate(spans))
        title = (f"device ({device_text(device)}) holds {name} block {held or 'scalar'}; "
                 f"local shape {shape(local)}" + (f"; partial {pending.op}" if pending else ""))
        drawing.rect(x + 4, y + 4, CELL_W - 8, CELL_H - 8, fill="#fff", stroke="#d1d5db")
        drawing.rect(box[0][0], box[1][0], box[0][1], box[1][1],
                     fill=PARTIAL if pending else BLOCK, opacity=0.8, title=title)
    drawing.height += 4
    return drawing


def draw_collective(number: int, move, mesh) -> Drawing:
    """A collective: the device grid with arrows around each group's ring (the devices
    that differ only along the move's mesh axes), labelled with the bytes each sends."""
    what = f"collective {number}: {move.kind.value}" + (f" ({move.op})" if move.op else "")
    title = (f"{what} of {move.tensor} over {'*'.join(move.mesh_axes)}: group={move.group}; "
             f"bytes_sent={move.bytes_sent} per device; operand_bytes={move.operand_bytes}")
    drawing = Drawing(title, "collective")
    marker = f"einfuse-arrow-{id(drawing)}"
    arrow_marker(drawing, marker, "#dc2626")
    drawing.text(2, 14, f"{what} of {move.tensor} over {'*'.join(move.mesh_axes)}",
                 size=12, font_weight="bold", title=title)
    drawing.text(2, 30, f"each device sends {nbytes(move.bytes_sent)} · operand "
                 f"{shape(move.operand_shape)} -> {shape(move.result_shape)} · devices "
                 f"({', '.join(mesh.names)})", size=11, fill="#dc2626", title=title)
    width, height, gap = 56, 34, 40
    centres = {}
    for device in devices(mesh):
        row, column = grid_position(mesh, device)
        x, y = 2 + column * (width + gap), 44 + row * (height + gap)
        centres[tuple(device.items())] = (x + width / 2, y + height / 2)
        drawing.rect(x, y, width, height, rx=4, fill="#f9fafb", stroke="#6b7280",
                     title=f"device ({device_text(device)})")
        drawing.text(x + width / 2, y + height / 2 + 4, ",".join(map(str, device.values())),
                     size=10, anchor="middle", title=f"device ({device_text(device)})")
    groups: Dict[tuple, List[Coordinates]] = {}
    for device in devices(mesh):
        key = tuple((k, v) for k, v in device.items() if k not in move.mesh_axes)
        groups.setdefault(key, []).append(device)
    for members in groups.values():
        if len(members) < 2:
            continue
        ring = members + [members[0]] if len(members) > 2 else members
        for a, b in zip(ring, ring[1:]):
            drawing.path(_arc(centres[tuple(a.items())], centres[tuple(b.items())],
                              width, height, len(members) > 2 and b is ring[-1]),
                         fill="none", stroke="#dc2626", stroke_width=1.8,
                         marker_end=f"url(#{marker})",
                         marker_start=f"url(#{marker})" if len(members) == 2 else None,
                         title=f"device ({device_text(a)}) -> ({device_text(b)}): part of "
                               f"the {nbytes(move.bytes_sent)} each device sends")
    rows, _ = grid_shape(mesh)
    drawing.grow(drawing.width, 44 + rows * (height + gap) + 10)
    return drawing


def _arc(start, end, width: float, height: float, closing: bool) -> str:
    """An arrow's path between two device boxes: straight between neighbours, the ring's
    closing arrow as an arc outside the row (or column)."""
    (x1, y1), (x2, y2) = start, end
    dx, dy = x2 - x1, y2 - y1
    length = max((dx * dx + dy * dy) ** 0.5, 1.0)
    ux, uy = dx / length, dy / length
    # leave each box at its edge
    sx = x1 + ux * width / 2 if abs(ux) > abs(uy) else x1
    sy = y1 + uy * height / 2 if abs(uy) >= abs(ux) else y1
    ex = x2 - ux * width / 2 if abs(ux) > abs(uy) else x2
    ey = y2 - uy * height / 2 if abs(uy) >= abs(ux) else y2
    if not closing:
        return f"M{sx:.1f},{sy:.1f} L{ex:.1f},{ey:.1f}"
    if abs(dx) >= abs(dy):        # back along a row: below it
        sy, ey = y1 + height / 2, y2 + height / 2
        sx, ex = x1, x2
        return f"M{sx:.1f},{sy:.1f} C{sx:.1f},{sy + 22:.1f} {ex:.1f},{ey + 22:.1f} " \
               f"{ex:.1f},{ey + 2:.1f}"
    sx, ex = x1 + width / 2, x2 + width / 2
    return f"M{sx:.1f},{y1:.1f} C{sx + 22:.1f},{y1:.1f} {ex + 22:.1f},{y2:.1f} " \
           f"{ex + 2:.1f},{y2:.1f}"


def draw_alternative(plan, cost, longest: float, chosen: bool, cheapest: bool) -> Drawing:
    """One alternative as a card: its assignment, its modelled time as compute and
    communication bars (to one scale across the cards), FLOPs and bytes per device."""
    label = str(plan.assignment) if plan.assignment.pairs else "nothing sharded"
    marks = (["this plan"] if chosen else []) + (["cheapest"] if cheapest else [])
    title = (f"alternative {label}: model_seconds={cost.seconds:.6g}; "
             f"compute_seconds={cost.compute_seconds:.6g}; "
             f"communication_seconds={cost.communication_seconds:.6g}; "
             f"local_flops={plan.local_flops}; bytes_sent={plan.bytes_sent}; "
             f"input_bytes={plan.input_bytes}" + (f"; {', '.join(marks)}" if marks else ""))
    drawing = Drawing(title, "alternative")
    drawing.rect(0, 0, 230, 118, rx=6, fill="#fff7ed" if cheapest else "#fff",
                 stroke="#16a34a" if cheapest else ("#2563eb" if chosen else "#d1d5db"),
                 stroke_width=3 if cheapest or chosen else 1, title=title)
    drawing.text(10, 18, label, size=12, font_weight="bold", title=title)
    if marks:
        drawing.text(10, 34, ("★ " if cheapest else "") + " · ".join(marks), size=11,
                     fill="#16a34a" if cheapest else "#2563eb", font_weight="bold")
    scale = 200 / max(longest, 1e-30)
    compute = cost.compute_seconds * scale
    communication = cost.communication_seconds * scale
    drawing.rect(10, 44, max(compute, 1), 14, fill="#60a5fa",
                 title=f"compute {seconds(cost.compute_seconds)}")
    drawing.rect(10 + compute, 44, max(communication, 0.5), 14, fill="#f87171",
                 title=f"communication {seconds(cost.communication_seconds)}")
    drawing.text(10, 74, f"model {seconds(cost.seconds)}", size=11, title=title)
    drawing.text(10, 90, f"{count(plan.local_flops)} FLOPs/device", size=10)
    drawing.text(10, 104, f"sends {nbytes(plan.bytes_sent)} · holds "
                 f"{nbytes(plan.input_bytes)}", size=10)
    drawing.width, drawing.height = max(drawing.width, 230), 118
    return drawing


def steps_rows(plan) -> List[List[str]]:
    rows = [["step", "what every device does", "per device", "FLOPs/device", "sends"]]
    number = 0
    for step in plan.steps:
        if hasattr(step, "split"):
            rows.append([str(step.number), step.text.strip(),
                         f"{step.output} {shape(step.local_output_shape)} at "
                         f"{step.output_placement}", count(step.local_flops), "-"])
        elif step.kind.is_collective:
            number += 1
            rows.append([f"collective {number}", f"{step.kind.value} of {step.tensor} over "
                         f"{'*'.join(step.mesh_axes)} ({step.group} devices)",
                         shape(step.result_shape), "-", nbytes(step.bytes_sent)])
        else:
            rows.append(["slice", f"local slice of {step.tensor}",
                         shape(step.result_shape), "-", "0 B"])
    return rows


def mesh_drawings(explanation) -> Tuple[List[Drawing], List[Drawing], List[Drawing]]:
    """(the arrays' placements, the collectives, the alternatives)."""
    plan = explanation.plan
    mesh = plan.mesh
    arrays = []
    for name, placement in plan.inputs:
        tensor = plan.tensor(name)
        arrays.append(draw_placement(name, tensor.dtype, tensor.shape, placement, mesh,
                                     "input"))
    for step in plan.steps:     # partial results, where the plan keeps one
        if hasattr(step, "split") and step.output_placement.pending is not None:
            tensor = plan.tensor(step.output)
            arrays.append(draw_placement(step.output, tensor.dtype, tensor.shape,
                                         step.output_placement, mesh, "partial"))
    for name, placement in plan.outputs:
        tensor = plan.tensor(name)
        arrays.append(draw_placement(name, tensor.dtype, tensor.shape, placement, mesh,
                                     "result"))
    collectives = [draw_collective(n, move, mesh)
                   for n, move in enumerate(explanation.collectives, 1)]
    plans = explanation.alternatives()
    costs = [explanation.cost(p) for p in plans]
    best = explanation.cost(explanation.cheapest).seconds
    longest = max(c.seconds for c in costs)
    cards = [draw_alternative(p, c, longest, p is plan, c.seconds <= best)
             for p, c in zip(plans, costs)]
    return arrays, collectives, cards
