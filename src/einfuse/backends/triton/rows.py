"""Print and launch a row group (schedule/row_groups.py) as one Triton kernel.

Each program of the grid holds ``ROWS`` whole rows as ``[ROWS, BLOCK]`` register
tensors: a member with output ``[r, c]`` is such a tensor, a member with output ``[r]``
(a row's reduction) a ``[ROWS, 1]`` one, so later members broadcast against both as
written.  Reductions run over the block's columns, the positions past the row's end
masked to the operation's identity; ``max``/``min`` propagate NaN as the statements do
(``tl.max`` alone may drop it).  Only the members the group says are stored reach
memory.  Value expressions print as in the statement kernels (TritonRenderer's
expression methods: the same helpers, the same correctly rounded float32 division)."""

from __future__ import annotations

import functools
import math
import struct
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple

from ... import ir
from ...ir import ReduceOp
from ...plan.row_group import TOTAL_LOCAL, RowGroup, RowRole, along_columns, grid_locals
from ..identifiers import name
from .backend import kernel_module, interpreted, launch_guard, launch_turns, warm_launches
from .repeat import PARAMETER_ARRAYS_KEPT, output_template
from .launch import PreparedLaunch
from .elementwise import ELEMENTWISE_HELPERS, TARGET_HELPERS
from .helpers import HELPERS
from .render import TritonRenderer

_lock = threading.Lock()


