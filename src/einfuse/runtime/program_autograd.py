"""A whole program (or a statement's hoisted form) as one torch autograd node.

Recorded statement by statement, a softmax program is three autograd nodes, each
running its gradient statements as separate kernels for each input, and the max's
arg-max gradient on top: many passes over memory.  Here the forward runs fused on
NumPy views of the CPU tensors (schedule/fusion.py), keeping the intermediates the
backward reads, and the backward runs the program's backward (autodiff/backward.py:
every wanted input in one sweep, the shift of a softmax left out) fused the same way.

Used for CPU tensors of float32/float64 where autograd records the call, on the C or
NumPy backend, when every statement is a ':=' statement and the backward can be
derived; anything else keeps the statement-by-statement path.  A call on such tensors
that autograd does not record runs fused too, and returns tensors.  A backward that must
itself be differentiable (``create_graph=True``) recomputes the forward statement by
statement on the saved tensors and differentiates that graph, so higher derivatives
are those of the statements."""

from __future__ import annotations

import threading
import weakref
from operator import itemgetter
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from .backward import Backward, backward_program
from ..errors import EinfuseError, GradientBlockedError
from ..lang.ast import reductions
from ..analysis.frameworks import contiguous, placeholder, to_numpy, torch_views
from .run_groups import run_statements
from .signatures import signature_of
from .torch_autograd import (numpy_view, numpy_views, refuse_in_transform, save_tensors,
                             saved_tensors)
from ..analysis.frameworks import torch_recording as recording
from .program_calls import differentiable_inputs, remember_call, shaped_like
from .program_backward import PLANS_KEPT, BackwardRun, Count
from . import torch_node
from ..schedule.torch_node_plan import plan_before_backward, signature_eligibility



DERIVATIONS = Count()       # program backwards derived (ProgramAutograd.backward_for)


