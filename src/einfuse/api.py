"""The front door: every call a user makes (``compile``, ``ein``, ``explain``, ``einsum``,
``rearrange``, ``reduce``, ``repeat``, ``jit``), on top of every floor; einfuse/__init__.py
exports them.  Each one checks its arguments and dispatches: a mesh to sharding/, a
program to program/, a statement to runtime.kernel.Kernel; an einsum string or einops
pattern is translated by frontends/ first; ``explain`` hands the compiled thing to
explain/.  Nothing below imports this module (docs/architecture.md)."""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from .analysis.frameworks import NUMPY, framework_of, has_dtensor, torch_compiling
from .analysis.options import shown
from .errors import (EinfuseError, EinfuseSyntaxError, EinfuseTypeError, OptionError,
                     ShapeError, UnexpectedArgumentError, attach_statement, did_you_mean,
                     unexpected_keywords)
from .autodiff.derive import check_derive_call
from .autodiff.derive import derive as derive_statement
from .explain.front_ends import FrontEndExplanation
from .explain.jit import explain_function, is_jax_function
from .explain.measure import measure_compiled
from .explain.program import explain_program
from .explain.sharding import explain_sharded
from .explain.statement import explain_statement
from .frontends.einops import EinopsPlan, prepared, split_options
from .frontends.einops import explain_einops
from .frontends.einsum import KEYWORDS as EINSUM_KEYWORDS
from .frontends.einsum import explain_einsum, from_sublists, plan_einsum
from .frontends.named import hooks as named_hooks, is_named
from .lang.parser import einops_hint, einsum_hint
from .program.compile import compile_source
from .program.gradient import ProgramGradient, derive_program
from .runtime.gradient_reference import run_reference as run_statements_reference
from .runtime import tracing
from .runtime.kernel import (NOT_GIVEN, Kernel, check_explain_options, statement_argument)
from .runtime.keywords import check_named, keyword_options
from .runtime import distributed
from .sharding import sharded
from .sharding.dtensor import run_on_dtensors


def compile(statement=NOT_GIVEN, /, *, ranges=None, pad=None, bounds="check", fill=0.0,
            dtype=None, backend="auto", threads: Optional[int] = None,
            memory_limit: Optional[int] = None, outputs=None, mesh=None, shard=None,
            memory=None, precision: str = "exact", **named):
    """Compile ``statement`` into a reusable :class:`Kernel`, or a program (several
    statements, separated by newlines or ';') into a :class:`~einfuse.program.Program`
    whose ``outputs`` are chosen by name (default: what no later statement reads).

    Options (as for :func:`ein`): ``ranges=`` ({"i": 10} or {"i": range(2, 12)}),
    ``pad=`` (value read outside affine accesses), ``bounds=`` ("check", "clip",
    "wrap", "fill", "promise": gathers out of range), ``fill=``, ``dtype=``,
    ``backend=`` ("auto", "c", "numpy", "triton"), ``threads=``, ``memory_limit=``,
    ``precision=`` ("exact", or "fast": rewrites that trade exactness for speed, such
    as a squared distance computed as a matrix product; docs/performance.md).

    Example::

        dist = ef.compile("D[i,j] := (w[k,i] - x[k,j])**2")
        D = dist(w=w, x=x)              # any shapes; compiled once per layout"""
    statement = statement_argument(statement, named, "compile")
    if mesh is not None or shard is not None or memory is not None:   # docs/sharding.md
        if mesh is None and memory is not None:
            raise attach_statement(OptionError(
                "memory= is the bytes each device of a mesh may hold; it needs mesh= "
                "(docs/sharding.md)"), statement)
        return sharded(compile(statement, ranges=ranges, pad=pad, bounds=bounds, fill=fill,
                               dtype=dtype, backend=backend, threads=threads,
                               memory_limit=memory_limit, outputs=outputs,
                               precision=precision, **named),
                       mesh, shard, memory)
    if named:
        options = keyword_options(compile)
        wrong = ", ".join(f"{name}={did_you_mean(name, options)}" for name in named)
        raise attach_statement(UnexpectedArgumentError(
            f"compile() takes the statement and options, not {wrong}; pass the arrays when "
            "calling the kernel"), statement)
    return compile_source(statement, ranges=ranges, pad=pad, bounds=bounds, fill=fill,
                          dtype=dtype, backend=backend, threads=threads,
                          memory_limit=memory_limit, outputs=outputs, precision=precision)


