"""The public entry points: ``ein``, ``compile`` and the reusable Kernel."""

from __future__ import annotations

import functools
import numbers
import unicodedata
from typing import Dict, Mapping, Optional, Tuple

import numpy as np

from ..analysis.options import INT64_MAX, OPTION_NAMES, Options, option_error, shown
from ..analysis.ranges import check_positions_defined
from ..analysis.spec import Spec, first_span, spec_of
from ..backends import get_backend
from ..errors import (BackendError, EinfuseError, EinfuseOverflowError, EinfuseSyntaxError,
                      EinfuseTypeError, MissingArgumentError, UnexpectedArgumentError,
                      attach_statement, warn)
from ..lang.ast import Number, accesses
from ..lang.printer import format_statement
from .attention import run_before_binding, run_fused_attention, statement_attention
from ..analysis.binding import BoundCall, bind_call, bind_names
from ..analysis.frameworks import (JAX, NUMPY, TORCH, contiguous, framework_of,
                                   from_numpy, numpy_dtype, torch_compiling,
                                   torch_recording)
from .hoisted import HoistedForm, epilogue_form, hoisted_form, run_hoisted
from . import kernel_maker
from .kernel_maker import option_collision
from .distributed import run_on_dtensors
from .tracing import traced_call
from ..schedule.choose import as_written, choose, runs_hoisted
from ..schedule.early import Early, before_binding
from ..schedule.route import backend_name
from ..schedule.schedule import Library, Route, Schedule
from .repeat import run_first
from ..schedule.cache_key import CacheKey, CacheKind
from .signatures import signature_of
from ..analysis.result_size import check_result_size, too_large


