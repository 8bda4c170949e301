"""Running a recognised attention (rewrite/online_softmax.py) as one pass with online
softmax: on the C backend as one kernel (backends/c/attention.py), on the NumPy backend
as a loop over key blocks that combines partial states with the softmax-weighted-sum
monoid (rewrite/monoids.py).  Either way no N x N array exists.

Where a call runs (the Triton kernel, recorded or not; the C kernel, recorded or
not; the NumPy pass; the statements) is schedule/attention_route.py's decision, from
the facts :func:`attention_decision` gathers; this module runs the route it is handed.
The statements as written stay the authority: a call the route sends to them, and one
whose values a kernel declines (not one float dtype, extents that disagree, a value
with inf or NaN, an empty axis), gets ``None`` here and runs statement by statement,
which raises any error itself."""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from ..rewrite.monoids import SOFTMAX_WEIGHTED_SUM, WeightedState, finalise_weighted
from ..rewrite.online_softmax import Attention, MaskKind, ScaleKind, recognise
from ..analysis.frameworks import TORCH, framework_of, placeholder
from ..analysis.cost import (attention_bytes, attention_flops, attention_pairs, bytes_text,
                             count_text)
from ..rewrite.attention_layout import (Canonical, call_band, canonical, float_extents,
                                        to_output)
from ..schedule.attention_route import AttentionRoute
from ..schedule.attention_route import AttentionRouteKind as RouteKind
from ..schedule.attention_route import route_of
from ..schedule.early import triton_may_take
from ..schedule.library import statement_attention
from . import attention_run
from .attention_run import torch_inputs, triton_scale

KEY_BLOCK = 256       # keys per step of the NumPy executor


def program_attention(specs: Sequence, outputs: Tuple[str, ...]) -> Optional[Attention]:
    """The attention a program's statements (their specs) compute, or None."""
    statements = [dataclasses.replace(spec.statement, rhs=spec.rhs) for spec in specs]
    return recognise(statements, tuple(outputs))


def attention_decision(attention: Attention, named: Dict[str, object], options,
                       framework: str):
    """(the schedule's AttentionRoute for this call, the Triton kernel's target or None,
    the arrays as the C kernel and the NumPy pass take them or None): the facts
    schedule/attention_route.py decides from, gathered here (types, devices, flags and
    options only: no values read)."""
    recording = constants = False
    if framework == "torch":
        from . import attention_autograd     # (it imports torch)
        recording = attention_autograd.recording(attention, named)
        constants = recording and attention_autograd.constants_need_grad(attention, named)
    target = triton_route(attention, named, options)
    views = None
    if target is None and not recording:
        views = named if framework == "numpy" else torch_inputs(attention, named)
    route = _route(attention, framework, recording, target, options,
                   views is not None or target is not None or recording, constants)
    return route, target, views


def _route(attention: Attention, framework: str, recording: bool, target, options,
           views: bool, constants: bool = False) -> AttentionRoute:
    """schedule/attention_route's decision from the facts both a call and explain
    gather (``target``: the Triton kernel's, or None; ``views``: the arrays are ones a
    fused kernel takes); a C compiler is asked for only where the C kernel could run."""
    backend = options.backend
    # (AttentionFacts' fields, in order: route_of caches by them)
    return route_of(framework, recording, None if target is None else target.value,
                    backend, disqualifying_option(options),
                    target is None and backend in ("auto", "c") and compiler_found(),
                    views, attention.normalised, constants)


def disqualifying_option(options) -> Optional[str]:
    """The first option given that no fused attention kernel takes, or None."""
    if options.pad is not None:
        return "pad="
    if options.ranges:
        return "ranges="
    if options.dtype is not None:
        return "dtype="
    return None


def compiler_found() -> bool:
    from ..backends.c import build as c_build
    return c_build.find_compiler() is not None