class PreparedCall:
    """Everything a recorded call of one signature (names, shapes, dtypes, strides,
    requires_grad of the tensors; which names are floats) needs that does not depend on
    the data: the forward's prepared run, what the backward reads, and the backward
    planned per layout of the seeds.  A repeated call is then torch's own bookkeeping,
    NumPy views and the kernel calls."""

    def __init__(self, owner: "ProgramAutograd", kernels: Tuple, names: Tuple[str, ...],
                 env: Dict[str, object], found, backend: str):
        backward, saved, recompute = found
        self.kernels, self.outputs, self.backend = kernels, owner.outputs, backend
        self.threads = owner.threads
        self.names = names                 # the differentiable inputs, in apply's order
        self.tensors = tuple(n for n, v in env.items() if isinstance(v, torch.Tensor))
        # every other tensor is passed to apply too (saved: torch's version check)
        self.others = tuple(n for n in self.tensors if n not in names)
        self.passed = names + self.others
        # (the passed tensors of a call, in order, by one C call)
        self.pick_passed = itemgetter(*self.passed) if len(self.passed) > 1 else \
            (lambda env, only=self.passed: [env[name] for name in only])
        self.scalars = tuple(n for n in env if n not in self.tensors)
        self.backward, self.recompute = backward, recompute
        self.keep = frozenset(self.outputs) | frozenset(saved)
        # intermediates the forward keeps for the backward, and the names whose shape
        # alone the backward needs (placeholders, found at the first call)
        self.kept = tuple(n for n in saved if n not in self.outputs)
        self.shaped = tuple(n for n in backward.shaped if n not in self.kept and
                            n not in env and n not in self.outputs)
        # per output: (name, whether the backward reads it, whether it needs its shape)
        self.output_uses = tuple((n, n in backward.reads or n in saved, n in backward.shaped)
                                 for n in self.outputs)
        self.input_shapes = tuple((tuple(env[n].shape), env[n].dtype) for n in names)
        self.runs = owner.runs
        self._forward = None               # the forward's PreparedRun, once known
        self._placeholders: Optional[Dict[str, object]] = None
        self._backwards: Dict[Tuple, Tuple[BackwardRun, Tuple[bool, ...]]] = {}
        self._lock = threading.Lock()
        # the C++ node's plan (runtime/torch_node.py), made after the first backward
        # with seeds like the outputs, or at a forward of a signature that has had
        # none (after_forward); tried once the node is built
        self.layouts = torch_node.layouts_of(env, self.passed)
        self._node = None
        # (schedule/torch_node_plan: from the signature now, else after a backward)
        early = signature_eligibility(self.layouts is not None, bool(self.scalars))
        self.node_decision = None if early.eligible else early
        self._node_tried = not early.eligible
        self._backward_count = 0
        self._forward_count = 0    # recorded forwards on the Python path, untranslated
        self._early_failed = False

    @property
    def node_plan(self):
        """The C++ node's plan of this signature (runtime/torch_node.translate's), or
        None: not made (yet), or declined (see ``node_decision``)."""
        return self._node

    def apply(self, env: Dict[str, object]):
        """The outputs of the program on ``env`` (this signature's tensors and scalars)
        as tensors that autograd records as one node; None where autograd records
        nothing now (grad mode off: the caller's path runs the statements fused,
        unrecorded)."""
        node = self._node
        # (inside inference_mode the node would save inference tensors, which torch
        # refuses even under enable_grad: the Python path records nothing there)
        if node is not None and not _transforms_active() and not _inference_mode():
            found = torch_node.run(node, self.pick_passed(env))
            if found is not None:
                return found
        arrays = numpy_views(env, self.tensors)
        for name in self.scalars:
            arrays[name] = env[name]
        if not _grad_enabled():     # (no_grad, an evaluation): the prepared forward alone
            self.run_forward(arrays)
            return tuple(torch.from_numpy(contiguous(np.asarray(arrays[name])))
                         for name in self.outputs)
        tensors = [env[name] for name in self.passed]
        if _DIRECT_APPLY is not None and not _transforms_active():
            return _DIRECT_APPLY((self, arrays), *tensors)
        refuse_in_transform(self.names)
        return ProgramFunction.apply((self, arrays), *tensors)

    def run_forward(self, env: Dict[str, object]) -> None:
        prepared = self._forward
        with torch_views():
            if prepared is not None:
                prepared(env)
            else:
                self._forward = run_statements(self.kernels, env, "numpy", keep=self.keep,
                                               runs=self.runs)

    def saved(self, env: Dict[str, object], arrays: Dict[str, object]) -> Dict[str, object]:
        """What the backward reads of the forward but its outputs: the kept
        intermediates, placeholders for names it needs the shape of, the inputs."""
        saved = {name: env[name] for name in self.kept}
        if self.shaped:
            if self._placeholders is None:
                self._placeholders = shaped_like(self.kernels, env, self.shaped)
            saved.update(self._placeholders)
        saved.update(arrays)
        return saved

    def gradients(self, env: Dict[str, object], grads, wanted) -> Tuple:
        """The gradients of the recorded inputs (None where not wanted or not
        reached), as tensors like the inputs; ``env``: the forward's saved arrays."""
        with torch_views():
            return self._gradients(env, grads, wanted)

    def _gradients(self, env: Dict[str, object], grads, wanted) -> Tuple:
        for seed, grad in zip(self.backward.seeds, grads):
            env[seed] = numpy_view(grad)
        key = self._seed_key(env)
        # (the arrays before this backward writes its own into env: the node's plan)
        clean = dict(env) if not self._node_tried else None
        given = list(env.values())
        found, values = self._planned_backward(key, env, given)
        if clean is not None:
            self._try_node(clean, key, found)
        result = []
        for number, name in enumerate(self.names):
            value = values.get(name)
            if value is None or not wanted[number]:
                result.append(None)
            elif found[1][number]:
                result.append(torch.from_numpy(value))
            else:
                shape, dtype = self.input_shapes[number]
                tensor = torch.as_tensor(value).to(dtype).reshape(shape)
                result.append(tensor.clone() if _shares(tensor.numpy(), given) else tensor)
        return tuple(result)

    def after_forward(self, saved: Dict[str, object], outputs: Sequence) -> None:
        """A recorded forward on the Python path ran (``saved``: what its backward
        reads, ``outputs``: its tensors): where schedule/torch_node_plan's
        plan_before_backward says so, the node's plan is made now, with the backward
        planned for contiguous seeds like the outputs and run once on zeros (its
        plan is kept: the first real backward of such seeds runs it), so that later
        forwards of a signature that never reaches a backward run as the node too."""
        self._forward_count += 1
        if self._early_failed or not plan_before_backward(
                self._forward_count, self._backward_count, torch_node.loaded()):
            return
        seeds = self.backward.seeds
        if len(seeds) != len(outputs) or \
                not all(t.dtype.is_floating_point for t in outputs):
            self._early_failed = True       # (an int output has no seed: its backward)
            return
        env = dict(saved)
        for seed, tensor in zip(seeds, outputs):
            env[seed] = np.zeros(tuple(tensor.shape), tensor.numpy().dtype)
        key = self._seed_key(env)
        clean, given = dict(env), list(env.values())
        try:
            with torch_views():
                self._try_node(clean, key, self._planned_backward(key, env, given)[0])
        except Exception:   # noqa: BLE001 -- a plan made ahead, for speed only
            # (a backward that cannot run on these arrays, for whatever reason, must not
            # fail the forward that asked for nothing: the first real backward, if any,
            # raises or plans on its own seeds as before)
            self._early_failed = True

    def _try_node(self, env: Dict[str, object], key, found) -> None:
        """The C++ node's plan for later calls: with the backward ``found`` where it was
        planned for contiguous seeds (the node makes every seed so), else with one
        planned now on contiguous copies of this call's seeds (``env``: the arrays the
        backward was given; computed once more, once)."""
        self._backward_count += 1
        if not torch_node.available(self._backward_count):
            return      # (its build runs in the background: a later backward tries)
        self._node_tried = True
        contiguous_key = tuple((shape, dtype, np.empty(shape, dtype).strides)
                               for shape, dtype, _ in key)
        if contiguous_key != key:
            found = self._backwards.get(contiguous_key)
            if found is None:
                for seed in self.backward.seeds:
                    env[seed] = np.ascontiguousarray(env[seed])
                try:
                    found = self._planned_backward(contiguous_key, env,
                                                   list(env.values()))[0]
                except EinfuseError:        # (as this call's did not: the Python path)
                    return
            key = contiguous_key
        owner = weakref.ref(self)     # (the plan, held by C++, must not keep this alive)

        def differentiable(tensors, grads, wanted):
            prepared = owner()
            found = _differentiable_backward(prepared, {}, tuple(tensors), tuple(grads),
                                             tuple(wanted))
            return [found.get(name) for name in prepared.names]
        # (schedule/torch_node_plan.NodeEligibility: whether it runs as the node, or why not)
        self._node, self.node_decision = torch_node.translate(
            self, self.layouts, key, found[0], found[1], differentiable)

    def _seed_key(self, env: Dict[str, object]) -> Tuple:
        """The layout of the seeds in ``env``: what a kept backward is planned for."""
        return tuple((env[s].shape, env[s].dtype, env[s].strides)
                     for s in self.backward.seeds)

    def _planned_backward(self, key, env: Dict[str, object], given):
        """(the backward kept for seeds of layout ``key``, its values on ``env``): the
        kept one run, or one planned, run and kept now."""
        found = self._backwards.get(key)
        if found is not None:
            return found, found[0](env)
        run = BackwardRun(self.backward, env, self.backend, self.recompute,
                          threads=self.threads)
        values = run(env)
        return self._keep_backward(key, run, values, given), values

    def _keep_backward(self, key, run: BackwardRun, values, given):
        """Remember ``run`` for seeds of this layout, with, per recorded input, whether
        its gradient goes to torch as it is: an array of the input's shape and dtype, of
        its own memory (not a view of ``given``, the seeds and saved arrays, which torch
        would then accumulate into)."""
        direct = []
        for number, name in enumerate(self.names):
            value = values.get(name)
            shape, dtype = self.input_shapes[number]
            direct.append(type(value) is np.ndarray and value.shape == shape and
                          value.flags.c_contiguous and value.flags.writeable and
                          torch.from_numpy(value.reshape(-1)[:0]).dtype == dtype and
                          not _shares(value, given))
        found = (run, tuple(direct))
        with self._lock:
            if len(self._backwards) >= PLANS_KEPT:
                self._backwards.clear()
            self._backwards[key] = found
        return found



