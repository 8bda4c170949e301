"""einfuse under ``torch.compile``: statements and programs as PyTorch custom operators.

Eager calls go through ``torch.autograd.Function`` (runtime/torch_autograd.py), the
cheapest way to run a kernel under autograd.  Dynamo cannot trace einfuse's own Python
(parsing, planning, ctypes), so when the caller is being compiled the API entry points
(``ein``, ``Kernel.__call__``, ``Program.__call__``) come here instead, and Dynamo sees
two things only:

* :func:`_compiled_key` (or :func:`_object_key` for a compiled Kernel or Program), run
  once at trace time (``assume_constant_result``): it compiles the statement or program
  with its options (errors surface while compiling, with einfuse's message) and returns
  a string key for it.  What Dynamo passes it must be Python constants (torch 2.11
  converts every argument with ``as_python_constant``, which no object of ours has, and
  under ``dynamic=True`` a float option read from an object is symbolic): a Kernel or
  Program goes as its ``id()``, on which Dynamo guards, and is found again by it;
* the operator ``einfuse::run(key, names, tensors, scalars, wanted)``
  returning the outputs, with a fake implementation (output shapes and dtypes from
  einfuse's range and dtype inference on shape-only placeholders) and an autograd
  formula.  On CPU floats with inputs that need a gradient (``wanted``) it also returns
  the intermediates the backward reads, and its backward is
  ``einfuse::run_fused_backward``, the eager recorded call's fused backward, derived
  once and planned once per signature (program/torch_compiled_fused.py); elsewhere the
  backward is ``einfuse::run_backward``, running the gradient statements
  (``ef.derive``) for the inputs that need them.

So a model that calls einfuse compiles without graph breaks, and AOTAutograd records
the backward as einfuse's kernels.  The backward operator has no derivative itself:
a second derivative under torch.compile is refused by torch (eager mode has them).

Imported only while torch.compile traces a call with torch tensors."""

from __future__ import annotations

import functools
import gc
import hashlib
import importlib.metadata
import math
import numbers
import threading
import weakref
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from ..analysis.options import Options
from ..runtime.kernel import Kernel
from .compile import compile_source
from .program import Program
from . import torch_compiled_fused as fused
from ..errors import EinfuseError, EinfuseTypeError, UnexpectedArgumentError, attach_statement
from ..analysis.frameworks import (contiguous, numpy_dtype, to_numpy, torch_stand_in,
                                   torch_views)

_LOCK = threading.Lock()
_COMPILED: Dict[str, object] = {}       # key -> Kernel or Program
_KEYS: Dict[Tuple, str] = {}            # (source, options, outputs) -> key
_OPTION_NAMES = ("ranges", "pad", "bounds", "fill", "dtype", "backend", "threads",
                 "memory_limit")


@torch._dynamo.assume_constant_result
def _compiled_key(source: str, options, outputs) -> Tuple[str, Tuple[str, ...], int]:
    """Compile ``source`` once per (text, options, outputs) and name it by a key that
    the operator carries; runs eagerly while Dynamo traces, which takes the key and
    the input names (for positional arguments) and the number of outputs as
    constants.  ``options``: a
    compiled Kernel's or Program's Options, or the values ``compile`` takes."""
    if isinstance(options, Options):
        options = _option_values(options)
    identity = (source, repr(options), repr(outputs))
    with _LOCK:
        key = _KEYS.get(identity)
        if key is None:
            compiled = compile_source(source, outputs=outputs,
                                  **dict(zip(_OPTION_NAMES, options)))
            _refuse_writes(compiled)
            key = _key_of(identity)
            _COMPILED[key] = compiled
            _KEYS[identity] = key
    compiled = _COMPILED[key]
    return key, tuple(compiled.inputs), len(_outputs(compiled))