def ein(statement=NOT_GIVEN, /, *args, ranges=None, pad=None, bounds="check", fill=0.0,
        dtype=None, backend="auto", threads: Optional[int] = None,
        memory_limit: Optional[int] = None, outputs=None, arrays=None, mesh=None, shard=None,
        memory=None, precision: str = "exact", **named):
    """Evaluate ``statement`` (or a program of several) once on the given arrays and
    scalars.  A tensor whose name is one of the options (``bounds``, ``ranges`` ...)
    goes in ``arrays={"bounds": b}``.  The options are :func:`compile`'s; NumPy,
    PyTorch (differentiable) and JAX arrays are accepted, and the result is of the
    same kind.  A repeated call reuses the compiled kernel.

    Example::

        y = ef.ein("y[i] := x[i+a] * ker[a]", x=x, ker=ker)     # a valid convolution"""
    statement = statement_argument(statement, named, "ein")
    if torch_compiling():
        from .program import torch_compiled   # (torch is imported: it traces)
        return torch_compiled.call_source(statement, (ranges, pad, bounds, fill, dtype, backend,
                                          threads, memory_limit), outputs, args, named, arrays)
    kernel = compile(statement, ranges=ranges, pad=pad, bounds=bounds, fill=fill,
                     dtype=dtype, backend=backend, threads=threads,
                     memory_limit=memory_limit, outputs=outputs, mesh=mesh, shard=shard,
                     memory=memory, precision=precision)
    check_named(kernel, named, keyword_options(ein))
    return kernel(*args, arrays=arrays, **named)


# explain()'s options that an einsum string's explanation passes on
EINSUM_EXPLAIN_OPTIONS = ("ranges", "pad", "bounds", "fill", "dtype", "backend", "threads",
                          "memory_limit", "gradients", "source")