def run_fused_attention(attention: Attention, named: Dict[str, object], options,
                        framework: str):
    """The attention run on the route the schedule decided (attention_decision): a
    NumPy result, or a torch tensor (under autograd recorded with a fused backward:
    runtime/attention_autograd.py); None where the statements run one by one (the route
    says so, or the kernel declines the call's values)."""
    route, target, views = attention_decision(attention, named, options, framework)
    kind = route.kind
    if kind is RouteKind.STATEMENTS:
        return None
    if kind is RouteKind.TRITON_RECORDED or kind is RouteKind.C_RECORDED:
        from . import attention_autograd
        if kind is RouteKind.TRITON_RECORDED:
            return attention_autograd.run_recorded_triton(attention, named, options,
                                                          target)
        return attention_autograd.run_recorded(attention, named, options)
    if kind is RouteKind.TRITON:       # backends/triton/attention.py
        from ..backends.triton import attention as triton_attention
        return triton_attention.run(attention, named,
                                    lambda query: triton_scale(attention, named, query),
                                    target)
    return run_attention(attention, views, options, kind)


def run_before_binding(kernel, named: Dict[str, object]):
    """A statement's recognised attention on torch tensors, run by the Triton kernel
    before the call is bound (schedule/early.py chose that route): the result, or
    None where the kernel declines the call (it is then bound and goes on)."""
    attention = statement_attention(kernel.statement)
    if triton_route(attention, named, kernel.options) is None:
        return None
    return run_fused_attention(attention, named, kernel.options, "torch")


def triton_route(attention: Attention, named: Dict[str, object], options):
    """The route (backends/triton/attention.AttentionTarget) of a call the fused Triton kernel
    takes -- torch CUDA tensors, or backend='triton' (schedule/early.triton_may_take)
    -- or None.  Imports no framework the caller's arrays do not belong to."""
    if not triton_may_take(attention, named, options):
        return None
    from ..backends.triton import attention as triton_attention
    return triton_attention.route(options, named,
                                  (attention.query, attention.key, attention.value))


def run_attention(attention: Attention, named: Dict[str, object], options,
                  kind: RouteKind) -> Optional[np.ndarray]:
    """The attention's output (a NumPy array) for these named NumPy arrays on the C or
    NumPy route the schedule decided, or None where the values decline it (extents
    that disagree or are empty, not one float dtype, a value holding inf or NaN): the
    statements then run one by one."""
    arrays = canonical(attention, named)
    if arrays is None:
        return None
    if kind is RouteKind.NUMPY:
        if not np.isfinite(arrays.value).all():
            return None
        out = _run_numpy(attention, arrays)
    else:
        out = attention_run.run_c(attention, arrays, options.threads or 0)
        if out is None:     # (a value holding inf or NaN)
            return None
    return to_output(attention, arrays, out)


def _run_numpy(attention: Attention, arrays: Canonical) -> np.ndarray:
    """One step per block of keys: the block's partial state, combined into the running
    one with the monoid."""
    q, k, v = arrays.query, arrays.key, arrays.value
    dtype = q.dtype
    scale = dtype.type(arrays.scale)
    groups, rows, _ = q.shape
    keys, features = v.shape[1], v.shape[2]
    monoid = SOFTMAX_WEIGHTED_SUM
    state = monoid.identity((groups, rows, features), dtype)
    i = np.arange(rows)[:, None]
    with np.errstate(all="ignore"):
        for j0 in range(0, keys, KEY_BLOCK):
            j = np.arange(j0, min(keys, j0 + KEY_BLOCK))[None, :]
            scores = np.matmul(q, k[:, j0:j0 + KEY_BLOCK].transpose(0, 2, 1))
            if attention.scale is ScaleKind.MULTIPLY:
                scores = scores * scale
            elif attention.scale is ScaleKind.DIVIDE:
                scores = scores / scale
            for term in arrays.terms:
                scores = scores + term.block(j0, j0 + j.shape[1], rows)
            seen = (j - i >= arrays.lower) & (j - i <= arrays.upper)
            top = np.where(seen, scores, -np.inf).max(axis=-1)
            weights = np.where(seen & (scores != -np.inf), np.exp(scores - top[..., None]), 0)
            weights = weights.astype(dtype, copy=False)
            block = WeightedState(top, weights.sum(axis=-1),
                                  np.matmul(weights, v[:, j0:j0 + KEY_BLOCK]))
            state = monoid.combine(state, block)
    return finalise_weighted(state, attention.normalised)