def _shares(value, arrays) -> bool:
    return any(type(other) is np.ndarray and np.may_share_memory(value, other)
               for other in arrays)


class ProgramFunction(torch.autograd.Function):
    """The autograd node of a program's call.  The tensors passed are the recorded
    inputs and then every other tensor of the call, all saved (with the outputs the
    backward reads), so that torch's version check refuses a backward after any of them
    was modified in place."""

    @staticmethod
    def forward(ctx, state, *tensors):
        # state: (the PreparedCall, this call's arrays by name: NumPy views of the
        # tensors, and the scalars), one argument (torch.func's wrapper check walks
        # every argument of apply)
        prepared, arrays = state
        env = dict(arrays)
        prepared.run_forward(env)
        saved = prepared.saved(env, arrays)
        results = []
        read = []          # outputs the backward reads (their arrays are the tensors')
        for name, reads, shaped in prepared.output_uses:
            tensor = torch.from_numpy(contiguous(env[name]))
            results.append(tensor)
            if reads:
                saved[name] = tensor.numpy()
                read.append(tensor)
            elif shaped:
                saved[name] = placeholder(env[name])
            if not tensor.dtype.is_floating_point:
                ctx.mark_non_differentiable(tensor)
        ctx.state, ctx.saved = state, saved
        save_tensors(ctx, (*tensors, *read))     # (an inference tensor is held as it is)
        if not prepared._node_tried:
            prepared.after_forward(saved, results)
        return tuple(results)

    @staticmethod
    def backward(ctx, *grads):
        prepared, arrays = ctx.state
        tensors = saved_tensors(ctx)
        count = len(prepared.names)
        wanted = ctx.needs_input_grad[1:1 + count]
        extra = (None,) * len(prepared.others)
        if torch.is_grad_enabled():
            found = _differentiable_backward(prepared, arrays, tensors, grads, wanted)
            return (None,) + tuple(found.get(name) for name in prepared.names) + extra
        return (None,) + prepared.gradients(dict(ctx.saved), grads, wanted) + extra