class Kernel:
    """A compiled statement, reusable for any shapes and dtypes.

    Call it with the statement's tensors and scalars by keyword (or positionally
    in order of first appearance on the right side).  ``bind`` checks a call without
    running it, ``source`` shows the code generated for it.

    Example::

        k = ef.compile("y[b,o] := x[b,i] * W[i,o] + bias[o]")
        y = k(x=x, W=W, bias=bias)
    """

    def __init__(self, statement: str, options: Options):
        self.statement = statement
        self.options = options
        try:
            self.spec = spec_of(statement)
        except EinfuseError as error:
            raise attach_statement(error, statement) from None
        for message, span in self.spec.warnings:
            warn(message, source=statement, span=span)
        # signature of a call -> its prepared runner, or None (runtime/repeat.py)
        self._repeat: Dict[Tuple, object] = {}
        # signature of a call -> its schedule (schedule/choose.py), chosen once
        self._schedules: Dict[CacheKey, Schedule] = {}

    @property
    def inputs(self):
        return self.spec.arg_order

    def __repr__(self) -> str:
        text = format_statement(self.spec.statement)
        takes = ", ".join(self.spec.arg_order) or "no inputs"
        if self.spec.assign != ":=":
            takes += f"; writes into {self.spec.output}"
        return f"<einfuse.Kernel {text!s} | takes {takes} | backend={self.options.backend}>"

    # ``self`` is positional-only, and ``arrays=`` takes any name, so that a tensor may
    # be called ``self``, ``arrays`` or anything else.
    def bind(self, /, *args, arrays=None, **kwargs) -> BoundCall:
        try:
            return self._bind_named(args, self._named(args, kwargs, arrays))
        except EinfuseError as error:
            raise attach_statement(error, self.statement) from None

    def _bind_named(self, args, named) -> BoundCall:
        call = bind_call(self.spec, self.options, args, named)
        _check_parameters(call)
        _check_index_arithmetic(self.spec, call.bounds)
        check_positions_defined(self.spec, call.bounds)
        return call

    def _named(self, args, kwargs, arrays) -> dict:
        """The keyword arguments with ``arrays=`` merged in, after the checks whose
        messages need to know the API (binding has the rest)."""
        spec = self.spec
        if arrays is not None:
            kwargs = _merge_arrays(spec, kwargs, arrays)
        if not all(name.isascii() for name in kwargs):
            # the statement's names are NFKC-normalised, as Python's own identifiers are;
            # keys of a ** dict are not
            kwargs = {unicodedata.normalize("NFKC", k): v for k, v in kwargs.items()}
        takes = _takes(spec)
        for name, value in kwargs.items():
            if name not in takes and name in spec.all_indices:
                raise _index_passed(spec, name, value)
        for name in _option_named(spec):
            if name not in kwargs and name not in spec.arg_order[:len(args)]:
                what = "output" if name == spec.output else \
                    "scalar parameter" if name in spec.params else "tensor"
                raise MissingArgumentError(
                    f"the {what} {name} was not passed; its name is also the option {name}= "
                    f"of ein() and explain(), so pass it as arrays={{'{name}': ...}}",
                    span=first_span(spec, name))
        return kwargs

    def __call__(self, /, *args, arrays=None, **kwargs):
        if torch_compiling():   # torch.compile sees a custom operator, not this code
            return traced_call(self, args, kwargs, arrays)
        # the common case first, with nothing called but the signature and the lookup
        # (all by keyword: _given's first answer)
        given = kwargs if not args and arrays is None else _given(args, kwargs, arrays)
        signature = None
        if given is not None:
            signature = signature_of(given)
            # (None is never a key: prepare keeps only signatures)
            runner = self._repeat.get(signature)
            if runner is not None:     # the fast path: all checks passed for it before
                return runner(given)
        try:
            kwargs = self._named(args, kwargs, arrays)
            early, named = before_binding(self, args, kwargs)     # schedule/early.py
            if early is Early.DTENSORS:
                return run_on_dtensors(self, bind_names(self.spec, args, kwargs))
            if early is Early.ATTENTION:
                result = run_before_binding(self, named)     # None: the kernel declines
                if result is not None:
                    return result
            if early is Early.JAX:
                from . import jax_adapter
                form = self.hoisted_form
                if form is not None and self.spec.assign == ":=":
                    # (a weakly typed scalar parameter stands in as a Python number,
                    # so the hoisted kernels have the dtypes the statement has)
                    stand_ins = self.bind(**{name: jax_adapter.stand_in(self, name, v)
                                             for name, v in named.items()})
                    if runs_hoisted(form, stand_ins):
                        done, result = run_hoisted(form, stand_ins, named, JAX)
                        if done:
                            return result
                return jax_adapter.call(self, named)
            call = self._bind_named(args, kwargs)
        except EinfuseError as error:
            raise attach_statement(error, self.statement) from None
        grad = False
        if call.framework == TORCH:
            from . import torch_autograd
            if torch_recording():
                if self.spec.assign != ":=":
                    _refuse_unrecorded_write(self.spec, call, self.statement)
                grad = bool(torch_autograd.differentiable_names(call))
        try:
            schedule = self.schedule(call, signature)
        except EinfuseError as error:
            raise attach_statement(error, self.statement) from None
        if schedule.route is Route.LIBRARY:
            # a hand-written kernel, which may decline the call's data: then its fallback
            result = _LIBRARY_RUNS[schedule.library](self, call, args, kwargs)
            if result is not None:
                return self.deliver(call, result)
            schedule = schedule.fallback
        if schedule.route in (Route.HOISTED, Route.BLAS_THEN_EPILOGUE):
            # autograd records each kernel of the hoisted form on its own
            form = self.hoisted_form if schedule.route is Route.HOISTED else \
                self.epilogue_form
            done, result = run_hoisted(form, call, bind_names(self.spec, args, kwargs))
            if done:
                if given is not None:
                    self._prepare_repeat(call, given)
                return result
        elif given is not None:
            # the first call of a signature runs as its repeats will (the same kernels,
            # BLAS and backward): the same bits, call after call (runtime/repeat.py)
            done, result = run_first(self, call, given, schedule.backend)
            if done:
                return result
        written = schedule.as_written()
        if grad and self.spec.assign == ":=" and schedule.route is Route.TRITON:
            # one program node: its backward's row kernel takes the gathers' scatters
            from .triton_statement_autograd import recorded_statement, takes_program_node
            result = recorded_statement(self, bind_names(self.spec, args, kwargs)) \
                if takes_program_node(self.spec) else None
            if result is not None:
                if given is not None:
                    self._prepare_repeat(call, given)
                return result
        if grad and self.spec.assign == ":=":
            result = torch_autograd.apply(self, call, lambda: self.run(call, written),
                                          backend_name(self.options.backend, call))
            if given is not None:
                self._prepare_repeat(call, given)
            return result
        result = self.deliver(call, self.run(call, written))
        if given is not None:
            self._prepare_repeat(call, given)
        return result

    def schedule(self, call: BoundCall, signature: Optional[Tuple] = None) -> Schedule:
        """The schedule of this call (schedule/choose.py): its route -- a library kernel,
        the hoisted form, BLAS, the loop nest, the NumPy reference, Triton -- and what was
        decided for it; chosen once per call ``signature`` (runtime/signatures.py)."""
        if signature is None:
            return choose(self, call)
        cache = self._schedules
        key = CacheKey(CacheKind.SCHEDULE, signature)
        found = cache.get(key)
        if found is None:
            if len(cache) >= SCHEDULES_KEPT:
                try:     # another thread may drop the same oldest one between these steps
                    cache.pop(next(iter(cache)), None)
                except (StopIteration, RuntimeError):
                    pass
            found = cache[key] = choose(self, call)
        return found

    def _prepare_repeat(self, call: BoundCall, kwargs) -> None:
        from .repeat import prepare
        prepare(self, call, kwargs)

    def source(self, /, *args, arrays=None, **kwargs) -> str:
        """The code generated for a call with these arrays (placeholders of the right
        shapes and dtypes do): C or Triton source, one kernel after the other where the
        statement runs in its hoisted form.  Nothing runs.

        Example::

            k = ef.compile("y[i] := sum[j](A[i,j] * x[j])")
            print(k.source(A=np.ones((4, 3)), x=np.ones(3)))"""
        call = self.bind(*args, arrays=arrays, **kwargs)
        form = self.hoisted_form
        kernels = form.kernels(call.dtypes) if form is not None else None
        if kernels is None:
            return _source(as_written(self, call), call)
        env = bind_names(self.spec, args, self._named(args, kwargs, arrays))
        parts = []
        for kernel in kernels:
            spec = kernel.spec
            bound = kernel.bind(arrays={name: env[name] for name in spec.arg_order})
            env[spec.output] = np.zeros(bound.output_shape, bound.dtypes.result)
            parts.append(f"=== {format_statement(spec.statement)} ===\n"
                         f"{_source(as_written(kernel, bound), bound)}")
        return "\n\n".join(parts)

    @property
    def hoisted_form(self) -> Optional[HoistedForm]:
        """The statement with its loop-invariant reductions computed once, before the
        loops that do not need them (rewrite/hoist.py), or None."""
        return hoisted_form(self.statement, self.spec, self.options)

    @property
    def epilogue_form(self) -> Optional[HoistedForm]:
        """The statement with its contractions under elementwise work split out, each
        a temporary BLAS computes, before the epilogue reading them
        (plan/contraction_epilogue.py), or None."""
        return epilogue_form(self.statement, self.spec, self.options)

    def run(self, call: BoundCall, schedule: Optional[Schedule] = None) -> np.ndarray:
        """The result of the statement as written, as a NumPy array in the result
        dtype; ``schedule``: the call's as-written schedule, where chosen already."""
        try:
            schedule = schedule or as_written(self, call)
            backend = get_backend(schedule.backend)
            check_result_size(call)
            try:
                # the backend renders and runs what the schedule decided (BLAS or the
                # loop nest, its threads)
                result = backend.run(call, schedule)
            except (EinfuseError, RecursionError):
                raise
            except Exception as error:
                # The NumPy executor bounds its intermediates by memory_limit, so running
                # out of memory means the result itself (or a device array) did not fit.
                if isinstance(error, MemoryError) or type(error).__name__ == \
                        "OutOfMemoryError":
                    raise too_large(call, "could not be allocated") from None
                # Anything else is a backend's fault, not the statement's: still an
                # EinfuseError, with the original chained for the traceback.
                raise BackendError(f"backend {backend.name!r} failed: "
                                   f"{type(error).__name__}: {error}") from error
            if call.bfloat16:   # computed in float32, returned as the inputs were
                import torch
                tensor = result if framework_of(result) == TORCH else \
                    torch.from_numpy(contiguous(np.asarray(result)))
                return tensor.to(torch.bfloat16)
            if framework_of(result) == TORCH:   # a device-resident backend's tensor
                import torch
                return result.to(getattr(torch, call.dtypes.result.name))
            return result.astype(call.dtypes.result, copy=False)
        except EinfuseError as error:
            raise attach_statement(error, self.statement) from None
        except RecursionError:
            raise attach_statement(EinfuseSyntaxError(
                "the statement nests too deeply to evaluate"), self.statement) from None

    def deliver(self, call: BoundCall, result: np.ndarray):
        """Hand the result back in the caller's framework; write into the output
        array for '=' and '+='."""
        spec = self.spec
        if spec.assign == ":=":
            if framework_of(result) == TORCH:
                return result
            # a torch caller's result goes to its tensors' device
            like = next((v for v in (call.sources or {}).values()
                         if framework_of(v) == TORCH), None)
            return from_numpy(np.asarray(result), call.framework, like=like)
        out = call.output
        if call.framework == NUMPY:
            if not isinstance(out, np.ndarray) or not out.flags.writeable:
                raise attach_statement(EinfuseTypeError(
                    f"'{spec.assign}' writes into {spec.output}, which must be a writable "
                    f"NumPy array, not {type(out).__name__}",
                    span=spec.statement.output_span), self.statement)
            if spec.assign == "=":
                out[...] = result
            else:
                out += result.astype(out.dtype, copy=False)
            return out
        if call.framework == TORCH:
            import torch
            value = result if isinstance(result, torch.Tensor) else \
                torch.from_numpy(contiguous(result))
            value = value.to(out.device, out.dtype)
            with torch.no_grad():
                out.copy_(value) if spec.assign == "=" else out.add_(value)
            return out
        raise attach_statement(EinfuseTypeError(
            f"'{spec.assign}' cannot write into a {call.framework} array, which is immutable;"
            " use ':=' and the framework's own update", span=spec.statement.output_span),
            self.statement)