class RowRenderer(TritonRenderer):
    """The expression printer of TritonRenderer over a row group's register tensors
    (inputs are loaded in their own dtype and converted in registers); ``native``:
    compiled for a GPU, not interpreted (TritonRenderer's ``native_dot``)."""

    def __init__(self, group: RowGroup, native: bool):   # (no loop-nest program here)
        self.group = group
        self.native_dot = native
        self.T = {"float32": "tl.float32", "float64": "tl.float64"}[group.working]
        self.shape = "[ROWS, BLOCK]"
        self.izero, self.omask, self.axes, self.rename = "0", "omask", None, {}
        self.shared = {node: f"e{n}" for n, node in enumerate(group.shared)}
        self.named = set()        # shared subexpressions assigned already
        self.pending: List[str] = []   # their assignments, before the line using them
        self.grid = grid_locals(group.members)
        self.gathers = 0          # gathered loads printed so far (their locals' numbers)
        self.outer_shape = None   # a total's value: printed over [1, BLOCK]

    def render(self) -> str:
        group = self.group
        inputs = [f"t{b}" for b in range(len(group.inputs))]
        strides = [f"s{b}_{axis}" for b, i in enumerate(group.inputs)
                   for axis in range(len(i.along_rows))]
        outputs = [f"o{m.stored}" for m in group.outputs]
        sums = ["part", "count"] if group.columns else []
        # a gathered axis's length (its labels are checked against it) and the error
        # flag a label outside it raises
        dims = [f"n{b}_{axis}" for b, axis in gathered_axes(group)]
        flag = ["err"] if dims else []
        args = inputs + (["qv"] if group.params else []) + ["M", "N"] + strides + dims + \
            outputs + flag + sums
        lines = ["@triton.jit",
                 f"def einfuse_rows({', '.join(args)}, ROWS: tl.constexpr, "
                 "BLOCK: tl.constexpr, PARTS: tl.constexpr):"]
        body = ["    col = tl.arange(0, BLOCK).to(tl.int64)[None, :]",
                "    rmask = row < M",
                "    cmask = col < N",
                "    omask = rmask & cmask"]
        slots = {id(m): slot for slot, m in enumerate(group.columns)}
        for number, member in enumerate(group.members):
            for reduction in member.reductions:
                body += self.reduction(reduction)
            if member.column:
                body += self.column_part(member, slots[id(member)])
                continue
            self.shape = "[ROWS, BLOCK]" if member.grid else "[ROWS, 1]"
            value = f"m{int(number)}"
            text = self.widen(self.expr(member.value))
            body += self.flushed() + [f"    {value} = {text}"]
            if member.stored is not None:
                out = f"o{int(member.stored)}"
                if member.grid:
                    body.append(f"    tl.store({out} + row * N + col, {value}, mask=omask)")
                else:
                    body.append(f"    tl.store({out} + row, {value}, mask=rmask)")
        if not group.columns:
            lines += ["    row = (tl.program_id(0).to(tl.int64) * ROWS + "
                      "tl.arange(0, ROWS).to(tl.int64))[:, None]"] + body
        else:
            lines += self.with_column_sums(body)
        return "import triton\nimport triton.language as tl\n" + HELPERS + \
            TARGET_HELPERS[self.native_dot] + ELEMENTWISE_HELPERS + "\n\n" + \
            "\n".join(lines) + "\n"

    def column_part(self, member, slot: int) -> List[str]:
        """This block's rows added into the program's partial sum of ``member``
        (float64 whatever the working dtype, as the C backend's column sums)."""
        self.shape = "[ROWS, BLOCK]"
        body = self.widen(self.expr(member.value))
        # (a total's row values, one per row, are summed in column 0 of its partials)
        mask = "rmask & (col == 0)" if member.role == RowRole.TOTAL else "omask"
        return self.flushed() + [
            f"    c{slot} += tl.sum(tl.where({mask}, {body}, 0.0).to(tl.float64), axis=0)"]

    def with_column_sums(self, body: List[str]) -> List[str]:
        """The group's lines as a loop over blocks of rows (program p takes blocks p,
        p + P, ...: a grid of P programs, capped by the runner), each program keeping
        one float64 partial sum per column member; then each program writes its
        partials to ``part`` (P x sums x BLOCK) and takes a ticket, and the program
        that takes the last adds every program's partials in program order and stores
        the sums.  One launch, and the same bits on every call (the order of the
        additions is fixed by the shapes and the grid, not by which program ends
        first).  The barrier makes the program's stores precede its ticket (a scalar
        atomic is one thread's); ``.cg`` loads read the partials from L2."""
        sums = len(self.group.columns)
        lines = [f"    c{k} = tl.zeros([BLOCK], tl.float64)" for k in range(sums)]
        lines += ["    pid = tl.program_id(0)",
                  "    for blk in range(pid, tl.cdiv(M, ROWS), tl.num_programs(0)):",
                  "        row = (tl.arange(0, ROWS).to(tl.int64) + blk * ROWS)[:, None]"]
        lines += ["    " + line for line in body]
        lines.append("    cols = tl.arange(0, BLOCK).to(tl.int64)")
        lines += [f"    tl.store(part + (pid * {sums} + {k}) * BLOCK + cols, c{k})"
                  for k in range(sums)]
        lines += ["    tl.debug_barrier()",
                  "    ticket = tl.atomic_add(count, 1)",
                  "    if ticket == tl.num_programs(0) - 1:",
                  "        programs = tl.num_programs(0)"]
        for k, member in enumerate(self.group.columns):
            lines += ["        total = tl.zeros([BLOCK], tl.float64)",
                      "        for first in range(0, programs, PARTS):",
                      "            p = (first + tl.arange(0, PARTS))[:, None]",
                      f"            total += tl.sum(tl.load(part + (p * {sums} + {k}) * BLOCK"
                      " + cols[None, :], mask=p < programs, other=0.0, "
                      "cache_modifier=\".cg\"), axis=0)"]
            lines += self.column_store(member)
        return lines

    def column_store(self, member) -> List[str]:
        """The last program's store of a column member's sums (``total``): a column
        sum's as they are, a total's value from its sum (column 0) by the rest of its
        statement, in the working dtype."""
        out = f"o{int(member.stored)}"
        if member.role != RowRole.TOTAL:
            return [f"        tl.store({out} + cols, total.to({self.T}), mask=cols < N)"]
        self.outer_shape = self.shape = "[1, BLOCK]"
        try:
            value = self.widen(self.expr(member.total))
        finally:
            self.outer_shape = None
        return [f"        {TOTAL_LOCAL} = total[None, :].to({self.T})"] + \
            ["    " + line for line in self.flushed()] + \
            [f"        tl.store({out} + cols[None, :] * 0, {value}, mask=cols[None, :] == 0)"]

    def reduction(self, reduction) -> List[str]:
        self.shape = "[ROWS, BLOCK]"
        acc, body = name(reduction.acc), self.widen(self.expr(reduction.body))
        if reduction.op == ReduceOp.SUM:
            return self.flushed() + [
                f"    {acc} = tl.sum(tl.where(omask, {body}, 0.0), axis=1)[:, None]"]
        if reduction.op == ReduceOp.LOGSUMEXP:
            # the row's maximum M (NaN kept), then M + log(sum(exp(x - M))) where M is
            # finite and M itself where not (a row of -inf, one holding inf or a NaN):
            # the statements' value (plan/row_statistics.py), two passes over registers
            return self.flushed() + [
                f"    v_ = tl.where(omask, {body}, float(\"-inf\"))",
                "    x_ = tl.where(tl.sum((v_ != v_).to(tl.int32), axis=1)[:, None] > 0, "
                "float(\"nan\"), tl.max(v_, axis=1)[:, None])",
                "    f_ = (x_ - x_) == 0",
                "    c_ = tl.where(f_, x_, 0.0)",
                f"    {acc} = tl.sum(tl.where(omask, tl.exp(v_ - c_), 0.0), axis=1)[:, None]",
                f"    {acc} = tl.where(f_, c_ + tl.log({acc}), x_)"]
        fill = 'float("-inf")' if reduction.op == ReduceOp.MAX else 'float("inf")'
        return self.flushed() + [
                f"    v_ = tl.where(omask, {body}, {fill})",
                f"    {acc} = tl.where(tl.sum((v_ != v_).to(tl.int32), axis=1)[:, None] > 0, "
                f"float(\"nan\"), tl.{reduction.op}(v_, axis=1)[:, None])"]

    def expr(self, node: ir.Expr) -> str:
        label = self.shared.get(node)
        if label is None:
            return self.shaped(node)
        if label not in self.named:
            text = self.shaped(node)
            self.named.add(label)
            self.pending.append(f"    {label} = {text}")
        return label

    def shaped(self, node: ir.Expr) -> str:
        """``node`` printed with its operands widened to a block where it varies along
        the columns and to one value per row where it does not (a row's sqrt(v + eps)
        is taken once, not once per column)."""
        saved = self.shape
        self.shape = self.outer_shape or (
            "[ROWS, BLOCK]" if along_columns(node, self.grid) else "[ROWS, 1]")
        try:
            return super().expr(node)
        finally:
            self.shape = saved

    def flushed(self) -> List[str]:
        lines, self.pending = self.pending, []
        return lines

    def expr_Load(self, node: ir.Load) -> str:
        buffer = int(node.buffer)
        kind = "tl.int64" if node.is_index else self.T
        if any(sub.gathers for sub in node.subscripts):
            return self.gathered(node, kind)
        counters = [sub.affine.names[0] for sub in node.subscripts]
        address = " + ".join(f"{name(c)} * {name(sub.stride)}"
                             for c, sub in zip(counters, node.subscripts))
        if not counters:
            return f"tl.load(t{buffer}).to({kind})"
        mask = {frozenset({"row"}): "rmask", frozenset({"col"}): "cmask"}.get(
            frozenset(counters), "omask")
        return f"tl.load(t{buffer} + {address}, mask={mask}, other=0).to({kind})"

    def gathered(self, node: ir.Load, kind: str) -> str:
        """A load at a gathered position (``X[i, t[i]]``): each gathered position is
        checked against its axis; the load reads only where every one is inside, and
        one outside in a row of this block raises the error flag (the runner then
        delivers nothing, and the statements raise their own error)."""
        buffer, number = int(node.buffer), self.gathers
        self.gathers += 1
        mask = "omask" if along_columns(node, set()) else "rmask"
        positions, inside = [], []
        for axis, sub in enumerate(node.subscripts):
            position = self.affine(sub.affine)
            for load, coefficient in sub.gathers:
                position = f"({position} + {int(coefficient)} * {self.expr(load)})"
            if sub.gathers:
                local = f"q{number}_{axis}"
                self.pending.append(f"    {local} = {position}")
                inside.append(f"({local} >= 0) & ({local} < n{buffer}_{axis})")
                position = local
            positions.append(f"{position} * s{buffer}_{axis}")
        ok = f"g{number}"
        self.pending += [
            f"    {ok} = {mask} & {' & '.join(inside)}",
            f"    tl.store(err, 1, mask=tl.sum(tl.sum(({mask} & ~{ok}).to(tl.int32), "
            "axis=1), axis=0) > 0)"]
        return f"tl.load(t{buffer} + {' + '.join(positions)}, mask={ok}, other=0).to({kind})"

    def expr_Const(self, node: ir.Const) -> str:
        # a tensor of the working dtype, not a Python number: an operation on constants
        # alone would be Python's (1.25 / 0.0 raised ZeroDivisionError, (0.5 <= 1) gave
        # a bool with no .to), and where(c, 0.1, 0.3) gave float32 values in a float64
        # group
        value = float(node.value)
        if value == 0 and math.copysign(1.0, value) < 0:    # (a zero is built as +0.0)
            return f"(-tl.full([1, 1], 0.0, {self.T}))"
        return f"tl.full([1, 1], {self.literal(value)}, {self.T})"

    def expr_IndexValue(self, node: ir.IndexValue) -> str:
        return f"{name(node.value.names[0])}.to({self.T})"

    def expr_Local(self, node: ir.Local) -> str:
        return name(node.name)

    def expr_AccValue(self, node: ir.AccValue) -> str:
        return name(node.acc)