def _direct_apply():
    """``ProgramFunction.apply`` as torch's C implementation, which the Python
    ``Function.apply`` calls after checking for torch.func transforms (a prepared
    call's tensors are never torch.func's wrappers: signature_of); None where this
    torch has no such entry."""
    base = getattr(torch._C, "_FunctionBase", None)
    method = base.__dict__.get("apply") if base is not None else None
    return method.__get__(None, ProgramFunction) if hasattr(method, "__get__") else None


_DIRECT_APPLY = _direct_apply()
_transforms_active = torch._C._are_functorch_transforms_active
_inference_mode = torch.is_inference_mode_enabled
# (inside inference_mode, enable_grad() records nothing either: recording)
_grad_enabled = recording


def _differentiable_backward(prepared: PreparedCall, arrays, tensors, grads, wanted):
    """create_graph=True: the gradients as a graph torch can differentiate again."""
    names = prepared.names
    chosen_names = [name for name, needed in zip(names, wanted) if needed]
    with torch.enable_grad():
        env = dict(arrays)
        env.update(zip(prepared.passed, tensors))
        run_statements(prepared.kernels, env, "torch", keep=set(prepared.outputs))
        outputs = [env[name] for name in prepared.outputs]
        chosen = [env[name] for name in chosen_names]
        pairs = [(o, g) for o, g in zip(outputs, grads) if o.requires_grad]
        found = torch.autograd.grad([o for o, _ in pairs], chosen, [g for _, g in pairs],
                                    create_graph=True, allow_unused=True)
    return {name: value for name, value in zip(chosen_names, found) if value is not None}