# Schedules kept per kernel (a new signature past this replaces the oldest).
SCHEDULES_KEPT = 32


def _run_attention(kernel: Kernel, call: BoundCall, args, kwargs):
    """The statement's online-softmax attention as one pass (runtime/attention.py), or
    None where the fused kernel declines the call (then the statement's fallback runs)."""
    fused = run_fused_attention(statement_attention(kernel.statement),
                                bind_names(kernel.spec, args, kwargs), kernel.options,
                                call.framework)
    return fused if fused is not None and numpy_dtype(fused) == call.dtypes.result \
        else None


# How each library kernel a schedule names runs (schedule/library.py registers them).
_LIBRARY_RUNS = {Library.ATTENTION: _run_attention}


def _source(schedule: Schedule, call: BoundCall) -> str:
    """The generated source of the statement as written, by its schedule."""
    backend = get_backend(schedule.backend)
    return backend.source(call) if schedule.blas is None else \
        backend.blas_source(schedule.blas)


def _given(args, kwargs, arrays):
    """The arguments as one dict when the fast path can key on them: all by keyword,
    or all in ``arrays=`` (as programs pass them); else None."""
    if args:
        return None
    if arrays is None:
        return kwargs
    return arrays if not kwargs and type(arrays) is dict else None


def _refuse_unrecorded_write(spec: Spec, call: BoundCall, statement: str) -> None:
    """'=' and '+=' write under no_grad, so autograd would not see the write: with grad
    mode on, a gradient through the output (it requires grad) or from it to an input
    that requires grad would be silently wrong.  torch records its own in-place ops;
    einfuse does not yet, so it refuses them (':=' is differentiable)."""
    involved = [name for name, value in (call.sources or {}).items()
                if getattr(value, "requires_grad", False)]
    if not involved:
        return
    raise attach_statement(EinfuseTypeError(
        f"'{spec.assign}' writes into {spec.output} in place, which autograd would not "
        f"record, and {', '.join(sorted(involved))} require grad; use ':=' (differentiable)"
        f" or call inside torch.no_grad()", span=spec.statement.output_span), statement)


