"""A prepared program call on CPU torch tensors handed to the C++ autograd node
(backends/c/torch_node.py): the forward's prepared run and the backward's, once both are
known for a signature (after its first backward, or at a forward of one that records
and has had no backward: program_autograd.PreparedCall.after_forward), are translated
into one plan of slots and kernel calls; later calls of that signature are one C++
call each way, with the same kernels on the same arrays, so the same values.

A call is translated only where every step is a prepared fused group, row kernel
(the log-sum-exp one too, on int64 labels), statement run alone by its repeat runner
(backends/c/repeat.py; or in its hoisted or epilogue form, by that form's prepared
run), product on torch's BLAS (an at::matmul / at::addmm operation on views of the
same slots: runtime/torch_node_products.py) or a backward's label check, whose
arguments depend on the layouts alone (no scalar parameters, no gathers checked per
call, no scatter), every output is a float array the forward makes, and every
gradient is an array the backward makes of the input's shape and dtype.
:func:`forward_only` plans an unrecorded chain (runtime/epilogue_chain.py) the same
way: a forward with no backward.  :func:`split_plan` hands a translated plan's two
halves to torch.compile's operators (program/torch_compiled_fused.py), run apart by
:func:`split_forward` and :func:`split_backward`, recording nothing.  An index array a fused kernel reads as
values is converted in C++, as the Python runner converts it.  Anything else, a call
whose tensors have another layout and torch.func's transforms keep the Python path; a
kernel that raises its error flag or a label out of range hands the call (forward) or
the backward to the Python path, which raises the statement's own error; a
backward with ``create_graph=True`` calls the Python path back from C++."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

from ..backends.c import torch_node as c_torch_node
from ..backends.c.threads import free_threads
from ..plan.thread_rows import ROW_ALIGN, padded_length
from ..schedule.torch_node_plan import (NodeCallFacts, NodeEligibility, NodeStep,
                                        NodeStepKind, node_eligibility)
from ..schedule.torch_node_split import SplitFacts, split_eligibility
from ..schedule.units import needed
from .program_backward import _check_labels
from .run_groups import PreparedRun, _run_one_step
from .signatures import signature_of
from .torch_node_products import recorded_product

# at::ScalarType's numbers (c10/core/ScalarType.h) of the dtypes a plan may hold
_SCALAR_TYPES = {np.dtype(np.float32): 6, np.dtype(np.float64): 7,
                 np.dtype(np.int64): 4, np.dtype(np.int32): 3}
_EMPTY, _SCRATCH, _CALL, _TOTAL, _CHECK, _CAST, _PRODUCT = 0, 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class NodeSlots:
    """Where a translated call's arrays are in its plan: each array the forward names
    (slot, (shape, dtype, byte strides)), the slots operations make, the forward slots
    the backward reads beyond the passed tensors and outputs, the outputs' slots, and
    each recorded input's gradient slot (-1: none)."""
    named: Tuple[Tuple[str, int, Tuple], ...]
    made: FrozenSet[int]
    kept: Tuple[int, ...]
    outputs: Tuple[int, ...]
    gradients: Tuple[int, ...]


class Untranslatable(Exception):
    """A step or value the C++ node cannot run as the Python path does."""


def _code(dtype) -> int:
    code = _SCALAR_TYPES.get(np.dtype(dtype))
    if code is None:
        raise Untranslatable(f"dtype {dtype}")
    return code


def _strides(shape, itemsize: int) -> Tuple[int, ...]:
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