def _key_of(identity: Tuple[str, str, str]) -> str:
    """The operator's key of a (text, options, outputs): a digest of them and of this
    einfuse's version, not a counter.  The key is a constant of the traced graph, and
    inductor's caches (on by default, shared by processes) key a compiled graph by it:
    a counter would name different programs alike in two processes, and a graph
    cached for one (its kept intermediates, their shapes) would be run for another."""
    digest = hashlib.sha256("\0".join((_version(),) + identity).encode()).hexdigest()
    return f"einfuse-{digest[:20]}"


@functools.lru_cache(maxsize=1)
def _version() -> str:
    try:
        return importlib.metadata.version("einfuse")
    except importlib.metadata.PackageNotFoundError:     # (run from a source tree)
        return "unknown"


def _outputs(compiled) -> Tuple:
    return tuple(compiled.outputs) if _is_program(compiled) else (compiled.spec.output,)


# Kernels and Programs by id(), for _object_key: those met at trace time stay findable
# while they live (a dead one's id may be reused by a newer object: weak values)
_BY_ID: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()


@torch._dynamo.assume_constant_result
def _object_key(ident: int) -> Tuple[str, Tuple[str, ...], int]:
    """:func:`_compiled_key` of the Kernel or Program whose ``id()`` is ``ident``; runs
    eagerly while Dynamo traces a call of it, so the object is alive (the traced frame
    holds it)."""
    found = _BY_ID.get(ident)
    if found is None:
        found = _find_by_id(ident)
    if _is_program(found):
        return _compiled_key(found.source, found.options, found.outputs)
    return _compiled_key(found.statement, found.options, None)


def _find_by_id(ident: int):
    """The live Kernel or Program of this ``id()``: the garbage collector lists every
    object with attributes, once per object first traced (a trace takes far longer)."""
    for candidate in gc.get_objects():
        if id(candidate) == ident and isinstance(candidate, (Kernel, Program)):
            _BY_ID[ident] = candidate
            return candidate
    raise EinfuseError("under torch.compile: the compiled statement or program being "
                       "traced was not found among the live objects")


def _is_program(compiled) -> bool:
    return hasattr(compiled, "statements")


def _kernels(compiled) -> List[object]:
    """The statement kernels of a compiled statement or program, in order."""
    return [s.kernel for s in compiled.statements] if _is_program(compiled) else [compiled]


def _refuse_writes(compiled) -> None:
    """'=' and '+=' write into the caller's arrays, a mutation the operator cannot
    declare for arrays chosen by name."""
    for kernel in _kernels(compiled):
        spec = kernel.spec
        if spec.assign != ":=":
            raise attach_statement(EinfuseTypeError(
                f"'{spec.assign}' writes into {spec.output}, which torch.compile cannot "
                "trace; use ':=' and assign the result", span=spec.statement.output_span),
                kernel.statement)


def _option_values(options) -> Tuple:
    """A validated Options object as plain values (what ``compile`` takes back)."""
    ranges = {name: range(lo, hi) for name, (lo, hi) in options.ranges} or None
    return (ranges, options.pad, options.bounds, options.fill, options.dtype,
            options.backend, options.threads, options.memory_limit)


def call_statement(kernel, args, kwargs, arrays):
    """``Kernel.__call__`` while torch.compile traces."""
    # its id(), not its options: under dynamic=True Dynamo makes a float read from an
    # attribute (fill) symbolic, and a symbolic value cannot reach the key
    key, inputs, count = _object_key(id(kernel))
    return _call_key(key, inputs, count, args, kwargs, arrays)


def call_program(program, args, kwargs, arrays):
    """``Program.__call__`` while torch.compile traces."""
    key, inputs, count = _object_key(id(program))
    return _call_key(key, inputs, count, args, kwargs, arrays)


def call_source(source, options: Tuple, outputs, args, kwargs, arrays):
    """``ein(source, ...)`` while torch.compile traces: ``options`` as ``compile``
    takes them."""
    # ein's default fill=0.0 is symbolic under dynamic=True; comparing it settles it
    # (Dynamo guards on the comparison), so the key gets a constant
    options = tuple(0.0 if _positive_zero(value) else value for value in options)
    key, inputs, count = _compiled_key(source, options, outputs)
    return _call_key(key, inputs, count, args, kwargs, arrays)


