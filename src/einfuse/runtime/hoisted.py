"""Running a statement in its hoisted form (rewrite/hoist.py): the temporaries, then the
statement reading them, each a Kernel of its own.

The statement as written stays the authority: it is bound (every check and error
message is its own) before the hoisted form runs, and when the hoisted form raises an
EinfuseError (a gather the statement's own ranges never read, a temporary that does
not fit in memory) the statement runs as written and reports or succeeds on its own.

Only float working dtypes are hoisted, and only where the result has the working
dtype (float32, float64): a temporary is then computed in exactly the dtype the
statement would have computed it in (``dtype=``), so hoisting changes no result
beyond the order of floating-point additions."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Dict, Optional, Tuple

import numpy as np

from ..errors import EinfuseError
from ..lang.printer import format_statement
from ..rewrite.hoist import Hoisted, hoist

_HOISTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class HoistedForm:
    """The hoisted program of one Kernel, with its kernels per working dtype."""

    def __init__(self, hoisted: Hoisted, options):
        self.hoisted = hoisted
        self.options = options
        self.texts = tuple(format_statement(s) for s in hoisted.statements)
        self._kernels: Dict[str, Tuple] = {}
        # prepared runs (schedule/fusion.py) per kernels tuple (one per working dtype)
        self._runs: Dict[int, dict] = {}

    @staticmethod
    def of(spec, options) -> Optional["HoistedForm"]:
        hoisted = hoist(spec.statement, spec.rhs, options.ranges, pad=options.pad is not None)
        return None if hoisted is None else HoistedForm(hoisted, options)

    @staticmethod
    def applies(dtypes) -> bool:
        """Whether a call with these dtypes runs in the hoisted form."""
        return dtypes.working in _HOISTED_DTYPES and dtypes.result == dtypes.working

    def kernels(self, dtypes) -> Optional[Tuple]:
        """The kernels for a call with these dtypes, or None to run as written."""
        if not self.applies(dtypes):
            return None
        working = dtypes.working
        if working.name not in self._kernels:
            from .kernel import Kernel
            built = []
            with warnings.catch_warnings():   # the statement as written warned already
                warnings.simplefilter("ignore")
                for number, text in enumerate(self.texts):
                    temporary = number < len(self.hoisted.temporaries)
                    built.append(Kernel(text, self._options(text, temporary, working)))
            self._kernels[working.name] = tuple(built)
        return self._kernels[working.name]

    def _options(self, text: str, temporary: bool, working: np.dtype):
        from .kernel import _spec_for
        options = self.options
        own = _spec_for(text).all_indices
        options = dataclasses.replace(
            options, ranges=tuple((n, b) for n, b in options.ranges if n in own))
        if temporary:
            options = dataclasses.replace(options, dtype=working.name)
        return options

    def run(self, kernels, named: Dict[str, object], framework: str):
        """The statement's result from its named arguments (and, for '='/'+=', the
        array it writes into), fused where schedule/fusion.py allows."""
        from ..schedule import run_statements
        if framework == "torch":     # one autograd node for the hoisted statements
            from ..program.autograd import recorded
            results = recorded(self, kernels, named, (kernels[-1].spec.output,),
                               self.options)
            if results is not None:
                return results[0]
        env = dict(named)
        run_statements(kernels, env, framework, keep={kernels[-1].spec.output},
                       runs=self._runs.setdefault(id(kernels), {}))
        return env[kernels[-1].spec.output]


@functools.lru_cache(maxsize=256)
def hoisted_form(statement: str, spec, options) -> Optional[HoistedForm]:
    """The hoisted form of a statement under these options (cached, with its
    kernels, across the Kernel objects that ``ein`` creates per call)."""
    return HoistedForm.of(spec, options)


def run_hoisted(form: HoistedForm, call, named) -> Tuple[bool, object]:
    """(True, result) from the hoisted form, or (False, None) when the statement must
    run as written."""
    kernels = form.kernels(call.dtypes)
    if kernels is None:
        return False, None
    try:
        return True, form.run(kernels, named, call.framework)
    except EinfuseError:
        return False, None
