"""``explain``: what a statement computes, what it costs and how it will run."""

from __future__ import annotations

from dataclasses import dataclass, field
import math
from typing import List, Optional

import numpy as np

from ..plan.windowed_contraction import windowed_refusal
from ..analysis.options import shown
from ..analysis.ranges import Bounds
from ..analysis.cost import bytes_text, count_flops, count_text
from ..analysis.placeholders import statement_placeholders
from ..analysis.spec import Spec
from ..errors import EinfuseError, attach_statement
from .eager import naive_intermediate
from ..lang.ast import Binary, Call, Expr, Param, Reduce, Unary, accesses, map_children
from ..lang.printer import format_expr, format_statement
from ..runtime.kernel import Kernel
from ..runtime.kernel_maker import compile_statement
from ..schedule.choose import as_written, choose
from ..schedule.schedule import Route
from ..runtime.gradient_reference import resolve_options
from ..pictures import save_page, statement_page
from .data import LoopLevel, Operand, loop_levels
from .measure import Measured, measure_compiled

_REDUCTION_WORDS = {"sum": "the sum", "prod": "the product", "max": "the maximum",
                    "min": "the minimum", "logsumexp": "the log-sum-exp",
                    "argmax": "the position of the first maximum",
                    "argmin": "the position of the first minimum"}
_ACCUMULATE = {"sum": "{acc} += {value}", "prod": "{acc} *= {value}",
               "max": "{acc} = max({acc}, {value})", "min": "{acc} = min({acc}, {value})",
               "logsumexp": "{acc} = logaddexp({acc}, {value})   # one pass, running max",
               "argmax": "if {value} > best or isnan({value}) and not isnan(best): "
                         "best, {acc} = {value}, position",
               "argmin": "if {value} < best or isnan({value}) and not isnan(best): "
                         "best, {acc} = {value}, position"}
_INITIAL = {"sum": "0", "prod": "1", "max": "-inf", "min": "+inf", "logsumexp": "-inf",
            "argmax": "0; best = -inf", "argmin": "0; best = +inf"}


@dataclass
class Explanation:
    """The parts of an explanation; ``str()`` gives the text shown to a person."""
    statement: str
    words: List[str]
    index_rows: List[List[str]]
    loop_nest: List[str]
    flops: Optional[int] = None
    bytes_read: Optional[int] = None
    bytes_written: Optional[int] = None
    naive_intermediate_bytes: Optional[int] = None
    strategy: Optional[str] = None
    compiled_loop_nest: Optional[List[str]] = None
    gradients: Optional[List[str]] = None
    hoisted: Optional[List[str]] = None
    notes: List[str] = field(default_factory=list)
    source: Optional[str] = None       # the generated code, with source=True
    result_dtype: Optional[str] = None   # the dtype the call returns (with arrays)
    loops: Optional[List[LoopLevel]] = None   # the loop nest as data (for the picture)
    inputs: Optional[List[Operand]] = None    # the arrays read (with arrays or shapes)
    output: Optional[Operand] = None          # the array written (with arrays or shapes)
    measured: Optional[Measured] = None       # with measure=True: the time per call
    schedule: Optional[str] = None            # the call's schedule (schedule/schedule.py)

    def page(self):
        """The picture of the plan (docs/pictures.md), a ``pictures.Page``."""
        return statement_page(self)

    def _repr_html_(self) -> str:
        return self.page().fragment()

    def save(self, path: str) -> None:
        """Write the picture of the plan as a self-contained HTML page."""
        save_page(self.page(), path)

    @property
    def arithmetic_intensity(self) -> Optional[float]:
        if self.flops is None or not (self.bytes_read or self.bytes_written):
            return None
        return self.flops / (self.bytes_read + self.bytes_written)

    def __str__(self) -> str:
        out = [self.statement, "", "What it computes"]
        out += ["  " + line for line in self.words]
        out += ["", "Indices"] + ["  " + line for line in _table(self.index_rows)]
        out += ["", "Loop nest"] + ["  " + line for line in self.loop_nest]
        if self.flops is not None:
            out += ["", "Cost",
                    f"  FLOPs                 {count_text(self.flops)}",
                    f"  bytes read            {bytes_text(self.bytes_read)} (each input once)",
                    f"  bytes written         {bytes_text(self.bytes_written)}",
                    "  arithmetic intensity  " + _intensity(self.arithmetic_intensity)]
            if self.naive_intermediate_bytes:
                out.append(f"  naive broadcast       {bytes_text(self.naive_intermediate_bytes)}"
                           " intermediate (what eager NumPy/PyTorch would allocate; "
                           "einfuse never does)")
        if self.hoisted:
            out += ["", "Computed once (reductions hoisted out of the loops that do not "
                        "need them, contractions split from their elementwise epilogue for "
                        "BLAS; in order, run as 'How it runs' says)"]
            out += ["  " + line for line in self.hoisted]
        if self.strategy:
            out += ["", "How it runs", "  " + self.strategy]
            if self.schedule:
                out.append("  schedule: " + self.schedule)
        if self.compiled_loop_nest:
            out += ["", "Compiled kernel (pseudo-code)"]
            out += ["  " + line for line in self.compiled_loop_nest]
        if self.gradients:
            out += ["", "Gradients (each statement its own kernel)"]
            out += ["  " + line for line in self.gradients]
        if self.notes:
            out += [""] + ["Note: " + n for n in self.notes]
        if self.source:
            out += ["", "Generated source"] + ["  " + line for line in self.source.splitlines()]
        if self.measured is not None:
            out += ["", "Measured (measure=True)", self.measured.line()]
        return "\n".join(out)


