"""A program statement that BLAS computes, as an operation of the C++ autograd node
(runtime/torch_node.py): the call its prepared runner makes on torch's BLAS, recorded.

The Python path's runner of such a statement (backends/c/blas.py, on NumPy views of a
torch caller's tensors) hands views of its arguments -- the arrays themselves, or
transposed -- to ``torch.matmul`` or ``torch.addmm`` (backends/c/torch_blas.py).  Here
the same runner, built for the same signature but with a route that records what it
is handed instead of multiplying, runs once on stand-in arrays: each operand it passes
is then found as (argument, element offset, sizes, element strides), and the node calls
``at::matmul`` / ``at::addmm`` -- the functions torch.matmul and torch.addmm are -- on
the same views of its slots, so the same products to the bit.  Whether the recorded
call is one the node can repeat is schedule/torch_node_plan.product_eligibility's
decision; a runner that does anything else with its operands (a conversion, a copy, a
scalar factor, an addend added after the product, a transposed result) declines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..backends.c.blas import addend_runner, contraction_runner, route_for
from ..backends.c.blas_route import BlasRoute
from ..errors import EinfuseError
from ..plan.contraction_addend import ContractionAddend
from ..plan.windowed_contraction import WindowedContraction
from ..schedule.choose import as_written
from ..schedule.schedule import Route
from ..schedule.torch_node_plan import (NodeEligibility, NodeProductFacts,
                                        product_eligibility)
from .signatures import signature_of

_PRODUCT_ROUTES = (Route.BLAS, Route.BLAS_THEN_ADDEND, Route.BLAS_WINDOWED)


@dataclass(frozen=True)
class OperandView:
    """An operand as the runner hands it to torch: a view of the argument ``name``."""
    name: str
    offset: int                  # elements from the argument's first
    sizes: Tuple[int, ...]
    strides: Tuple[int, ...]     # elements


@dataclass(frozen=True)
class RecordedProduct:
    """``at::addmm(addend, left, right)`` where ``addmm``, else ``at::matmul(left,
    right)`` (``operands``: (addend,) left, right), giving ``shape`` of ``dtype``."""
    addmm: bool
    operands: Tuple[OperandView, ...]
    shape: Tuple[int, ...]
    dtype: np.dtype


def _stand_ins(layouts: Dict[str, Tuple]) -> Optional[Dict[str, np.ndarray]]:
    """Arrays of these (shape, dtype, byte strides) layouts on memory of their own
    each (nothing is read or written: an operand is found by the address it views)."""
    found = {}
    for name, (shape, dtype, strides) in layouts.items():
        if any(s < 0 for s in strides) or 0 in shape:
            return None
        item = np.dtype(dtype).itemsize
        extent = item + sum((n - 1) * s for n, s in zip(shape, strides))
        memory = np.empty(-(-extent // item), dtype)
        found[name] = np.lib.stride_tricks.as_strided(memory, shape, strides)
    return found


class _Recorder:
    """A BLAS route that records the arrays it is handed and gives a read-only result
    (an addend added in place afterwards then fails, which declines)."""

    def __init__(self):
        self.calls: List[Tuple[bool, Tuple[np.ndarray, ...], np.ndarray]] = []

    def _result(self, addmm: bool, arrays) -> np.ndarray:
        left, right = arrays[-2], arrays[-1]
        shape = np.broadcast_shapes(left.shape[:-2], right.shape[:-2]) + \
            (left.shape[-2], right.shape[-1])
        result = np.empty(shape, np.result_type(left, right))
        result.flags.writeable = False
        self.calls.append((addmm, tuple(arrays), result))
        return result

    def route(self) -> BlasRoute:
        return BlasRoute("recorded",
                         lambda left, right: self._result(False, (left, right)),
                         lambda addend, left, right: self._result(True, (addend, left, right)))


def _view_of(array: np.ndarray, stand_ins: Dict[str, np.ndarray]) -> Optional[OperandView]:
    """``array`` as a view of one stand-in, or None (a copy, a conversion)."""
    address = array.ctypes.data
    for name, given in stand_ins.items():
        start = given.ctypes.data
        span = given.itemsize + sum((n - 1) * s for n, s in zip(given.shape, given.strides))
        if array.dtype != given.dtype or not start <= address < start + span:
            continue
        item = array.itemsize
        if (address - start) % item or any(s % item or s < 0 for s in array.strides):
            return None
        return OperandView(name, (address - start) // item, tuple(array.shape),
                           tuple(s // item for s in array.strides))
    return None


def recorded_product(kernel, layouts: Dict[str, Tuple], chained: bool = False
                     ) -> Tuple[Optional[RecordedProduct], Optional[NodeEligibility]]:
    """(the product, None) of a statement BLAS computes for arguments of ``layouts``
    (name -> (shape, dtype, byte strides)); (None, the reason) where it is one the node
    does not repeat; (None, None) where the statement is not a product at all.
    ``chained``: a product runtime/epilogue_chain.py's chain runs by a runner of its
    own (backends/c/repeat.blas_runner on the as-written schedule, torch's route), not
    the statement's repeat runner."""
    stand_ins = _stand_ins(layouts)
    if stand_ins is None:
        return None, None
    try:
        bound = kernel.bind(arrays=stand_ins)
    except EinfuseError:
        return None, None
    signature = signature_of(stand_ins)
    written = as_written(kernel, bound)
    blas = written.blas
    schedule = written if chained else kernel.schedule(bound, signature)
    if schedule.backend != "c" or schedule.route not in _PRODUCT_ROUTES or blas is None:
        return None, None
    prepared = chained or signature is not None and kernel._repeat.get(signature) is not None
    windowed = isinstance(blas, WindowedContraction)
    contraction = blas.contraction if isinstance(blas, ContractionAddend) else blas
    torch_blas = not windowed and route_for(contraction, bound, True).name == "torch"
    one_call = viewed = False
    views: Tuple[OperandView, ...] = ()
    call = None
    if not windowed:
        recorder = _Recorder()
        build = addend_runner if isinstance(blas, ContractionAddend) else contraction_runner
        try:
            result = build(blas, bound, recorder.route())(stand_ins)
        except ValueError:      # (the addend added to the read-only product)
            result = None
        one_call = len(recorder.calls) == 1 and result is recorder.calls[0][2] and \
            tuple(result.shape) == tuple(bound.output_shape)
        if one_call:
            call = recorder.calls[0]
            found = tuple(_view_of(array, stand_ins) for array in call[1])
            viewed = all(view is not None for view in found)
            views = found if viewed else ()
    dtype = np.dtype(bound.dtypes.working)
    decision = product_eligibility(NodeProductFacts(
        prepared=prepared, torch_blas=torch_blas, windowed=windowed, one_call=one_call,
        operands_viewed=viewed,
        result_dtype=dtype == np.dtype(bound.dtypes.result) and
        (call is None or call[2].dtype == dtype)))
    if not decision.eligible:
        return None, decision
    return RecordedProduct(call[0], views, tuple(bound.output_shape), dtype), None


__all__ = ["OperandView", "RecordedProduct", "recorded_product"]
