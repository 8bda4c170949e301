"""A program (or a statement's hoisted form) on the Triton backend as one torch autograd
node: the GPU's counterpart of program/autograd.py.

Recorded statement by statement, a softmax program on CUDA tensors is three autograd
nodes, its forward three Triton kernels (one per statement, each intermediate written
out and read back) and its backward the gradient statements of each node.  Here the
forward runs with nothing recorded, so its row groups run as one Triton kernel each
(schedule/row_groups.py), keeping only the outputs and the intermediates the backward
reads; the backward runs the program's backward (autodiff/backward.py: every wanted
input in one sweep, softmax's ``P * (dP - sum(dP * P))``) on the tensors, its own row
groups fused the same way.  A backward that must itself be differentiable
(``create_graph=True``) recomputes the forward statement by statement on the saved
tensors and differentiates that graph, as the CPU node does.

Used for CUDA tensors (one device; CPU tensors only under ``TRITON_INTERPRET=1`` with
``backend="triton"``, how the tests check it) of float32/float64 where autograd records
the call, when every statement is a ':=' statement and the backward can be derived.  A
gather's gradient that adds one value per position (cross-entropy's ``dX[i, t[i]] +=
v[i]``) runs inside the backward's row kernel as ``where(j == t[i], v[i], 0)``, after
one check of the labels on the device (runtime/program_scatter.where_form); other
scatters run as their own kernels."""

from __future__ import annotations

import importlib.util
import operator
import threading
from types import MappingProxyType
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from .run_groups import RowLaunches, run_statements
from .signatures import signature_of
from .torch_autograd import refuse_in_transform, save_tensors, saved_tensors
from ..analysis.frameworks import torch_recording as recording
from ..analysis.triton_facts import interpreted
from .program_calls import differentiable_inputs, remember_call, shaped_like
from .program_backward import PLANS_KEPT, BackwardRun

_NONE = MappingProxyType({})     # a call's scalars where it has none
_detach = torch.Tensor.detach
_is_inference = torch.Tensor.is_inference


def triton_route(env: Dict[str, object], backend: str) -> bool:
    """Whether a call on ``env`` runs on the Triton backend: torch tensors of one CUDA
    device with ``backend="auto"`` or ``"triton"``, or, under the interpreter, CPU
    tensors with ``backend="triton"``.  (Asked on every unrecorded torch call: the
    tensors' places are read by ``is_cuda``/``get_device``, which make no torch.device
    object, and a CUDA tensor's presence already says that CUDA is there, so that only
    whether Triton is installed is left to ask, once.)"""
    if backend not in ("auto", "triton"):
        return False
    place = None
    for value in env.values():
        if isinstance(value, torch.Tensor):
            here = value.get_device() if value.is_cuda else "cpu" if value.is_cpu else None
            if here is None or (place is not None and here != place):
                return False     # another device type, or two devices
            place = here
    if place is None:
        return False
    if place != "cpu":
        return _triton_installed()
    return backend == "triton" and interpreted()


_installed: list = []


def _triton_installed() -> bool:
    if not _installed:
        _installed.append(importlib.util.find_spec("triton") is not None)
    return _installed[0]


def recorded(owner, kernels, env: Dict[str, object], backend: str) -> Optional[Tuple]:
    """The outputs of ``kernels`` on ``env`` as one recorded autograd node, or None where
    this call keeps the statement-by-statement path (grad mode off too: the caller's
    path then runs the statements fused, unrecorded)."""
    if any(k.spec.assign != ":=" for k in kernels):
        return None
    names = differentiable_inputs(env)
    if names is None:
        return None
    if not names:       # nothing to record, in either grad mode: remembered as such
        unrecorded = UnrecordedTritonCall(owner, tuple(kernels))
        remember_call(owner, signature_of(env), unrecorded)
        return unrecorded.apply(env)
    if not recording():
        return None
    found = owner.backward_for(tuple(names), kernels)
    if found is None:
        return None
    call = TritonCall(owner, tuple(kernels), tuple(names), env, found, backend)
    remember_call(owner, signature_of(env), call)
    return call.apply(env, TritonProgramFunction.apply)