class _NotGiven:
    """The default of a statement argument not given (see statement_argument)."""

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN = _NotGiven()


def statement_argument(statement, named: dict, function: str) -> str:
    """The statement of ein()/compile()/explain(): their first positional argument, which
    is positional-only so that a tensor may be called ``statement``; the older call form
    ``statement=...`` still works where no positional statement was given."""
    if statement is NOT_GIVEN:
        if "statement" not in named:
            raise MissingArgumentError(f"{function}() takes the statement as its first "
                                       "argument")
        statement = named.pop("statement")
    if not isinstance(statement, str):
        raise EinfuseSyntaxError(f"a statement must be a string, not "
                                 f"{type(statement).__name__}")
    return statement


def check_explain_options(statement: str, shapes, gradients, source=False) -> None:
    """explain()'s own options, checked before their truth value is taken: an array
    there was meant for a tensor of the same name."""
    flag = (bool, np.bool_, numbers.Integral)
    problems = {"shapes": shapes is not None and not isinstance(shapes, Mapping),
                "gradients": not isinstance(gradients, flag),
                "source": not isinstance(source, flag)}
    for option, bad in problems.items():
        if bad:
            value = {"shapes": shapes, "gradients": gradients, "source": source}[option]
            wanted = "a dict of name -> shape" if option == "shapes" else "True or False"
            error = option_error(option, f"{option}= takes {wanted}, not {shown(value)}")
            raise attach_statement(option_collision(error, statement), statement)