class _Builder:
    """Slots by environment key while the steps are translated in order."""

    def __init__(self, passed: Tuple[str, ...], layouts):
        self.count = len(passed)
        self.slot: Dict[str, int] = {name: n for n, name in enumerate(passed)}
        # per slot: (shape, dtype, byte strides) of the array it holds
        self.layout: Dict[int, Tuple] = dict(enumerate(layouts))
        self.made = set()        # slots an operation writes (fresh arrays)
        # what the plan's raw addresses point into, beyond the prepared runs: the repeat
        # runners of statements run alone (a kernel may drop one from its cache)
        self.alive: List[object] = []

    def new(self, shape, dtype, strides=None) -> int:
        slot = self.count
        self.count += 1
        dtype = np.dtype(dtype)
        self.layout[slot] = (tuple(shape), dtype,
                             strides if strides is not None else _strides(shape, dtype.itemsize))
        self.made.add(slot)
        return slot

    def read(self, key, layout, ops: list) -> int:
        slot = self.slot.get(key)
        if slot is None:
            raise Untranslatable(f"{key} comes from no step")
        shape, dtype, strides = self.layout[slot]
        wanted = (tuple(layout[0]), np.dtype(layout[1]), tuple(layout[2]))
        if (tuple(shape), np.dtype(dtype), tuple(strides)) == wanted:
            return slot
        # an index array a kernel reads as values (converted per call, as the Python
        # runner's laid_out does): a contiguous copy in the working dtype
        if tuple(shape) == wanted[0] and np.dtype(dtype) in (np.int64, np.int32) and \
                wanted[1] in (np.float32, np.float64) and \
                wanted[2] == _strides(shape, wanted[1].itemsize):
            cast = self.new(shape, wanted[1])
            ops.append((_CAST, cast, slot, list(shape), _code(wanted[1])))
            return cast
        raise Untranslatable(f"{key} of another layout than the step's")

    def empty(self, ops: list, shape, dtype, owned: bool = False) -> int:
        """A fresh array's slot; ``owned``: one nothing reads after its step, which
        the plan keeps from call to call."""
        slot = self.new(shape, dtype)
        ops.append((_EMPTY, slot, list(shape), _code(dtype), owned))
        return slot

    def scratch(self, ops: list, rows: int, length: int, dtype, zero: bool) -> int:
        dtype = np.dtype(dtype)
        padded = padded_length(length, dtype.itemsize)
        slot = self.new((rows, padded), dtype)
        ops.append((_SCRATCH, slot, rows, padded, _code(dtype), zero, ROW_ALIGN, True))
        return slot

    def steps(self, classified, ops: list) -> None:
        """The operations of a run's steps, as :func:`classify` found them."""
        for step, payload in classified:
            if step.kind is NodeStepKind.LABEL_CHECK:
                self.labels(payload, ops)
            elif step.kind is NodeStepKind.STATEMENT:
                self.alone(payload[0], ops)    # (its framework, numpy, chose the kind)
            elif step.kind in (NodeStepKind.FUSED_GROUP, NodeStepKind.ROW_KERNEL):
                self.step(*payload, ops)
            else:     # (node_eligibility refused these before)
                raise Untranslatable(step.kind.value)

    def labels(self, piece, ops: list) -> None:
        """A backward's range checks of the labels its scatters gather by: in C++,
        where a failed one hands the backward to the Python path (which raises the
        statement's own error)."""
        for _statement, checks in piece.checks:
            for name, size, _axis in checks:
                slot = self.slot.get(name)
                if slot is None or self.layout[slot][1] not in (np.int64, np.int32):
                    raise Untranslatable(f"labels {name}")
                ops.append((_CHECK, slot, int(size)))

    def alone(self, kernel, ops: list) -> None:
        """A statement run alone: the kernel calls of the repeat runner that its
        signature's arrays (by layout) have prepared (backends/c/repeat.py)."""
        names = needed(kernel.spec)
        stand_ins = {}
        for name in names:
            slot = self.slot.get(name)
            if slot is None:
                raise Untranslatable(f"{name} comes from no step")
            shape, dtype, strides = self.layout[slot]
            stand_ins[name] = np.lib.stride_tricks.as_strided(
                np.empty(1, dtype), shape, strides, writeable=False)
        signature = signature_of(stand_ins)
        runner = kernel._repeat.get(signature) if signature is not None else None
        describe = getattr(runner, "describe", None)
        if describe is None:
            if not self.product(kernel, names, ops):
                self.hoisted(kernel, names, stand_ins, ops)
            return
        self.described(runner, kernel.spec.output, ops)

    def described(self, runner, output: str, ops: list) -> None:
        """The kernel calls of a prepared repeat runner (backends/c/repeat.py's
        ``describe``) computing ``output``."""
        found = runner.describe()
        self.alive.append(runner)
        buffers = []
        for name, dtype in found["inputs"]:
            slot = self.slot[name]
            if self.layout[slot][1] != np.dtype(dtype):
                raise Untranslatable(f"{name} converted per call")
            buffers.append(slot)
        out = self.empty(ops, found["shape"], found["dtype"])
        buffers.append(out)
        for entry in found["entries"]:
            ops.append((_CALL, entry, *found["addresses"], 1 if found["adaptive"] else 0,
                        found["threads"], buffers))
        self.slot[output] = out

    def product(self, kernel, names, ops: list, chained: bool = False) -> bool:
        """A statement BLAS computes: the torch BLAS call its runner makes, on views
        of the same slots (runtime/torch_node_products.py); False where the statement
        is no product.  ``chained``: a step of runtime/epilogue_chain.py's chain."""
        layouts = {}
        for name in names:
            if name not in self.slot:
                raise Untranslatable(f"{name} comes from no step")
            layouts[name] = self.layout[self.slot[name]]
        found, declined = recorded_product(kernel, layouts, chained=chained)
        if declined is not None:
            raise Untranslatable(f"{kernel.spec.output}: {declined.reason}")
        if found is None:
            return False
        views = [(self.slot[o.name], o.offset, list(o.sizes), list(o.strides))
                 for o in found.operands]
        out = self.new(found.shape, found.dtype)
        ops.append((_PRODUCT, out, found.addmm, views))
        self.slot[kernel.spec.output] = out
        return True

    def hoisted(self, kernel, names, stand_ins, ops: list) -> None:
        """A statement run alone in its hoisted form (runtime/hoisted.py): the steps of
        the prepared run its arrays' layouts made (a gain's column sum ``dg[j]`` over a
        per-row temporary), translated on slots of their own names: a temporary's name
        hides none of the program's."""
        run = None
        # (or a product under an elementwise epilogue: its epilogue form, a product
        # statement and then the epilogue's pass, runtime/repeat.py's _epilogue_runner)
        for form in (kernel.hoisted_form, kernel.epilogue_form):
            run = form.prepared_run(stand_ins) if form is not None else None
            if run is not None:
                break
        if run is None or run.kernels[-1].spec.output != kernel.spec.output:
            raise Untranslatable(f"{kernel.spec.output}: a statement with no prepared kernel")
        program_slots = self.slot
        self.slot = {name: program_slots[name] for name in names}
        try:
            classified = classify(run)
            refused = next((step for step, _ in classified if step.kind not in
                            (NodeStepKind.FUSED_GROUP, NodeStepKind.ROW_KERNEL,
                             NodeStepKind.STATEMENT)), None)
            if refused is not None:
                raise Untranslatable(f"{kernel.spec.output}'s hoisted form has "
                                     f"{refused.kind.value}")
            self.steps(classified, ops)
            out = self.slot.get(kernel.spec.output)
        finally:
            self.slot = program_slots
        if out is None or out not in self.made:
            raise Untranslatable(f"{kernel.spec.output}: its hoisted form's result")
        self.alive.append(run)
        self.slot[kernel.spec.output] = out

    def step(self, found, keys, ops: list) -> None:
        working = found["working"]
        call = (_CALL, found["entry"], *found["addresses"], found["adaptive"],
                found["threads"])
        if "plan" not in found:          # a row kernel
            inputs = [self.read(key, layout, ops) for key, layout in found["inputs"]]
            outs = {k: self.empty(ops, shape, working, keys[k] is None)
                    for k, shape in found["shapes"]}
            members = [outs[k] for k, _ in found["shapes"]]
            buffers = [inputs[0], outs[0], outs[2], outs[3]] if found["softmax"] else \
                [inputs[0]] + members + inputs[1:] if found.get("statistics") else \
                inputs + members
            ops.append(call + (buffers,))
            for k, slot in outs.items():
                if keys[k] is not None:
                    self.slot[keys[k]] = slot
            return
        outputs = {k: self.empty(ops, shape, working, keys[k] is None)
                   for k, shape in zip(found["outputs"], found["shapes"])}
        rows = {k: self.scratch(ops, *shape, working, False)
                for k, shape in found["scratch"].items()}
        columns = {}
        for k, (shape, dtype) in found["columns"].items():
            columns[k] = tuple(self.scratch(ops, shape[0], shape[1], dtype, True)
                               for _ in range(2))
            if self.layout[columns[k][0]][0] != tuple(shape):
                raise Untranslatable("column accumulators of another row length")
        buffers = []
        for how in found["plan"]:
            if how[0] == "in":
                buffers.append(self.read(how[1], how[3], ops))
            elif how[0] == "out":
                buffers.append(outputs[how[1]])
            elif how[0] == "rows":
                buffers.append(rows[how[1]])
            else:
                from ..plan.fuse import COLUMN_SUMS
                buffers.append(columns[how[1]][0 if how[2] == COLUMN_SUMS else 1])
        ops.append(call + (buffers,))
        for k, slot in outputs.items():
            if keys[k] is not None:
                self.slot[keys[k]] = slot
        for k, (shape, compensated) in found["totals"].items():
            if keys[k] is None:
                continue
            sums, errors = columns[k]
            slot = self.new(shape, working)
            size = int(np.prod(shape, dtype=np.int64))
            ops.append((_TOTAL, slot, sums, errors, size, list(shape), _code(working),
                        bool(compensated)))
            self.slot[keys[k]] = slot


