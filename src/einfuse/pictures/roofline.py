"""A roofline: each kernel's arithmetic intensity (FLOPs per byte moved) against this
machine's measured memory bandwidth and FLOP rate (calibrate.py); the best a kernel of
that intensity can do is min(FLOP rate, bandwidth x intensity)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

from .svg import Drawing
from .units import count, nbytes, rate, seconds

WIDTH = 560
HEIGHT = 300
LEFT = 70
TOP = 14


@dataclass
class Point:
    label: str
    flops: int
    bytes_moved: int
    measured_seconds: Optional[float] = None

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes_moved

    def bound(self, calibration) -> float:
        """The FLOP rate the roofline allows at this intensity."""
        return min(calibration.flops_per_second,
                   calibration.bytes_per_second * self.intensity)

    def bound_seconds(self, calibration) -> float:
        return self.flops / self.bound(calibration) if self.flops else \
            self.bytes_moved / calibration.bytes_per_second

    def limit(self, calibration) -> str:
        ridge = calibration.flops_per_second / calibration.bytes_per_second
        return "memory-bound" if self.intensity < ridge else "compute-bound"


def draw_roofline(points: List[Point], calibration) -> Drawing:
    drawing = Drawing("roofline: each kernel's FLOPs per byte against this machine's "
                      "measured bandwidth and FLOP rate", "roofline")
    peak, bandwidth = calibration.flops_per_second, calibration.bytes_per_second
    ridge = peak / bandwidth
    shown = [p for p in points if p.flops > 0 and p.bytes_moved > 0]
    xs = [p.intensity for p in shown] + [ridge]
    x_lo = 10 ** math.floor(math.log10(min(xs)) - 0.5)
    x_hi = 10 ** math.ceil(math.log10(max(xs)) + 0.5)
    ys = [p.bound(calibration) for p in shown] + [peak, bandwidth * x_lo]
    ys += [p.flops / p.measured_seconds for p in shown if p.measured_seconds]
    y_lo = 10 ** math.floor(math.log10(min(ys)) - 0.3)
    y_hi = 10 ** math.ceil(math.log10(max(ys)) + 0.2)

    def at(x: float, y: float):
        fx = (math.log10(x) - math.log10(x_lo)) / (math.log10(x_hi) - math.log10(x_lo))
        fy = (math.log10(y) - math.log10(y_lo)) / (math.log10(y_hi) - math.log10(y_lo))
        return LEFT + fx * WIDTH, TOP + (1 - fy) * HEIGHT

    drawing.rect(LEFT, TOP, WIDTH, HEIGHT, fill="#fff", stroke="#999")
    for e in range(round(math.log10(x_lo)), round(math.log10(x_hi)) + 1):
        x, _ = at(10.0 ** e, y_lo)
        drawing.line(x, TOP, x, TOP + HEIGHT, stroke="#eee")
        drawing.text(x, TOP + HEIGHT + 16, f"{10.0 ** e:g}", size=10, anchor="middle")
    for e in range(round(math.log10(y_lo)), round(math.log10(y_hi)) + 1):
        _, y = at(x_lo, 10.0 ** e)
        drawing.line(LEFT, y, LEFT + WIDTH, y, stroke="#eee")
        drawing.text(LEFT - 6, y + 4, rate(10.0 ** e, "F/s"), size=10, anchor="end")
    drawing.text(LEFT + WIDTH / 2, TOP + HEIGHT + 34, "arithmetic intensity (FLOP per byte "
                 "moved through memory)", size=11, anchor="middle")
    # the roof: bandwidth x intensity up to the ridge, then the FLOP rate
    x0, y0 = at(x_lo, bandwidth * x_lo)
    x1, y1 = at(ridge, peak)
    x2, y2 = at(x_hi, peak)
    roof = (f"roof: bandwidth_bytes_per_second={bandwidth:.6g}; "
            f"flops_per_second={peak:.6g}; ridge={ridge:.4g} FLOP/byte")
    drawing.path(f"M{x0:.1f},{y0:.1f} L{x1:.1f},{y1:.1f} L{x2:.1f},{y2:.1f}", fill="none",
                 stroke="#dc2626", stroke_width=2.5, title=roof)
    drawing.text(x1 + 6, y1 - 6, f"{rate(peak, 'FLOP/s')} measured", size=10, fill="#dc2626")
    drawing.text(x0 + 8, max(y0 - 8, TOP + 12), f"{rate(bandwidth, 'B/s')}", size=10,
                 fill="#dc2626")
    for k, point in enumerate(shown):
        x, y = at(point.intensity, point.bound(calibration))
        title = (f"{point.label}: flops={point.flops}; bytes={point.bytes_moved}; "
                 f"intensity={point.intensity:.4g} FLOP/byte; "
                 f"{point.limit(calibration)}; at best "
                 f"{seconds(point.bound_seconds(calibration))}")
        drawing.circle(x, y, 6, fill="#2563eb", stroke="#fff", title=title)
        drawing.text(x + 8, y + 14 + 12 * (k % 2), point.label, size=10, title=title)
        if point.measured_seconds:
            mx, my = at(point.intensity, point.flops / point.measured_seconds)
            measured = (f"{point.label} measured: seconds={point.measured_seconds:.6g}; "
                        f"{rate(point.flops / point.measured_seconds, 'FLOP/s')}")
            drawing.rect(mx - 5, my - 5, 10, 10, fill="#f59e0b", title=measured)
    return drawing


def roofline_rows(points: List[Point], calibration) -> List[List[str]]:
    rows = [["kernel", "FLOPs", "bytes moved", "FLOP/byte", "limit", "best time",
             "measured"]]
    for p in points:
        if p.bytes_moved <= 0:
            rows.append([p.label, count(p.flops), nbytes(p.bytes_moved), "-", "-", "-", "-"])
            continue
        rows.append([p.label, count(p.flops), nbytes(p.bytes_moved), f"{p.intensity:.3g}",
                     p.limit(calibration), seconds(p.bound_seconds(calibration)),
                     seconds(p.measured_seconds)])
    return rows