@dataclasses.dataclass(frozen=True)
class FusedAttention:
    """What ``explain`` says about an attention that runs fused, for given shapes."""
    attention: Attention
    groups: int          # product of the batch extents
    rows: int            # NQ
    keys: int            # NK
    dot: int             # D
    features: int        # E
    itemsize: int
    dtype: str
    # where the Triton kernel runs (backends/triton/attention.AttentionTarget) and its Config;
    # None: the C kernel (or the NumPy pass)
    route: Optional[object] = None
    config: Optional[object] = None
    # (lower, upper) on j - i for this call (None: a bound's parameter not given)
    band: Optional[Tuple[int, int]] = None
    # the schedule's route for the call (schedule/attention_route.AttentionRoute)
    decision: Optional[AttentionRoute] = None

    @property
    def pairs(self) -> int:
        """(i, j) pairs the rows see, over all rows of one batch element."""
        return attention_pairs(self.rows, self.keys, self.band)

    @property
    def flops(self) -> int:
        a = self.attention
        return attention_flops(self.groups, self.pairs, self.rows, self.dot, self.features,
                               scaled=a.scale is not ScaleKind.NONE, terms=len(a.terms),
                               normalised=a.normalised)

    @property
    def bytes_read(self) -> int:
        return attention_bytes(self.groups, self.rows, self.keys, self.dot, self.features,
                               self.itemsize)[0]

    @property
    def bytes_written(self) -> int:
        return attention_bytes(self.groups, self.rows, self.keys, self.dot, self.features,
                               self.itemsize)[1]

    def lines(self):
        a = self.attention
        square = bytes_text(self.groups * self.rows * self.keys * self.itemsize)
        skipped = "" if a.mask is MaskKind.NONE else \
            f"; mask {a.mask.value}: key blocks past the diagonal are never computed" \
            if a.mask is not MaskKind.BAND else \
            "; masks " + " and ".join([f"j - i <= {b}" for b in a.upper] +
                                      [f"j - i >= {b}" for b in a.lower]) + \
            ": key blocks outside the band are never computed"
        if a.terms:
            skipped += f"; plus {len(a.terms)} additive term(s) of the scores " \
                f"({', '.join(a.term_tensors) or 'index terms'}), read per block"
        weights = "exp(s_j - max_k s_k)"
        what = f"sum_j {weights} * {a.value}_j" + (f" / sum_j {weights}" if a.normalised
                                                    else "")
        which = f"statements 1-{a.statements}" if a.statements > 1 else "the statement"
        if self.route is not None:
            return self._triton_lines(which, what, skipped, square)
        transposed = self.groups * self.dot * -(-self.keys // 64) * 64 * self.itemsize
        return [
            f"  1 kernel: {which} fused as attention with online softmax "
            "(rewrite/online_softmax.py)", *self._route_line(),
            f"    {a.output} = {what}, s = {a.query} . {a.key} summed over the dot index"
            f"{' and scaled' if a.scale is not ScaleKind.NONE else ''}{skipped}",
            "    one pass over j per block of 64 rows with a running max, a running "
            "denominator and a rescaled accumulator (the softmax-weighted-sum monoid)",
            f"    {count_text(self.pairs * self.groups)} (i, j) pairs computed",
            f"    for NumPy {self.dtype} arrays and CPU torch tensors on the C backend "
            "(the NumPy backend runs the same pass by key blocks); under torch autograd "
            "the backward is one fused kernel too (normalised, every row seeing a key, "
            "finite inputs, a scale needing no gradient; the gradients of an added bias or "
            "mask and of a slope from the same kernel); JAX runs "
            "the statements one by one, and so does a value array holding inf or NaN",
            f"  materialised: nothing N x N (scores or weights in memory would take {square} "
            "each); per thread: blocks of 64 x 64 scores and 64 rows of the accumulator; "
            f"the keys transposed in blocks of 64 (once per call): {bytes_text(transposed)}"]


    def _route_line(self):
        return [] if self.decision is None else \
            [f"    route (schedule/attention_route.py): {self.decision.reason}"]

    def _triton_lines(self, which, what, skipped, square):
        a, config = self.attention, self.config
        dots = "IEEE-exact float32 dots (no TF32)" if self.dtype == "float32" else \
            (f"{self.dtype} dots with float32 accumulation (the weights rounded to "
             f"{self.dtype} for the weighted sum)")
        return [
            f"  1 kernel: {which} fused as attention with online softmax "
            "(rewrite/online_softmax.py)", *self._route_line(),
            f"    {a.output} = {what}, s = {a.query} . {a.key} summed over the dot index"
            f"{' and scaled' if a.scale is not ScaleKind.NONE else ''}{skipped}",
            f"    one Triton kernel (FlashAttention-2 forward, backends/triton/attention.py) "
            f"on {self.route.value}: one program per {config.block_m} rows of one batch "
            f"element, streaming blocks of {config.block_n} keys ({config.warps} warps, "
            f"{config.stages} stages) with a running max, a running denominator and a "
            f"rescaled accumulator; exp2 with log2(e) folded into the scale; {dots}; "
            f"the result in {self.dtype}",
            f"    {count_text(self.pairs * self.groups)} (i, j) pairs computed",
            "    under torch autograd the backward is fused too (two Triton kernels, "
            "backends/triton/attention_backward.py: dQ, dK, dV and the gradients of "
            "added tensors and slopes that need one; the statements' formula in torch for "
            "a non-finite output gradient, a row seeing no finite score, a double "
            "backward, a value holding inf or NaN: flagged on the device by the forward "
            "kernel, whose result is kept, and read with the backward's checks at once)",
            f"  materialised: nothing N x N (scores or weights in memory would take {square} "
            f"each); per program: a {config.block_m} x {config.block_n} block of scores and "
            f"{config.block_m} rows of the accumulator, in registers"]


def attention_notes(kernel, values: Dict[str, object]):
    """explain's notes for one statement that runs as fused attention."""
    attention = statement_attention(kernel.statement)
    fused = explain_attention(attention, values, kernel.options)
    if fused is None:
        return triton_fallback_notes(attention, values, kernel.options)
    return [f"the statement runs fused as attention with online softmax, not as the "
            f"kernels above: {count_text(fused.flops)} FLOPs; "
            + "; ".join(line.strip() for line in fused.lines()[1:])]


def explain_attention(attention: Optional[Attention], values: Dict[str, object],
                      options) -> Optional[FusedAttention]:
    """The fused attention for arrays like ``values`` (only shapes and dtypes are read),
    or None where this call would run statement by statement."""
    if attention is None:
        return None
    decision, route = explain_decision(attention, values, options)
    if decision.kind is RouteKind.TRITON:
        return _explain_triton(attention, values, route, decision)
    if not decision.fused:
        return None
    arrays = [values.get(n) for n in (attention.query, attention.key, attention.value)]
    if any(isinstance(a, np.ndarray) and type(a) is not np.ndarray for a in arrays):
        arrays = [np.asarray(a) if isinstance(a, np.ndarray) else a for a in arrays]
    # CPU torch tensors of float32/float64 run the C kernel on NumPy views of themselves
    # (as the call does): stand-ins of their shapes and dtypes answer for them here
    arrays = [placeholder(a) if framework_of(a) == TORCH and a.device.type == "cpu" and
              str(a.dtype) in ("torch.float32", "torch.float64") else a for a in arrays]
    extents = float_extents(attention, arrays)
    if extents is None:
        return None
    groups = int(np.prod([extents[b] for b in attention.batch], dtype=np.int64))
    dtype = arrays[0].dtype
    band = call_band(attention, values, extents)
    return FusedAttention(attention, groups, extents[attention.row],
                          extents[attention.key_index], extents[attention.dot_index],
                          extents[attention.feature], dtype.itemsize, dtype.name,
                          band=band, decision=decision)


def explain_decision(attention: Attention, values: Dict[str, object], options):
    """(the schedule's route, the Triton target or None) of a call, not recorded by
    autograd, with arrays like ``values`` (shapes, dtypes and devices only: explain's
    stand-ins answer for arrays): attention_decision's facts for explain."""
    arrays = [values.get(n) for n in (attention.query, attention.key, attention.value)]
    torch_arrays = [framework_of(a) == TORCH for a in arrays]
    framework = "torch" if any(torch_arrays) else "numpy"
    # (the C kernel takes CPU float32/float64 tensors, as NumPy views of themselves)
    views = all(not is_torch or (a.device.type == "cpu" and
                                 str(a.dtype) in ("torch.float32", "torch.float64"))
                for a, is_torch in zip(arrays, torch_arrays))
    target = triton_route(attention, values, options)
    return _route(attention, framework, False, target, options,
                  views or target is not None), target


def _triton_call(attention: Attention, values: Dict[str, object]):
    """(extents, dtype name) of a call for the Triton kernel, from shapes and dtypes only,
    or None where they disagree, are empty or are not one dtype."""
    arrays = [values.get(n) for n in (attention.query, attention.key, attention.value)]
    names = {str(getattr(a, "dtype", "")).rsplit(".", 1)[-1] for a in arrays}
    if len(names) != 1:
        return None
    extents: Dict[str, int] = {}
    for array, indices in zip(arrays, (attention.query_indices, attention.key_indices,
                                       attention.value_indices)):
        shape = tuple(getattr(array, "shape", ()))
        if len(shape) != len(indices):
            return None
        for index, extent in zip(indices, shape):
            if extents.setdefault(index, int(extent)) != int(extent):
                return None
    if any(extent == 0 for extent in extents.values()):
        return None
    return extents, names.pop()


def _explain_triton(attention: Attention, values: Dict[str, object], route, decision):
    from ..backends.triton import attention as triton_attention
    found = _triton_call(attention, values)
    if found is None:
        return None
    extents, dtype = found
    dot, features = extents[attention.dot_index], extents[attention.feature]
    if triton_attention.unsupported(dtype, dot, features) is not None or \
            triton_attention.terms_reason(attention, values) is not None:
        return None
    config = triton_attention.choose_config(
        dtype, max(dot, features), route is triton_attention.AttentionTarget.INTERPRETER)
    groups = int(np.prod([extents[b] for b in attention.batch], dtype=np.int64))
    itemsize = 4 if dtype == "float32" else 2
    return FusedAttention(attention, groups, extents[attention.row],
                          extents[attention.key_index], dot, features, itemsize, dtype,
                          route=route, config=config,
                          band=call_band(attention, values, extents), decision=decision)


def triton_fallback_notes(attention: Optional[Attention], values: Dict[str, object],
                          options):
    """explain's note where the Triton kernel would take a call but does not take its
    dtype or head dimension (the statements run one by one)."""
    if attention is None or \
            explain_decision(attention, values, options)[0].kind is not RouteKind.TRITON:
        return []
    found = _triton_call(attention, values)
    if found is None:
        return []
    from ..backends.triton import attention as triton_attention
    extents, dtype = found
    reason = triton_attention.unsupported(dtype, extents[attention.dot_index],
                                          extents[attention.feature]) or \
        triton_attention.terms_reason(attention, values)
    return [] if reason is None else [
        f"the fused Triton attention kernel does not take {reason}: the statements run "
        "one by one"]
