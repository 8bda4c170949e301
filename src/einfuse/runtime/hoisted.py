"""Running a statement in its hoisted form (rewrite/hoist.py): the temporaries, then the
statement reading them, each a Kernel of its own.

The statement as written stays the authority: it is bound (every check and error
message is its own) before the hoisted form runs, and when the hoisted form raises an
EinfuseError (a gather the statement's own ranges never read, a temporary that does
not fit in memory) the statement runs as written and reports or succeeds on its own.

Only float32, float64, int64 and uint64 working dtypes are hoisted, and only where
the result has the working dtype: a temporary is then computed in exactly the dtype
the statement would have computed it in (``dtype=``), so hoisting changes no result
beyond the order of floating-point additions (64-bit integer arithmetic wraps the same
in any order).  Without it a nested reduction runs its inner one anew for every value
of the outer index: time exponential in the nesting."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Dict, Optional, Tuple

import numpy as np

from ..errors import EinfuseError
from ..lang.printer import format_statement
from ..plan.contraction_epilogue import epilogue_program
from ..rewrite.hoist import Hoisted, hoist
from ..analysis.spec import spec_of
from .kernel_maker import new_kernel

_HOISTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64),
                   np.dtype(np.uint64))


class HoistedForm:
    """The hoisted program of one Kernel, with its kernels per working dtype."""

    def __init__(self, hoisted: Hoisted, options, epilogue=None):
        self.hoisted = hoisted
        # plan/contraction_epilogue.ContractionEpilogue where the form splits a
        # contraction from its elementwise epilogue (the BLAS_THEN_EPILOGUE route)
        self.epilogue = epilogue
        self.options = options
        self.texts = tuple(format_statement(s) for s in hoisted.statements)
        self._kernels: Dict[str, Tuple] = {}
        # prepared runs (schedule/fusion.py) per kernels tuple (one per working dtype)
        self._runs: Dict[int, dict] = {}
        # per working dtype: the form with its repeated expensive expressions computed
        # once (kernels, shares), or None; and per call signature, the kernels chosen
        self._shared: Dict[str, Optional[Tuple]] = {}
        self._chosen: Dict[Tuple, Tuple] = {}

    @staticmethod
    def of(spec, options) -> Optional["HoistedForm"]:
        hoisted = hoist(spec.statement, spec.rhs, options.ranges, pad=options.pad is not None)
        return None if hoisted is None else HoistedForm(hoisted, options)

    @staticmethod
    def applies(dtypes) -> bool:
        """Whether a call with these dtypes runs in the hoisted form."""
        return dtypes.working in _HOISTED_DTYPES and dtypes.result == dtypes.working

    def runs(self, call) -> bool:
        """Whether this call runs in the hoisted form: its dtypes apply, and positions
        held in a temporary are exact for its ranges."""
        return self.applies(call.dtypes) and (
            not self.hoisted.index_valued or _positions_exact(call))

    def kernels(self, dtypes) -> Optional[Tuple]:
        """The kernels for a call with these dtypes, or None to run as written."""
        if not self.applies(dtypes):
            return None
        working = dtypes.working
        if working.name not in self._kernels:
            built = []
            with warnings.catch_warnings():   # the statement as written warned already
                warnings.simplefilter("ignore")
                for number, text in enumerate(self.texts):
                    temporary = number < len(self.hoisted.temporaries)
                    built.append(new_kernel(text, self._options(text, temporary, working)))
            self._kernels[working.name] = tuple(built)
        return self._kernels[working.name]

    def _options(self, text: str, temporary: bool, working: np.dtype):
        options = self.options
        own = spec_of(text).all_indices
        options = dataclasses.replace(
            options, ranges=tuple((n, b) for n, b in options.ranges if n in own))
        if temporary:
            options = dataclasses.replace(options, dtype=working.name)
        return options

    def run(self, kernels, named: Dict[str, object], framework: str):
        """The statement's result from its named arguments (and, for '='/'+=', the
        array it writes into), fused where schedule/fusion.py allows."""
        from .run_groups import run_statements
        if framework == "torch":     # one autograd node for the hoisted statements
            from .program_autograd import recorded
            # (its forward computes a repeated exp once too, as for NumPy callers)
            results = recorded(self, self._with_shared(kernels, named), named,
                               (kernels[-1].spec.output,), self.options)
            if results is not None:
                return results[0]
        if framework == "jax":       # one differentiable function (runtime/jax_program.py)
            from . import jax_program
            results = jax_program.recorded(self, kernels, named,
                                           (kernels[-1].spec.output,), self.options)
            if results is not None:
                return results[0]
        if framework == "numpy":
            kernels = self._with_shared(kernels, named)
        env = dict(named)
        run_statements(kernels, env, framework, keep={kernels[-1].spec.output},
                       runs=self._runs.setdefault(id(kernels), {}))
        return env[kernels[-1].spec.output]

    def prepared_run(self, named: Dict[str, object]):
        """The prepared run (run_groups.PreparedRun) an earlier NumPy call of this form
        on arrays like ``named`` made (the one its next such call takes), or None where
        none has run (runtime/torch_node.py translates it)."""
        from .signatures import signature_of
        signature = signature_of(named)
        if signature is None:
            return None
        for kernels in self._kernels.values():
            chosen = self._chosen.get((id(kernels), signature))
            if chosen is None:
                continue
            run = self._runs.get(id(chosen), {}).get(
                (signature, frozenset({chosen[-1].spec.output})))
            if run is not None:
                return run
        return None

    def recorded_calls(self, kernels, named: Dict[str, object]) -> Tuple:
        """The prepared autograd call (program/autograd.py) of these kernels for
        arrays like ``named``, once a call made it: a tuple of it, or empty."""
        from .program_autograd import prepared_call
        found = prepared_call(self, self._with_shared(kernels, named), named)
        return () if found is None else (found,)

    def _with_shared(self, kernels, named) -> Tuple:
        """``kernels``, or the form with a repeated expensive expression computed once
        (autodiff/cse.py: softmax's ``exp(X[i,k] - h1[i])``, in the row sum and again in
        the result, becomes one row ``cse_1[i,k]`` that both read), where every read of
        it covers exactly the ranges it is computed over for these arrays.  Decided once
        per call signature."""
        from .signatures import signature_of
        signature = signature_of(named)
        key = (id(kernels), signature)
        chosen = self._chosen.get(key) if signature is not None else None
        if chosen is not None:
            return chosen
        shared = self._shared_form(kernels)
        chosen = kernels
        if shared is not None and _ranges_match(*shared, named):
            chosen = shared[0]
        if signature is not None:
            if len(self._chosen) >= 64:
                self._chosen.clear()
            self._chosen[key] = chosen
        return chosen

    def _shared_form(self, kernels) -> Optional[Tuple]:
        """(kernels, shares) of the shared form of these kernels, built once, or None."""
        name = str(id(kernels))
        if name in self._shared:
            return self._shared[name]
        from ..autodiff.cse import share
        statements = [spec_of(k.statement).statement for k in kernels]
        taken = {n for k in kernels for n in k.spec.arg_order + (k.spec.output,)}
        rewritten, shares = share(statements, [False] * len(statements), taken)
        found = None
        if shares and rewritten[-1].output == statements[-1].output:
            working = kernels[0].options.dtype
            built = []
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for number, statement in enumerate(rewritten):
                    text = format_statement(statement)
                    options = self._options(text, number < len(rewritten) - 1,
                                            np.dtype(working))
                    built.append(new_kernel(text, options))
            found = (tuple(built), tuple(shares))
        self._shared[name] = found
        return found


def _ranges_match(kernels, shares, named) -> bool:
    """Whether every read of each shared expression covers exactly the ranges its
    definition is computed over, for arrays like ``named`` (only shapes are read)."""
    from ..analysis.frameworks import placeholder
    shapes = {name: placeholder(value) for name, value in named.items()}
    ranges = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for kernel in kernels:
                call = kernel.bind(arrays={n: shapes[n] for n in kernel.spec.arg_order})
                shapes[kernel.spec.output] = np.broadcast_to(
                    np.zeros((), call.dtypes.result), call.output_shape)
                ranges.append(call.bounds.range_map)
    except (EinfuseError, KeyError):
        return False
    outputs = [k.spec.output for k in kernels]
    for item in shares:
        definer = outputs.index(item.name)
        own = ranges[definer]
        axes = kernels[definer].spec.output_indices
        for position, indices in item.uses:
            if any(tuple(ranges[position][index]) != tuple(own[axis])
                   for axis, index in zip(axes, indices)):
                return False
    return True


@functools.lru_cache(maxsize=256)
def hoisted_form(statement: str, spec, options) -> Optional[HoistedForm]:
    """The hoisted form of a statement under these options (cached, with its
    kernels, across the Kernel objects that ``ein`` creates per call)."""
    return HoistedForm.of(spec, options)


@functools.lru_cache(maxsize=256)
def epilogue_form(statement: str, spec, options) -> Optional[HoistedForm]:
    """The statement as its hoisted temporaries, the contractions under its
    elementwise work (each a temporary BLAS computes) and the epilogue reading them
    (plan/contraction_epilogue.py), or None where it has no such contraction; the
    schedule (schedule/choose.py) decides where it runs."""
    found = epilogue_program(spec.statement, spec.rhs, options.ranges,
                             pad=options.pad is not None)
    return None if found is None else HoistedForm(found[0], options, found[1])


def _positions_exact(call) -> bool:
    """Every index value of the call is an integer the working dtype holds exactly (a
    temporary holding positions is computed in it)."""
    working = call.dtypes.working
    if working.kind in "iu":
        info = np.iinfo(working)
        return all(info.min <= lo and hi - 1 <= info.max
                   for lo, hi in call.bounds.range_map.values())
    limit = 2 ** (np.finfo(working).nmant + 1)
    return all(-limit < lo and hi <= limit for lo, hi in call.bounds.range_map.values())


def run_hoisted(form: HoistedForm, call, named, framework: Optional[str] = None
                ) -> Tuple[bool, object]:
    """(True, result) from the hoisted form the schedule chose for ``call``
    (schedule/choose.runs_hoisted), or (False, None) when its temporaries cannot be
    computed and the statement must run as written.  ``framework``: that of ``named``
    where ``call`` was bound on stand-ins (JAX values)."""
    kernels = form.kernels(call.dtypes)
    if kernels is None:
        return False, None
    try:
        return True, form.run(kernels, named, framework or call.framework)
    except EinfuseError:
        return False, None