def _table(rows: List[List[str]]) -> List[str]:
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _indices_text(names) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


# -- plain words ---------------------------------------------------------------------------
def describe(expr: Expr) -> str:
    """``expr`` in words, reductions spelled out, other parts as formulas."""
    if isinstance(expr, Reduce):
        return f"{_REDUCTION_WORDS[expr.op]} over {_indices_text(expr.indices)} of " \
               f"{describe(expr.body)}"
    if not any(isinstance(n, Reduce) for n in expr.walk()):
        return format_expr(expr)
    if isinstance(expr, Call):
        return f"{expr.func} of ({', '.join(describe(a) for a in expr.args)})"
    if isinstance(expr, Binary):
        return f"({describe(expr.left)}) {expr.op} ({describe(expr.right)})"
    if isinstance(expr, Unary):
        return f"minus ({describe(expr.operand)})"
    return format_expr(expr)


def words(spec: Spec, options) -> List[str]:
    st = spec.statement
    target = f"{st.output}[{', '.join(st.output_indices)}]" if st.output_indices \
        else f"the scalar {st.output}"
    verb = {":=": "is", "=": "is overwritten with", "+=": "is increased by"}[st.assign]
    lead = f"For every {_indices_text(st.output_indices)}, " if st.output_indices else ""
    lines = [f"{lead}{target} {verb} {describe(spec.rhs)}."]
    if spec.implicit_reduction:
        names = _indices_text(spec.rhs.indices)
        one = len(spec.rhs.indices) == 1
        lines.append(f"{names} {'is' if one else 'are'} summed because "
                     f"{'it does' if one else 'they do'} not appear on the left side "
                     "(implicit sum).")
    seen = set()
    for access in accesses(spec.rhs):
        if access in seen:
            continue
        seen.add(access)
        for axis, sub in enumerate(access.indices):
            if sub.gathers:
                arrays = _indices_text([str(a) for a, _ in sub.gathers])
                lines.append(f"{access.tensor} is gathered: axis {axis} is indexed by the "
                             f"values of {arrays} (bounds={options.bounds!r}).")
            elif sub.is_affine and sub.terms:
                how = f"reads outside give {options.pad} (pad=)" if options.pad is not None \
                    else "the ranges keep every read inside the array"
                lines.append(f"{access.tensor} is read at shifted position {sub} on axis "
                             f"{axis}; {how}.")
    if spec.result_is_bool:
        lines.append("The right side is a comparison, so the result is bool.")
    return lines


