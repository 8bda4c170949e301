"""The text of ``ef.explain(..., mesh=, shard=)``: the assignment, each statement's
per-device shapes and FLOPs, every collective with the bytes each device sends, the
modelled cost, and the alternatives side by side with the cheapest named."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional, Sequence, Tuple

from ..analysis.cost import bytes_text, count_text
from ..analysis.placeholders import program_placeholders, statement_placeholders
from ..errors import EinfuseError, OptionError, attach_statement
from ..program import Program
from ..sharding.api import (Choice, check_options, choose, shape_values, shard_of_inputs,
                            statements_of, with_memory)
from ..sharding.cost import CostModel, plan_cost, seconds_text
from ..sharding.dtensor_execute import check_sayable
from ..sharding.dtensor_backward import (BackwardNotPlanned, backward_plan,
                                         backward_statements, forward_shapes,
                                         gradient_inputs, gradient_targets, seed_placements)
from ..sharding.layout import MoveKind
from ..sharding.memory import memory_use
from ..sharding.planner import ShardPlan, StatementPlan
from ..pictures import save_page, sharding_page

ALTERNATIVES_SHOWN = 6


def _shape(shape) -> str:
    return "x".join(str(s) for s in shape) or "()"


def collectives_text(plan: ShardPlan) -> str:
    kinds = [m.kind.value for m in plan.collectives]
    if not kinds:
        return "none"
    counted = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
    return ", ".join(f"{n} {k}" for k, n in counted.items())


@dataclass
class BackwardExplanation:
    """``explain(..., gradients=True)`` on DTensors: the plan of the backward that a
    recorded call runs (sharding/dtensor_backward.py), each output's gradient arriving
    at the output's placement; ``plan`` None where it is not planned (``why``: then
    autograd goes through DTensor's own ops)."""
    plan: Optional[ShardPlan]
    wrt: Tuple[str, ...]
    why: Optional[str] = None
    seeds: Tuple[str, ...] = ()

    @property
    def collectives(self):
        """The backward's collectives (``Move`` objects, as ``collectives`` of the
        forward); empty where it is not planned."""
        return self.plan.collectives if self.plan is not None else ()

    def __str__(self) -> str:
        names = ", ".join(self.wrt)
        if self.plan is None:
            return (f"Backward (gradients of {names}): not planned ({self.why}); autograd "
                    "goes through DTensor's own ops (the collectives' transposes)")
        plan = self.plan
        out = [f"Backward (gradients of {names}; planned on the forward's assignment "
               f"{plan.assignment}, {', '.join(self.seeds)} where the outputs are)",
               "  Inputs (saved by the forward where it left them, and the output "
               "gradients)"]
        rows = [[name, plan.tensor(name).dtype, _shape(plan.tensor(name).shape), str(place)]
                for name, place in plan.inputs]
        out += ["    " + line for line in _table(rows)] if rows else ["    none"]
        out += ["  Steps, in order"] + ["  " + line for line in steps_text(plan)]
        out += ["  Gradients"] + ["  " + line for line in results_text(plan)]
        out += [f"  Per device: FLOPs {count_text(plan.local_flops)}, collectives "
                f"{collectives_text(plan)}, bytes sent {bytes_text(plan.bytes_sent)}"]
        return "\n".join(out)