def _positive_zero(value) -> bool:
    return isinstance(value, float) and value == 0.0 and math.copysign(1.0, value) > 0


def _call_key(key: str, inputs, count: int, args, kwargs, arrays):
    names: List[str] = []
    tensors: List[torch.Tensor] = []
    scalars: List[str] = []
    if len(args) > len(inputs):
        _refuse_positional(len(args), len(inputs))
    named = dict(zip(inputs, args))
    named.update(kwargs)
    if arrays is not None:
        named.update(arrays)
    for name, value in named.items():
        if isinstance(value, torch.Tensor):
            names.append(name)
            tensors.append(value)
        elif isinstance(value, bool) or isinstance(value, numbers.Integral):
            scalars.append(f"i:{name}:{int(value)}")
        elif isinstance(value, numbers.Real):     # exactly, as a hexadecimal float
            scalars.append(f"f:{name}:{float(value).hex()}")
        else:
            _refuse_value(name, value)
    # names travel joined by commas (the schema has no list of strings); they are
    # identifiers, checked when the statement was parsed
    # Python numbers are constants of the traced graph (torch.compile specialises on
    # them), so they travel in the text too
    # the inputs a gradient is wanted for decide what the forward keeps for the
    # backward (torch.compile guards on requires_grad and on grad mode)
    wanted = [name for name, t in zip(names, tensors)
              if t.requires_grad and t.dtype.is_floating_point] \
        if torch.is_grad_enabled() else []
    results = torch.ops.einfuse.run(key, ",".join(names), tensors, ",".join(scalars),
                                    ",".join(wanted))
    # (after the outputs: the intermediates kept for the backward, fused.forward)
    return results[0] if count == 1 else tuple(results[:count])


def _outside_the_graph(fn):
    """``fn`` run by Python, not traced: a graph break, then ``fn`` raises einfuse's
    error itself (Dynamo 2.11 cannot construct einfuse's exceptions in traced code:
    "Attempted to raise a non-Exception").  Under fullgraph=True torch reports the graph
    break, with this reason."""
    reason = ("einfuse refuses these arguments (it takes tensors and Python numbers); "
              "call without fullgraph=True to see einfuse's error")
    try:
        return torch.compiler.disable(fn, reason=reason)
    except TypeError:     # a torch whose disable() takes no reason
        return torch.compiler.disable(fn)


@_outside_the_graph
def _refuse_positional(given: int, taken: int):
    raise UnexpectedArgumentError(f"{given} positional arguments given but {taken} "
                                  "inputs are taken")


@_outside_the_graph
def _refuse_value(name: str, value):
    raise EinfuseTypeError(f"under torch.compile einfuse takes tensors and Python "
                           f"numbers; {name} is a {type(value).__name__}")


def _split(joined: str) -> List[str]:
    return joined.split(",") if joined else []


def _scalars(scalars: str) -> Dict[str, object]:
    values = {}
    for tagged in _split(scalars):
        kind, name, text = tagged.split(":", 2)
        values[name] = int(text) if kind == "i" else float.fromhex(text)
    return values


@functools.lru_cache(maxsize=1024)
def _parsed(names: str, scalars: str) -> Tuple[Tuple[str, ...], Dict[str, object]]:
    """The operator's names and scalars as the fused route reads them, parsed once per
    text (the dict is shared: read only)."""
    return tuple(_split(names)), _scalars(scalars)


def _host(tensor: torch.Tensor):
    """What the kernels read: a NumPy view for CPU tensors, the tensor on a device."""
    detached = tensor.detach()
    # (read as the tensor it is: its sums widen by torch's rule, as in an eager call)
    return torch_stand_in(to_numpy(detached)) if detached.device.type == "cpu" else \
        detached


