"""Row groups for the Triton backend: consecutive statements of a program (or of a
statement's hoisted form) over the same rows run as one Triton kernel, each program of
its grid holding whole rows in registers.

This is the GPU's counterpart of the C backend's row fusion (schedule/fusion.py): a
softmax written as four statements -- row maximum, exponentials, row sum, quotient --
reads each row from memory once and writes the result once, where one kernel per
statement reads the input three times and writes and reads the exponentials twice.

A statement joins the group of the statements before it when, for this call,

* it is a ':=' statement run by the Triton backend on torch tensors of one device (a
  CUDA GPU, or the CPU under ``TRITON_INTERPRET=1``), with no hoisted form of its own,
  no ``pad=``, its working dtype float32 or float64 and its result in that
  dtype, the same for every member;
* its output is ``[r]`` or ``[r, c]`` and it uses no index but ``r`` and ``c``: ``r``
  runs over the group's rows (0 to M), ``c`` over the group's columns (0 to N, a row at most
  :data:`MAX_ROW_BYTES`); its reductions are ``sum``, ``max``, ``min`` or
  ``logsumexp`` over ``c``, not nested; or it is a total ``L[] := f(sum[r](body))``
  (``[]``: a mean cross-entropy, its body a row's value, ``f`` numbers and parameters
  around the one sum; rows there must be); or it is a column sum ``c[c] := sum[r](body)`` (``[c]``, its sum over the
  group's rows, taken as one where the statement cannot join as a row's: layernorm's
  ``dg[j] := dy[i,j] * xhat[i,j]``), whose body is a block as a ``[r, c]`` member's and
  which no later member reads (backends/triton/rows.py adds the programs' partial sums
  in the same launch);
* every subscript is a plain index, at most once per access, or a gathered one
  (``X[i, t[i]]``: an input read at positions an input index array gives, checked in
  the kernel under bounds='check' or 'promise' -- a label outside its axis and the
  statements run alone and raise their own error -- plan/row_gathers.py); an input
  array read as
  ``X[r, c]``, ``X[c, r]``, ``X[r]``, ``X[c]`` or ``X[]`` (an array of two or more
  axes laid out with its unit stride along the columns, so that a block's loads are
  contiguous), an earlier member read
  exactly as it was written (``T[r]`` or ``T[r, c]``: its row is in registers); every
  input array is a torch tensor (not a number or a list the statement would convert);
* every scalar parameter is a Python or NumPy number, and autograd records nothing
  (no tensor requires a gradient, or grad mode is off): a recorded call keeps one
  autograd node per statement.

The group is decided here as a row schedule (plan/row_group.RowSchedule: its
statements, each one's role -- a row's value, a block of rows, a column sum -- which
outputs are written out, the launch's shape) and lowered by the statements' lowering
(plan/lower.plan_rows, which refuses what a row of registers cannot hold) to a
:class:`RowGroup` over the IR's value expressions; backends/triton/rows.py prints and
launches it.  Rows longer than that, and
every other statement, run one statement at a time as before."""

from __future__ import annotations

import numbers
import warnings
from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

from ..analysis import triton_facts
from ..lang import ast
from ..errors import EinfuseError
from ..plan.lower import lower_row_statement, plan_rows
from ..plan.row_group import (RowGroup, RowInput, RowLaunch, RowRefused, RowRole,
                              RowSchedule, RowScope, RowStatement, total_sum)
from .fusion_reasons import KernelBreak, Split
from .choose import runs_hoisted
from .units import statement_units

# The longest row a group holds in registers: 64 KiB (16384 float32, 8192 float64)
# across a program of 16 warps is 32 registers a thread per live row value.
MAX_ROW_BYTES = 1 << 16
# Elements one program holds per value: short rows are taken several at a time, so a
# program has enough work to hide its loads.
PROGRAM_ELEMENTS = 4096


def triton_rows_possible(kernels: Sequence, env: Dict[str, object]) -> bool:
    """Whether a call of ``kernels`` on ``env`` may run row groups at all (a cheap test
    made before any statement is bound)."""
    if len(kernels) < 2:
        return False
    if not triton_facts.available():
        return False
    import torch
    from ..analysis.frameworks import torch_recording as recording
    device = None
    for value in env.values():
        if isinstance(value, torch.Tensor):
            if device is None:
                device = value.device
            elif value.device != device:
                return False
            if value.requires_grad and recording():
                return False
    if device is None:
        return False
    if device.type != "cuda":     # CPU tensors: the Triton interpreter, when named
        return triton_facts.interpreted() and \
            any(k.options.backend == "triton" for k in kernels)
    return True


def row_group(kernels: Sequence, start: int, env: Dict[str, object],
              keep: Optional[Set[str]]) -> Optional[RowGroup]:
    """The group of two or more members from ``start`` for this call, or None.  A
    statement with a hoisted form that runs for this call (rewrite/hoist.py) joins as
    its statements, all or none of them; their temporaries live in registers.  A member
    is stored when ``keep`` is None or names it, or a later statement reads it."""
    return row_group_and_break(kernels, start, env, keep)[0]