@dataclass
class ShardingExplanation:
    statements: Sequence[str]
    choice: Choice
    model: CostModel
    # gradients=True on DTensors: the backward's plan
    backward: Optional[BackwardExplanation] = None

    @property
    def backward_collectives(self):
        """The collectives of the backward's plan (``gradients=True`` on DTensors)."""
        if self.backward is None:
            raise OptionError("the backward's collectives are explained with "
                              "gradients=True (on DTensors: explain(..., gradients=True))")
        return self.backward.collectives

    @property
    def plan(self) -> ShardPlan:
        return self.choice.plan

    @property
    def collectives(self):
        """The collectives of the chosen plan (``Move`` objects: kind, tensor, mesh axes,
        per-device operand and result shapes, ``bytes_sent``)."""
        return self.plan.collectives

    @property
    def cheapest(self) -> ShardPlan:
        return self.choice.search.best.plan

    def cost(self, plan: ShardPlan):
        """``plan``'s modelled cost per device (compute_seconds, communication_seconds,
        seconds) by this explanation's cost model."""
        return plan_cost(plan, self.model)

    def alternatives(self) -> List[ShardPlan]:
        """The plans the alternatives table shows: this plan, then the others cheapest
        first, one per way of splitting the statements, at most ALTERNATIVES_SHOWN."""
        shown, seen = [], set()
        for plan in [self.plan] + [c.plan for c in self.choice.search.ranked]:
            # assignments whose statements split the same indices are one plan
            same = tuple(s.split for s in plan.statements)
            if same not in seen:
                seen.add(same)
                shown.append(plan)
        return shown[:ALTERNATIVES_SHOWN]

    def page(self):
        """The picture of the plan on the mesh (docs/pictures.md), a ``pictures.Page``."""
        return sharding_page(self)

    def _repr_html_(self) -> str:
        return self.page().fragment()

    def save(self, path: str) -> None:
        """Write the picture of the plan on the mesh as a self-contained HTML page."""
        save_page(self.page(), path)

    def __str__(self) -> str:
        plan, mesh = self.plan, self.plan.mesh
        search = self.choice.search
        how = {"given": "as given by shard=",
               "default": "default: each index named like a mesh axis goes on it",
               "inputs": "read off the DTensor inputs' Shard placements",
               "auto": f"shard='auto': the cheapest of {search.tried} tried "
                       f"({'every assignment' if search.exhaustive else 'greedy search'})"}
        out = [f"Sharded on mesh {mesh} ({mesh.size()} devices)",
               f"Assignment: {plan.assignment}   ({how[self.choice.how]})", "",
               "Inputs ([-, x]: axis 0 whole, axis 1 split over mesh axis x; each device "
               "holds its block)"]
        rows = [[name, plan.tensor(name).dtype, _shape(plan.tensor(name).shape), str(place),
                 "per device " + _shape(place.local_shape(plan.tensor(name).shape, mesh))]
                for name, place in plan.inputs]
        out += ["  " + line for line in _table(rows)] if rows else ["  none"]
        out += ["", "Steps, in order (what every device does)"]
        out += steps_text(plan)
        out += ["", "Results"]
        out += results_text(plan)
        cost = plan_cost(plan, self.model)
        whole = sum(s.flops for s in plan.statements)
        out += ["", "Per device",
                f"  FLOPs        {count_text(plan.local_flops)} (one device alone: "
                f"{count_text(whole)})",
                f"  collectives  {collectives_text(plan)}",
                f"  bytes sent   {bytes_text(plan.bytes_sent)}",
                f"  memory       {self._memory(plan)}",
                f"  model        {seconds_text(cost.compute_seconds)} compute + "
                f"{seconds_text(cost.communication_seconds)} communication = "
                f"{seconds_text(cost.seconds)}"]
        out += ["", "Alternatives (the model's cost per device, cheapest first; memory/device: "
                    "the most one device holds at once, inputs included)"]
        out += ["  " + line for line in _table(self._alternatives())]
        best = self.cheapest
        if plan_cost(plan, self.model).seconds <= plan_cost(best, self.model).seconds:
            out.append("  Cheapest: the plan above" + (
                "" if best.assignment == plan.assignment else
                f" (tied with {best.assignment})"))
        else:
            saving = plan_cost(plan, self.model).seconds / max(
                plan_cost(best, self.model).seconds, 1e-30)
            out.append(f"  Cheapest: {best.assignment} ({saving:.2f}x less than the plan "
                       "above by the model)")
        if self.backward is not None:
            out += ["", str(self.backward)]
        m = self.model
        out += ["", f"Cost model: FLOPs / {m.flops_per_second:.3g} FLOP/s + per collective "
                    f"{seconds_text(m.latency_seconds)} + bytes sent / "
                    f"{m.bytes_per_second:.3g} B/s (einfuse.sharding.CostModel; "
                    "cost_model= to change)"]
        return "\n".join(out)

    def _memory(self, plan: ShardPlan) -> str:
        use, limit = memory_use(plan), self.model.memory_per_device
        text = f"peak {bytes_text(use.peak)} (inputs {bytes_text(use.inputs)}; at {use.at})"
        if limit is not None:
            text += f" of {bytes_text(limit)} per device" + (
                "" if use.peak <= limit else ": DOES NOT FIT, a run refuses it")
        return text

    def _alternatives(self) -> List[List[str]]:
        rows = [["assignment", "FLOPs/device", "collectives", "sent/device",
                 "memory/device", "model time"]]
        limit = self.model.memory_per_device
        for plan in self.alternatives():
            label = str(plan.assignment) if plan.assignment.pairs else "nothing sharded"
            if plan is self.plan:
                label += "  (this plan)"
            peak = memory_use(plan).peak
            if limit is not None and peak > limit:
                label += "  (does not fit)"
            rows.append([label, count_text(plan.local_flops), collectives_text(plan),
                         bytes_text(plan.bytes_sent), bytes_text(peak),
                         seconds_text(plan_cost(plan, self.model).seconds)])
        return rows


