"""The fused route of einfuse's operator under torch.compile (program/torch_compiled.py):
the forward and backward of an eager recorded call (runtime/program_autograd.py) as the
bodies of the two operators, prepared once per signature.

Eagerly, a program on CPU tensors that need gradients is one autograd node: its forward
runs fused and keeps the intermediates its backward reads, and its backward (every
wanted input in one sweep, autodiff/backward.py) is derived once per set of wanted
inputs and planned once per layout.  Under torch.compile the same work is split
between the operators:

* ``einfuse::run`` with a non-empty ``wanted`` returns the outputs and then the kept
  intermediates (AOTAutograd saves them for the backward like any other output);
* ``einfuse::run_fused_backward`` runs the planned backward on the saved tensors and the
  output gradients.

What depends only on the program and the set of wanted inputs (the derived backward, the
names kept) is a :class:`FusedPlan`, found once per (key, wanted, dtypes, devices), the
same at trace time (fake tensors) and at run time; what depends on shapes and strides
too (the forward's prepared run, the backward's plans per seed layout) is the
:class:`~einfuse.runtime.program_autograd.PreparedCall` of that signature, made at the
first real call and reused by every later forward and backward.  So a training step
derives nothing and plans nothing after its first call.

Where the eager call runs as the C++ node (runtime/torch_node.py; the same plan, made
in a backward of this route), the operators run its two halves apart
(torch_node.split_plan: the forward returns exactly what the node's backward reads,
schedule/torch_node_split.py says when): each operator site first tries the split of its
last signature, before any Python work of the call, and the node checks every tensor's
layout, declining one of another signature or a kernel that raised its flag (the route
below then runs, and raises the statement's error).

Used where the eager path would record one node: CPU tensors, float32/float64 floats,
the C or NumPy backend, a backward that can be derived; any other call keeps the
statement-by-statement operators."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..analysis.frameworks import contiguous, numpy_dtype, placeholder
from ..runtime import torch_node
from ..runtime.program_autograd import PreparedCall, ProgramAutograd
from ..runtime.program_backward import PLANS_KEPT
from ..runtime.torch_autograd import numpy_views

_FLOATS = (torch.float32, torch.float64)
_LOCK = threading.Lock()
_OWNERS: Dict[str, ProgramAutograd] = {}              # operator key -> derived backwards
_PLANS: Dict[Tuple, Optional["FusedPlan"]] = {}
_CALLS: Dict[Tuple, PreparedCall] = {}                # see _prepared
# signature -> (the node plan it was split from, the split or None, the decision:
# schedule/torch_node_split.py's, None before the call has a node plan): _new_split
_SPLITS: Dict[Tuple, Tuple[object, Optional["_Split"], object]] = {}


@dataclass(frozen=True)
class FusedPlan:
    """One program (or statement) with one set of wanted inputs, on CPU floats:
    ``kept`` are the intermediates the forward operator returns after the outputs."""
    key: str
    owner: ProgramAutograd
    kernels: Tuple
    wanted: Tuple[str, ...]
    outputs: Tuple[str, ...]
    kept: Tuple[str, ...]
    backend: str
    found: Tuple       # owner.backward_for(wanted): (backward, saved, recompute)


@dataclass(frozen=True)
class _Split:
    """A call's node plan as the operators run it: ``order``, the operator's tensor of
    each passed slot; ``wanted``, the operator's tensor of each recorded input."""
    order: Tuple[int, ...]
    wanted: Tuple[int, ...]
    outputs: int                  # (the gradients after these are the kept values')
    plan: torch_node.SplitPlan


# (key, wanted, names, scalars) as the operator's strings -> the split its last
# signature made: the operators try it first, before any Python work of the call (the
# node checks every tensor's layout and declines one of another signature)
_LATEST: Dict[Tuple, _Split] = {}


def node_forward(site: Tuple, tensors: List[torch.Tensor]) -> Optional[List[torch.Tensor]]:
    """The forward operator's results by the node, or None (the operator's other
    routes run); ``site``: its (key, wanted, names, scalars)."""
    split = _LATEST.get(site)
    if split is None:
        return None
    found = torch_node.split_forward(split.plan, [tensors[n] for n in split.order])
    return list(found) if found is not None else None


def node_backward(site: Tuple, tensors: List[torch.Tensor], saved: List[torch.Tensor],
                  grads: List[Optional[torch.Tensor]]) -> Optional[List[torch.Tensor]]:
    """The backward operator's gradients by the node, or None (see node_forward)."""
    split = _LATEST.get(site)
    if split is None or len(saved) != len(split.plan.returned):
        return None
    given = [tensors[n] for n in split.order]
    given.extend(saved)
    computed = torch_node.split_backward(split.plan, given, list(grads[:split.outputs]))
    if computed is None:
        return None
    return [grad if grad is not None else torch.zeros_like(tensors[n])
            for grad, n in zip(computed, split.wanted)]


# what known_plan answers for a call whose plan is not decided yet
UNKNOWN = object()


