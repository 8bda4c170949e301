"""Where a tensor lives on the mesh, and the moves between two placements.

A placement is a layout (for each tensor axis, the mesh axes it is split over) and,
for a partial result, the pending reduction: every device holds its own partial value
of a sum (max, min) over a sharded reduction index, to be combined across those mesh
axes.  A move turns one placement into another: a collective (all-gather,
reduce-scatter, all-reduce, all-to-all) or a local slice, which costs no
communication."""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import List, Optional, Tuple

import numpy as np

from .mesh import MeshAxes, MeshShape, axes_text


@dataclass(frozen=True)
class Pending:
    """A partial value: the reduction ``op`` over the mesh ``axes`` is still to be done."""
    op: str              # "sum", "max" or "min"
    axes: MeshAxes


@dataclass(frozen=True)
class Placement:
    layout: Tuple[MeshAxes, ...]
    pending: Optional[Pending] = None

    def local_shape(self, shape: Tuple[int, ...], mesh: MeshShape) -> Tuple[int, ...]:
        return tuple(extent // mesh.size(axes) for extent, axes in zip(shape, self.layout))

    def __str__(self) -> str:
        text = "[" + ", ".join(axes_text(a) for a in self.layout) + "]"
        if self.pending is not None:
            text += f" partial {self.pending.op} over {axes_text(self.pending.axes)}"
        return text


def replicated(rank: int) -> Placement:
    return Placement(((),) * rank)


class MoveKind(enum.Enum):
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_REDUCE = "all-reduce"
    ALL_TO_ALL = "all-to-all"
    SLICE = "local slice"       # no communication: each device keeps its block

    @property
    def is_collective(self) -> bool:
        return self is not MoveKind.SLICE


@dataclass(frozen=True)
class Move:
    """One step from ``source`` to ``target`` placement of ``tensor``.  ``axis`` is the
    tensor axis gathered, scattered or sliced (for all-to-all: the axis split, with
    ``other_axis`` the one concatenated); ``mesh_axes`` the group; shapes are local
    (per device) and ``itemsize`` that of the dtype."""
    kind: MoveKind
    tensor: str
    source: Placement
    target: Placement
    mesh_axes: MeshAxes
    axis: Optional[int]
    other_axis: Optional[int]
    operand_shape: Tuple[int, ...]
    result_shape: Tuple[int, ...]
    itemsize: int
    group: int                    # devices in one collective group
    op: Optional[str] = None      # the reduction of all-reduce / reduce-scatter
    reason: str = ""

    @property
    def operand_bytes(self) -> int:
        return int(np.prod(self.operand_shape, dtype=np.int64)) * self.itemsize

    @property
    def bytes_sent(self) -> int:
        """Bytes each device sends with the bandwidth-optimal (ring) algorithm:
        all-gather (n-1) shards, reduce-scatter and all-to-all (n-1)/n of the operand,
        all-reduce twice that (a reduce-scatter then an all-gather)."""
        n, size = self.group, self.operand_bytes
        if self.kind is MoveKind.ALL_GATHER:
            return (n - 1) * size
        if self.kind in (MoveKind.REDUCE_SCATTER, MoveKind.ALL_TO_ALL):
            return (n - 1) * size // n
        if self.kind is MoveKind.ALL_REDUCE:
            return 2 * (n - 1) * size // n
        return 0


def moves_between(tensor: str, shape: Tuple[int, ...], itemsize: int, source: Placement,
                  target: Placement, mesh: MeshShape, reason: str) -> List[Move]:
    """The moves that turn ``source`` into ``target`` (which has no pending reduction):
    the pending reduction first (a reduce-scatter where the target splits an axis over
    exactly the pending mesh axes, else an all-reduce), then all-to-alls where a mesh
    axis group moves from one tensor axis to another, all-gathers where the target
    keeps less split, and local slices where it splits more."""
    moves: List[Move] = []
    current = source

    def step(kind, new_layout, axes, axis=None, other=None, op=None):
        nonlocal current
        new = Placement(tuple(new_layout))
        moves.append(Move(kind, tensor, current, new, tuple(axes), axis, other,
                          current.local_shape(shape, mesh), new.local_shape(shape, mesh),
                          itemsize, mesh.size(axes), op, reason))
        current = new

    if current.pending is not None:
        pending = current.pending
        layout = list(current.layout)
        # a tensor axis the target splits over the pending axes first (in any order: a
        # sum does not mind), to be split further by a local slice where it wants more
        width = len(pending.axes)
        scatter = next((p for p, axes in enumerate(target.layout)
                        if set(axes[:width]) == set(pending.axes) and layout[p] == ()), None)
        if pending.op == "sum" and scatter is not None:
            axes = target.layout[scatter][:width]
            layout[scatter] = axes
            step(MoveKind.REDUCE_SCATTER, layout, axes, axis=scatter, op="sum")
        else:
            step(MoveKind.ALL_REDUCE, layout, pending.axes, op=pending.op)
    rank = len(shape)
    for p in range(rank):
        for q in range(rank):
            layout = list(current.layout)
            if p != q and layout[p] and layout[p] == target.layout[q] and \
                    layout[q] == () and target.layout[p] == ():
                axes = layout[p]
                layout[q], layout[p] = axes, ()
                # split tensor axis q across the group, concatenate the pieces on p
                step(MoveKind.ALL_TO_ALL, layout, axes, axis=q, other=p)
    for p in range(rank):
        layout = list(current.layout)
        have, want = layout[p], target.layout[p]
        if have and have != want[:len(have)]:
            # blocks over (x, y) -> over x: gather over y only (x is the major axis);
            # to anything that does not start with the same axes: gather them all
            keep = want if want == have[:len(want)] else ()
            layout[p] = keep
            step(MoveKind.ALL_GATHER, layout, have[len(keep):], axis=p)
    for p in range(rank):
        layout = list(current.layout)
        have, want = layout[p], target.layout[p]
        if have != want:
            # ``have`` is a prefix of ``want`` here: each device keeps its sub-block
            # over the remaining axes (x -> (x, y): its block over y of its x block)
            layout[p] = want
            step(MoveKind.SLICE, layout, want[len(have):], axis=p)
    return moves


def without_pending(placement: Placement) -> Placement:
    return replace(placement, pending=None)
