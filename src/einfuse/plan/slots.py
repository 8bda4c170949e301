"""The kernel's buffers in order, as every backend passes them: one per tensor use
(its values or its gathered index array), the output last."""

from __future__ import annotations

from typing import Tuple


def buffer_slots(spec) -> Tuple[Tuple[str, str], ...]:
    """Kernel buffers in order: (tensor, "value"|"index") per use, the output last."""
    slots = []
    for info in spec.tensors:
        if info.as_value:
            slots.append((info.name, "value"))
        if info.as_index:
            slots.append((info.name, "index"))
    slots.append((spec.output, "output"))
    return tuple(slots)
