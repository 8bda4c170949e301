"""The two copies a windowed contraction pays around its GEMMs, as fixed C kernels:

* :func:`pack_window`: a strided window view of an array (im2col's patches) copied into
  a fresh C-contiguous array, the reads that fall outside the array given the pad value
  -- no padded copy of the array first.  On a conv2d 8x16x64x64 (stride 2, pad 1) the
  NumPy form (np.zeros + the padded copy + a strided copy of 1.2 M elements) took
  0.6 ms of a 0.8 ms torch convolution.
* :func:`add_window`: ``target[view] += values`` for a view of the target whose points
  never repeat an address (one window offset of col2im), the values read with any
  steps (a GEMM's product as it lies) and points outside the target dropped (they were
  padded reads).  Each element receives one IEEE addition, as with NumPy's ``+=``; on
  one thread, rows of step 2 (a stride-2 col2im) are added with whole vectors, the
  elements between the points blended back as they were.

Both walk the view as rows of its last axis: per row the array coordinates of its first
point and the stretch of the row inside the array are found once (the bounds are linear
in the row's index), and the inner loop copies or adds without tests.  A prepared pack
told the length of the rows of the matrix it is read as writes rows that would alias in
the cache (a multiple of 4 KiB apart) one cache line apart (:func:`padded_row`).  The C
source is window_pack_source.py's."""

from __future__ import annotations

import ctypes
import math
import threading
from typing import List, Optional, Sequence, Tuple

import numpy as np

from . import build as c_build
from .threads import thread_count
from .window_pack_source import SOURCE

_KINDS = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
MAX_AXES = 16

# Below this many elements NumPy's own copy or add is as fast and needs no compiler.
MIN_ELEMENTS = 1 << 12


_FUNCTIONS: dict = {}


def _function(name: str):
    """The kernel, or None where it cannot be built (the callers then copy or add by
    NumPy); looked up once."""
    if name in _FUNCTIONS:
        return _FUNCTIONS[name]
    from .compiler_process import CompileError
    function = None
    if c_build.find_compiler() is not None:
        try:
            function = getattr(c_build.load(SOURCE), name)
            function.restype = None
        except CompileError:
            function = None
    _FUNCTIONS[name] = function
    return function


def _arguments(*groups) -> Tuple[np.ndarray, List[ctypes.c_void_p]]:
    """The integer arrays the kernels read, in one int64 buffer (one NumPy call, not
    one per array: these calls are made per GEMM operand), and a pointer to each."""
    flat = [int(v) for group in groups for v in group]
    buffer = np.array(flat, dtype=np.int64)
    address, at, pointers = buffer.ctypes.data, 0, []
    for group in groups:
        pointers.append(ctypes.c_void_p(address + 8 * at))
        at += len(group)
    return buffer, pointers


def _usable(array: np.ndarray, shape: Sequence[int], coefficients) -> Optional[str]:
    """The kernel suffix for ``array`` (its dtype), or None where these kernels do not
    take it: another dtype, too few elements, too many axes."""
    kind = _KINDS.get(array.dtype)
    if kind is None or not len(shape) or math.prod(shape) < MIN_ELEMENTS or \
            array.ndim > MAX_AXES or array.ndim == 0 or len(shape) + 1 > MAX_AXES or \
            any(s % array.itemsize for s in array.strides) or \
            len(coefficients) != len(shape):
        return None
    return kind


def _blocks(shape, coefficients, steps=None):
    """The view as the kernels walk it: blocks of its last two axes, no array axis
    moved by both (a unit row axis put in before the last where one is, or where the
    view has one axis)."""
    shape, coefficients = list(shape), [list(c) for c in coefficients]
    steps = None if steps is None else list(steps)
    if len(shape) < 2 or any(a and b for a, b in zip(coefficients[-2], coefficients[-1])):
        shape.insert(len(shape) - 1, 1)
        coefficients.insert(len(coefficients) - 1, [0] * len(coefficients[-1]))
        if steps is not None:
            steps.insert(len(steps) - 1, 0)
    return shape, coefficients, steps


# Packs kept by one PackMemo at most (bytes): past it they are packed again.
MEMO_BYTES = 1 << 28

_ACTIVE = threading.local()       # the PackMemo in force on this thread, if any


