"""Binding one call's arguments to a Spec: names, arrays, dtypes, ranges."""

from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass
from typing import Dict, Iterator, Mapping, Optional, Sequence, Tuple

import numpy as np

from .dtypes import DTypes, check_index_dtype, check_output_cast, check_value_dtype, resolve_dtypes
from .options import Options
from .ranges import Bounds, infer_ranges
from .spec import Spec
from ..errors import (EinfuseTypeError, MissingArgumentError, OutOfBoundsError, ShapeError,
                      UnexpectedArgumentError, did_you_mean)
from ..lang.ast import accesses
from .frameworks import (NUMPY, TORCH, check_torch_layout, common_framework, dtype_rules,
                         framework_of, is_bfloat16, numpy_dtype, to_numpy)


class HostArrays(Mapping):
    """The call's tensors as NumPy arrays, each converted the first time a backend reads
    it: a Triton run on CUDA tensors never copies them to the host (binding needs only
    their shapes and dtypes, which it reads without touching the data)."""

    def __init__(self, values: Mapping[str, object]):
        self._values = dict(values)
        self._host: Dict[str, np.ndarray] = {}
        for name, value in self._values.items():
            check_torch_layout(name, value)
        self.shapes = {name: tuple(v.shape) for name, v in self._values.items()}
        self.dtypes = {name: numpy_dtype(v) for name, v in self._values.items()}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._host:
            self._host[name] = to_numpy(self._values[name])
        return self._host[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    @property
    def converted(self) -> Tuple[str, ...]:
        """Names already copied to NumPy (what tests read to prove none was)."""
        return tuple(self._host)


@dataclass
class BoundCall:
    """Everything a backend needs to run one statement on concrete arrays."""
    spec: Spec
    options: Options
    arrays: HostArrays                # every tensor read on the right, as NumPy (lazily)
    params: Dict[str, object]         # scalar parameters (Python or NumPy scalars)
    bounds: Bounds
    dtypes: DTypes
    framework: str
    output: object = None             # the caller's array for '=' / '+='
    sources: Dict[str, object] = None  # the caller's own objects, by name (for autograd)
    bfloat16: bool = False            # every float input is a bfloat16 tensor: so is the result

    @property
    def output_shape(self) -> Tuple[int, ...]:
        return tuple(self.bounds.extent(n) for n in self.spec.output_indices)


def bind_names(spec: Spec, args: Sequence[object], kwargs: Mapping[str, object]):
    """Positional arguments bind in order of first appearance on the right."""
    order = spec.arg_order
    if len(args) > len(order):
        raise UnexpectedArgumentError(f"{len(args)} positional arguments given but the "
                                      f"statement takes {len(order)} ({', '.join(order)})")
    named: Dict[str, object] = dict(zip(order, args))
    output = spec.output if spec.assign != ":=" else None
    allowed = set(order) | ({output} if output else set())
    for name, value in kwargs.items():
        if name not in allowed:
            if name == spec.output:
                raise UnexpectedArgumentError(f"{name} is created by ':='; do not pass it "
                                              "(use '=' to write into an existing array)",
                                              span=spec.statement.output_span)
            raise UnexpectedArgumentError(f"{name}={did_you_mean(name, allowed)} is not used "
                                          f"by the statement (it takes "
                                          f"{', '.join(sorted(allowed)) or 'no arguments'})")
        if name in named:
            raise UnexpectedArgumentError(f"{name} is given both by position and by keyword")
        named[name] = value
    for name in order:
        if name not in named:
            span = next((a.span for a in accesses(spec.rhs) if a.tensor == name), None)
            what = "tensor" if name in {t.name for t in spec.tensors} else "scalar parameter"
            raise MissingArgumentError(f"the {what} {name} was not passed; pass {name}=...",
                                       span=span)
    if output and output not in named:
        raise MissingArgumentError(f"'{spec.assign}' writes into an existing array: pass "
                                   f"{output}=...", span=spec.statement.output_span)
    return named


def _scalar(name: str, value, spec: Spec):
    if isinstance(value, (bool, int, float)):     # (np.float64 is a float too)
        return value
    if isinstance(value, numbers.Number) and not isinstance(value, (complex, np.generic)):
        # a Fraction, a Decimal: NumPy would hold it as an object, no dtype to compute in
        span = next((n.span for n in spec.rhs.walk()
                     if getattr(n, "name", None) == name), None)
        raise EinfuseTypeError(f"{name} is a scalar parameter given a "
                               f"{type(value).__name__} ({value!r}); einfuse takes a Python "
                               f"int, float or bool or a NumPy, torch or JAX number: pass "
                               f"float({name})", span=span)
    array = to_numpy(value)
    if array.ndim != 0:
        span = next((n.span for n in spec.rhs.walk()
                     if getattr(n, "name", None) == name), None)
        raise ShapeError(f"{name} is a scalar parameter (used without brackets) but got "
                         f"an array of shape {array.shape}; index it as {name}[...] or pass "
                         "a number", span=span)
    check_value_dtype(name, array.dtype, None, None)
    return array[()]


def _check_torch_output(spec: Spec, output) -> None:
    """torch refuses an in-place write into a leaf tensor that requires grad, or into a
    view of one, while grad mode is on: autograd could not account for it.  einfuse
    writes under no_grad, so it has to apply that rule itself, before anything runs.
    With grad mode off (an optimiser step) torch allows the write, and so does this."""
    import torch
    if any(stride == 0 and extent > 1 for stride, extent in zip(output.stride(),
                                                                 output.shape)):
        # an expanded tensor: several of its elements are one memory location
        raise EinfuseTypeError(f"{spec.output} is an expanded tensor (stride 0 along an axis "
                               f"of length > 1), so several of its elements share memory "
                               f"and '{spec.assign}' cannot write each one; pass a "
                               f"tensor that owns its elements (.clone())",
                               span=spec.statement.output_span)
    if not (output.requires_grad and torch.is_grad_enabled()):
        return
    base = output._base  # noqa: SLF001 - how torch itself tells a view from its leaf
    what = "a leaf tensor" if output.is_leaf else \
        "a view of a leaf tensor" if base is not None and base.is_leaf else None
    if what is not None:
        raise EinfuseTypeError(f"{spec.output} is {what} that requires grad; torch does not "
                               f"allow writing into it in place, so '{spec.assign}' cannot; "
                               f"use ':=', or call inside torch.no_grad()",
                               span=spec.statement.output_span)


def _check_empty_gathers(spec: Spec, policy: str, shapes, bounds: Bounds) -> None:
    """clip and wrap map every index value to an element of the gathered axis; an empty
    axis has none, so a gather that reads it at all (some iteration and some index value)
    has no right answer: an error on every backend, where bounds='fill' gives the fill."""
    if any(bounds.extent(index) == 0 for index in bounds.range_map):
        return   # nothing is read
    for access in accesses(spec.rhs):
        for axis, sub in enumerate(access.indices):
            if not sub.gathers or shapes[access.tensor][axis] != 0:
                continue
            if any(int(np.prod(shapes[g.tensor], dtype=np.int64)) == 0
                   for g, _ in sub.gathers):
                continue   # an empty index array gives no position to read
            raise OutOfBoundsError(
                f"axis {axis} of {access.tensor} is empty, so bounds='{policy}' has no "
                f"element to map an index value to; use bounds='fill' (every read gives "
                f"fill=) or a non-empty {access.tensor}", span=access.span)


@functools.lru_cache(maxsize=1024)
def _first_spans(spec: Spec) -> Dict[str, Tuple[int, int]]:
    """Each tensor's first access in the statement (where a dtype error points), found
    once per statement rather than on every call."""
    spans: Dict[str, Tuple[int, int]] = {}
    for access in accesses(spec.rhs):
        spans.setdefault(access.tensor, access.span)
    return spans


@functools.lru_cache(maxsize=1024)
def _ranges_for(spec: Spec, shapes, options: Options, output_shape) -> Bounds:
    """The per-shape stage, cached: a kernel called again with the same shapes skips
    range inference and its checks."""
    return infer_ranges(spec, dict(shapes), options, output_shape)


def _as_array(name: str, value) -> np.ndarray:
    """``value`` (NumPy's, a nested list...) as an array; what NumPy cannot make one of
    (a ragged list) is an error naming it, not NumPy's raw ValueError."""
    try:
        return to_numpy(value)
    except (TypeError, ValueError) as error:
        raise EinfuseTypeError(f"{name} cannot be read as an array ({error}); pass an "
                               "array or a nested list of numbers of one shape") from None


def bind_call(spec: Spec, options: Options, args, kwargs) -> BoundCall:
    named = bind_names(spec, args, kwargs)
    framework = common_framework(named)
    params = {name: _scalar(name, named[name], spec) for name in spec.params}
    values = {}
    for info in spec.tensors:
        value = named[info.name]
        if framework_of(value) == NUMPY:   # torch and JAX arrays are left where they are
            value = _as_array(info.name, value)
        values[info.name] = value
    arrays = HostArrays(values)
    spans = _first_spans(spec)
    for info in spec.tensors:
        dtype = arrays.dtypes[info.name]
        span = spans[info.name]
        if info.as_index:
            check_index_dtype(info.name, dtype, None, span)
        if info.as_value:
            check_value_dtype(info.name, dtype, None, span)
    output = named.get(spec.output) if spec.assign != ":=" else None
    output_shape: Optional[Tuple[int, ...]] = None
    if output is not None:
        if isinstance(output, numbers.Number):
            raise EinfuseTypeError(f"'{spec.assign}' needs an array to write into; "
                                   f"{spec.output} is a {type(output).__name__}",
                                   span=spec.statement.output_span)
        if framework_of(output) == TORCH:
            _check_torch_output(spec, output)
            output_shape = tuple(output.shape)
        else:
            output_shape = tuple(np.shape(to_numpy(output)))
    bounds = _ranges_for(spec, tuple(arrays.shapes.items()), options, output_shape)
    if options.bounds in ("clip", "wrap"):
        _check_empty_gathers(spec, options.bounds, arrays.shapes, bounds)
    dtypes = resolve_dtypes(spec, arrays.dtypes, params, options,
                            dtype_rules(framework, named), bounds.range_map)
    if output is not None:
        check_output_cast(spec.output, dtypes.result, numpy_dtype(output), options,
                          spec.statement.output_span)
    float_inputs = [named[t.name] for t in spec.tensors if t.as_value
                    and arrays.dtypes[t.name].kind == "f"]
    bfloat16 = bool(float_inputs) and all(is_bfloat16(v) for v in float_inputs) and \
        options.dtype is None and dtypes.result == np.float32
    return BoundCall(spec, options, arrays, params, bounds, dtypes, framework, output, named,
                     bfloat16)