def _merge_arrays(spec: Spec, kwargs, arrays) -> dict:
    """``kwargs`` with the ``arrays=`` mapping's entries added."""
    if not isinstance(arrays, Mapping):
        if "arrays" not in _takes(spec):
            raise UnexpectedArgumentError("arrays= takes a dict of name -> array, such as "
                                          f"arrays={{'x': x}}, not {shown(arrays)}")
        arrays = {"arrays": arrays}   # the statement's own tensor called 'arrays'
    merged = dict(kwargs)
    for name, value in arrays.items():
        if not isinstance(name, str):
            raise UnexpectedArgumentError(f"arrays= maps names to arrays; {name!r} is not "
                                          "a name")
        if name in merged:
            raise UnexpectedArgumentError(f"{name} is given twice, as {name}= and in "
                                          "arrays=")
        merged[name] = value
    return merged


@functools.lru_cache(maxsize=512)
def _takes(spec: Spec) -> frozenset:
    """Every name a call may pass: tensors, scalars and the output."""
    return frozenset(spec.arg_order) | {spec.output}


@functools.lru_cache(maxsize=512)
def _option_named(spec: Spec) -> tuple:
    """The names the statement needs passed that are also options of ein()."""
    wanted = spec.arg_order + ((spec.output,) if spec.assign != ":=" else ())
    return tuple(name for name in wanted if name in OPTION_NAMES)