class PackMemo:
    """The patch matrices packed while it is in force (:func:`keeping_packs`), kept by
    what they were packed from: the array's memory, layout and dtype and the pack's
    window, so that a later pack of the same view of the same array (a conv's weight
    gradient re-packing the forward's patches) is the kept one.

    Whoever puts it in force answers for the arrays not changing while it lives: a
    torch autograd node keeps one from its forward to its backward, over tensors it has
    saved, whose version check refuses a backward after an in-place change
    (runtime/torch_prepared.py).  Each entry holds its source array, so that no other
    array can come to lie at its address while the memo lives."""

    def __init__(self):
        self.kept: dict = {}
        self.sources: set = set()     # (address, shape, strides) of the arrays packed
        self.bytes = 0

    def packed_from(self, array: np.ndarray) -> bool:
        """Whether it keeps a pack of an array at ``array``'s address and of its shape
        and strides."""
        return (array.ctypes.data, array.shape, array.strides) in self.sources

    def find(self, key) -> Optional[np.ndarray]:
        entry = self.kept.get(key)
        return None if entry is None else entry[1]

    def keep(self, key, source: np.ndarray, packed: np.ndarray) -> None:
        if self.bytes + packed.nbytes <= MEMO_BYTES:
            self.kept[key] = (source, packed)
            self.sources.add((key[0], source.shape, source.strides))
            self.bytes += packed.nbytes


def active_memo() -> Optional[PackMemo]:
    return getattr(_ACTIVE, "memo", None)


def set_memo(memo: Optional[PackMemo]) -> Optional[PackMemo]:
    """Puts ``memo`` (or none) in force on this thread; the one it replaces."""
    previous = getattr(_ACTIVE, "memo", None)
    _ACTIVE.memo = memo
    return previous


# A GEMM operand whose rows lie a multiple of this many bytes apart maps every row to
# the same cache sets: a padded row of one more cache line (PAD_BYTES) spreads them.
# Measured on a Zen 4, one thread: 32x144 by the patches 144x1024 159 -> 114 us on
# OpenBLAS's AVX-512 kernels, 163 -> 109 us on MKL (its Haswell kernels: 105 either way);
# rows 17 KiB apart (a 1 KiB remainder) ran as fast padded or not.
ALIASED_ROW_BYTES = 4096
PAD_BYTES = 64


def padded_row(elements: int, itemsize: int) -> int:
    """The elements from one row of a packed matrix to the next: ``elements``, or one
    cache line more where ``elements`` rows would lie a multiple of
    ALIASED_ROW_BYTES apart."""
    if elements and (elements * itemsize) % ALIASED_ROW_BYTES == 0:
        return elements + PAD_BYTES // itemsize
    return elements