def identity_of(key: str, wanted: str, tensors: Sequence[torch.Tensor]) -> Tuple:
    """What decides a call's plan: the operator's key, the wanted inputs, and the
    dtypes, devices and layouts of the tensors."""
    return (key, wanted, tuple((t.dtype, t.is_cpu, t.layout) for t in tensors))


def known_plan(identity: Tuple):
    """The plan decided for ``identity`` (None: the statement-by-statement operators),
    or UNKNOWN."""
    return _PLANS.get(identity, UNKNOWN)


def plan_for(identity: Tuple, compiled, kernels: Sequence, outputs: Sequence[str],
             wanted: Tuple[str, ...], tensors: Sequence[torch.Tensor]
             ) -> Optional[FusedPlan]:
    """The fused plan of this call, or None where the call keeps the statement-by-
    statement operators; decided from dtypes and devices alone, so fake tensors (the
    trace) and real ones (the run) get the same answer."""
    key = identity[0]
    if not wanted:
        return None
    if identity in _PLANS:
        return _PLANS[identity]
    plan = _new_plan(key, compiled, tuple(kernels), tuple(outputs), wanted, tensors)
    with _LOCK:
        _PLANS[identity] = plan
    return plan


def _new_plan(key, compiled, kernels, outputs, wanted, tensors) -> Optional[FusedPlan]:
    backend = compiled.options.backend
    if backend not in ("auto", "c", "numpy") or any(
            t.device.type != "cpu" or t.layout != torch.strided or t.is_complex() or
            (t.dtype.is_floating_point and t.dtype not in _FLOATS) for t in tensors):
        return None
    owner = _OWNERS.get(key)
    if owner is None:
        owner = ProgramAutograd.of([k.statement for k in kernels],
                                   [k.spec for k in kernels], outputs, compiled.options)
        with _LOCK:
            _OWNERS[key] = owner
    found = owner.backward_for(wanted, kernels)
    if found is None:
        return None
    _, saved, _ = found
    kept = tuple(name for name in saved if name not in outputs)
    return FusedPlan(key, owner, kernels, wanted, outputs, kept, backend, found)


def _signature(plan: FusedPlan, names: Tuple[str, ...], tensors: Sequence[torch.Tensor],
               scalars: str) -> Tuple:
    """What a prepared call is made for: names, shapes, dtypes and strides of the
    tensors and the scalars' text (a Python number is a constant of the traced graph)."""
    return (plan.key, plan.wanted, names, scalars,
            tuple((t.shape, t.dtype, t.stride()) for t in tensors))


def _prepared(plan: FusedPlan, signature: Tuple, names: Tuple[str, ...],
              tensors: Sequence[torch.Tensor], numbers: Dict[str, object]) -> PreparedCall:
    """The prepared call of this signature."""
    call = _CALLS.get(signature)
    if call is None:
        values: Dict[str, object] = dict(zip(names, tensors))
        values.update(numbers)
        call = PreparedCall(plan.owner, plan.kernels, plan.wanted, values, plan.found,
                            plan.backend)
        with _LOCK:
            if len(_CALLS) >= 4 * PLANS_KEPT:
                _CALLS.clear()
                _SPLITS.clear()
                _LATEST.clear()
            _CALLS[signature] = call
    return call


def _split_of(signature: Tuple) -> Optional[_Split]:
    entry = _SPLITS.get(signature)
    return entry[1] if entry is not None else None


def _new_split(plan: FusedPlan, signature: Tuple, call: PreparedCall,
               names: Tuple[str, ...], saved: Sequence[torch.Tensor],
               site: Optional[Tuple]) -> Optional[_Split]:
    """The node's plan of ``call`` split for the two operators (runtime/torch_node.py's
    split_plan), once the call has one, checked against the tensors the forward
    operator returned (``saved``); None where it keeps the Python path."""
    found = call.node_plan
    entry = _SPLITS.get(signature)
    if entry is not None and entry[0] is found:
        return entry[1]
    split, decision = None, None
    if found is not None:
        declared = tuple((tuple(t.shape), numpy_dtype(t),
                          tuple(s * t.element_size() for s in t.stride())) for t in saved)
        made, decision = torch_node.split_plan(found, len(call.passed),
                                               plan.outputs + plan.kept, declared)
        if made is not None:
            split = _Split(tuple(names.index(name) for name in call.passed),
                           tuple(names.index(name) for name in plan.wanted),
                           len(plan.outputs), made)
    with _LOCK:
        _SPLITS[signature] = (found, split, decision)
        if split is not None and site is not None:
            _LATEST[site] = split
    return split


def _views(names: Tuple[str, ...], tensors: Sequence[torch.Tensor],
           numbers: Dict[str, object]) -> Dict[str, object]:
    """NumPy views of the tensors by name, and the numbers."""
    arrays = numpy_views(dict(zip(names, tensors)), names)
    if numbers:
        arrays.update(numbers)
    return arrays