# -- loop nest -----------------------------------------------------------------------------
def loop_nest(spec: Spec, bounds: Optional[Bounds]) -> List[str]:
    def loop_range(name: str) -> str:
        if bounds is None:
            return f"range({name})"
        lo, hi = bounds.range_map[name]
        return f"{lo}..{hi - 1}" if hi > lo else "(empty)"

    lines: List[str] = []
    counter = [0]

    def emit(expr: Expr, depth: int) -> Expr:
        """Emit the loops of every reduction in ``expr``; return ``expr`` with each
        reduction replaced by its accumulator's name."""
        if isinstance(expr, Reduce):
            counter[0] += 1
            acc = f"acc{counter[0]}"
            pad = "  " * depth
            lines.append(f"{pad}{acc} = {_INITIAL[expr.op]}")
            for offset, name in enumerate(expr.indices):
                lines.append(f"{pad}{'  ' * offset}for {name} in {loop_range(name)}:"
                             f"   # {expr.op}")
            inner = depth + len(expr.indices)
            value = format_expr(emit(expr.body, inner))
            lines.append("  " * inner + _ACCUMULATE[expr.op].format(acc=acc, value=value))
            return Param(acc)
        return map_children(expr, lambda child: emit(child, depth))

    depth = 0
    for name in spec.output_indices:
        kind = "parallel" if name in spec.race_free_indices else "serial"
        lines.append(f"{'  ' * depth}for {name} in {loop_range(name)}:   # {kind}")
        depth += 1
    value = format_expr(emit(spec.rhs, depth))
    target = f"{spec.output}[{', '.join(spec.output_indices)}]" if spec.output_indices \
        else spec.output
    op = "+=" if spec.assign == "+=" else "="
    lines.append(f"{'  ' * depth}{target} {op} {value}")
    return lines


def index_rows(spec: Spec, bounds: Optional[Bounds]) -> List[List[str]]:
    rows = [["index", "role", "extent", "values", "from"]]
    for name in spec.all_indices:
        if name in spec.output_indices:
            role = f"output axis {spec.output_indices.index(name)}"
        else:
            role = f"reduced ({spec.reduction_of(name).op})"
        if bounds is None:
            sources = sorted({f"{u.access.tensor} axis {u.axis}" for u in spec.uses(name)})
            rows.append([name, role, "per call", "", ", ".join(sources) or "ranges="])
        else:
            lo, hi = bounds.range_map[name]
            values = f"{lo}..{hi - 1}" if hi > lo else "empty"
            rows.append([name, role, str(bounds.extent(name)), values, bounds.source(name)])
    return rows


def _intensity(value: Optional[float]) -> str:
    # an empty axis moves no bytes: FLOPs per byte is undefined, not zero
    return "- (no bytes moved)" if value is None else f"{value:.2f} FLOP/byte"


