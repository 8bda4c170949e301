"""Tables (text and Markdown) and a bar chart of benchmark measurements."""

from __future__ import annotations

from typing import Dict, List, Optional

from .runner import Measurement


def _einfuse_times(results: List[Measurement]) -> Dict[str, Optional[float]]:
    return {m.case: m.median_s for m in results if m.implementation == "einfuse"}


def ratio(m: Measurement, einfuse_s: Optional[float]) -> Optional[float]:
    """Peer time over einfuse time: above 1 means einfuse is faster."""
    if m.median_s is None or not einfuse_s:
        return None
    return m.median_s / einfuse_s


def _time(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:     # per-call overheads: microseconds, not "0.01 ms"
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.2f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _compiled(count: Optional[int], first_launches: int = 0) -> str:
    if count is None:
        return ""
    parts = [f"compiled {count} kernel{'s' if count > 1 else ''}"] if count else []
    if first_launches:   # Triton compiles on a kernel's first launch (or loads its cache)
        parts.append(f"first launch of {first_launches} Triton kernel"
                     f"{'s' if first_launches > 1 else ''}: JIT compile or Triton's "
                     "cache, and tuning")
    return f" ({'; '.join(parts)})" if parts else " (kernels from the cache)"


def rows(results: List[Measurement]) -> List[List[str]]:
    base = _einfuse_times(results)
    table = [["case", "implementation", "median", "peer / einfuse", "note"]]
    for m in results:
        r = ratio(m, base.get(m.case))
        shown = "1 (baseline)" if m.implementation == "einfuse" else \
            (f"{r:.2f}x" if r is not None else "-")
        note = m.note
        if m.implementation == "einfuse" and m.first_call_s is not None:
            note = (f"first call {_time(m.first_call_s)}"
                    f"{_compiled(m.compiled, m.first_launches)}")
        if m.device_note:
            note = f"{note}; {m.device_note}" if note else m.device_note
        table.append([m.case, m.implementation, _time(m.median_s), shown, note])
    return table


def text_table(results: List[Measurement]) -> str:
    table = rows(results)
    widths = [max(len(r[c]) for r in table) for c in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(results: List[Measurement], header: str = "") -> str:
    table = rows(results)
    out = [header] if header else []
    out.append("| " + " | ".join(table[0]) + " |")
    out.append("|" + "---|" * len(table[0]))
    out += ["| " + " | ".join(cell.replace("|", "/") for cell in r) + " |" for r in table[1:]]
    return "\n".join(out) + "\n"


def bar_chart(results: List[Measurement], path: str, title: str) -> None:
    """Peer time / einfuse time per case, log scale; the line at 1 is parity."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    base = _einfuse_times(results)
    bars = [(f"{m.case}\n{m.implementation}", ratio(m, base.get(m.case))) for m in results
            if m.implementation != "einfuse"]
    bars = [(label, r) for label, r in bars if r is not None]
    if not bars:
        return
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(bars) + 1.5))
    labels, values = zip(*bars)
    colors = ["tab:green" if v >= 1 else "tab:red" for v in values]
    ax.barh(range(len(values)), values, color=colors)
    ax.set_yticks(range(len(values)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xlabel("peer time / einfuse time (right of the line: einfuse is faster)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
