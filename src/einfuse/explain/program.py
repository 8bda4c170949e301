"""``explain`` of a program: its statements, the kernels that run, what is materialised
and why, the costs of the whole, and each statement's own explanation."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..analysis.cost import bytes_text, count_text
from ..analysis.placeholders import program_placeholder, program_placeholders
from ..errors import EinfuseError, ShapeError, attach_statement
from ..pictures import program_page, save_page
from ..schedule.fusion import FusionGroup
from ..program.program import Program

@dataclass(frozen=True)
class Intermediate:
    name: str
    shape: Tuple[int, ...]
    dtype: str
    nbytes: int
    readers: Tuple[int, ...]     # statements (1-based) that read it
    row_bytes: Optional[int] = None   # lives as one row per thread (of these bytes)
    why: Optional[str] = None         # why it is written to memory (None: not known)


@dataclass
class ProgramExplanation:
    statements: List[str]
    outputs: Tuple[str, ...]
    parts: list                              # each statement's Explanation
    materialised: Optional[List[Intermediate]] = None
    groups: Optional[List[FusionGroup]] = None   # the kernels, in order
    notes: List[str] = field(default_factory=list)
    attention: Optional[object] = None   # runtime.attention.FusedAttention, when it applies
    measured: Optional[object] = None    # with measure=True: measure.Measured, the whole call

    @property
    def flops(self) -> Optional[int]:
        if self.attention is not None:
            return self.attention.flops
        return _total(p.flops for p in self.parts)

    @property
    def bytes_read(self) -> Optional[int]:
        if self.attention is not None:
            return self.attention.bytes_read
        return _total(p.bytes_read for p in self.parts)

    @property
    def bytes_written(self) -> Optional[int]:
        if self.attention is not None:
            return self.attention.bytes_written
        return _total(p.bytes_written for p in self.parts)

    def page(self):
        """The picture of the program (docs/pictures.md), a ``pictures.Page``."""
        return program_page(self)

    def _repr_html_(self) -> str:
        return self.page().fragment()

    def save(self, path: str) -> None:
        """Write the picture of the program as a self-contained HTML page."""
        save_page(self.page(), path)

    def _kernel_lines(self, n: int) -> List[str]:
        groups = self.groups or [FusionGroup((i,)) for i in range(n)]
        out = [f"  {len(groups)} kernel{'s' if len(groups) != 1 else ''}, in order "
               "(NumPy arrays and CPU torch tensors on the C backend, the backward under "
               "torch autograd fused too; torch tensors on the Triton backend fused by "
               "rows, forward and backward; JAX runs one kernel per statement, and under "
               "jax.grad the program's backward, not each statement's):"]
        said = None     # the break the line before gave (a statement alone repeats it)
        for number, group in enumerate(groups, 1):
            many = len(group.statements) > 1
            which = ", ".join(str(i + 1) for i in group.statements)
            how = "fused: one loop over rows, each statement's row computed in turn" \
                if many else "alone"
            if group.row_kernel == "triton":
                how = "fused: one Triton kernel, each program holding whole rows in " \
                    "registers and computing each statement's row in turn"
            elif group.row_kernel is not None:
                how = f"fused: the {group.row_kernel} row kernel, one loop over rows"
            if group.column_sums:
                how += "; " + ", ".join(str(i + 1) for i in group.column_sums) + \
                    " summed over the rows as each row passes, into per-thread " \
                    "accumulators (float64 for float32, else compensated)"
            out.append(f"    kernel {number}: statement{'s' if many else ''} {which} ({how})")
            ended = group.ended_by
            if ended is not None and (ended.statement, ended.reason) != said:
                out.append(f"      ({ended.describe()})")
            said = None if ended is None else (ended.statement, ended.reason)
        if self.materialised is not None:
            rows = [m for m in self.materialised if m.row_bytes is not None]
            memory = [m for m in self.materialised if m.row_bytes is None]
            if rows:
                triton = any(g.row_kernel == "triton" for g in groups)
                out.append("  kept as one row per thread" + (
                    " (in a Triton kernel: in the registers of the program holding the "
                    "row)" if triton else "") + " (read only inside its fused "
                           "kernel, at the row just written; never written to memory "
                           "whole):")
                for m in rows:
                    out.append(f"    {m.name}  {m.dtype} {'x'.join(map(str, m.shape))}  "
                               f"{bytes_text(m.row_bytes)} per thread instead of "
                               f"{bytes_text(m.nbytes)}")
            if memory:
                out.append("  materialised intermediates (written to memory; inside a fused "
                           "kernel each row is read back from cache right after it is "
                           "written):")
                for m in memory:
                    readers = ", ".join(str(r) for r in m.readers)
                    out.append(f"    {m.name}  {m.dtype} {'x'.join(map(str, m.shape)) or '()'}"
                               f"  {bytes_text(m.nbytes)}  read by statement {readers}" +
                               (f": {m.why}" if m.why else ""))
            elif not rows:
                out.append("  no intermediate is materialised")
        return out

    def __str__(self) -> str:
        n = len(self.statements)
        out = [f"Program of {n} statement{'s' if n != 1 else ''}"]
        out += [f"  {i}. {text}" for i, text in enumerate(self.statements, 1)]
        out += ["", f"Outputs: {', '.join(self.outputs)}", "", "How it runs"]
        if self.attention is not None:
            out += self.attention.lines()
        else:
            out += self._kernel_lines(n)
        if self.flops is not None:
            out += ["", "Cost (the whole program)",
                    f"  FLOPs                 {count_text(self.flops)}",
                    f"  bytes read            {bytes_text(self.bytes_read)} (each statement's "
                    "inputs once)",
                    f"  bytes written         {bytes_text(self.bytes_written)}"]
        for i, part in enumerate(self.parts, 1):
            out += ["", f"-- statement {i} " + "-" * 60]
            out += str(part).splitlines()
        if self.notes:
            out += [""] + ["Note: " + note for note in self.notes]
        if self.measured is not None:
            out += ["", "Measured (measure=True, the whole program)", self.measured.line()]
        return "\n".join(out)


def _total(values) -> Optional[int]:
    values = list(values)
    return None if any(v is None for v in values) else int(sum(values))


def _in_framework_of(values: Dict[str, object]):
    """(the inputs' framework, how an intermediate's placeholder is made from its shape
    and dtype name): NumPy arrays for NumPy, torch's as a zero-strided tensor on the
    inputs' device (binding refuses arrays of two frameworks in one call; a device
    decides the backend; bfloat16 exists in torch only).  JAX inputs are explained on
    NumPy placeholders of their shapes (explain_program), intermediates likewise."""
    from ..analysis.frameworks import TORCH, common_framework, tensor_placeholder
    framework = common_framework({k: v for k, v in values.items()
                                  if not isinstance(v, numbers.Number)})
    if framework != TORCH:
        return framework, program_placeholder
    import torch
    device = next(v.device for v in values.values() if isinstance(v, torch.Tensor))
    return framework, lambda shape, dtype: tensor_placeholder(shape, getattr(torch, dtype),
                                                              device)


def _add_source(part, kernel, given, position: int, groups) -> None:
    """The generated source of statement ``position`` where it runs as its own kernel;
    inside a fused kernel, a note saying which (its merged source is not shown)."""
    group = next((n for n, g in enumerate(groups or (), 1) if position in g.statements),
                 None)
    if group is not None and len(groups[group - 1].statements) > 1:
        fused = groups[group - 1]
        others = ", ".join(str(i + 1) for i in fused.statements)
        if fused.row_group is not None:  # one printed kernel: shown with its first member
            part.notes.append(f"source=True: this statement runs inside kernel {group}, "
                              f"one fused kernel of statements {others}" +
                              (", whose source follows" if position == fused.statements[0]
                               else f", whose source is shown with statement "
                               f"{fused.statements[0] + 1}"))
            if position == fused.statements[0]:
                from ..backends.triton import rows as triton_rows
                part.source = triton_rows.source(fused.row_group)
            return
        part.notes.append(f"source=True: this statement runs inside kernel {group}, one "
                          f"fused kernel of statements {others}; that kernel's merged "
                          "source is not shown")
        return
    from .statement import kernel_source
    part.source = kernel_source(kernel, (), given, part.notes)


def explain_program(program: Program, args, arrays, shapes, gradients: bool,
                    source: bool = False):
    """Each statement explained with the shapes and dtypes its inputs have when the
    program runs (intermediates as placeholders of their inferred shapes); with
    ``source``, the generated source of each statement that runs as its own kernel."""
    from .statement import delivered_dtype, dtype_itemsize, explain_kernel
    texts = [s.source.text for s in program.statements]
    values = dict(zip(program.inputs, args))
    values.update(arrays.pop("arrays", None) or {})
    values.update(arrays)
    try:
        if shapes:
            values = {**program_placeholders(program, shapes), **values}
        if values:   # the names a call would take: none missing, none unknown
            program._named((), values, None)
    except EinfuseError as error:
        raise attach_statement(error, program.source) from None
    if not values:
        parts = [explain_kernel(s.kernel, (), {}, None, gradients)
                 for s in program.statements]
        return ProgramExplanation(texts, program.outputs, parts, notes=[
            "pass arrays or shapes= to see ranges, costs and what is materialised"] + (
            ["pass arrays or shapes= to see the generated source"] if source else []))
    from ..schedule.fusion import fusion_groups
    unplanned: List[str] = []
    try:
        groups = fusion_groups(tuple(s.kernel for s in program.statements), values,
                               keep=set(program.outputs))
    except EinfuseError:
        groups = None     # the statements' own explanations say what is wrong
    except MemoryError:   # a group is planned on real buffers: shapes beyond memory
        groups = None
        unplanned = ["which statements run fused is not shown: planning a fused kernel "
                     "needs its buffers in memory, which these shapes do not fit"]
    framework, shaped = _in_framework_of(values)
    from ..analysis.frameworks import JAX, NUMPY, TORCH, placeholder
    env = {name: placeholder(value) for name, value in values.items()} \
        if framework == JAX else dict(values)
    parts = []
    produced: Dict[str, Tuple[Tuple[int, ...], str]] = {}
    for statement in program.statements:
        kernel = statement.kernel
        needed = statement.reads + ((statement.output,) if statement.assign != ":="
                                    else ())
        given = {name: env[name] for name in needed if name in env}
        parts.append(explain_kernel(kernel, (), {"arrays": given}, None, gradients,
                                    framework))
        if source:
            _add_source(parts[-1], kernel, given, len(parts) - 1, groups)
        if statement.assign == ":=":     # as the call holds it (bfloat16, JAX's dtypes)
            call = kernel.bind(arrays=given)
            result = delivered_dtype(call, framework)
            elements = math.prod(call.output_shape)
            if elements * dtype_itemsize(result) > np.iinfo(np.int64).max:
                raise attach_statement(ShapeError(
                    f"{statement.output} would have shape {tuple(call.output_shape)}: "
                    f"{elements:,} elements of {result}, more than an array can hold",
                    span=kernel.spec.statement.output_span), statement.source.text)
            env[statement.output] = shaped(call.output_shape, result)
            produced[statement.output] = (tuple(call.output_shape), result)
    rows = {name: size for group in groups or () for name, size in group.thread_rows}
    # each statement's kernel (1-based) and each intermediate's statement, once
    kernel_of = {s: k for k, group in enumerate(groups or (), 1) for s in group.statements}
    producer_of = {s.output: n for n, s in enumerate(program.statements) if s.assign == ":="}
    materialised = []
    for name, (shape, dtype) in produced.items():
        readers = tuple(i for i, s in enumerate(program.statements, 1) if name in s.reads)
        if readers:
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype_itemsize(dtype)
            materialised.append(Intermediate(name, shape, dtype, nbytes, readers,
                                             rows.get(name),
                                             _why_materialised(
                                                 name in program.outputs, shape, readers,
                                                 kernel_of, producer_of[name])))
    from ..runtime.attention import explain_attention, triton_fallback_notes
    # as the call: the fused attention runs for NumPy and torch callers only
    fused = explain_attention(program.attention, values, program.options) \
        if program.options is not None and framework in (NUMPY, TORCH) else None
    notes = triton_fallback_notes(program.attention, values, program.options) \
        if program.options is not None and fused is None else []
    notes = unplanned + notes
    return ProgramExplanation(texts, program.outputs, parts, materialised, groups,
                              notes=notes, attention=fused)


def _why_materialised(output: bool, shape, readers: Tuple[int, ...],
                      kernel_of: Dict[int, int], producer: int) -> Optional[str]:
    """Why an intermediate (``output``: one the caller receives) computed by statement
    ``producer`` (0-based) and read by ``readers`` (1-based) is written to memory whole,
    from the kernels the schedule chose (``kernel_of``: statement -> kernel; empty where
    there are none to say it from: None)."""
    if not kernel_of:
        return None
    mine = kernel_of.get(producer)
    later = sorted({kernel_of[r - 1] for r in readers if kernel_of.get(r - 1) != mine})
    if output:
        return "an output of the program"
    if later:
        where = ", ".join(str(k) for k in later)
        return f"computed by kernel {mine}, read by kernel{'s' if len(later) > 1 else ''} " \
            f"{where} after it ends"
    if len(shape) < 2:
        return "one value per row, written as each row passes"
    return "written whole: a reader inside the kernel reads it laid out as the loops " \
        "address it, not as one row per thread"