def statement_lines(plan: ShardPlan, step: StatementPlan) -> List[str]:
    mesh = plan.mesh
    lines = [f"  {step.number}. {step.text.strip()}"]
    split = str(step.split) if step.split.pairs else "nothing (every device computes " \
                                                      "all of it)"
    lines.append(f"     splits {split}; FLOPs per device {count_text(step.local_flops)} "
                 f"of {count_text(step.flops)}")
    reads = ", ".join(f"{n} {_shape(p.local_shape(plan.tensor(n).shape, mesh))}"
                      for n, p in step.reads)
    lines.append(f"     reads {reads or 'nothing'}; writes {step.output} "
                 f"{_shape(step.local_output_shape)} per device at "
                 f"{step.output_placement}")
    for name in step.deferred:
        lines.append(f"     {name} is a partial sum and this statement is linear in it: "
                     "its reduction moves past this statement")
    lines += [f"     note: {n}" for n in step.notes]
    return lines


def steps_text(plan: ShardPlan) -> List[str]:
    """Each step of ``plan``: its statements, local slices and collectives (numbered,
    with their bytes)."""
    out: List[str] = []
    number = 0
    for step in plan.steps:
        if isinstance(step, StatementPlan):
            out += statement_lines(plan, step)
        elif step.kind is MoveKind.SLICE:
            out.append(f"  - local slice: {step.tensor} {step.source} -> {step.target}, "
                       f"per device {_shape(step.result_shape)} (no communication)")
        else:
            number += 1
            op = f" ({step.op})" if step.op else ""
            out.append(f"  * collective {number}: {step.kind.value}{op} of {step.tensor} "
                       f"over {'*'.join(step.mesh_axes)} ({step.group} devices): "
                       f"operand {plan.tensor(step.tensor).dtype} "
                       f"{_shape(step.operand_shape)} ({bytes_text(step.operand_bytes)}) -> "
                       f"{_shape(step.result_shape)}; each device sends "
                       f"{bytes_text(step.bytes_sent)}   [{step.reason}]")
    return out


def results_text(plan: ShardPlan) -> List[str]:
    mesh = plan.mesh
    out: List[str] = []
    for name, place in plan.outputs:
        shape = plan.tensor(name).shape
        out.append(f"  {name} {_shape(shape)} at {place}, per device "
                   f"{_shape(place.local_shape(shape, mesh))}")
    return out