def classify(run) -> Tuple[Tuple[NodeStep, object], ...]:
    """Each step of a prepared forward's or backward's run (``run``) with what its
    translation reads: the piece of a label check, a statement's (kernel, framework),
    a fused group's or row kernel's (description, environment keys)."""
    if getattr(run, "func", None) is _check_labels:
        return ((NodeStep(NodeStepKind.LABEL_CHECK), run.args[0]),)
    if not isinstance(run, PreparedRun):
        return ((NodeStep(NodeStepKind.UNKNOWN_RUN, type(run).__name__), None),)
    found = []
    for step in run.steps:
        function = getattr(step.run, "func", None)
        if function is _run_one_step:
            kernel, framework = step.run.args
            kind = NodeStepKind.STATEMENT if framework == "numpy" else \
                NodeStepKind.OTHER_FRAMEWORK
            found.append((NodeStep(kind, kernel.spec.output), (kernel, framework)))
            continue
        describe = getattr(function, "describe", None)
        if describe is None:
            found.append((NodeStep(NodeStepKind.UNPREPARED), None))
            continue
        described = describe()
        kind = NodeStepKind.FUSED_GROUP if "plan" in described else NodeStepKind.ROW_KERNEL
        found.append((NodeStep(kind), (described, step.run.keywords["keys"])))
    return tuple(found)