class UnrecordedTritonCall:
    """A repeated Triton call of one signature in which no tensor requires a gradient
    (so autograd records nothing, whatever the grad mode): the statements' prepared run
    on the tensors, found by the holder's look-up of the call's signature, without the
    argument checks, the framework and route questions and the second signature look-up
    of the full path (which computes the same: the statements fused, the outputs kept)."""

    def __init__(self, owner, kernels: Tuple):
        self.kernels, self.outputs, self.runs = kernels, owner.outputs, owner.runs
        self._run = None

    def apply(self, env: Dict[str, object], node_apply=None) -> Tuple:
        env = dict(env)
        run = self._run
        if run is not None:
            run(env)
        else:
            run = run_statements(self.kernels, env, "torch", keep=set(self.outputs),
                                 runs=self.runs)
            # (no tensor requires a gradient, so no step's autograd guard can refuse:
            # a run of row groups alone is their runners, run_groups.RowLaunches)
            self._run = (RowLaunches.of((run,)) or run) if run is not None else None
        return tuple(map(env.__getitem__, self.outputs))


class TritonCall:
    """A recorded call of one signature (names, shapes, dtypes, strides, devices,
    requires_grad): what the forward keeps, and the backward planned per layout of the
    output gradients.  ``apply`` is also the holder's fast path for a repeated call."""

    def __init__(self, owner, kernels: Tuple, names: Tuple[str, ...], env, found,
                 backend: str):
        backward, saved, recompute = found
        self.kernels, self.outputs, self.backend = kernels, owner.outputs, backend
        self.names = names
        # (the per-call facts saved_by_plan reads: the seeds' names by output)
        self.seeding = tuple((owner.outputs.index(name), name, seed) for name, seed in
                             zip(backward.outputs, backward.seeds))
        narrowed = self.saved_by_plan(env, backward, saved, recompute, backend)
        # (a name the plan does not read is still bound by shape: a placeholder)
        dropped = tuple(n for n in saved if n not in narrowed)
        saved = narrowed
        tensors = tuple(n for n, v in env.items() if isinstance(v, torch.Tensor))
        self.others = tuple(n for n in tensors if n not in names)
        self.passed = names + self.others
        self.saved_names = self.passed + tuple(self.outputs)    # the saved tensors
        self.extra = (None,) * len(self.others)      # the other tensors' gradients
        self.scalars = tuple(n for n in env if n not in tensors)
        self.backward, self.recompute = backward, recompute
        self.keep = frozenset(self.outputs) | frozenset(saved)
        self.kept = tuple(n for n in saved if n not in self.outputs)
        self.shaped = tuple(n for n in dict.fromkeys(tuple(backward.shaped) + dropped)
                            if n not in self.kept and n not in env and
                            n not in self.outputs)
        self.input_shapes = tuple((tuple(env[n].shape), env[n].dtype) for n in names)
        # (self.seeding, above: per seed of the backward, the output's position among
        # the gradients torch passes, its name and the seed's)
        self.runs: dict = {}          # the forward's prepared runs (run_statements)
        # the forward's prepared run, once there is one: every call of this node has the
        # signature it was made for (the holder looks it up by signature), so a repeated
        # forward goes straight to its steps, without the signature's look-up again
        self._forward_run = None
        # that run as its row groups' runners alone (run_groups.RowLaunches), where it
        # is one: the node's forward records nothing, and launches them directly
        self.launches: Optional[RowLaunches] = None
        self.marks: Optional[Tuple[int, ...]] = None   # the outputs that are not floats
        self._backwards: Dict[Tuple, _PreparedBackward] = {}
        self._placeholders: Optional[Dict[str, object]] = None
        self._lock = threading.Lock()
        self._state = (self, _NONE)        # the node's state where there are no scalars

    def apply(self, env: Dict[str, object], node_apply=None):
        """The node's outputs on ``env``, a call of this node's signature (looked up by
        signature_of, which refuses torch.func's wrapped tensors): the node is applied
        by torch's C entry, without ``Function.apply``'s Python steps (the setup-context
        probe, the transform check made here, the unwrapping of dead torch.func
        wrappers that such a signature cannot hold).  ``node_apply``: torch's full
        ``Function.apply`` instead (the first call, whose tensors nothing has vetted)."""
        if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
            return None       # (recording(), inlined: this is every repeated call's path)
        if torch._C._are_functorch_transforms_active():
            refuse_in_transform(self.names)
        state = (self, {name: env[name] for name in self.scalars}) if self.scalars else \
            self._state
        return (node_apply or _node_apply)(state, *map(env.__getitem__, self.passed))

    def forward(self, env: Dict[str, object]) -> None:
        prepared = self._forward_run
        if prepared is not None:
            prepared(env)
            return
        run = run_statements(self.kernels, env, "torch", keep=set(self.keep),
                             runs=self.runs)
        self._forward_run = run
        if run is not None:
            self.launches = RowLaunches.of((run,))

    def saved_by_plan(self, env, backward, saved: Tuple[str, ...], recompute,
                      backend: str) -> Tuple[str, ...]:
        """``saved`` narrowed to the names the backward's plan for arrays like ``env``
        reads: where the folded backward runs (program_backward: exact for these
        shapes), softmax's ``P * (dP - sum(dP * P))`` reads the output, not the row
        maximum ``m``, which then stays in the forward's registers instead of being
        written beside each row.  (The plan is the same at the backward: it depends on
        the shapes and dtypes, which this node's signature fixes.)"""
        folded = backward.folded
        if folded is None or not saved:
            return saved
        from .program_backward import folded_entries, output_placeholder
        from ..analysis.frameworks import placeholder
        with torch.no_grad():
            shapes = {name: placeholder(value) for name, value in env.items()}
            shapes.update(shaped_like(self.kernels, env, tuple(self.outputs) + saved))
            for _, name, seed in self.seeding:
                shapes[seed] = shapes[name]
            for kernel in recompute:
                shapes[kernel.spec.output] = output_placeholder(kernel, shapes)
            if folded_entries(folded, shapes, backend) is None:
                return saved
        needed = [k for k in recompute if k.spec.output in folded.reads]
        reads = set(folded.reads) | {n for k in needed for n in k.spec.arg_order}
        return tuple(name for name in saved if name in reads)

    def placeholders(self, env: Dict[str, object]) -> Dict[str, object]:
        """Tensors of the shapes (and dtypes) of the intermediates whose shape alone the
        backward needs, on the forward's device: one element of memory each."""
        if self._placeholders is None:
            from ..analysis.frameworks import tensor_placeholder
            device = next(v.device for v in env.values() if isinstance(v, torch.Tensor))
            self._placeholders = {
                name: tensor_placeholder(
                    value.shape, torch.from_numpy(np.empty(0, value.dtype)).dtype, device)
                for name, value in shaped_like(self.kernels, env, self.shaped).items()}
        return self._placeholders

    def gradients(self, env: Dict[str, object], saved: Tuple, grads, wanted) -> Tuple:
        """What the node's backward returns: None for the state, the wanted inputs'
        gradients (None for the others), None for the other tensors; from the program's
        backward on ``env`` (the scalars and the intermediates kept), the ``saved``
        tensors (``saved_names``) and the outputs' ``grads``.  The backward is planned
        per layout of the seeds (the saved tensors' follow from the forward's
        signature, which is this node's), and with it, on its first run, which of its
        results need converting to their input's dtype and shape and whether it is
        row groups alone: a repeated backward is the seeds' layouts, one look-up and
        the plan's kernels (row groups: their runners, run_groups.RowLaunches, on the
        saved tensors as they are -- a launch reads their storage only)."""
        env.update(zip(self.saved_names, saved))
        key = []
        marks = self.marks
        for position, name, seed in self.seeding:
            grad = grads[position]
            if grad is None or position in marks:    # (marks: the outputs not floats)
                value = env[name]
                grad = torch.zeros(value.shape, dtype=value.dtype if
                                   value.dtype.is_floating_point else torch.float32,
                                   device=value.device)
            env[seed] = grad
            key.append((grad.dtype, grad.stride()))
        key = tuple(key)
        prepared = self._backwards.get(key)
        if prepared is not None and prepared.launches is not None:
            prepared.launches(env)
            if wanted == prepared.wanted:    # (fixed per node: the inputs' requires_grad)
                env[None] = None             # (what the getter gives for no gradient)
                return prepared.returned(env)
            return (None,) + tuple(None if result is None or not want else env[result]
                                   for result, want in zip(prepared.picks, wanted)) + \
                self.extra
        # (the full way, and a plan's first run, read detached tensors)
        env.update(zip(self.saved_names, map(_detach, saved)))
        if prepared is None:
            run = BackwardRun(self.backward, env, self.backend, self.recompute, "torch")
            values = run(env)
            prepared = _PreparedBackward(run, self._conversions(values), self.saved_names,
                                         wanted, len(self.extra))
            with self._lock:
                if len(self._backwards) >= PLANS_KEPT:
                    self._backwards.clear()
                self._backwards[key] = prepared
        else:
            values = prepared.run(env)
        result = []
        get = values.get
        for number, (name, convert) in enumerate(prepared.conversions):
            value = get(name)
            if value is None or not wanted[number]:
                result.append(None)
            elif convert:
                shape, dtype = self.input_shapes[number]
                result.append(torch.as_tensor(value).to(dtype).reshape(shape))
            else:
                result.append(value)
        return (None,) + tuple(result) + self.extra

    def _conversions(self, values: Dict[str, object]) -> Tuple[Tuple[str, bool], ...]:
        """Per differentiated input, its name and whether the backward's result for it
        is to be converted (not a torch tensor of the input's dtype and shape).  The
        plan fixes it: the same kernels on the same layouts give the same kinds."""
        found = []
        for name, (shape, dtype) in zip(self.names, self.input_shapes):
            value = values.get(name)
            found.append((name, value is not None and (
                type(value) is not torch.Tensor or value.dtype != dtype or
                tuple(value.shape) != shape)))
        return tuple(found)


