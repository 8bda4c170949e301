"""Runners for statements that BLAS computes (plan/contraction.py's contractions and
plan/contraction_addend.py's contraction plus a broadcast term), for one signature of
their arguments: only the NumPy steps that change something (a transpose, a window, a
dtype conversion) and then one matmul, or one ``addmm`` where a term is added.

Whose BLAS: NumPy's by default.  For torch tensors the caller passes torch's (MKL) as
its :class:`BlasRoute` (backends/c/torch_blas.py) from :data:`TORCH_BLAS_WORK` multiply-adds
on: both libraries keep their worker threads spinning for a while after a call, so in a
torch program NumPy's BLAS threads compete with torch's own for the cores during the
next torch operations (and the other way round); at 2 threads that made a Linear
layer's backward about 1.5x slower than torch's.  Below that size OpenBLAS runs on the
calling thread alone and NumPy's lower call cost wins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import numpy as np

from ...analysis.ranges import points
from .blas_route import NUMPY_BLAS, BlasRoute
from ...plan.contraction import Contraction, PreparedContraction, prepare_contraction
from ...plan.contraction_addend import ContractionAddend

Runner = Callable[[Mapping[str, np.ndarray]], np.ndarray]

# From this many multiply-adds (m*n*k) a torch call's BLAS is torch's (see above):
# OpenBLAS's own threshold for using more than the calling thread.
TORCH_BLAS_WORK = 1 << 18


def multiply_adds(contraction, call) -> int:
    """m * n * k (times the batch) of ``contraction`` (a Contraction, or a windowed one:
    both name their batch, m, n and k axes) for this call's ranges."""
    return points(contraction.batch + contraction.m + contraction.n + contraction.k,
                  call.bounds.range_map)


def route_for(contraction: Contraction, call, torch_route: bool) -> BlasRoute:
    """NUMPY_BLAS, or torch's where ``torch_route`` (the caller's arrays are torch's),
    the working dtype is one torch's BLAS takes and the product is large enough."""
    if torch_route and call.dtypes.working in (np.float32, np.float64) and \
            multiply_adds(contraction, call) >= TORCH_BLAS_WORK:
        from .torch_blas import TORCH_BLAS
        return TORCH_BLAS
    return NUMPY_BLAS


def blas_library(found, call) -> str:
    """Whose BLAS runs a contraction (or one plus a term, ``found``) for this call, in
    explain's words."""
    from ...analysis.frameworks import TORCH
    contraction = found.contraction if isinstance(found, ContractionAddend) else found
    if route_for(contraction, call, call.framework == TORCH) is NUMPY_BLAS:
        return "numpy.matmul"
    return "torch.matmul or torch.addmm on repeated calls"


def contraction_runner(contraction: Contraction, call, route: BlasRoute = NUMPY_BLAS) -> Runner:
    """The contraction's result (working dtype) from arrays of this call's signature by
    name (other names are ignored)."""
    prepared = prepare_contraction(contraction, call)
    direct = _product(prepared, call, route)
    if direct is None:       # scalar factors: the general call does them (NumPy's BLAS)
        return lambda named: prepared(named, named)     # (factors by name)
    return direct.run


def addend_runner(found: ContractionAddend, call, route: BlasRoute = NUMPY_BLAS) -> Runner:
    """The statement's result (working dtype): the contraction, then the addend added in
    place, or both in one ``addmm`` where the product is 2-D and in the output's order."""
    prepared = prepare_contraction(found.contraction, call)
    addend = _addend_view(found, call)
    product = _product(prepared, call, route)
    if product is not None and product.finish is None and prepared.left.sizes[0] == 1:
        get_left, get_right, addmm = product.left, product.right, route.addmm
        return lambda named: addmm(addend(named), get_left(named), get_right(named))
    compute = product.run if product is not None else (lambda named: prepared(named, named))

    def run(named):
        result = compute(named)       # a fresh array (perhaps a transposed view of one)
        np.add(result, addend(named), out=result)
        return result
    return run


def run_contraction_addend(found: ContractionAddend, call) -> np.ndarray:
    """The full path's run of such a statement (NumPy's BLAS)."""
    named = dict(call.arrays)
    named.update(call.params)
    return addend_runner(found, call)(named)


