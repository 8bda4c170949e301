"""The device mesh and the assignment of indices to its axes (programs.md section 4).

A mesh is read from a dict of axis sizes (``{"x": 4, "y": 2}``, no JAX needed) or from a
``jax.sharding.Mesh`` (read by duck typing, so that explaining never imports JAX).  An
assignment maps index names to a tuple of mesh axes: the index's range is split into
``product(sizes)`` equal blocks, the first axis the major one, as ``PartitionSpec``
does for a tuple of axes."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Dict, Iterable, Mapping, Optional, Tuple

from ..errors import OptionError

MeshAxes = Tuple[str, ...]       # mesh axes one tensor axis or index is split over


@dataclass(frozen=True)
class MeshShape:
    """Axis names and sizes of a device mesh, in the mesh's order."""
    axes: Tuple[Tuple[str, int], ...]

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    def size(self, axes: Iterable[str] = None) -> int:
        """Devices along ``axes`` (all of the mesh's by default)."""
        sizes = dict(self.axes)
        total = 1
        for name in (self.names if axes is None else axes):
            total *= sizes[name]
        return total

    def __str__(self) -> str:
        return "{" + ", ".join(f"{n}: {s}" for n, s in self.axes) + "}"


def mesh_shape(mesh) -> MeshShape:
    """The shape of ``mesh``: a dict of axis name -> size, or a ``jax.sharding.Mesh``."""
    if isinstance(mesh, Mapping):
        items = list(mesh.items())
    elif hasattr(mesh, "axis_names") and hasattr(mesh, "shape") and \
            isinstance(getattr(mesh, "shape"), Mapping):
        items = [(name, mesh.shape[name]) for name in mesh.axis_names]
    elif hasattr(mesh, "mesh_dim_names") and hasattr(mesh, "ndim"):
        # a torch.distributed DeviceMesh: unnamed dimensions are called dim0, dim1, ...
        items = list(zip(device_mesh_names(mesh), tuple(mesh.shape)))
    else:
        raise OptionError(f"mesh= takes a jax.sharding.Mesh, a torch DeviceMesh or a dict "
                          f"of axis sizes such as {{'x': 4, 'y': 2}}, not "
                          f"{type(mesh).__name__}")
    if not items:
        raise OptionError("mesh= has no axes")
    axes = []
    for name, size in items:
        # any non-empty string, as JAX's meshes take ("data-parallel" too)
        if not isinstance(name, str) or not name:
            raise OptionError(f"mesh axis names are non-empty strings such as 'x'; "
                              f"{name!r} is not")
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
            raise OptionError(f"mesh axis {name} has size {size!r}; sizes are positive "
                              "integers")
        axes.append((name, int(size)))
    return MeshShape(tuple(axes))


@dataclass(frozen=True)
class Assignment:
    """Index name -> the mesh axes its range is split over (indices not listed are not
    split: every device holds their whole range)."""
    pairs: Tuple[Tuple[str, MeshAxes], ...]

    def get(self, index: str) -> MeshAxes:
        return dict(self.pairs).get(index, ())

    def restricted(self, indices: Iterable[str]) -> "Assignment":
        keep = set(indices)
        return Assignment(tuple((i, a) for i, a in self.pairs if i in keep))

    @property
    def as_dict(self) -> Dict[str, MeshAxes]:
        return dict(self.pairs)

    def __str__(self) -> str:
        if not self.pairs:
            return "nothing sharded (every device computes everything)"
        return ", ".join(f"{i}->{'*'.join(a)}" for i, a in self.pairs)


def assignment_from(shard, indices: Tuple[str, ...], mesh: MeshShape) -> Assignment:
    """``shard=`` checked against the statements' ``indices`` and the mesh: a dict of
    index -> mesh axis (or tuple of axes, or None), or None for the default (an index
    named like a mesh axis goes on it)."""
    if shard is None:
        return Assignment(tuple((i, (i,)) for i in indices if i in mesh.names))
    if not isinstance(shard, Mapping):
        raise OptionError(f"shard= takes a dict of index -> mesh axis (such as "
                          f"{{'i': 'x'}}), 'auto' or None, not {shard!r}")
    pairs = []
    for index, axes in shard.items():
        if index not in indices:
            raise OptionError(f"shard= names index {index!r}, which the statement does not "
                              f"use (its indices are {', '.join(indices) or 'none'})")
        if axes is None or axes == ():
            continue
        axes = (axes,) if isinstance(axes, str) else axes
        if not isinstance(axes, tuple) or not all(isinstance(a, str) for a in axes):
            raise OptionError(f"shard= maps index {index} to {axes!r}; give a mesh axis "
                              "name or a tuple of them")
        for axis in axes:
            if axis not in mesh.names:
                raise OptionError(f"shard= puts index {index} on mesh axis {axis!r}, which "
                                  f"the mesh {mesh} does not have")
        if len(set(axes)) != len(axes):
            raise OptionError(f"shard= lists a mesh axis twice for index {index}: {axes}")
        pairs.append((index, tuple(axes)))
    return Assignment(tuple(pairs))


def check_statement_axes(assignment: Assignment, indices: Tuple[str, ...],
                         where: str) -> None:
    """One mesh axis splits at most one index of a statement: two indices on one axis
    would give each device only the diagonal blocks of the pair."""
    owner: Dict[str, str] = {}
    for index in dict.fromkeys(indices):     # an index may be reduced twice
        for axis in assignment.get(index):
            if axis in owner:
                raise OptionError(f"mesh axis {axis} is assigned to both {owner[axis]} and "
                                  f"{index}, which are indices of the same statement "
                                  f"({where}); a mesh axis can split only one of them")
            owner[axis] = index


def device_mesh_names(mesh) -> Tuple[str, ...]:
    """The axis names of a torch DeviceMesh (``dim0``, ``dim1`` ... where unnamed)."""
    names = getattr(mesh, "mesh_dim_names", None)
    return tuple(names) if names else tuple(f"dim{m}" for m in range(mesh.ndim))


def axes_text(axes: Optional[MeshAxes]) -> str:
    return "*".join(axes) if axes else "-"