class _PreparedBackward:
    """A node's backward for one layout of its seeds: the planned run and, per
    differentiated input, whether its result is converted (TritonCall._conversions);
    where no result is and the run is row groups alone, ``launches`` (their runners)
    and ``picks``: per differentiated input, the name of its result in the run's
    ``env`` (None: no gradient), and ``returned``: for ``wanted`` (the first call's
    ``needs_input_grad``, fixed per node), the node backward's whole result read out of
    ``env`` by one getter, its Nones read at the key None.  A result that is one of the
    ``saved`` names as it is (no kernel computes it) keeps the full way, which gives it
    detached."""
    __slots__ = ("run", "conversions", "launches", "picks", "wanted", "returned")

    def __init__(self, run: BackwardRun, conversions: Tuple[Tuple[str, bool], ...],
                 saved: Tuple[str, ...], wanted: Tuple[bool, ...], others: int):
        self.run, self.conversions = run, conversions
        results = dict(run.results)
        self.picks = tuple(results.get(name) for name, _ in conversions)
        self.wanted = tuple(wanted)
        self.returned = operator.itemgetter(
            None, *[pick if want else None for pick, want in zip(self.picks, wanted)],
            *(None,) * others)
        self.launches = run.row_launches() if not any(
            convert for _, convert in conversions) and \
            not set(self.picks) & set(saved) else None