def _addend_view(found: ContractionAddend, call) -> Runner:
    """The addend as a view in the working dtype that broadcasts against the result:
    its window of the ranges, its axes in the output's order, a unit axis for each
    output index it does not name."""
    name, indices = found.addend, found.addend_indices
    ranges = call.bounds.range_map
    window = tuple(slice(*ranges[index]) for index in indices)
    shape = tuple(call.arrays.shapes[name])
    whole = all(w == slice(0, n) for w, n in zip(window, shape))
    output = call.spec.output_indices
    named_order = sorted(range(len(indices)), key=lambda axis: output.index(indices[axis]))
    in_order = named_order == list(range(len(indices)))
    extents = [max(0, ranges[i][1] - ranges[i][0]) if i in indices else 1
               for i in output]
    first = next((n for n, i in enumerate(output) if i in indices), len(output))
    # leading unit axes broadcast by themselves; inner ones must be explicit
    target = tuple(extents[first:])
    working = call.dtypes.working
    return _arranged(name, working if call.arrays.dtypes[name] != working else None,
                     None if whole else window, None if in_order else tuple(named_order),
                     target if len(target) != len(indices) else None)


def _arranged(name: str, convert, window, order, shape) -> Runner:
    """The array ``name`` as BLAS or the result wants it, each step only where it is
    given: converted to the dtype ``convert``, cut to ``window``, its axes put in
    ``order``, reshaped to ``shape``."""
    def get(named):
        array = named[name]
        if convert is not None:
            array = array.astype(convert)
        if window is not None:
            array = array[window]
        if order is not None:
            array = array.transpose(order)
        return array if shape is None else array.reshape(shape)
    return get


@dataclass(frozen=True)
class _Product:
    """A contraction as ``finish(matmul(left(named), right(named)))``; ``finish`` None
    where the product is the result as it is (2-D operands where there is no batch);
    ``run`` the whole of it, in its fastest form."""
    left: Runner
    right: Runner
    finish: Optional[Callable[[np.ndarray], np.ndarray]]
    run: Runner


def _product(prepared: PreparedContraction, call, route: BlasRoute) -> Optional[_Product]:
    """``prepared`` for this signature with only the steps that change something: no
    dtype conversion, window, transpose or reshape where the array is already so (each
    NumPy step costs about as much as a 4x4 matmul), and a 2-D matmul where there is no
    batch.  None where the contraction has scalar factors (the general call does them)."""
    if prepared.contraction.scale:
        return None
    working = prepared.working
    flat = prepared.left.sizes[0] == 1     # no batch: 2-D operands

    def operand(o):
        """The operand's name where the array is used as it is, else a function of the
        arrays giving it as the matmul wants it."""
        name, window, order = o.tensor, o.window, o.order
        shape = tuple(call.arrays.shapes[name])
        convert = call.arrays.dtypes[name] != working
        whole = all(w == slice(0, n) for w, n in zip(window, shape))
        in_order = order == tuple(range(len(shape)))
        target = o.sizes[1:] if flat else o.sizes
        seen = tuple(w.stop - w.start for w in window)
        reshape = tuple(seen[axis] for axis in order) != target
        if not convert and whole and not reshape:
            if in_order:
                return name
            if order == (1, 0):
                return lambda named: named[name].T
        return _arranged(name, working if convert else None, None if whole else window,
                         None if in_order else order, target if reshape else None)

    left, right = operand(prepared.left), operand(prepared.right)
    get_left = left if callable(left) else (lambda named: named[left])
    get_right = right if callable(right) else (lambda named: named[right])
    grid = (prepared.left.sizes[1], prepared.right.sizes[2])
    product_shape = grid if flat else (prepared.left.sizes[0],) + grid
    shape, order = prepared.shape, prepared.order
    reshape, in_order = product_shape != shape, order == tuple(range(len(shape)))
    matmul = route.matmul
    if not reshape and in_order:     # the common forms without a call per operand
        if type(left) is str and type(right) is str:
            run = lambda named: matmul(named[left], named[right])     # noqa: E731
        elif type(left) is str:
            run = lambda named: matmul(named[left], right(named))     # noqa: E731
        elif type(right) is str:
            run = lambda named: matmul(left(named), named[right])     # noqa: E731
        else:
            run = lambda named: matmul(left(named), right(named))     # noqa: E731
        return _Product(get_left, get_right, None, run)
    if not reshape and order in ((1, 0), (0, 2, 1)):
        # the transposed product as the product of the transposes: C-contiguous, as
        # the output's consumers (torch's gradient accumulation) want it
        def swapped_left(named):
            return get_right(named).swapaxes(-1, -2)

        def swapped_right(named):
            return get_left(named).swapaxes(-1, -2)

        def run_swapped(named):
            return matmul(swapped_left(named), swapped_right(named))
        return _Product(swapped_left, swapped_right, None, run_swapped)

    def finish(product):
        if reshape:
            product = product.reshape(shape)
        return product if in_order else product.transpose(order)

    def run(named):
        return finish(matmul(get_left(named), get_right(named)))
    return _Product(get_left, get_right, finish, run)
