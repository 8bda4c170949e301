"""Where the Triton jit renderer (backends/triton/jit_render.py) keeps a buffer that
does not fit, or would not pay, as a register tile -- in memory (an output in its own
array, an intermediate in a per-program scratch array) -- and how a statement writes one
there (a ``tl.store`` between barriers)."""

from __future__ import annotations

import math

from ...ir import Assign, Const, Index, Loop, Read, ScatterAdd, walk
from .jit_lanes import output_mask
from .jit_ops import Declined, padded, where_text
from .jit_reductions import ATOMIC_TYPES

MEMORY_ELEMENTS = 4096      # a buffer of more (padded) elements lives in memory
ROW_WRITTEN_ELEMENTS = 256  # a buffer written a row at a time lives in memory above this
ONE_HOT_EXTENT = 16         # ... and one read at computed positions along a longer axis


class Nest:
    """The axes of the statement being rendered: name -> (position, extent, padded)."""

    def __init__(self, axes):
        self.axes = {n: (k, e, padded(e)) for k, (n, e) in enumerate(axes)}
        self.rank = len(axes)
        self.shape = tuple(padded(e) for _, e in axes)


def placed_in_memory(renderer) -> set:
    """The non-input buffers kept in memory: larger than MEMORY_ELEMENTS, read at
    computed positions along an axis longer than ONE_HOT_EXTENT, written a row at a time
    and larger than ROW_WRITTEN_ELEMENTS, or the target of an adding scatter that large
    (of a type with an atomic add).  A loop carry there declines (its copy after each
    step is not rendered)."""
    row_written = {node.buffer for node in walk(renderer.program)
                   if isinstance(node, Assign) and node.prefix}
    # read at computed positions (a window x[i + k], a gather) along a long axis: a
    # one-hot pick would cost the nest times that axis; a load costs the nest
    gathered = set()
    for node in walk(renderer.program):
        if isinstance(node, Read) and node.buffer not in renderer.inputs:
            shape = renderer.shape_of(node.buffer)
            if any(not isinstance(s, (Index, Const)) and e > ONE_HOT_EXTENT
                   for s, e in zip(node.subscripts, shape)):
                gathered.add(node.buffer)
        # a scatter-add's one-hot tile is its points times its target: a target of
        # more than a row goes to memory (an atomic add there)
        if isinstance(node, ScatterAdd) and not node.replace and \
                renderer.program.buffer(node.buffer).size > ROW_WRITTEN_ELEMENTS and \
                renderer.program.buffer(node.buffer).dtype in ATOMIC_TYPES:
            gathered.add(node.buffer)
    found = set()
    for buffer in renderer.program.buffers:
        if buffer.name in renderer.inputs:
            continue
        size = math.prod(padded(e) for e in buffer.shape) if buffer.shape else 1
        if size > MEMORY_ELEMENTS or buffer.name in gathered or \
                (buffer.name in row_written and size > ROW_WRITTEN_ELEMENTS):
            found.add(buffer.name)
    for node in walk(renderer.program):
        if isinstance(node, Loop):
            for carry, new in node.updates:
                if carry in found or new in found:
                    raise Declined(f"the loop carry {carry} is too large for registers")
    return found



def store(renderer, step: Assign, value: str, out_shape) -> None:
    """``value`` (a tile over the statement's output axes) into the memory of
    ``step.buffer`` at the prefix position (a prefix out of range writes nothing)."""
    shape = renderer.shape_of(step.buffer)
    prefix = len(step.prefix)
    if not out_shape:            # a scalar: stored as a tile of one
        out_shape = (1,)
        renderer.emit(f"{value} = tl.broadcast_to({value}, (1,))")
        shape = shape + (1,)
    rank = len(out_shape)
    offsets, masks, stride = [], [], 1
    for k in range(len(shape) - 1, -1, -1):
        if k >= prefix:
            axis = k - prefix
            lane = f"tl.arange(0, {out_shape[axis]}).to(tl.int64)"
            if rank > 1:
                lane += "[" + ", ".join(":" if a == axis else "None"
                                        for a in range(rank)) + "]"
            if out_shape[axis] != shape[k]:
                masks.append(f"({lane} < {shape[k]})")
        else:
            if not renderer.is_scalar(step.prefix[k], Nest(())):
                raise Declined(f"the statement{where_text(step.origin)} writes at a "
                               "position that is not a scalar")
            # the position as a tile (the interpreter takes no mask made of a
            # scalar broadcast to the tile)
            lane = renderer.fresh("o")
            renderer.emit(f"{lane} = tl.zeros({out_shape}, tl.int64) + "
                      f"{renderer.expr(step.prefix[k], Nest(()))}")
            masks.append(f"({lane} >= 0) & ({lane} < {shape[k]})")
        if k == 0 and output_mask(renderer, step.buffer, lane) is not None:
            masks.append(output_mask(renderer, step.buffer, lane))   # a ragged block
        offsets.append(lane if stride == 1 else f"{lane} * {stride}")
        stride *= shape[k]
    mask = f", mask={' & '.join(masks)}" if masks else ""
    renderer.emit("tl.debug_barrier()")
    renderer.emit(f"tl.store({renderer.pointer(step.buffer)} + "
              f"{' + '.join(reversed(offsets)) or '0'}, {value}{mask})")
    renderer.emit("tl.debug_barrier()")



__all__ = ["MEMORY_ELEMENTS", "Nest", "ONE_HOT_EXTENT", "ROW_WRITTEN_ELEMENTS",
           "placed_in_memory", "store"]