def explain_statement(compiled: Kernel, args, arrays, shapes, gradients: bool,
                      source: bool, measure: bool = False) -> Explanation:
    """``ef.explain`` of one compiled statement: its explanation, attention's notes,
    with ``source=True`` the generated source and with ``measure=True`` the time per
    call on the given arrays (or zeros of the given shapes)."""
    given = dict(arrays.get("arrays") or {})
    given.update({k: v for k, v in arrays.items() if k != "arrays"})
    explanation = explain_kernel(compiled, args, arrays, shapes, gradients)
    if measure:
        spec = compiled.spec
        wanted = set(spec.arg_order) | ({spec.output} if spec.assign != ":=" else set())
        given.update(zip(spec.arg_order, args))
        given = {**{name: 1.0 for name in spec.params}, **given}
        explanation.measured = measure_compiled(compiled, [explanation], given, wanted)
    from ..runtime.attention import attention_notes      # rewrite/online_softmax.py
    explanation.notes += attention_notes(compiled, {**statement_placeholders(compiled.spec, shapes),
                                                    **arrays} if shapes else arrays)
    if source:
        if shapes:
            arrays = {**statement_placeholders(compiled.spec, shapes), **arrays}
        if not args and not arrays:
            explanation.notes.append("pass arrays or shapes= to see the generated source")
        else:
            explanation.source = kernel_source(compiled, args, arrays, explanation.notes)
    return explanation


def explain_kernel(kernel: Kernel, args, arrays, shapes, gradients: bool,
                   framework: Optional[str] = None) -> Explanation:
    """The explanation of one compiled statement for these arrays or shapes;
    ``framework``: the caller's, where ``arrays`` stand in for its arrays (a program's
    JAX inputs are explained on NumPy placeholders)."""
    from ..backends import get_backend
    statement = kernel.statement
    spec = kernel.spec
    text = format_statement(spec.statement)
    if spec.statement.expanded:
        text = f"{spec.statement.source.strip()}\n  which is  {text}"
    if shapes:
        try:
            # what the caller passed (a scalar parameter's value) wins over placeholders
            arrays = {**statement_placeholders(spec, shapes), **arrays}
        except EinfuseError as error:
            raise attach_statement(error, statement) from None
    if not args and not arrays:
        return Explanation(text, words(spec, kernel.options), index_rows(spec, None),
                           loop_nest(spec, None),
                           gradients=gradient_lines(kernel, None) if gradients else None,
                           notes=["pass arrays or shapes= to see ranges, costs and the plan"],
                           loops=loop_levels(spec, None))
    call = kernel.bind(*args, **arrays)
    result = delivered_dtype(call, framework or call.framework)
    result_item = dtype_itemsize(result)
    read = sum(a.nbytes for a in call.arrays.values())
    written = int(np.prod(call.output_shape, dtype=np.int64)) * result_item
    if spec.assign == "+=":
        read += written
    # (CUDA tensors: Triton, as they run)
    schedule = choose(kernel, call)
    chosen = get_backend(schedule.backend)
    route = schedule.without_library().route
    form = kernel.epilogue_form if route is Route.BLAS_THEN_EPILOGUE else kernel.hoisted_form
    hoisted = form.hoisted if route in (Route.HOISTED, Route.BLAS_THEN_EPILOGUE) else None
    lines = None
    if hoisted is not None:
        lines, nests = hoisted_lines(form, call, chosen)
        how = hoisted_how(len(form.texts), hoisted_groups(form, call))
    else:
        blas = schedule.as_written().blas
        nests = chosen.loop_nest(call) if hasattr(chosen, "loop_nest") and blas is None \
            else None
        how = how_it_runs(chosen, call, blas)
    built = _built(chosen, call) if hoisted is None and hasattr(chosen, "built") and \
        schedule.as_written().blas is None else None
    notes = [] if built is None else [
        "the C kernel for these shapes is built (in the cache): no compile on the first call"
        if built else "the first call with these shapes compiles the C kernel (once; then "
        "it is cached on disk for every later call and process)"]
    # (said only of a reduction through windows: a gather alone is no contraction)
    refusal = windowed_refusal(spec) if schedule.backend == "c" and \
        schedule.as_written().route is Route.LOOP_NEST and spec.reduction_indices else None
    if refusal is not None:     # it reads through windows, but BLAS cannot take it
        notes.append(f"not a windowed contraction for BLAS ({refusal}): the loop nest "
                     "runs it")
    if call.framework == "jax":   # where jax.jit runs it (runtime/jax_ffi.py)
        from ..runtime.jax_ffi import route_note
        notes.append(route_note(kernel, call))
    return Explanation(
        text, words(spec, kernel.options), index_rows(spec, call.bounds),
        loop_nest(spec, call.bounds), flops=count_flops(spec, call.bounds, hoisted),
        bytes_read=read, bytes_written=written,
        naive_intermediate_bytes=naive_intermediate(spec, call.bounds,
                                                    call.dtypes.working.itemsize),
        strategy=f"backend {chosen.name}: {how}; result dtype {result}" + (
            " (computed in float32)" if call.bfloat16 else ""),
        compiled_loop_nest=nests,
        gradients=gradient_lines(kernel, call) if gradients else None, hoisted=lines,
        notes=notes, result_dtype=result, loops=loop_levels(spec, call.bounds),
        schedule=schedule.describe(),
        inputs=[Operand(name, tuple(value.shape), _dtype_name(value), int(value.nbytes))
                for name, value in call.arrays.items()],
        output=Operand(spec.output, tuple(call.output_shape), result,
                       written))