def gathered_axes(group: RowGroup) -> Tuple[Tuple[int, int], ...]:
    """(input buffer, axis) of every gathered subscript of the group, in order."""
    found = []
    for member in group.members:
        for root in [r.body for r in member.reductions] + [member.value]:
            for node in ir.walk(root):
                if isinstance(node, ir.Load):
                    found += [(int(node.buffer), axis)
                              for axis, sub in enumerate(node.subscripts) if sub.gathers]
    return tuple(dict.fromkeys(found))


def source(group: RowGroup) -> str:
    """The kernel's Triton source as this machine would compile it (explain)."""
    return RowRenderer(group, not interpreted()).render()


@functools.lru_cache(maxsize=256)
def compiled(group: RowGroup, native: bool):
    """The @triton.jit kernel of ``group`` (printed and imported once per group)."""
    _, module = kernel_module(RowRenderer(group, native).render())
    return module.einfuse_rows


@dataclass(frozen=True)
class RowRunner:
    """A group's launch for one call signature: the kernel, its grid and the extents
    (M rows, N columns); each input's strides are read at each call, from the tensor
    passed to the kernel.  ``launcher``: the kernel with this grid and the group's
    block sizes (launch.py), direct after its first call on a GPU.  What a call reads
    of the group (its inputs' keys, the outputs' keys and shapes, whether it has column
    sums) is taken out of it once, here, so that a repeated call is the loads of its
    tensors, the outputs' allocation and the launch."""
    group: RowGroup
    kernel: object
    grid: Tuple[int]
    extents: Tuple[int, int]
    device: object
    dtypes: Tuple[object, ...]       # per input: the dtype it is passed in
    launcher: PreparedLaunch

    compiled_launch: bool            # compiled for a GPU (not interpreted)
    working: object                  # the group's working torch dtype
    empty: Callable                  # torch.empty (torch is imported on first use)
    empty_like: Callable             # torch.empty_like
    outputs: Tuple                   # group.outputs (a property that builds a tuple)
    inputs: Tuple[Tuple[str, object], ...] = ()   # per input: its key and passed dtype
    # per output: its key and a template of one element (of its shape, the working
    # dtype, on the device) that ``torch.empty_like`` copies all but the layout of: about
    # half the host time of ``torch.empty(shape, dtype=, device=)``, whose keywords torch
    # parses on every call
    out_templates: Tuple[Tuple[str, object], ...] = ()
    column_sums: int = 0             # len(group.columns)
    # per gathered axis (gathered_axes): the input's position among ``inputs`` and the
    # axis, whose length the kernel checks each label against
    gathered: Tuple[Tuple[int, int], ...] = ()
    zeros: Callable = None           # torch.zeros (the error flag)
    int32: object = None             # torch.int32
    # scalar parameter values -> their device array (a training loop passes the same
    # few values again and again; a host-to-device copy per call costs about 19 us)
    parameter_arrays: dict = field(default_factory=dict, compare=False, hash=False)
    # the strides (of the tensors passed) whose launch key is warm (launch_guard): a
    # repeated call compares its strides with these instead of building that key
    warm_strides: set = field(default_factory=set, compare=False, hash=False)

    def __call__(self, env: Dict[str, object]) -> bool:
        """Run the group on ``env`` and write its outputs there; False (nothing
        written) where a label is outside its axis: the statements, run one by one,
        raise their own error."""
        tensors, strides = [], []
        for key, dtype in self.inputs:
            tensor = env[key]
            # (a tensor that requires a gradient is launched as it is -- the launch
            # reads its storage only -- and detached where it is converted, which
            # autograd would record)
            if tensor.is_neg() or tensor.dtype != dtype:
                if tensor.requires_grad:
                    tensor = tensor.detach()
                if tensor.is_neg():    # a lazily negated view (z.conj().imag): its
                    tensor = tensor.resolve_neg()      # storage holds the negatives
                if tensor.dtype != dtype:
                    tensor = tensor.to(dtype)
            tensors.append(tensor)
            # (a converted or resolved copy of a strided slice is laid out anew: the
            # kernel reads it with its own strides, not the argument's)
            strides += tensor.stride()
        params = (self.parameter_array(env),) if self.group.params else ()
        empty_like = self.empty_like
        outs = [empty_like(template) for _, template in self.out_templates]
        sums = self.column_sum_buffers(outs) if self.column_sums else ()
        dims = tuple(tensors[b].shape[axis] for b, axis in self.gathered) \
            if self.gathered else ()      # (an empty generator's tuple costs 0.3 us)
        flag = (self.zeros((1,), dtype=self.int32, device=self.device),) if dims else ()
        if self.grid[0]:
            args = (*tensors, *params, *self.extents, *strides, *dims, *outs, *flag, *sums)
            strides = tuple(strides)
            # (launches take turns as the statements' do, triton_backend.launch_guard:
            # a warm GPU kernel's run concurrently, interpreted ones one at a time)
            if strides in self.warm_strides:
                if self.compiled_launch:
                    self.launcher(*args)
                else:
                    with launch_turns:
                        self.launcher(*args)
            else:
                key = ("rows", self.kernel, self.dtypes, strides)
                with launch_guard(key):
                    self.launcher(*args)
                if key in warm_launches:
                    with _lock:
                        self.warm_strides.add(strides)
            # (the one read of the device a group with labels makes: the statements'
            # error must be raised by this call, before anything is delivered)
            if flag and flag[0].item():
                return False
        for (key, _), out in zip(self.out_templates, outs):
            env[key] = out
        return True

    def column_sum_buffers(self, outs: List) -> Tuple:
        """The partial sums' buffer and the finished programs' counter of a group with
        column sums; with no rows, its column outputs are zeros (``outs`` replaced)."""
        import torch
        if not self.grid[0]:     # no rows: every column's sum is 0
            outs[:] = [torch.zeros(m.shape, dtype=self.working, device=self.device)
                       if m.column else out for m, out in zip(self.outputs, outs)]
        block = self.group.launch.block
        return (self.empty((self.grid[0] * self.column_sums * block,), dtype=torch.float64,
                           device=self.device),
                torch.zeros((1,), dtype=torch.int32, device=self.device))

    def parameter_array(self, env: Dict[str, object]):
        values = tuple(float(env[p]) for p in self.group.params)
        key = struct.pack(f"{len(values)}d", *values)      # bits: -0.0 is not 0.0
        array = self.parameter_arrays.get(key)
        if array is None:
            import torch
            array = torch.tensor(values, dtype=self.working, device=self.device)
            with _lock:
                if len(self.parameter_arrays) >= PARAMETER_ARRAYS_KEPT:
                    self.parameter_arrays.clear()
                self.parameter_arrays[key] = array
        return array