def layouts_of(env: Dict[str, object], names) -> Optional[Tuple]:
    """(shape, NumPy dtype, byte strides) of each tensor ``names`` of ``env``, or None
    where one is not a plain strided CPU tensor of a dtype a plan holds."""
    found = []
    for name in names:
        tensor = env[name]
        dtype = np.dtype(str(tensor.dtype).split(".")[-1]) \
            if str(tensor.dtype).split(".")[-1] in ("float32", "float64", "int64", "int32") \
            else None
        if dtype is None or str(tensor.layout) != "torch.strided" or \
                tensor.device.type != "cpu":
            return None
        found.append((tuple(tensor.shape), dtype,
                      tuple(s * dtype.itemsize for s in tensor.stride())))
    return tuple(found)


# A signature's backwards before one starts the node's build (where it is not loaded
# yet): a short script or test with a backward or two never pays for it
BACKWARDS_BEFORE_BUILD = 3


def available(backwards: int) -> bool:
    """Whether the node is built and loaded; after ``backwards`` backwards of one
    signature (at least BACKWARDS_BEFORE_BUILD), its build starts otherwise."""
    if backwards < BACKWARDS_BEFORE_BUILD:
        return c_torch_node.loaded() is not None
    return c_torch_node.module() is not None


def loaded() -> bool:
    """Whether the node is built and loaded (asking starts no build)."""
    return c_torch_node.loaded() is not None


def translate(prepared, layouts, seed_layouts, backward_run, direct, fallback
              ) -> Tuple[Optional[tuple], NodeEligibility]:
    """(the C++ plan of ``prepared`` (a PreparedCall) for tensors of ``layouts`` (its
    passed ones'), with the backward ``backward_run`` that was planned for seeds of
    ``seed_layouts`` (they must be the outputs' own, contiguous), or None; and the
    decision: schedule/torch_node_plan.node_eligibility's, or the reason a step gave
    while it was translated)."""
    node = c_torch_node.module()
    forward = classify(prepared._forward) if prepared._forward is not None else ()
    backward = tuple(item for run in backward_run._runs for item in classify(run))
    facts = NodeCallFacts(node_built=node is not None, strided_cpu=layouts is not None,
                          scalar_parameters=bool(prepared.scalars),
                          gradients_direct=all(direct),
                          forward_prepared=prepared._forward is not None)
    decision = node_eligibility(facts, tuple(step for step, _ in forward),
                                tuple(step for step, _ in backward))
    if not decision.eligible:
        return None, decision
    try:
        return _translate(node, prepared, prepared.passed, layouts, seed_layouts,
                          forward, backward, fallback, backward_run), decision
    except Untranslatable as why:
        return None, NodeEligibility.declined(str(why))