def _dtype_name(array) -> str:
    dtype = array.dtype
    return getattr(dtype, "name", None) or str(dtype).replace("torch.", "")


def delivered_dtype(call, framework: str) -> str:
    """The name of the dtype a caller of ``framework`` gets: bfloat16 where the inputs
    are (computed in float32), what JAX holds for a JAX caller (float32 for float64
    without x64)."""
    if call.bfloat16:
        return "bfloat16"
    if framework == "jax":
        import jax
        return np.dtype(jax.dtypes.canonicalize_dtype(call.dtypes.result)).name
    return call.dtypes.result.name


def dtype_itemsize(name: str) -> int:
    return 2 if name == "bfloat16" else np.dtype(name).itemsize


def kernel_source(kernel: Kernel, args, arrays, notes: List[str]) -> Optional[str]:
    """``kernel``'s generated source for these arrays, or None with a note in ``notes``
    where the shapes are too large to lay the kernel out (the backend does so on a real
    output array)."""
    try:
        return kernel.source(*args, arrays=arrays)
    except MemoryError:
        notes.append("the generated source is not shown: laying the kernel out needs its "
                     "output in memory, which these shapes do not fit")
        return None


def _built(backend, call) -> Optional[bool]:
    """Whether the call's C kernel is built; None where finding out would allocate an
    output this machine cannot hold (the backend lays its kernel out on real buffers; a
    shape given to explain may be far larger than memory)."""
    nbytes = math.prod(call.output_shape) * call.dtypes.working.itemsize
    if nbytes > np.iinfo(np.intp).max:
        return None
    try:
        return backend.built(call)
    except MemoryError:
        return None


def hoisted_groups(form, call):
    """The kernels the hoisted statements run as for this call (schedule/fusion.py), as
    the call groups them: NumPy views on the C backend (CPU tensors too), torch tensors
    on the Triton backend; None where each runs alone (JAX) or grouping fails."""
    from ..schedule.fusion import fusion_groups
    sources = call.sources or {}
    if call.framework == "jax":
        return None
    on_device = any(getattr(v, "is_cuda", False) for v in sources.values()) or \
        call.options.backend == "triton"
    env = dict(sources) if on_device else dict(call.arrays)
    env.update(call.params)
    try:     # (fusion_groups binds without repeating the statements' warnings)
        return fusion_groups(form.kernels(call.dtypes), env, keep={call.spec.output})
    except (EinfuseError, MemoryError, KeyError):
        return None