def explain(statement=NOT_GIVEN, /, *args, shapes: Optional[Dict[str, tuple]] = None,
            ranges=None, pad=None, bounds="check", fill=0.0, dtype=None, backend="auto",
            threads=None, memory_limit=None, gradients: bool = False, outputs=None,
            source: bool = False, mesh=None, shard=None, cost_model=None, memory=None,
            measure: bool = False, precision: str = "exact", **arrays):
    """Explain ``statement`` (or a program of several); with arrays (or
    ``shapes={"A": (100, 50)}``) also the ranges, costs and plan for those shapes; with
    ``gradients=True`` also every gradient statement and how it runs; with
    ``source=True`` (and arrays or shapes) also the generated C or Triton source;
    with ``measure=True`` (and arrays or shapes) also the time per call on this machine;
    with ``mesh=`` (and ``shard=``) the plan on a device mesh (docs/sharding.md).
    ``str()`` of the result is the text.  A tensor named like an option goes in
    ``arrays={"bounds": b}``, as for ``ein``.

    Example::

        print(ef.explain("D[i,j] := (w[k,i] - x[k,j])**2", shapes={"w": (3, 5),
                                                                  "x": (3, 4)}))"""
    if is_named(statement) or (isinstance(statement, tuple) and statement and
                               is_named(statement[0])):     # named dimensions (dims.md)
        return named_hooks["explain"](statement, args, dict(
            shapes=shapes, pad=pad, bounds=bounds, fill=fill, dtype=dtype, backend=backend,
            threads=threads, memory_limit=memory_limit, gradients=gradients, source=source,
            mesh=mesh, shard=shard, cost_model=cost_model, memory=memory, ranges=ranges,
            outputs=outputs, measure=measure, **arrays), explain)
    if not isinstance(measure, (bool, np.bool_)):
        raise OptionError(f"measure= takes True or False, not {shown(measure)}")
    if measure and (mesh is not None or shard is not None or is_jax_function(statement) or
                    _einsum_or_einops(statement)):
        raise OptionError("measure=True times an index statement or program on this "
                          "machine; not a plan on a mesh, a JAX function or an einsum/einops "
                          "pattern (explain the statements they show with measure=True)")
    if mesh is None and has_dtensor(args, arrays):     # DTensors: the plan on their mesh
        mesh = next(v for v in (*args, *arrays.values()) if has_dtensor((v,), {})).device_mesh
    if (cost_model is not None or memory is not None) and mesh is None:
        raise OptionError(f"{'cost_model' if memory is None else 'memory'}= prices plans "
                          "on a device mesh; it needs mesh= (docs/sharding.md)")
    if is_jax_function(statement):   # ef.explain(fn, *example_args) (docs/jit.md)
        if mesh is not None or shard is not None:
            raise OptionError("mesh= and shard= explain a statement or program on a device "
                              "mesh, not a JAX function; explain the statements with mesh=")
        return explain_function(statement, args, arrays)
    statement = statement_argument(statement, arrays, "explain")
    if einsum_hint(statement) and mesh is None and shard is None:   # einsum's statement
        optimize = arrays.pop("optimize", "auto")    # (einsum's path search, as it runs)
        if arrays:   # the operands are positional: a keyword is a misspelt option
            raise attach_statement(unexpected_keywords(
                "explain() of an einsum string", arrays,
                ("shapes", "optimize") + EINSUM_EXPLAIN_OPTIONS), statement)
        return FrontEndExplanation(explain_einsum(
            statement, args, shapes, explain, optimize, ranges=ranges, pad=pad,
            bounds=bounds, fill=fill, dtype=dtype, backend=backend, threads=threads,
            memory_limit=memory_limit, gradients=gradients, source=source))
    if einops_hint(statement) is not None and mesh is None and shard is None:
        return FrontEndExplanation(explain_einops(statement, args, shapes, arrays, explain,
                                                  dtype=dtype, backend=backend,
                                                  threads=threads))
    check_explain_options(statement, shapes, gradients, source)

    compiled = compile(statement, ranges=ranges, pad=pad, bounds=bounds, fill=fill,
                       dtype=dtype, backend=backend, threads=threads,
                       memory_limit=memory_limit, outputs=outputs, precision=precision)
    # (arrays= is a keyword of explain's too, merged by binding as for ein)
    check_named(compiled, arrays, keyword_options(explain) + ("arrays",))
    if mesh is not None or shard is not None:
        return explain_sharded(compiled, args, arrays, shapes, mesh, shard, cost_model,
                               source, memory, gradients=gradients)
    if not isinstance(compiled, Kernel):
        given = dict(zip(compiled.inputs, args))
        given.update(arrays.get("arrays") or {})
        given.update({k: v for k, v in arrays.items() if k != "arrays"})
        explanation = explain_program(compiled, args, arrays, shapes, gradients, source)
        if measure:
            explanation.measured = measure_compiled(compiled, explanation.parts, given,
                                                    compiled.inputs)
        return explanation
    return explain_statement(compiled, args, arrays, shapes, gradients, source, measure)


def _einsum_or_einops(statement) -> bool:
    return isinstance(statement, str) and (bool(einsum_hint(statement)) or
                                           einops_hint(statement) is not None)


# -- numpy.einsum's call ----------------------------------------------------------------------
_EINSUM_CASTINGS = ("no", "equiv", "safe", "same_kind", "unsafe")


def _einsum_keywords(operands, options, casting: str, order: str) -> None:
    """numpy.einsum's ``casting`` rule for ``dtype=`` (checked on NumPy operands) and
    its ``order`` values."""
    if casting not in _EINSUM_CASTINGS:
        raise OptionError(f"casting={casting!r}: it is one of {', '.join(_EINSUM_CASTINGS)}")
    if not isinstance(order, str) or order.upper() not in ("K", "A", "C", "F"):
        raise OptionError(f"order={order!r}: it is one of K, A, C, F")
    wanted = options.get("dtype")
    if wanted is None:
        return
    if framework_of(wanted) == NUMPY:        # a torch dtype is ein's to check
        try:
            wanted = np.dtype(wanted)
        except TypeError:
            raise EinfuseTypeError(f"dtype={wanted!r} is not a data type") from None
    for n, op in enumerate(operands):
        if isinstance(op, np.ndarray) and not np.can_cast(op.dtype, wanted, casting):
            raise EinfuseTypeError(f"operand {n} of dtype {op.dtype} cannot be cast to "
                                   f"dtype={np.dtype(wanted).name} under "
                                   f"casting={casting!r} (numpy.einsum's rule)")