def _translate(node, prepared, passed, layouts, seed_layouts, forward_steps,
               backward_steps, fallback, backward_run):
    builder = _Builder(passed, layouts)
    forward: List[tuple] = []
    builder.steps(forward_steps, forward)
    outputs = []
    for name in prepared.outputs:
        slot = builder.slot.get(name)
        if slot is None or slot not in builder.made or \
                builder.layout[slot][1].kind != "f":
            raise Untranslatable(f"output {name}")
        outputs.append(slot)
    if len(set(outputs)) != len(outputs):
        raise Untranslatable("one array for two outputs")
    forward_slots = dict(builder.slot)
    seeds = []
    if len(seed_layouts) != len(outputs):
        raise Untranslatable("seeds")
    for name, slot, given in zip(prepared.backward.seeds, outputs, seed_layouts):
        shape, dtype, strides = builder.layout[slot]
        if (tuple(given[0]), np.dtype(given[1]), tuple(given[2])) != (shape, dtype, strides):
            raise Untranslatable("seeds of another layout than the outputs'")
        seed = builder.new(shape, dtype)
        builder.slot[name] = seed
        seeds.append((seed, list(shape), [s // dtype.itemsize for s in strides],
                      _code(dtype)))
    start = builder.count
    backward: List[tuple] = []
    builder.steps(backward_steps, backward)
    # what the backward reads of the forward: passed tensors (all saved: torch's version
    # check), outputs, and intermediates kept
    read = {slot for op in backward if op[0] == _CALL for slot in op[-1]} | \
        {slot for op in backward if op[0] == _TOTAL for slot in op[2:4]} | \
        {op[2] for op in backward if op[0] == _CAST} | \
        {view[0] for op in backward if op[0] == _PRODUCT for view in op[3]}
    kept = sorted(s for s in read if len(passed) <= s < start and s not in outputs and
                  s in forward_slots.values() and s not in {seed[0] for seed in seeds})
    saved_outputs = [n for n, slot in enumerate(outputs) if slot in read]
    gradients = []
    results = dict(backward_run.results)
    for number, name in enumerate(prepared.names):
        key = results.get(name)
        if key is None:
            gradients.append(-1)
            continue
        slot = builder.slot.get(key)
        shape, dtype = prepared.input_shapes[number]
        if slot is None or slot < start or slot not in builder.made or \
                builder.layout[slot][0] != tuple(shape) or \
                _SCALAR_TYPES.get(builder.layout[slot][1]) != _code(str(dtype).split(".")[-1]):
            raise Untranslatable(f"the gradient of {name}")
        gradients.append(slot)
    checks = [(n, list(shape), [s // np.dtype(dtype).itemsize for s in strides], _code(dtype))
              for n, (shape, dtype, strides) in enumerate(layouts)]
    plan = node.make_plan(builder.count, len(passed), len(prepared.names), checks, forward,
                          backward, outputs, list(range(len(passed))), saved_outputs, kept,
                          seeds, gradients, fallback,
                          (prepared._forward, backward_run, tuple(builder.alive)))
    adaptive = any(op[0] == _CALL and op[6] for op in forward + backward)
    # (where the arrays are, for split_plan: torch.compile runs the halves apart)
    slots = NodeSlots(tuple((name, slot, builder.layout[slot])
                            for name, slot in forward_slots.items()),
                      frozenset(builder.made), tuple(kept), tuple(outputs),
                      tuple(gradients))
    return node.apply, plan, adaptive, slots


def forward_only(passed: Tuple[str, ...], layouts, steps) -> Optional[tuple]:
    """The node's plan of an unrecorded chain of statements (runtime/epilogue_chain.py:
    a product, then its epilogue) on tensors ``passed`` of ``layouts``, for :func:`run`:
    a forward with no backward, recording nothing; or None where the node is not
    loaded or a step does not translate.  ``steps``: per statement, (its kernel, the
    chain's prepared runner of it, whether BLAS computes it, (shape, dtype, byte
    strides) of each array the runner was prepared for, by name)."""
    node = c_torch_node.loaded()
    if node is None or layouts is None:
        return None
    builder = _Builder(passed, layouts)
    ops: List[tuple] = []
    try:
        for kernel, runner, product, prepared_for in steps:
            for name, layout in prepared_for.items():
                slot = builder.slot.get(name)
                if slot is None or builder.layout[slot] != layout:
                    raise Untranslatable(f"{name} of another layout than its runner's")
            if product:
                if not builder.product(kernel, tuple(prepared_for), ops, chained=True):
                    raise Untranslatable(f"{kernel.spec.output}: no product")
            elif getattr(runner, "describe", None) is not None:
                builder.described(runner, kernel.spec.output, ops)
            else:
                raise Untranslatable(f"{kernel.spec.output}: no kernel calls described")
    except Untranslatable:
        return None
    out = builder.slot[steps[-1][0].spec.output]
    shape, dtype, strides = builder.layout[out]
    # (no backward: one unused seed per output, as the plan's shape asks)
    seed = builder.new(shape, dtype)
    checks = [(n, list(s), [b // np.dtype(d).itemsize for b in st], _code(d))
              for n, (s, d, st) in enumerate(layouts)]
    plan = node.make_plan(builder.count, len(passed), 0, checks, ops, [], [out], [], [],
                          [], [(seed, list(shape), [b // dtype.itemsize for b in strides],
                                _code(dtype))], [], None, tuple(builder.alive))
    adaptive = any(op[0] == _CALL and op[6] for op in ops)
    return node.apply, plan, adaptive


def run(found, tensors) -> Optional[tuple]:
    """The outputs of the call on ``tensors`` (the passed ones, in order) by the node
    ``found`` (translate's), or None where the node declines this call."""
    apply, plan, adaptive = found[:3]
    return apply(plan, tensors, free_threads() if adaptive else 0)


@dataclass(frozen=True)
class SplitPlan:
    """A translated call's node plan as torch.compile's two operators run it
    (program/torch_compiled_fused.py): the forward returns the slots ``returned`` (the
    outputs, then the kept intermediates the operator declares, by name); the backward
    is given the passed tensors and those again."""
    node: object                  # the loaded extension
    plan: object
    adaptive: bool
    returned: Tuple[int, ...]
    given: Tuple[int, ...]        # the passed slots, then ``returned``
    dtypes: Tuple[int, ...]       # per returned slot: its at::ScalarType, its elements
    numels: Tuple[int, ...]


def split_plan(found, passed: int, names: Sequence[str], declared: Sequence[Tuple]
               ) -> Tuple[Optional[SplitPlan], NodeEligibility]:
    """The node plan ``found`` (translate's) for torch.compile's operators, where the
    tensors between them, ``names`` (the outputs, then the kept intermediates) of the
    ``declared`` (shape, dtype, byte strides) are exactly what its backward reads; or
    None, and why not (schedule/torch_node_split.py)."""
    if len(found) < 4:
        return None, NodeEligibility.declined("a plan with no backward")
    slots: NodeSlots = found[3]
    named = {name: (slot, layout) for name, slot, layout in slots.named}
    located = [named.get(name) for name in names]
    returned = tuple(pair[0] for pair in located if pair is not None)
    facts = SplitFacts(
        named=all(pair is not None for pair in located),
        fresh=len(set(returned)) == len(returned) and
        all(slot in slots.made for slot in returned),
        declared=all(pair is not None and _same_layout(pair[1], layout)
                     for pair, layout in zip(located, declared)),
        reads_covered=set(slots.kept) <= set(returned),
        gradients_apart=len({g for g in slots.gradients if g >= 0}) ==
        len([g for g in slots.gradients if g >= 0]))
    decision = split_eligibility(facts)
    if not decision.eligible:
        return None, decision
    node = c_torch_node.loaded()
    if node is None:
        return None, NodeEligibility.declined("the node is not loaded")
    return SplitPlan(node, found[1], found[2], returned, tuple(range(passed)) + returned,
                     tuple(_code(layout[1]) for layout in declared),
                     tuple(int(np.prod(layout[0], dtype=np.int64)) for layout in declared)
                     ), decision


def _same_layout(one, other) -> bool:
    return (tuple(one[0]), np.dtype(one[1]), tuple(one[2])) == \
        (tuple(other[0]), np.dtype(other[1]), tuple(other[2]))


def split_forward(split: SplitPlan, tensors) -> Optional[tuple]:
    """The forward's returned slots on ``tensors`` (the passed ones, in order), or None
    where the node declines this call (the operator's Python path runs)."""
    return split.node.forward_slots(split.plan, tensors,
                              free_threads() if split.adaptive else 0, split.returned)


def split_backward(split: SplitPlan, given, grads) -> Optional[list]:
    """Each recorded input's gradient (None: the plan makes none) from ``given`` (the
    passed tensors, then what the forward returned) and the outputs' gradients, or None
    where a kernel raised its flag."""
    return split.node.backward_slots(split.plan, split.given, given, grads,
                               free_threads() if split.adaptive else 0, split.dtypes,
                               split.numels)