def _table(rows) -> List[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def explain_sharded(compiled, args, arrays, shapes, mesh, shard, cost_model=None,
                    extras=False, memory=None, gradients=False):
    """``ef.explain`` with ``mesh=``; ``extras``: source= (or, on a mesh that is not a
    torch DeviceMesh, gradients=) was asked for, which the sharded explanation does not
    show; ``gradients``: on a torch DeviceMesh, the backward's plan too."""
    torch_mesh = hasattr(mesh, "mesh_dim_names")      # a torch DeviceMesh (sharding/mesh.py)
    if extras or (gradients and not torch_mesh):
        source = getattr(compiled, "source", None)
        raise attach_statement(OptionError(
            "explain with mesh= shows the plan on the mesh, not gradients= or source=; "
            "ask for those without mesh= (gradients=True with mesh= shows the backward's "
            "plan of a call on DTensors)"), source if isinstance(source, str)
            else compiled.statement)
    return _explain(compiled, args, arrays, shapes, mesh, shard, cost_model, memory,
                    gradients)


def _explain(compiled, args, arrays, shapes, mesh, shard,
             cost_model: Optional[CostModel], memory=None, gradients=False):
    """``ef.explain(..., mesh=, shard=, memory=)``."""
    mesh_info = check_options(mesh, shard)
    model = with_memory(_model(cost_model), memory, mesh)
    program = statements_of(compiled)
    values = dict(zip(program.inputs, args))
    values.update(arrays.pop("arrays", None) or {})
    values.update(arrays)
    if shapes:
        values = {**_placeholders(compiled, shapes), **values}
    if not values and program.inputs:
        raise attach_statement(OptionError(
            "explain with mesh= needs the arrays or shapes= (per-device shapes, FLOPs and "
            "collectives depend on them)"), program.source)
    for name in program.params:
        values.setdefault(name, 1.0)
    torch_mesh = hasattr(mesh, "mesh_dim_names")      # a torch DeviceMesh (sharding/mesh.py)
    from_inputs = shard is None and torch_mesh
    if from_inputs:
        shard = shard_of_inputs(program, values, mesh_info)
    choice = choose(program, shape_values(values), mesh_info, shard, model,
                    narrow=not torch_mesh)
    if from_inputs:
        choice = replace(choice, how="inputs")
    backward = explain_backward(compiled, program, choice.plan, values, mesh_info) \
        if gradients else None
    return ShardingExplanation(program.texts, choice, model, backward)


def explain_backward(compiled, program, forward: ShardPlan, values, mesh_info
                     ) -> BackwardExplanation:
    """The backward's plan as a recorded DTensor call makes it (dtensor.py), for the
    inputs that require a gradient (every floating one where none does)."""
    wrt = gradient_inputs(values, forward)
    try:
        backward = backward_statements(program, compiled.options, wrt,
                                       forward_shapes(forward, program.params))
        plan = backward_plan(forward, backward, mesh_info,
                             seed_placements(forward, backward),
                             gradient_targets(values, forward, mesh_info, wrt), CostModel())
        check_sayable(plan, mesh_info)
    except BackwardNotPlanned as why:
        return BackwardExplanation(None, wrt, str(why))
    except OptionError as error:
        return BackwardExplanation(None, wrt, str(error))
    return BackwardExplanation(plan, wrt, seeds=backward.seeds)


def _model(cost_model) -> CostModel:
    if cost_model is None:
        return CostModel()
    if not isinstance(cost_model, CostModel):
        raise OptionError(f"cost_model= takes an einfuse.sharding.CostModel, not "
                          f"{type(cost_model).__name__}")
    return cost_model


def _placeholders(compiled, shapes) -> dict:
    try:
        if isinstance(compiled, Program):
            return program_placeholders(compiled, shapes)
        return statement_placeholders(compiled.spec, shapes)
    except EinfuseError as error:
        source = compiled.source if isinstance(compiled, Program) else compiled.statement
        raise attach_statement(error, source) from None