def _index_passed(spec: Spec, name: str, value) -> UnexpectedArgumentError:
    """The error for a value passed for an index, as in ``x[i + n]`` with ``n=2``."""
    used_in = next((access for access in accesses(spec.rhs)
                    for sub in access.indices if name in sub.index_names), None)
    if used_in is None:
        return UnexpectedArgumentError(
            f"{name} is an index of the statement, and indices are not passed: their "
            f"ranges come from the arrays or from ranges={{'{name}': ...}}",
            span=first_span(spec, name))
    offset = value if isinstance(value, numbers.Integral) and \
        not isinstance(value, bool) else 2
    return UnexpectedArgumentError(
        f"{name} appears inside {used_in}, so it is an index, not a scalar parameter: "
        "offsets inside subscripts are integer literals or indices; write the number "
        f"into the statement, or make {name} an index with that one value: "
        f"ranges={{'{name}': range({offset}, {offset + 1})}}", span=used_in.span)


def _check_parameters(call: BoundCall) -> None:
    """Python ints are int64 to every backend, and under NumPy 2's rules (NEP 50) a Python
    int must also fit the integer dtype it is computed in: ``int8_array + 300`` raises
    OverflowError there.  Literals and scalar parameters follow that one rule on every
    backend (comparisons included, which NumPy 2 alone exempts)."""
    spec, working = call.spec, call.dtypes.working
    info = np.iinfo(working) if working.kind in "iu" else None
    for name, value in call.params.items():
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            continue
        span = first_span(spec, name)
        if not -INT64_MAX <= int(value) <= INT64_MAX:
            raise EinfuseOverflowError(f"the scalar parameter {name}={value} does not fit in "
                                       "int64; pass a float for a large value", span=span)
        if info is not None and isinstance(value, int) and not info.min <= value <= info.max:
            raise EinfuseOverflowError(_narrow(f"the scalar parameter {name}={value}",
                                               working, info), span=span)
    if info is None:
        return
    for node in _int_literals(spec):
        if not info.min <= node.value <= info.max:
            raise EinfuseOverflowError(_narrow(f"the literal {node.value}", working, info),
                                       span=node.span)


@functools.lru_cache(maxsize=512)
def _int_literals(spec: Spec) -> tuple:
    return tuple(node for node in spec.rhs.walk()
                 if isinstance(node, Number) and isinstance(node.value, int))


def _narrow(what: str, working: np.dtype, info) -> str:
    return (f"{what} does not fit {working} ({info.min}..{info.max}), the integer dtype "
            f"this statement computes in; NumPy 2 raises OverflowError for this too; use "
            "wider inputs or a float dtype")


@functools.lru_cache(maxsize=1024)
def _check_index_arithmetic(spec: Spec, bounds) -> None:
    """Subscripts are computed in int64 on every backend: a bound on each one's magnitude
    over the ranges (on every partial sum) must fit.  Gathered values
    are bounded by their index arrays' own integer dtype."""
    ranges = bounds.range_map

    def worst(sub) -> int:
        # Backends compute c*i as c*lo + c*(i - lo), so both parts must fit as well.
        total = abs(sub.constant)
        for name, coeff in sub.terms:
            lo, hi = ranges[name]
            if hi > lo:
                total += abs(coeff) * (abs(lo) + hi - 1 - lo)
        for part, coeff in sub.quasi:   # inner // d: at most |inner| // d + 1; % d: d - 1
            inner = worst(part.inner)
            if inner > INT64_MAX:
                return inner
            total += abs(coeff) * (inner // part.divisor + 1 if part.op == "//"
                                   else part.divisor - 1)
        return total

    for access in accesses(spec.rhs):
        for sub in access.indices:
            largest = worst(sub)
            if largest > INT64_MAX:
                shown = ", ".join(f"{n} in {ranges[n][0]}..{ranges[n][1] - 1}"
                                  for n in sub.index_names)
                raise EinfuseOverflowError(
                    f"{access}: subscript {sub} may reach magnitude {largest} for {shown}, "
                    "beyond int64 (index arithmetic is int64 on every backend)",
                    span=sub.span or access.span)


__all__ = ["Kernel"]


kernel_maker.install(Kernel)