def _results(compiled, values) -> Tuple:
    with torch_views():     # (NumPy views of the operator's tensors)
        results = compiled(**values)
    return results if isinstance(results, tuple) else (results,)


def _as_tensor(value, like: Optional[torch.Tensor]) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    tensor = torch.from_numpy(contiguous(np.array(value)))
    return tensor.to(like.device) if like is not None else tensor


def _plan(key: str, tensors, wanted: str) -> Optional[fused.FusedPlan]:
    """The fused route's plan of this call (program/torch_compiled_fused.py), or None."""
    if not wanted:
        return None
    identity = fused.identity_of(key, wanted, tensors)
    found = fused.known_plan(identity)      # (every call after the trace's first)
    if found is not fused.UNKNOWN:
        return found
    compiled = _COMPILED[key]
    return fused.plan_for(identity, compiled, _kernels(compiled), _outputs(compiled),
                          tuple(_split(wanted)), tensors)


# The operators are defined through torch.library.Library rather than custom_op: a
# custom_op call's dispatch (its Python wrappers' checks of the arguments and of the
# results' aliasing) cost about 24 us a call against 10 us here (a Python autograd
# kernel, then the implementation), four calls a training step.  Nothing checks the
# results' aliasing then: they are fresh tensors or the node's own slots, and a
# gradient that is an argument's memory (dX = dy) is copied (torch_node_compiled.cpp,
# torch_compiled_fused._gradient_results)
_LIBRARY = torch.library.Library("einfuse", "DEF")
_LIBRARY.define("run(str key, str names, Tensor[] tensors, str scalars, str wanted) "
                "-> Tensor[]")
_LIBRARY.define("run_fused_backward(str key, str names, Tensor[] tensors, str scalars, "
                "str wanted, Tensor[] saved, Tensor?[] grads) -> Tensor[]")
_LIBRARY.define("run_backward(str key, str names, Tensor[] tensors, str scalars, "
                "Tensor?[] grads, str wanted) -> Tensor[]")


def _operator(name: str):
    """``fn`` as the implementation of the operator ``einfuse::name`` on every device."""
    def register(fn):
        _LIBRARY.impl(name, fn, "CompositeExplicitAutograd")
        return fn
    return register


def _fake(name: str):
    def register(fn):
        torch.library.register_fake(f"einfuse::{name}", fn, lib=_LIBRARY)
        return fn
    return register


@_operator("run")
def run(key: str, names: str, tensors: List[torch.Tensor], scalars: str,
        wanted: str) -> List[torch.Tensor]:
    if wanted:      # the C++ node's forward, where this site's last signature has one
        found = fused.node_forward((key, wanted, names, scalars), tensors)
        if found is not None:
            return found
    plan = _plan(key, tensors, wanted)
    if plan is not None:
        split, numbers = _parsed(names, scalars)
        return fused.forward(plan, split, tensors, scalars, numbers)
    compiled = _COMPILED[key]
    values = {name: _host(t) for name, t in zip(_split(names), tensors)}
    values.update(_scalars(scalars))
    like = tensors[0] if tensors else None
    # a fresh tensor per output: an operator may not return views of its inputs
    results = [_as_tensor(value, like) for value in _results(compiled, values)]
    if _all_bfloat16(tensors):    # computed in float32 (as eagerly), returned as given
        results = [r.to(torch.bfloat16) if r.dtype.is_floating_point else r
                   for r in results]
    return results


def _all_bfloat16(tensors) -> bool:
    floats = [t for t in tensors if t.dtype.is_floating_point]
    return bool(floats) and all(t.dtype == torch.bfloat16 for t in floats)


@_fake("run")
def _run_fake(key, names, tensors, scalars, wanted):
    shapes = _output_placeholders(_COMPILED[key], _split(names), tensors,
                                  _scalars(scalars),
                                  fused.kept_names(_plan(key, tensors, wanted)))
    device = tensors[0].device if tensors else torch.device("cpu")
    return [tensors[0].new_empty(shape, dtype=dtype) if tensors else
            torch.empty(shape, dtype=dtype, device=device) for shape, dtype in shapes]