def hoisted_how(count: int, groups) -> str:
    """'How it runs' for a hoisted form of ``count`` statements run as ``groups``."""
    if not groups or len(groups) == count:
        return f"the {count} statements above, each its own kernel, in order"
    parts = []
    for group in groups:
        which = ", ".join(str(n + 1) for n in group.statements)
        if len(group.statements) == 1:
            parts.append(f"statement {which} alone")
        elif group.row_kernel == "triton":
            parts.append(f"statements {which} fused: one Triton kernel holding whole rows "
                         "in registers")
        elif group.row_kernel is not None:
            parts.append(f"statements {which} fused: the {group.row_kernel} row kernel")
        else:
            parts.append(f"statements {which} fused: one loop over rows, each statement's "
                         "row in turn")
    kernels = f"{len(groups)} kernel{'s' if len(groups) != 1 else ''}"
    return f"the {count} statements above as {kernels}: " + "; ".join(parts)


def hoisted_lines(form, call, backend):
    """Each statement of a hoisted form with how it runs, and their pseudo-code (the
    temporaries bound as uninitialised arrays of their extents)."""
    import warnings
    arrays = {**dict(call.arrays), **call.params}
    if call.output is not None:
        arrays[call.spec.output] = call.output
    lines: List[str] = []
    nests: List[str] = []
    for kernel, text in zip(form.kernels(call.dtypes), form.texts):
        spec = kernel.spec
        needed = spec.arg_order + ((spec.output,) if spec.assign != ":=" else ())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bound = kernel.bind(arrays={name: arrays[name] for name in needed})
        blas = as_written(kernel, bound, backend.name).blas
        lines += [text, f"    {how_it_runs(backend, bound, blas)}"]
        if hasattr(backend, "loop_nest"):
            nests += [f"# {text}"] + (backend.loop_nest(bound) if blas is None else [])
        if spec.assign == ":=":
            arrays[spec.output] = np.empty(bound.output_shape, call.dtypes.working)
    return lines, nests or None


def gradient_lines(kernel, call) -> List[str]:
    """Each float input's gradient statements and, for concrete arrays, their plans."""
    import warnings

    from ..backends import get_backend
    from ..errors import NoGradientError
    from ..runtime.gradient_reference import statements_to_run
    from ..runtime.gradients import gradient_statements, options_key
    spec = kernel.spec
    wanted = [t.name for t in spec.tensors if t.as_value and t.name != spec.output]
    wanted += list(spec.params)
    lines: List[str] = []
    for name in wanted:
        if call is not None:
            value = call.arrays.get(name, call.params.get(name))
            if np.asarray(value).dtype.kind != "f":
                continue
        try:
            statements = gradient_statements(kernel.statement, name,
                                             options_key(kernel.options))
        except NoGradientError as error:
            lines.append(f"d{name}: none ({error.message})")
            continue
        if call is not None:
            arrays = dict(call.arrays)
            arrays.update(call.params)
            arrays["d" + spec.output] = np.broadcast_to(
                np.zeros((), call.dtypes.result), call.output_shape)
            # the statements these arrays run (an output starting elsewhere than 0, a
            # gather's fallback: autodiff/reference.py)
            statements = statements_to_run(statements, arrays)
        for g in statements:
            shown = g.description or g.text
            lines.append(f"{shown}   [{g.kind}]")
            if call is None:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                options = resolve_options(g, arrays)
                gradient = _compile_for(g.text, kernel.options.backend, options)
                bound = gradient.bind(**{n: arrays[n] for n in g.inputs})
            backend = get_backend(kernel.options.backend)
            plan = how_it_runs(backend, bound, as_written(gradient, bound, backend.name).blas)
            if g.kind == "scatter":
                plan += "; then added into the gradient by a scatter-add (rows: a " \
                        "column-parallel C kernel, deterministic)"
            lines.append(f"    {plan}")
    return lines


def how_it_runs(backend, call, blas) -> str:
    """The backend's 'How it runs' for a call; ``blas``: what the call's schedule hands
    to BLAS (schedule/choose.py), or None."""
    return backend.strategy(call) if blas is None else backend.blas_strategy(call, blas)


def _compile_for(text: str, backend: str, options):
    return compile_statement(text, backend=backend, **options)