class WindowPack:
    """:func:`pack_window` prepared for arrays of one shape, dtype and strides (a
    runner's signature): the kernel and its integer arguments found once, so that a
    call costs the allocation and the kernel (a small conv's forward is 0.3 ms).

    ``row``: the elements of one row of the matrix the pack is read as (its last axes);
    where they are the kernel's blocks (the view's last two axes) and such rows would
    alias (:func:`padded_row`), each is written a cache line past the one before and
    the pack is a view of that padded buffer, of ``shape`` still."""

    def __init__(self, function, like: np.ndarray, shape, coefficients, origin, fill,
                 row=None):
        self.function, self.shape = function, tuple(shape)
        self.dtype, self.key = like.dtype, (like.shape, like.strides)
        strides = [s // like.itemsize for s in like.strides]
        blocked, coefficients, _ = _blocks(shape, coefficients)
        block = blocked[-1] * blocked[-2]
        self.blocks = math.prod(blocked[:-2])
        self.stride = padded_row(block, like.itemsize) \
            if row == block and self.blocks > 1 else block
        self.padded = self.stride != block
        self.keep, pointers = _arguments(blocked, like.shape, strides,
                                         [c for row in coefficients for c in row], origin)
        self.rank = ctypes.c_int64(len(blocked))
        self.naxes = ctypes.c_int64(like.ndim)
        self.pointers = pointers
        self.fill = ctypes.c_double(float(fill))
        self.size = math.prod(self.shape)
        # what the result depends on besides the array's values
        self.window = (self.dtype.str, like.shape, like.strides, self.shape,
                       tuple(tuple(int(c) for c in row) for row in coefficients),
                       tuple(int(o) for o in origin), float(fill))

    def __call__(self, array: np.ndarray) -> np.ndarray:
        if (array.shape, array.strides) != self.key or array.dtype != self.dtype:
            raise ValueError("a WindowPack was given an array of another layout")
        memo = getattr(_ACTIVE, "memo", None)
        if memo is not None:
            key = (array.ctypes.data, self.window)
            kept = memo.find(key)
            if kept is not None:
                return kept
            out = self._pack(array)
            memo.keep(key, array, out)
            return out
        return self._pack(array)

    def _pack(self, array: np.ndarray) -> np.ndarray:
        padded = self.padded
        out = np.empty((self.blocks, self.stride) if padded else self.shape, self.dtype)
        self.function(ctypes.c_void_p(array.ctypes.data), ctypes.c_void_p(out.ctypes.data),
                      self.rank, self.pointers[0], self.naxes, *self.pointers[1:],
                      self.fill, ctypes.c_int(thread_count(None, self.size)),
                      ctypes.c_int64(self.stride))
        if padded:
            return out[:, :self.size // self.blocks].reshape(self.shape)
        return out


def prepared_pack(like: np.ndarray, shape: Sequence[int], coefficients: Sequence[Sequence[int]],
                  origin: Sequence[int], fill, row=None) -> Optional[WindowPack]:
    """:func:`pack_window` for arrays laid out as ``like``, or None where the kernel
    does not take them; ``row``: the elements of one row of the matrix it is read as
    (rows that would alias are padded: WindowPack)."""
    kind = _usable(like, shape, coefficients)
    function = None if kind is None else _function(f"einfuse_pack_window_{kind}")
    if function is None:
        return None
    return WindowPack(function, like, shape, coefficients, origin, fill, row)


def pack_window(array: np.ndarray, shape: Sequence[int], coefficients: Sequence[Sequence[int]],
                origin: Sequence[int], fill) -> Optional[np.ndarray]:
    """The view of ``array`` whose point ``(t_0, .., t_k)`` is the element at array
    coordinates ``origin + sum_k t_k * coefficients[k]`` (``fill`` where those leave the
    array), copied into a fresh C-contiguous array of ``shape``; None where the kernel
    does not take these arrays (the caller copies by NumPy)."""
    pack = prepared_pack(array, shape, coefficients, origin, fill)
    return None if pack is None else pack(array)


def add_window(target: np.ndarray, values: np.ndarray, coefficients: Sequence[Sequence[int]],
               origin: Sequence[int], shared: int = 0) -> bool:
    """``target`` at coordinates ``origin + sum_k t_k * coefficients[k]`` plus
    ``values[t]``, in place, in the order of the view's points, points outside
    ``target`` dropped; False (nothing done) where the kernel does not take these
    arrays.  The caller guarantees that two points which share an address differ only
    in the view's last ``shared`` axes and the two innermost (those run on one
    thread; threads split the others)."""
    adder = window_adder(target, values, coefficients, origin, shared)
    if adder is None:
        return False
    return adder(target, values)


class WindowAdder:
    """:func:`add_window` for one layout of target and values (shapes, strides, dtype),
    its kernel arguments made once: a repeated backward's col2im then costs the
    kernel alone."""

    def __init__(self, function, target, values, coefficients, origin, shared):
        shape = tuple(values.shape)
        self.function = function
        self.key = (target.shape, target.strides, values.shape, values.strides,
                    target.dtype)
        strides = [s // target.itemsize for s in target.strides]
        vsteps = [s // values.itemsize for s in values.strides]
        rank = len(shape)
        shape, coefficients, vsteps = _blocks(shape, coefficients, vsteps)
        # (the runs: the blocks of the shared axes, and of the row axis where a unit one
        # was put in after it)
        group = math.prod(shape[max(0, rank - 2 - shared):len(shape) - 2])
        self.keep, pointers = _arguments(shape, target.shape, strides,
                                         [c for row in coefficients for c in row], origin,
                                         vsteps)
        self.head = (ctypes.c_int64(len(shape)), pointers[0], ctypes.c_int64(target.ndim),
                     *pointers[1:], ctypes.c_int64(max(1, group)))
        self.size = values.size
        self.dense = ctypes.c_int(int(target.flags.c_contiguous))

    def __call__(self, target: np.ndarray, values: np.ndarray) -> bool:
        """The add, True; False (nothing done) for arrays of another layout."""
        if (target.shape, target.strides, values.shape, values.strides,
                target.dtype) != self.key or values.dtype != target.dtype or \
                not target.flags.writeable:
            return False
        self.function(ctypes.c_void_p(target.ctypes.data),
                      ctypes.c_void_p(values.ctypes.data), *self.head,
                      ctypes.c_int(thread_count(None, self.size)), self.dense)
        return True


def window_adder(target: np.ndarray, values: np.ndarray, coefficients: Sequence[Sequence[int]],
                 origin: Sequence[int], shared: int = 0) -> Optional[WindowAdder]:
    """:func:`add_window` prepared for arrays laid out as ``target`` and ``values``, or
    None where the kernel does not take them."""
    kind = _usable(target, tuple(values.shape), coefficients)
    if kind is None or not target.flags.writeable or values.dtype != target.dtype or \
            any(s % values.itemsize for s in values.strides):
        return None
    function = _function(f"einfuse_add_window_{kind}")
    if function is None:
        return None
    return WindowAdder(function, target, values, coefficients, origin, shared)