@dataclass
class ProgramAutograd:
    """Per program (or hoisted form): its backward programs by the set of inputs
    that need a gradient, its prepared forward runs, and the prepared recorded calls by
    call signature."""
    pieces: Tuple[str, ...]
    specs: Tuple
    outputs: Tuple[str, ...]
    options: Dict[str, object]
    backwards: Dict[Tuple[str, ...], Optional[Tuple[Backward, Tuple[str, ...], Tuple]]]
    runs: dict
    # call signatures (runtime/repeat.signature_of) whose checks passed -> their call
    calls: Dict[Tuple, PreparedCall] = field(default_factory=dict)
    threads: Optional[int] = None      # the program's threads=, the backward's too

    @staticmethod
    def of(pieces: Sequence[str], specs: Sequence, outputs: Sequence[str],
           options) -> "ProgramAutograd":
        passed = {key: getattr(options, key) for key in ("pad", "bounds", "fill")
                  if getattr(options, key, None) is not None}
        if getattr(options, "ranges", None):
            passed["ranges"] = {n: range(lo, hi) for n, (lo, hi) in options.ranges}
        return ProgramAutograd(tuple(pieces), tuple(specs), tuple(outputs), passed, {}, {},
                               threads=getattr(options, "threads", None))

    def backward_for(self, names: Tuple[str, ...], kernels):
        """(the backward, the intermediates to save, the forward kernels to recompute)
        for gradients of ``names``, or None where it cannot be derived."""
        if names not in self.backwards:
            DERIVATIONS.add()
            try:
                backward = backward_program(self.pieces, self.specs, self.outputs, names,
                                            self.options)
            except GradientBlockedError:
                # an input that reaches the outputs only through argmax, sign...: the error
                # a statement gives (a program's statements, each on its own, may not see
                # it: argmax's int output is no gradient to ask for)
                raise
            except EinfuseError:     # the statements' own path says what is wrong, later
                self.backwards[names] = None
            else:
                saved, recompute = _saved_or_recomputed(backward, kernels, self.outputs)
                self.backwards[names] = (backward, saved, recompute)
        return self.backwards[names]


def _saved_or_recomputed(backward: Backward, kernels, outputs) -> Tuple[Tuple[str, ...],
                                                                          Tuple]:
    """Which intermediates the backward reads are kept from the forward and which it
    computes again.  An intermediate with as many axes as the widest output, computed
    without a reduction from inputs and kept values (softmax's ``e = exp(X - m)``), is
    recomputed row by row inside the backward's first kernel: writing it whole in the
    forward and reading it back would cost a full pass over memory each way, where
    recomputing costs one ``exp`` per element in cache.  Everything else is kept."""
    defined = {k.spec.output: k for k in kernels}
    widest = max((len(defined[o].spec.output_indices) for o in outputs if o in defined),
                 default=0)
    recompute, saved = [], []
    for kernel in kernels:
        name = kernel.spec.output
        if name in outputs or name not in backward.reads:
            continue
        spec = kernel.spec
        cheap = not any(True for _ in reductions(spec.rhs)) and widest >= 2 and \
            len(spec.output_indices) >= widest and \
            all(n not in defined or n in saved or n in outputs for n in spec.arg_order)
        (recompute if cheap else saved).append(kernel if cheap else name)
    # an output that a recomputed statement reads is kept (as the returned tensor)
    saved += [n for k in recompute for n in k.spec.arg_order if n in outputs]
    return tuple(dict.fromkeys(saved)), tuple(recompute)


def recorded(holder, kernels: Sequence, env: Dict[str, object], outputs: Sequence[str],
             options) -> Optional[Tuple]:
    """The outputs of ``kernels`` run on ``env`` as tensors that autograd records as
    one node, or None where this call keeps the statement-by-statement path.
    ``holder`` (a Program, a HoistedForm) keeps the derived backwards across calls."""
    owners = holder.__dict__.setdefault("_autograd", {})
    owner = owners.get(id(kernels))
    if owner is None:
        owner = owners[id(kernels)] = ProgramAutograd.of(
            [k.statement for k in kernels], [k.spec for k in kernels], outputs, options)
        # the holder's first kernels' prepared calls, for its own fast path
        holder.__dict__.setdefault("_recorded_calls", owner.calls)
    return _run_recorded(owner, kernels, env, options.backend)