def _static_shape(tensor: torch.Tensor) -> Tuple[int, ...]:
    # A symbolic size becomes its value here, with a guard: einfuse's ranges are
    # integer arithmetic on sizes, decided per shape (one graph per shape).
    return tuple(int(size) for size in tensor.shape)


def _fake_value(tensor: torch.Tensor) -> np.ndarray:
    """A shape-only NumPy stand-in for a fake tensor (one element of memory); its dtype
    read by name (numpy_dtype makes no tensor: this runs under fake-tensor mode)."""
    return torch_stand_in(np.broadcast_to(np.zeros((), numpy_dtype(tensor)),
                                          _static_shape(tensor)))


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return getattr(torch, np.dtype(dtype).name)


def _output_placeholders(compiled, names, tensors, scalars, kept=()):
    """(shape, torch dtype) of each output, and then of each intermediate of ``kept``,
    from binding shape-only placeholders."""
    env = {name: _fake_value(t) for name, t in zip(names, tensors)}
    env.update(scalars)
    bf16 = _all_bfloat16(tensors)
    kernels = _kernels(compiled)
    outputs = compiled.outputs if _is_program(compiled) else (None,)
    produced = {}
    # a program on device tensors runs on tensors throughout; on the CPU its
    # intermediates are NumPy arrays (see _host): their placeholders follow suit
    on_device = any(t.device.type != "cpu" for t in tensors)
    for kernel in kernels:
        spec = kernel.spec
        call = kernel.bind(arrays={name: env[name] for name in spec.arg_order})
        dtype = call.dtypes.result
        env[spec.output] = np.broadcast_to(np.zeros((), dtype), call.output_shape)
        if on_device:
            env[spec.output] = torch_stand_in(env[spec.output])
        produced[spec.output] = (call.output_shape, dtype)
    shapes = []
    for name in tuple(outputs) + tuple(kept):
        shape, dtype = produced[name if name is not None else kernels[0].spec.output]
        torch_dtype = torch.bfloat16 if bf16 and dtype.kind == "f" else _torch_dtype(dtype)
        shapes.append((tuple(shape), torch_dtype))
    return shapes


def _setup_context(ctx, inputs, output):
    key, names, tensors, scalars, wanted = inputs
    ctx.key, ctx.names, ctx.scalars = key, names, scalars
    ctx.plan = _plan(key, tensors, wanted)
    if ctx.plan is not None:      # the fused backward reads the outputs and kept values
        ctx.wanted = list(ctx.plan.wanted)
        ctx.save_for_backward(*tensors, *output)
        ctx.count = len(tensors)
        # the kept values are the backward's inputs, not results a loss reads: marked,
        # the compiled backward gets no gradient for them (else AOTAutograd fills a
        # zero tensor per kept value, a batch-sized write per call), and an output
        # the loss does not read comes as None (zeros made only where needed)
        kept = output[len(ctx.plan.outputs):]
        if kept:
            ctx.mark_non_differentiable(*kept)
        ctx.set_materialize_grads(False)
        return
    ctx.wanted = [name for name, t in zip(_split(names), tensors)
                  if t.requires_grad and t.dtype.is_floating_point]
    ctx.save_for_backward(*tensors)


def _backward(ctx, grads):
    tensors = ctx.saved_tensors
    found = {}
    if ctx.plan is not None:
        computed = torch.ops.einfuse.run_fused_backward(
            ctx.key, ctx.names, list(tensors[:ctx.count]), ctx.scalars,
            ",".join(ctx.wanted), list(tensors[ctx.count:]), list(grads))
        found = dict(zip(ctx.wanted, computed))
    elif ctx.wanted:
        computed = torch.ops.einfuse.run_backward(ctx.key, ctx.names, list(tensors),
                                                  ctx.scalars, list(grads),
                                                  ",".join(ctx.wanted))
        found = dict(zip(ctx.wanted, computed))
    return None, None, [found.get(name) for name in _split(ctx.names)], None, None