def _einsum_into(out, result, casting: str):
    """numpy.einsum's ``out=``: the result written into ``out``, which is returned."""
    if not isinstance(out, np.ndarray) and not hasattr(out, "copy_"):
        raise EinfuseTypeError(f"out= is a {type(out).__name__}; it must be a NumPy array "
                               "or a torch tensor (JAX arrays are immutable)")
    if tuple(out.shape) != tuple(result.shape):
        raise ShapeError(f"out= has shape {tuple(getattr(out, 'shape', ()))} but the result "
                         f"has shape {tuple(result.shape)}")
    if isinstance(out, np.ndarray):
        result = np.asarray(result)
        if not np.can_cast(result.dtype, out.dtype, casting):
            raise EinfuseTypeError(f"the result of dtype {result.dtype} cannot be written "
                                   f"into out= of dtype {out.dtype} under "
                                   f"casting={casting!r} (numpy.einsum's rule)")
        np.copyto(out, result, casting="unsafe")
        return out
    out.copy_(result)               # a torch tensor
    return out


def einsum(subscripts: str = None, *operands, optimize="auto", backend="auto", out=None,
           casting: str = "safe", order: str = "K", **options):
    """numpy.einsum's semantics on NumPy, PyTorch (differentiable) and JAX (jit, grad,
    vmap) arrays: ``ef.einsum("bthr,bThr->bhtT", Q, K)``.  Two operands become one
    statement; three or more a program of pairwise contractions in the order opt_einsum
    finds (``optimize=False``: one fused statement; "greedy", "optimal" or an explicit
    path choose the search).  numpy's sublist form, ``ef.einsum(a, [0, 1], b, [1, 2])``,
    and its ``out=``, ``casting=`` and ``order=`` work too.  Other keywords are
    ``ein``'s options."""
    unknown = [name for name in options if name not in EINSUM_KEYWORDS]
    if unknown:    # (numpy: a TypeError; an UnexpectedArgumentError is one)
        error = unexpected_keywords("einsum()", unknown, EINSUM_KEYWORDS)
        raise attach_statement(error, subscripts) if isinstance(subscripts, str) else error
    if subscripts is None and not operands:
        raise EinfuseSyntaxError("einsum needs its subscripts and at least one operand")
    if not isinstance(subscripts, str):    # numpy's sublist form
        subscripts, operands = from_sublists((subscripts,) + operands)
    operands = [op if hasattr(op, "shape") else np.asarray(op) for op in operands]
    shapes = [tuple(op.shape) for op in operands]
    try:
        _einsum_keywords(operands, options, casting, order)
        plan = plan_einsum(subscripts, shapes, optimize)
    except EinfuseError as error:
        raise attach_statement(error, subscripts) from None
    if plan.view and out is None and "dtype" not in options and order.upper() != "F" and \
            type(operands[0]) is np.ndarray and operands[0].dtype.kind in "biuf":
        # nothing to compute: numpy's own view of the operand (writeable, as numpy's)
        return np.einsum(subscripts, operands[0])
    arrays = {name: (op if shape is None else op.reshape(shape))
              for name, op, shape in zip(plan.names, operands, plan.reshapes)}
    result = ein(plan.source, backend=backend, arrays=arrays, outputs=(plan.output,)
                 if "\n" in plan.source else None, **options)
    if operands and "dtype" not in options and \
            all(str(op.dtype).endswith("bool") for op in operands):
        # numpy.einsum sums bool products in bool (an or of ands); einfuse sums them
        # as integers (notation.md), so the count becomes its truth value here
        result = result != 0
    if order.upper() == "F" and isinstance(result, np.ndarray):
        result = np.asfortranarray(result)
    if out is not None:
        try:
            return _einsum_into(out, result, casting)
        except EinfuseError as error:
            raise attach_statement(error, subscripts) from None
    return result


# -- einops' calls ---------------------------------------------------------------------------
def rearrange(x, pattern: str, **sizes):
    """einops.rearrange: ``ef.rearrange(x, "b (h w) c -> b h w c", h=4)``; a reordering
    runs as one kernel, a pure reshape returns the reshape (a view where possible)."""
    options = split_options(sizes)
    return _einops("rearrange", x, pattern, None, sizes, options)


def reduce(x, pattern: str, reduction, **sizes):
    """einops.reduce with sum, mean, max, min, prod, any, all and logsumexp, one kernel:
    ``ef.reduce(x, "b (h h2) (w w2) c -> b h w c", "max", h2=2, w2=2)``.  As in einops,
    ``reduction`` may also be a callable ``f(x, axes)`` that reduces the tuple of axes
    of ``x`` (the input split into its elementary axes); einfuse orders the rest."""
    options = split_options(sizes)
    return _einops("reduce", x, pattern, reduction, sizes, options)