def forward(plan: FusedPlan, names: Tuple[str, ...], tensors: List[torch.Tensor],
            scalars: str, numbers: Dict[str, object]) -> List[torch.Tensor]:
    """The outputs, then the kept intermediates, as tensors of their own memory;
    ``names``, ``numbers``: the tensors' names and the scalars, parsed (read only)."""
    signature = _signature(plan, names, tensors, scalars)
    split = _split_of(signature)
    if split is not None:      # the C++ node's forward (None: it declines this call)
        found = torch_node.split_forward(split.plan, [tensors[n] for n in split.order])
        if found is not None:
            return list(found)
    call = _prepared(plan, signature, names, tensors, numbers)
    arrays = _views(names, tensors, numbers)
    env = dict(arrays)
    call.run_forward(env)
    given = list(arrays.values())
    results = []
    for name in plan.outputs + plan.kept:
        results.append(_own_tensor(env[name], given))
    return results


def _own_tensor(value, given: list) -> torch.Tensor:
    """``value`` as a tensor that shares no memory with ``given`` (the inputs and the
    results before it: an operator's outputs may not alias), which it joins."""
    array = contiguous(value)
    # an array that owns its memory (a kernel's fresh result, the common case) aliases
    # nothing but itself; any other is compared with each of ``given``
    owns = array.base is None and not any(other is array for other in given)
    if not array.flags.writeable or (not owns and any(
            type(other) is np.ndarray and np.may_share_memory(array, other)
            for other in given)):
        array = array.copy()
    given.append(array)
    return torch.from_numpy(array)


def backward(plan: FusedPlan, names: Tuple[str, ...], tensors: List[torch.Tensor],
             scalars: str, numbers: Dict[str, object], saved: List[torch.Tensor],
             grads: List[Optional[torch.Tensor]], site: Optional[Tuple] = None
             ) -> List[torch.Tensor]:
    """The gradients of the wanted inputs, in ``plan.wanted``'s order; ``saved``: the
    forward operator's results (outputs, then kept intermediates)."""
    signature = _signature(plan, names, tensors, scalars)
    call = _prepared(plan, signature, names, tensors, numbers)
    count = len(plan.outputs)
    split = _new_split(plan, signature, call, names, saved, site)
    if split is not None:      # the C++ node's backward (None: a kernel raised its flag)
        given = [tensors[n] for n in split.order]
        given.extend(saved)
        computed = torch_node.split_backward(split.plan, given, list(grads[:count]))
        if computed is not None:
            return _gradient_results(plan, names, tensors, computed)
    arrays = _views(names, tensors, numbers)
    outputs, kept = saved[:count], saved[count:]
    env = dict(arrays)
    for name, tensor in zip(plan.kept, kept):
        env[name] = tensor.numpy()
    found = call.saved(env, arrays)
    for (name, reads, shaped), tensor in zip(call.output_uses, outputs):
        if reads:
            found[name] = tensor.numpy()
        elif shaped:
            found[name] = placeholder(tensor.numpy())
    # an output no gradient reached (unused, or an integer output): zeros
    seeds = [grad if grad is not None else torch.zeros_like(out)
             for grad, out in zip(grads[:count], outputs)]
    computed = call.gradients(found, seeds, (True,) * len(plan.wanted))
    return _gradient_results(plan, names, tensors, computed,
                             list(tensors) + list(saved) + seeds)


def _gradient_results(plan: FusedPlan, names: Tuple[str, ...],
                      tensors: List[torch.Tensor], computed,
                      arguments: Sequence[torch.Tensor] = ()) -> List[torch.Tensor]:
    """The wanted inputs' gradients as the operator returns them: zeros where the
    outputs do not depend on an input, none sharing memory with another or with one of
    ``arguments`` (the operator's tensors: a gradient that is its seed, dX = dy, is
    copied; torch.compile frees and reuses an argument's buffer by that contract)."""
    by_name = dict(zip(names, tensors))
    taken = {_storage(t) for t in arguments if t is not None}
    results: List[torch.Tensor] = []
    for name, grad in zip(plan.wanted, computed):
        tensor = by_name[name]
        if grad is None:        # the outputs do not depend on this input
            grad = torch.zeros_like(tensor)
        elif _storage(grad) in taken:
            grad = grad.clone()
        taken.add(_storage(grad))
        results.append(grad)
    return results


def _storage(tensor: torch.Tensor) -> int:
    """Where a tensor's storage starts (views of one buffer compare equal); for a
    storage of no memory, a number no other tensor's is."""
    return tensor.untyped_storage().data_ptr() or -id(tensor)


def node_decisions() -> Tuple:
    """Per signature the operators met, whether its node plan runs them (a
    NodeEligibility), or None where the call has no node plan (yet)."""
    return tuple(entry[2] for entry in list(_SPLITS.values()))


def kept_names(plan: Optional[FusedPlan]) -> Tuple[str, ...]:
    return plan.kept if plan is not None else ()