class TritonProgramFunction(torch.autograd.Function):
    """The autograd node of a program's call on the Triton backend: the recorded inputs
    and then every other tensor of the call are passed (and saved, so that torch's
    version check refuses a backward after one was modified in place)."""

    @staticmethod
    def forward(ctx, state, *tensors):
        call, scalars = state
        env = dict(scalars) if scalars else {}
        launches = call.launches
        if launches is not None:     # (a launch reads the tensors' storage only)
            env.update(zip(call.passed, tensors))
            launches(env)
        else:
            env.update(zip(call.passed, map(_detach, tensors)))
            call.forward(env)
        outputs = tuple(map(env.__getitem__, call.outputs))
        marks = call.marks
        if marks is None:       # (the first call: which outputs are not floats)
            marks = call.marks = tuple(o for o, out in enumerate(outputs)
                                       if not out.dtype.is_floating_point)
        for position in marks:
            ctx.mark_non_differentiable(outputs[position])
        ctx.state = state
        ctx.kept = {name: env[name] for name in call.kept} if call.kept else _NONE
        ctx.shaped = call.placeholders(env) if call.shaped else _NONE
        # (the outputs are new tensors, never inference tensors: only the inputs are
        # asked, save_tensors' question)
        if any(map(_is_inference, tensors)):
            save_tensors(ctx, (*tensors, *outputs))
        else:
            ctx.inference = None
            ctx.save_for_backward(*tensors, *outputs)
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        call, scalars = ctx.state
        saved = ctx.saved_tensors if ctx.inference is None else saved_tensors(ctx)
        wanted = ctx.needs_input_grad[1:1 + len(call.names)]
        if torch.is_grad_enabled():      # create_graph=True: a differentiable backward
            found = _differentiable(call, scalars, saved[:len(call.passed)], grads, wanted)
            return (None,) + tuple(found.get(name) for name in call.names) + call.extra
        # (the names are disjoint: the call's tensors, its outputs, the intermediates
        # kept and the placeholders' shapes)
        env = {**scalars, **ctx.kept, **ctx.shaped} if scalars or call.kept or \
            call.shaped else {}
        return call.gradients(env, saved, grads, wanted)