def row_group_and_break(kernels: Sequence, start: int, env: Dict[str, object],
                        keep: Optional[Set[str]]
                        ) -> Tuple[Optional[RowGroup], Optional[KernelBreak]]:
    """row_group's group, and why it ends where it does (schedule/fusion_reasons.py:
    the statement that did not join and the rule it broke; None where the program
    ends)."""
    import torch

    from ..analysis.frameworks import tensor_placeholder
    scratch = dict(env)
    builder = _Builder()
    joined = 0
    ended_by: Optional[KernelBreak] = None
    device = next(v.device for v in env.values() if isinstance(v, torch.Tensor))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for number, kernel in enumerate(kernels[start:]):
            units = statement_units(kernel, scratch, number)
            if units is None:
                ended_by = KernelBreak(start + number, Split.UPDATES
                                       if kernel.spec.assign != ":=" else Split.NOT_BOUND,
                                       alone=not builder.statements)
                break
            saved = builder.snapshot()
            alone = not builder.statements
            for unit, names, key in units:
                member = builder.join(unit, scratch, names)
                if isinstance(member, Split):
                    ended_by = KernelBreak(start + number, member, alone=alone)
                    break
                shape, dtype = member
                scratch[key] = tensor_placeholder(shape, dtype, device)
            else:
                joined += 1
                continue
            builder.restore(saved)
            break
    if joined < 1 or len(builder.statements) < 2:
        return None, ended_by
    needed: Set[str] = set()
    for kernel in kernels[start + joined:]:
        needed.update(kernel.spec.arg_order)
        if kernel.spec.assign != ":=":
            needed.add(kernel.spec.output)
    return builder.group(joined, lambda key: "#" not in key and (
        keep is None or key in keep or key in needed)), ended_by