torch.library.register_autograd("einfuse::run", _backward, setup_context=_setup_context,
                               lib=_LIBRARY)


@_operator("run_fused_backward")
def run_fused_backward(key: str, names: str, tensors: List[torch.Tensor], scalars: str,
                       wanted: str, saved: List[torch.Tensor],
                       grads: List[Optional[torch.Tensor]]) -> List[torch.Tensor]:
    site = (key, wanted, names, scalars)
    found = fused.node_backward(site, tensors, saved, grads)
    if found is not None:
        return found
    plan = _plan(key, tensors, wanted)
    split, numbers = _parsed(names, scalars)
    return fused.backward(plan, split, tensors, scalars, numbers, saved, grads, site)


@_fake("run_fused_backward")
def _run_fused_backward_fake(key, names, tensors, scalars, wanted, saved, grads):
    by_name = dict(zip(_split(names), tensors))
    return [torch.empty_like(by_name[name]) for name in _split(wanted)]


@_operator("run_backward")
def run_backward(key: str, names: str, tensors: List[torch.Tensor], scalars: str,
                 grads: List[Optional[torch.Tensor]], wanted: str) -> List[torch.Tensor]:
    compiled = _COMPILED[key]
    values = {name: _host(t) for name, t in zip(_split(names), tensors)}
    values.update(_scalars(scalars))
    by_name = dict(zip(_split(names), tensors))
    wanted = _split(wanted)
    found = _gradients(compiled, values, grads, wanted, by_name)
    return [_as_tensor(found[name], by_name[name]).to(by_name[name].dtype)
            .reshape(by_name[name].shape) for name in wanted]


@_fake("run_backward")
def _run_backward_fake(key, names, tensors, scalars, grads, wanted):
    by_name = dict(zip(_split(names), tensors))
    return [torch.empty_like(by_name[name]) for name in _split(wanted)]


def _gradients(compiled, values, grads, wanted, by_name) -> Dict[str, object]:
    from ..runtime import gradients
    if not _is_program(compiled):     # one statement
        grad = grads[0]
        if grad is None:
            return {name: np.zeros(tuple(by_name[name].shape)) for name in wanted}
        return gradients.compute_gradients(compiled.statement, compiled.options, values,
                                           _host(grad), wanted)
    found = {}
    # an output with no gradient seeds zeros of its shape: the outputs, computed once
    outputs = _results(compiled, values) if any(g is None for g in grads) else ()
    options = compiled.options
    for name in wanted:
        gradient = _derived(compiled.source, name, options.ranges, options.pad,
                            options.bounds, options.fill, tuple(compiled.outputs),
                            options.negative_zeros)
        arrays = dict(values)
        for index, (seed, grad) in enumerate(zip(gradient.seeds, grads)):
            arrays[seed] = _host(grad) if grad is not None else \
                np.zeros_like(np.asarray(outputs[index]))
        found[name] = gradient.run(arrays, backend=compiled.options.backend)
    return found


@functools.lru_cache(maxsize=256)
def _derived(source: str, wrt: str, ranges, pad, bounds, fill, outputs: Tuple[str, ...],
             negative_zeros: Tuple[bool, bool]):
    """The gradient program, derived once per program, input and options (a backward
    under torch.compile runs on every step); ``negative_zeros`` keys pad=-0.0 and
    fill=-0.0 apart from 0.0, which compare equal."""
    from .gradient import derive_program
    options = {"bounds": bounds, "fill": fill}
    if ranges:
        options["ranges"] = {name: range(lo, hi) for name, (lo, hi) in ranges}
    if pad is not None:
        options["pad"] = pad
    return derive_program(source, wrt, options, outputs=outputs)