def repeat(x, pattern: str, **sizes):
    """einops.repeat, one kernel: ``ef.repeat(x, "h w -> h w c", c=3)``."""
    options = split_options(sizes)
    return _einops("repeat", x, pattern, None, sizes, options)


def _einops(kind: str, x, pattern: str, reduction: Optional[str], sizes, options):
    plan, inner, options = prepared(kind, x, pattern, reduction, sizes, options)
    if plan.statement is None:
        return inner.reshape(plan.output_shape)
    if callable(reduction):
        return _einops_callable(reduction, inner, plan, pattern, options)
    result = ein(plan.statement, arrays={"X": inner}, ranges=dict(plan.ranges) or None,
                 **options)
    return result.reshape(plan.output_shape)


def _einops_callable(reduction, inner, plan: EinopsPlan, pattern: str, options):
    """einops' callable reduction: ``reduction(x, axes)`` on the elementary axes, the
    axes it leaves then ordered and composed as the right side says."""
    want = tuple(n for k, n in enumerate(plan.inner_shape) if k not in plan.reduced)
    try:
        reduced = reduction(inner, plan.reduced)
    except EinfuseError:
        raise
    except Exception as error:   # the caller's function: named, with its own message
        raise attach_statement(EinfuseError(
            f"the reduction {getattr(reduction, '__name__', reduction)!r} failed on axes "
            f"{plan.reduced}: {type(error).__name__}: {error}", source=pattern,
            span=(0, len(pattern))), pattern) from error
    if tuple(getattr(reduced, "shape", ())) != want:
        raise attach_statement(ShapeError(
            f"the reduction {getattr(reduction, '__name__', reduction)!r} over axes "
            f"{plan.reduced} returned shape {tuple(getattr(reduced, 'shape', ()))}, not "
            f"{want}", source=pattern, span=(0, len(pattern))), pattern)
    if plan.after_callable is not None:     # (a copy of bools is bool)
        reduced = ein(plan.after_callable, arrays={"X": reduced}, **options)
    return reduced.reshape(plan.output_shape)


def jit(fn=None, *, static_argnums=(), static_argnames=(), fallback=False, backend="auto",
        **unknown):
    """A JAX function compiled into one einfuse kernel, loops included (docs/jit.md);
    imports JAX only when called."""
    if unknown:     # (an EinfuseError, a TypeError as Python's own would be)
        raise unexpected_keywords("jit()", unknown, ("static_argnums", "static_argnames",
                                                     "fallback", "backend"))
    from .runtime.jit import jit as _jit
    return _jit(fn, static_argnums=static_argnums, static_argnames=static_argnames,
                fallback=fallback, backend=backend)



def derive(statement, wrt: str, *, output_grad_name=None, options=None, outputs=None,
           **unknown):
    """Gradient statements of ``statement`` with respect to ``wrt`` (autodiff/derive.py);
    for a program's text, its gradient program (program/gradient.py)."""
    if check_derive_call(statement, wrt, output_grad_name, options, unknown):
        return derive_program(statement, wrt, options, outputs)
    return derive_statement(statement, wrt, output_grad_name=output_grad_name,
                            options=options, outputs=outputs)


derive.__doc__ = derive_statement.__doc__


def run_reference(grads, arrays, *, backend: str = "numpy"):
    """Evaluate gradient statements (runtime/gradient_reference.py), or run a program's
    gradient (program/gradient.py): ``{target: gradient}``."""
    if isinstance(grads, ProgramGradient):
        return {grads.result: grads.run(arrays, backend=backend)}
    return run_statements_reference(grads, arrays, backend=backend)


run_reference.__doc__ = run_statements_reference.__doc__

def _traced_call(compiled, args, kwargs, arrays):
    """A Kernel's or Program's call under torch.compile (runtime/tracing.py)."""
    from .program import torch_compiled   # (torch is imported: it traces)
    if hasattr(compiled, "statements"):
        return torch_compiled.call_program(compiled, args, kwargs, arrays)
    return torch_compiled.call_statement(compiled, args, kwargs, arrays)


tracing.install(_traced_call)
distributed.install(run_on_dtensors)
