"""Where a recognised attention (rewrite/online_softmax.py) runs, decided here as a
frozen :class:`AttentionRoute` from facts of the call that runtime/attention.py
gathers (:class:`AttentionFacts`: the framework, whether autograd records, whether the
fused Triton kernel's route takes the arrays, the backend option, an option that
disqualifies the fused kernels, whether a C compiler is found); the runtime runs the
route it is handed.

The routes, in the order they are tried:

* a recorded call (torch autograd records it) whose attention is not normalised, or
  whose scale or band parameter needs a gradient (or a term's tensor whose gradient
  would have to be joined with another): the statements, which record their own
  backward;
* the Triton kernel's route takes the arrays (torch CUDA tensors, or
  ``backend='triton'``: backends/triton/attention.route): TRITON_RECORDED under
  autograd, else TRITON;
* a recorded call: C_RECORDED (the C kernel with its fused C backward) on ``auto`` or
  ``c`` without ``pad=``/``ranges=``/``dtype=`` and with a C compiler, else the
  statements;
* ``pad=``, ``ranges=``, ``dtype=`` or a backend other than ``auto``/``c``/``numpy``:
  the statements;
* arrays the C kernel and the NumPy pass do not take (torch tensors on a device, not
  strided, not float32/float64): the statements;
* ``backend='numpy'``: NUMPY (the key-block pass); a C compiler: C; ``backend='c'``
  without one: the statements (they raise the backend's own error); else NUMPY.

What the kernels test while they run -- a value holding inf or NaN, extents that
disagree, a row seeing no key, an allocation -- are value checks the runners make (they
then decline, and the statements run), not routes: a kernel's index-bound or
finiteness test is a value check."""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Optional

# the backend options under which the C kernel or the NumPy pass runs
_FUSED_BACKENDS = ("auto", "c", "numpy")
# ... and those under which a recorded call runs the C kernel and its fused backward
_RECORDED_BACKENDS = ("auto", "c")


class AttentionRouteKind(enum.Enum):
    TRITON_RECORDED = "the fused Triton kernel, recorded with its fused Triton backward"
    TRITON = "the fused Triton kernel"
    C_RECORDED = "the C kernel, recorded with its fused C backward"
    C = "the C kernel"
    NUMPY = "the NumPy key-block pass"
    STATEMENTS = "the statements one by one"


@dataclass(frozen=True)
class AttentionFacts:
    """What the route is decided from (no values read).

    ``framework``: "numpy" or "torch"; ``recording``: torch autograd records the call;
    ``triton``: where the Triton kernel's route puts it (its target's words, e.g. "the
    GPU"), None where that route does not take the arrays; ``backend``: the backend
    option; ``option``: the first of ``pad=``/``ranges=``/``dtype=`` given, None where
    none is; ``compiler``: a C compiler is found (asked only where the backend option
    lets the C kernel run, else False); ``views``: the arrays are ones the C kernel and
    the NumPy pass take (NumPy arrays, CPU float32/float64 torch tensors; gathered only
    for a call neither Triton nor recorded, else True); ``normalised``: the attention
    divides by its weights' sum; ``constants_need_grad``: a recorded call's scale or
    band parameter needs a gradient, or a term's gradient would need joining."""
    framework: str
    recording: bool
    triton: Optional[str]
    backend: str
    option: Optional[str]
    compiler: bool
    views: bool = True
    normalised: bool = True
    constants_need_grad: bool = False


@dataclass(frozen=True)
class AttentionRoute:
    """The decision: the route and why."""
    kind: AttentionRouteKind
    reason: str

    @property
    def fused(self) -> bool:
        """Whether a fused kernel (not the statements) is asked to run the call."""
        return self.kind is not AttentionRouteKind.STATEMENTS


def _statements(reason: str) -> AttentionRoute:
    return AttentionRoute(AttentionRouteKind.STATEMENTS, f"the statements one by one: {reason}")


@functools.lru_cache(maxsize=256)
def route_of(*fields) -> AttentionRoute:
    """attention_route of ``AttentionFacts(*fields)``, cached by the fields (every call
    of a recognised attention asks: no facts value is built for a signature seen
    before)."""
    return attention_route(AttentionFacts(*fields))


def attention_route(facts: AttentionFacts) -> AttentionRoute:
    """The route of a call of these facts (the module's rule)."""
    Kind = AttentionRouteKind
    if facts.recording:
        if not facts.normalised:
            return _statements("autograd records an attention not divided by its "
                               "weights' sum (its gradient needs the statements)")
        if facts.constants_need_grad:
            return _statements("autograd records a scale, band parameter or term whose "
                               "gradient the fused backward does not give")
    if facts.triton is not None:
        where = f"on {facts.triton} (backends/triton/attention.py)"
        if facts.recording:
            return AttentionRoute(Kind.TRITON_RECORDED,
                                  f"{Kind.TRITON_RECORDED.value}, {where}")
        return AttentionRoute(Kind.TRITON, f"{Kind.TRITON.value}, {where}")
    if facts.option is not None:
        return _statements(f"{facts.option} (the fused kernels take no such option)")
    if facts.recording:
        if facts.backend not in _RECORDED_BACKENDS:
            return _statements(f"autograd records the call on backend={facts.backend!r} "
                               "(the fused backward is the C kernel's)")
        if not facts.compiler:
            return _statements("autograd records the call and no C compiler is found "
                               "(the fused backward is a C kernel)")
        return AttentionRoute(Kind.C_RECORDED, f"{Kind.C_RECORDED.value} "
                              "(backends/c/attention.py, attention_grad.py): CPU torch "
                              "tensors autograd records")
    if facts.backend not in _FUSED_BACKENDS:
        return _statements(f"backend={facts.backend!r} (the fused kernels run on 'auto', "
                           "'c' and 'numpy')")
    if not facts.views:
        return _statements("torch tensors the C kernel does not take (on a device, not "
                           "strided, not float32 or float64)")
    if facts.backend == "numpy":
        return AttentionRoute(Kind.NUMPY, f"{Kind.NUMPY.value}: backend='numpy'")
    if facts.compiler:
        arrays = "NumPy arrays" if facts.framework == "numpy" else "CPU torch tensors"
        return AttentionRoute(Kind.C, f"{Kind.C.value} (backends/c/attention.py) on {arrays}")
    if facts.backend == "c":
        return _statements("backend='c' and no C compiler is found (the statements "
                           "raise the backend's own error)")
    return AttentionRoute(Kind.NUMPY, f"{Kind.NUMPY.value}: no C compiler is found")