class _Builder:
    """Statements scheduled one by one (``join``, each lowered as it joins: the
    lowering refuses what a row of registers cannot hold), then the group
    (``group``)."""

    def __init__(self):
        self.statements: List[RowStatement] = []
        self.scope = RowScope()       # the statements so far, lowered
        self.working: Optional[str] = None
        self.extents: Optional[Tuple[int, Optional[int]]] = None

    def snapshot(self):
        return list(self.statements), self.scope, self.working, self.extents

    def restore(self, saved) -> None:
        self.statements, self.scope, self.working, self.extents = saved

    def join(self, kernel, scratch, names: Dict[str, str]
             ) -> Union[Tuple[Tuple[int, ...], object], Split]:
        """Schedule ``kernel`` as the next member: (its output shape, torch dtype), or
        the rule it breaks where it cannot join (nothing of it is kept then).  ``names``: the
        statement's names that have other keys in ``scratch`` (a hoisted form's
        temporaries)."""
        spec = kernel.spec
        if spec.assign != ":=":
            return Split.UPDATES
        if len(spec.output_indices) > 2 or kernel.options.pad is not None or \
                not spec.output_indices and total_sum(spec.rhs) is None:
            return Split.ROW_SHAPE
        try:
            call = kernel.bind(arrays={name: scratch[names.get(name, name)]
                                       for name in spec.arg_order})
        except (EinfuseError, KeyError):
            return Split.NOT_BOUND
        from .route import backend_name
        if backend_name(kernel.options.backend, call) != "triton" or \
                call.framework != "torch" or triton_facts.host_fallback(call):
            return Split.NOT_TRITON
        form = kernel.hoisted_form
        if runs_hoisted(form, call):
            return Split.HOISTED_FORM
        import torch
        if any(not isinstance(scratch[names.get(info.name, info.name)], torch.Tensor)
               for info in spec.tensors):
            # an array given as a Python or NumPy number or a list (``s[]`` from 2.0):
            # the statement converts it, the group's launch takes tensors only
            return Split.NOT_TENSOR
        working = call.dtypes.working
        if working.name not in ("float32", "float64"):
            return Split.DTYPE_KIND
        if call.dtypes.result != working:
            return Split.ROUNDED
        if self.working is not None and working.name != self.working:
            return Split.OTHER_DTYPE
        if triton_facts.result_dtype(call) != getattr(torch, working.name):
            return Split.ROUNDED    # (a bfloat16 input: it stores a bfloat16 result)
        from ..analysis.result_size import check_result_size
        try:    # a result larger than the machine's memory: the statement says so
            check_result_size(call)
        except EinfuseError:
            return Split.MEMORY
        if kernel.options.bounds not in ("check", "promise") and any(
                sub.gathers for access in ast.accesses(spec.rhs) for sub in access.indices):
            return Split.GATHER_POLICY
        for name in spec.params:
            value = call.params.get(name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                return Split.PARAMETER
        # as a row's statement first; a sum over its one output index's rows where that
        # is refused (dg[j] := dy[i,j] * xhat[i,j]: j is not the group's rows, or dy's
        # unit stride runs along j)
        if not spec.output_indices:     # a total over the rows (a mean cross-entropy)
            if not self._schedule(spec, call, scratch, names, working, column=True):
                return Split.ROW_UNFIT
        elif not self._schedule(spec, call, scratch, names, working, column=False) and \
                not self._schedule(spec, call, scratch, names, working, column=True):
            return Split.ROW_UNFIT
        return tuple(call.output_shape), getattr(torch, working.name)

    def _schedule(self, spec, call, scratch, names: Dict[str, str], working,
                  column: bool) -> bool:
        """Schedule the bound statement as the next member (a column sum where
        ``column``); whether it joined (nothing of it is kept otherwise)."""
        rhs = spec.rhs
        if column and not spec.output_indices:
            summed = total_sum(rhs)
            row, role = summed.indices[0], RowRole.TOTAL
            columns_named = tuple(i for i in spec.all_indices if i != row)
            if not call.bounds.range_map[row][1] > 0:
                return False    # (no rows: no program adds the value of an empty sum)
        elif column:
            if len(spec.output_indices) != 1 or not isinstance(rhs, ast.Reduce) or \
                    rhs.op != "sum" or len(rhs.indices) != 1:
                return False
            row, columns_named = rhs.indices[0], spec.output_indices
            role = RowRole.COLUMN
        else:
            row = spec.output_indices[0]
            role = RowRole.GRID if len(spec.output_indices) == 2 else RowRole.ROW
            columns_named = spec.output_indices[1:] + tuple(spec.reduction_indices)
        if row in columns_named or set(spec.all_indices) != {row} | set(columns_named):
            return False
        ranges = call.bounds.range_map
        if any(ranges[name][0] != 0 for name in (row,) + columns_named):
            return False
        rows = ranges[row][1]
        widths = {ranges[name][1] for name in columns_named}
        known = self.extents
        if len(widths) > 1 or known is not None and (
                rows != known[0] or widths and known[1] is not None and
                widths != {known[1]}):
            return False
        columns = widths.pop() if widths else None
        if columns is not None and columns * working.itemsize > MAX_ROW_BYTES:
            return False
        statement = RowStatement(spec, tuple(sorted(names.items())), role,
                                 names.get(spec.output, spec.output),
                                 tuple(call.output_shape))
        try:
            scope = lower_row_statement(self.scope, statement, working.name)
        except RowRefused:
            return False
        if any(_strided_along_columns(i, scratch[i.key]) for i in scope.inputs):
            return False
        # committed: the member and what its lowering added
        self.working = working.name
        self.extents = (rows, columns if columns is not None else
                        (known[1] if known is not None else None))
        self.statements.append(statement)
        self.scope = scope
        return True

    def group(self, joined: int, stored) -> RowGroup:
        """The row schedule of the statements joined, lowered: ``stored(key)``, whether
        a member's output is written to memory (a column sum's always is)."""
        rows, columns = self.extents
        columns = 0 if columns is None else columns
        statements = tuple(replace(s, stored=s.role in (RowRole.COLUMN, RowRole.TOTAL) or
                                   stored(s.key)) for s in self.statements)
        block = 1
        while block < columns:
            block *= 2
        per_program = 1
        while per_program * block * 2 <= PROGRAM_ELEMENTS and per_program < rows:
            per_program *= 2
        elements = per_program * block
        warps = 16 if elements >= 8192 else 8 if elements >= 4096 else 4
        # (the last program adds the others' partial column sums a tile of programs at
        # a time: one load of parts x block values each)
        sums = any(s.role in (RowRole.COLUMN, RowRole.TOTAL) for s in statements)
        parts = max(1, min(64, PROGRAM_ELEMENTS // block)) if sums else 1
        return plan_rows(RowSchedule(joined, statements, self.working, (rows, columns),
                                     RowLaunch(per_program, block, warps, parts)))


def _strided_along_columns(read: RowInput, array) -> bool:
    """Whether a block of ``array`` read as ``read`` would not be contiguous along the
    columns: its unit-stride axis runs along the rows while another axis runs along the
    columns (``dg[j] := sum[i](dy[i,j] * ...)`` over row-major ``dy``: each program's
    block of a column sum would gather one element per row, a memory transaction each;
    the statement's own kernel tiles it along ``j`` instead)."""
    shape, strides = tuple(getattr(array, "shape", ())), getattr(array, "stride", None)
    if len(read.along_rows) < 2 or strides is None or not callable(strides) or \
            not array.dtype.is_floating_point:
        return False    # (integers and bools are converted at the launch: a new layout)
    strides = strides()
    if not any(not rows and extent > 1 for rows, extent in zip(read.along_rows, shape)):
        return False
    # (an axis of stride 0 -- a broadcast, as the ones of ``y.sum().backward()`` --
    # reads one address however long: it is no axis a block gathers along)
    moving = [(abs(st), axis) for axis, (st, extent) in enumerate(zip(strides, shape))
              if extent > 1 and st != 0]
    return bool(moving) and read.along_rows[min(moving)[1]]