# torch's C entry of a Function (what ``Function.apply`` calls last), bound to the node
_node_apply = super(torch.autograd.Function, TritonProgramFunction).apply


# set while a differentiable backward records the forward statement by statement: a
# statement then records its own node, not a one-statement program node again (whose
# differentiable backward would come back here without end)
recording_statements = threading.local()


def statement_by_statement() -> bool:
    return getattr(recording_statements, "depth", 0) > 0


def _differentiable(call: TritonCall, scalars, tensors, grads, wanted):
    """The forward again, statement by statement with autograd recording (each
    statement its own node), differentiated with ``create_graph=True``."""
    chosen = [name for name, needed in zip(call.names, wanted) if needed]
    recording_statements.depth = getattr(recording_statements, "depth", 0) + 1
    try:
        return _recorded_again(call, chosen, scalars, tensors, grads)
    finally:
        recording_statements.depth -= 1


def _recorded_again(call: TritonCall, chosen, scalars, tensors, grads):
    with torch.enable_grad():
        env = dict(scalars)
        env.update(zip(call.passed, tensors))
        run_statements(call.kernels, env, "torch", keep=set(call.outputs))
        outputs = [env[name] for name in call.outputs]
        pairs = [(o, g) for o, g in zip(outputs, grads) if o.requires_grad and g is not None]
        found = torch.autograd.grad([o for o, _ in pairs], [env[n] for n in chosen],
                                    [g for _, g in pairs], create_graph=True,
                                    allow_unused=True)
    return {name: value for name, value in zip(chosen, found) if value is not None}