def prepared_call(holder, kernels: Sequence, env: Dict[str, object]
                  ) -> Optional[PreparedCall]:
    """The prepared call that :func:`recorded` made for ``kernels`` of ``holder`` and
    arrays of ``env``'s signature, if it made one."""
    owner = holder.__dict__.get("_autograd", {}).get(id(kernels))
    signature = signature_of(env) if owner is not None else None
    return owner.calls.get(signature) if signature is not None else None


def _run_recorded(owner: ProgramAutograd, kernels: Sequence, env: Dict[str, object],
                  backend: str) -> Optional[Tuple]:
    # a repeated call (same names, shapes, dtypes, strides, requires_grad on CPU) goes
    # straight to its prepared call: the checks below passed for its signature already
    grad = _grad_enabled()
    signature = signature_of(env) if grad else None
    prepared = owner.calls.get(signature) if signature is not None else None
    if prepared is not None:
        return prepared.apply(env)
    from .program_triton_autograd import recorded as triton_recorded, triton_route
    if triton_route(env, backend):      # CUDA tensors: the Triton node
        return triton_recorded(owner, kernels, env, backend)
    if backend not in ("auto", "c", "numpy") or any(k.spec.assign != ":=" for k in kernels):
        return None
    if any(isinstance(v, torch.Tensor) and v.device.type != "cpu" for v in env.values()):
        return None
    names = differentiable_inputs(env)
    if names is None:
        return None
    if not names:       # nothing to record, now or in grad mode: remembered as such
        signature = signature if grad else signature_of(env)
        call = UnrecordedCall(owner, tuple(kernels), env)
        remember_call(owner, signature, call)
        return call.apply(env)
    if not grad:
        return _unrecorded(owner, kernels, {
            name: to_numpy(value) if isinstance(value, torch.Tensor) else value
            for name, value in env.items()})
    found = owner.backward_for(tuple(names), kernels)
    if found is None:
        return None
    prepared = PreparedCall(owner, tuple(kernels), tuple(names), env, found, backend)
    remember_call(owner, signature, prepared)
    return prepared.apply(env)


class UnrecordedCall:
    """A repeated call of one signature in which no tensor requires a gradient: the
    statements' prepared run on NumPy views, the outputs as tensors sharing their
    arrays (what :func:`_unrecorded` gives, without its checks and conversions)."""

    def __init__(self, owner: ProgramAutograd, kernels: Tuple, env: Dict[str, object]):
        self.owner, self.kernels, self.outputs = owner, kernels, owner.outputs
        self.tensors = tuple(n for n, v in env.items() if isinstance(v, torch.Tensor))
        self.scalars = tuple(n for n in env if n not in self.tensors)
        self._run = None

    def apply(self, env: Dict[str, object]) -> Tuple:
        arrays = numpy_views(env, self.tensors)
        for name in self.scalars:
            arrays[name] = env[name]
        with torch_views():
            if self._run is not None:
                self._run(arrays)
            else:
                self._run = run_statements(self.kernels, arrays, "numpy",
                                           keep=set(self.outputs), runs=self.owner.runs)
        return tuple(torch.from_numpy(contiguous(np.asarray(arrays[name])))
                     for name in self.outputs)


def _unrecorded(owner: ProgramAutograd, kernels: Sequence, arrays: Dict[str, object]):
    """A call autograd does not record: the statements fused on NumPy views, as for
    NumPy callers; the outputs as tensors sharing their arrays."""
    with torch_views():
        run_statements(kernels, arrays, "numpy", keep=set(owner.outputs), runs=owner.runs)
    return tuple(torch.from_numpy(contiguous(np.asarray(arrays[name])))
                 for name in owner.outputs)


__all__ = ["ProgramAutograd", "recorded"]