# Programs of a group with column sums: a few per multiprocessor on a GPU (each loops
# over blocks of rows, so its partial sums cover many rows and the last program adds
# few of them); under the interpreter a handful, so that tests run several programs
# and several blocks per program.
COLUMN_PROGRAMS_PER_SM = 2
COLUMN_PROGRAMS_INTERPRETED = 4


def column_programs(device) -> int:
    if device.type != "cuda":
        return COLUMN_PROGRAMS_INTERPRETED
    import torch
    return COLUMN_PROGRAMS_PER_SM * torch.cuda.get_device_properties(
        device).multi_processor_count


def runner(group: RowGroup, env: Dict[str, object]) -> RowRunner:
    """The launch of ``group`` on arrays laid out as ``env``'s."""
    import torch
    import triton
    rows, columns = group.extents
    dtypes, device = [], None
    working = getattr(torch, group.working)
    for spec in group.inputs:
        tensor = env[spec.key]
        device = tensor.device
        if spec.index:      # labels: as integers (int32 and int64 as they are)
            dtypes.append(tensor.dtype if tensor.dtype in (torch.int32, torch.int64)
                          else torch.int64)
            continue
        # bool and integer values are computed as floats (as triton_backend passes them)
        dtypes.append(tensor.dtype if tensor.dtype.is_floating_point else working)
    if device is None:
        device = next(v.device for v in env.values() if isinstance(v, torch.Tensor))
    with _lock:
        kernel = compiled(group, not interpreted())
    grid = (triton.cdiv(rows, group.launch.rows),)
    if group.columns:
        grid = (min(grid[0], column_programs(device)),)
    launch = group.launch
    launcher = PreparedLaunch(kernel, grid, dict(num_warps=launch.warps),
                              dict(ROWS=launch.rows, BLOCK=launch.block,
                                   PARTS=launch.parts),
                              device.index if device.type == "cuda" else None)
    outputs = tuple(group.outputs)
    return RowRunner(group, kernel, grid, (rows, columns), device, tuple(dtypes), launcher,
                     not interpreted(), working, torch.empty, torch.empty_like, outputs,
                     tuple((spec.key, dtype) for spec, dtype in zip(group.inputs, dtypes)),
                     tuple((m.key, output_template(m.shape, working, device))
                           for m in outputs), len(group.columns), gathered_axes(group),
                     torch.zeros, torch.int32)

