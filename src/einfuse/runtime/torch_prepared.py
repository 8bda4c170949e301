"""The repeated call of a statement on CPU torch tensors (issue 11): everything autograd
needs that depends only on the call's signature (names, shapes, dtypes, strides,
requires_grad) is found once, so that a training step costs torch's own bookkeeping plus
the kernels.

* forward: NumPy views of the tensors, the prepared C kernel (backends/c/repeat.py) and
  one ``PreparedFunction.apply``;
* backward: per wanted input, the gradient statements' own prepared kernels, called
  directly (no derivation, option resolution or binding after the first backward of a
  signature), their result handed to torch without a copy where its shape and dtype are
  the input's already.

A gradient that adds into the input at computed positions (kind "scatter", e.g. through
a gather) computes its values with its prepared kernel and adds them in with its options
resolved once (row by row for the embedding backward).  A backward with
``create_graph=True`` takes the general path (runtime/gradients.py), which records the
gradient statements in turn.

Imported only when the caller's arrays are torch tensors."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, Mapping, Optional, Tuple

import numpy as np
import torch

from ..autodiff.attribution import gradient_errors
from .gradient_reference import NumpyOps, numpy_scatter_add, scatter_entry
from ..backends.c.scatter import scatter_rows
from ..backends.c.window_pack import PackMemo, set_memo
from ..lang.ast import Access
from . import gradients
from .signatures import BY_NAME, signature_of
from .side_by_side import side_by_side
from .torch_autograd import (differentiable_names, input_gradients, numpy_view,
                             numpy_views, refuse_in_transform, save_tensors,
                             saved_tensors)
from ..analysis.frameworks import torch_recording as recording
from .gradient_reference import resolve_options
from .window_scatter import prepared_add
from ..analysis.frameworks import NUMPY
from ..schedule.prepared_steps import StepRoute, prepared_step_route
from ..schedule.scatter_kernels import ScatterRoute, prepared_rows_route
from ..schedule.schedule import Library

# Prepared backwards kept per forward signature: one per layout (strides) of dOUT.
LAYOUTS_KEPT = 8

# Whether a windowed contraction's node keeps the patches (or panels) its forward packed
# for its weight gradient (backends/c/window_pack.PackMemo) rather than the gradient
# packing them again.  Off: on a Zen 4 (one thread, forward + backward under autograd,
# kept against packed again, interleaved in one process at loads of 5-8) keeping them
# was slower in every case measured -- conv2d 8x32x32^2 by 64x32x3^2 13.3 against 12.8
# ms (its 8 panels, 3.3 MB, written to fresh memory by the forward and read back from
# beyond the cache by the gradient, where a pack again takes 28 us an image from x,
# itself in cache, into the buffer the last one freed), dilated 13.1-13.9 against
# 12.7-13.0, a stride-2 conv2d's 4.7 MB of patches 5.9-6.0 against 5.5-5.7, and small
# ones whose packs fit the core's L2 (2x16x32^2 by 32x16x3^2, stride 2: 0.64-0.73
# against 0.61-0.68 ms) as well.
KEEP_FORWARD_PACKS = False

_NUMPY_OPS = NumpyOps()


@dataclass(frozen=True)
class PreparedStep:
    """One gradient statement's kernel for one layout of its arrays: ``run`` is its
    prepared runner (or the kernel itself, called by keyword, where it has none), given
    every array when ``by_name`` (it picks its own), else just ``inputs``.  A scatter
    statement (``scatter``: it and its options, resolved for this signature) computes
    values that are then added into the gradient at the positions it names (by rows of
    the index array named third, where it has the embedding-backward form).  ``adders``:
    per layout of gradient and values, the scatter's col2im prepared once
    (window_scatter.prepared_add), or None where it takes another way.  ``row_routes``:
    per layout of gradient and rows, the route of the row scatter
    (schedule/scatter_kernels.prepared_rows_route), decided once."""
    run: Callable[[Mapping[str, object]], np.ndarray]
    inputs: Tuple[str, ...]
    by_name: bool
    scatter: Optional[Tuple[object, Mapping[str, object], Optional[str]]] = None
    adders: Dict[Tuple, Optional[Callable]] = field(default_factory=dict, compare=False)
    row_routes: Dict[Tuple, object] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class PreparedGradient:
    """How one input's gradient is computed for one layout of dOUT: ``compute(values)``
    (values: the forward's arrays and dOUT, by name) is the gradient as a tensor like
    the input."""
    name: str
    output_grad: str
    compute: Callable[[Mapping[str, object]], torch.Tensor]


class PreparedAutograd:
    """The forward and the gradients of one call signature of a statement."""

    def __init__(self, kernel, options, recorded: Tuple[str, ...], saved: Tuple[str, ...],
                 run_forward, shapes):
        self.statement = kernel.statement
        self.options = options
        self.recorded = recorded       # the differentiable inputs, in apply's order
        self.saved = saved             # every tensor passed to apply (recorded first)
        self.run_forward = run_forward  # NumPy arrays by name -> the result (NumPy)
        self.shapes = shapes           # recorded name -> (shape, torch dtype)
        # a gradient reads the forward's result (autodiff/reuse.py): the node saves it
        self.keeps_output = gradients.reads_output(self.statement, options, recorded)
        self.output = kernel.spec.output
        # the forward packs patch matrices (a windowed contraction): the node keeps them
        # for its backward, whose weight gradient packs the same ones
        self.keeps_packs = False
        self._layouts: Dict[Tuple, Tuple[PreparedGradient, ...]] = {}
        self._lock = threading.Lock()

    def gradients(self, arrays: Mapping[str, object], grad_output: torch.Tensor,
                  output: Optional[np.ndarray] = None):
        """The gradient of every recorded input, as tensors (autograd mode off);
        ``output``: the forward's result, where ``keeps_output``."""
        grad = numpy_view(grad_output)
        # (``arrays`` is this call's own dict, made by its forward: dOUT and the
        # forward's result may go into it)
        if output is not None:
            arrays[self.output] = output
        plans = self._layouts.get((grad.strides, grad.dtype))
        if plans is None:
            plans = self._prepare(arrays, grad)
        found = []
        for plan in plans:
            arrays[plan.output_grad] = grad
            found.append(plan.compute(arrays))
        return tuple(found)

    def _prepare(self, arrays, grad) -> Tuple[PreparedGradient, ...]:
        from .gradient_reference import statements_to_run
        key = gradients.options_key(self.options)
        output = self.output if self.keeps_output else None   # (put in arrays then)
        plans, wanted = [], []
        for name in self.recorded:
            grads = gradients.gradient_statements(self.statement, name, key)
            output_grad = grads[0].output_grad if grads else "dOUT"
            values = dict(arrays)
            values[output_grad] = grad
            wanted.append((name, output_grad, values,
                           statements_to_run(grads, values) if grads else []))
        made = self._steps_side_by_side([(g, values) for _, _, values, todo in wanted
                                         for g in todo], output)
        for name, output_grad, values, todo in wanted:
            shape, dtype = self.shapes[name]
            if todo:
                # (a step whose making failed is made again here, in order: its error
                # is the one the one-by-one loop raises)
                steps = tuple(made.get(id(g)) or self._attributed_step(g, values, output)
                              for g in todo)
                compute = _gradient(steps, values, shape, dtype)
            else:       # no statement: the general path says why, every call
                compute = self._general(name, output_grad, shape, dtype)
            plans.append(PreparedGradient(name, output_grad, compute))
        plans = tuple(plans)
        with self._lock:
            if len(self._layouts) >= LAYOUTS_KEPT:
                self._layouts.clear()
            self._layouts[(grad.strides, grad.dtype)] = plans
        return plans

    def _steps_side_by_side(self, todo, output: Optional[str]) -> Dict[int, "PreparedStep"]:
        """The steps of the gradient statements in ``todo`` ((statement, values) pairs),
        made in threads side by side: making a step runs its kernel once, which compiles
        it on a first backward, and the compiles of independent kernels then take the
        time of the slowest rather than their sum (issue 32).  By ``id`` of the
        statement; one whose making raised is left out (the caller makes it again)."""
        seen = set()     # one thread per statement text: two must not prepare one kernel
        todo = [(g, values) for g, values in todo
                if not (g.text in seen or seen.add(g.text))]
        if len(todo) < 2:
            return {}
        grad_mode = torch.is_grad_enabled()

        def make(pair):
            g, values = pair
            with torch.set_grad_enabled(grad_mode):    # (autograd's mode is per thread)
                return self._attributed_step(g, values, output)

        # (a step whose making raised is left out: the caller makes it again, in order)
        return {id(pair[0]): outcome for pair, outcome in zip(todo, side_by_side(make, todo))
                if not isinstance(outcome, Exception)}

    def _attributed_step(self, g, values, output: Optional[str]) -> "PreparedStep":
        with gradient_errors(g):     # its errors told of the statement as written
            return self._step(g, values, output)

    def _step(self, g, values, output: Optional[str]) -> "PreparedStep":
        """The step running gradient statement ``g``: a gather reads the forward's
        result ``output`` where it would recompute it (runtime/gradients.py)."""
        from .gradient_reference import gradient_kernel
        backend = self.options.backend
        if g.kind == "gather":
            kernel, inputs = gradients.step_kernel(g, values, backend, self.statement, output)
        else:
            kernel, inputs = gradient_kernel(g, values, backend), g.inputs
        return _step(g, kernel, inputs, values)

    def _general(self, name: str, output_grad: str, shape, dtype):
        def compute(values):
            value = gradients.compute_gradients(self.statement, self.options, values,
                                                values[output_grad], (name,))[name]
            return torch.as_tensor(value).to(dtype).reshape(shape)
        return compute


def _run_steps(steps: Tuple[PreparedStep, ...], values, shape) -> np.ndarray:
    """The gradient as autodiff/reference.py's run_reference computes it: the gathers'
    results added up, and the scatters' values added in at their positions."""
    total = None
    for step in steps:
        part = step.run(values if step.by_name else
                        {name: values[name] for name in step.inputs})
        if step.scatter is None:
            total = part if total is None else total + part
            continue
        g, options, rows_by = step.scatter
        part = np.asarray(part)
        if total is None:     # (in the values' float dtype, as run_reference does)
            total = _NUMPY_OPS.zeros(shape, part)
        if rows_by is not None and _add_rows(total, part, values[rows_by], step.row_routes):
            continue
        if rows_by is None and _add_prepared(step.adders, total, g, part, options):
            continue
        total = numpy_scatter_add(_NUMPY_OPS, total, g, part, options, values)
    return total


_UNSEEN = object()


def _add_prepared(adders, total, g, part, options) -> bool:
    """``part`` added into ``total`` at ``g``'s windows by the col2im prepared for
    their layouts (True), made on the first call of a layout; False where that
    layout takes another way, left to numpy_scatter_add."""
    if type(total) is not np.ndarray or type(part) is not np.ndarray:
        return False
    key = (total.shape, total.strides, total.dtype, part.shape, part.strides, part.dtype)
    adder = adders.get(key, _UNSEEN)
    if adder is _UNSEEN:
        if len(adders) >= LAYOUTS_KEPT:
            adders.clear()
        adder = adders[key] = _scatter_adder(total, g, part, options)
    return adder is not None and adder(total, part)


def _scatter_adder(total, g, part, options) -> Optional[Callable]:
    """window_scatter.prepared_add for arrays like these where numpy_scatter_add adds
    them by that one C walk (the registry's col2im entry); None otherwise."""
    if scatter_entry(total, g, part, options, NUMPY)[0] is not Library.WINDOW_ADD:
        return None
    return prepared_add(total, g, part, {n: options["ranges"][n]
                                          for n in g.spec.output_indices})


def _rows_by(g, options, values) -> Optional[str]:
    """The index array of a scatter of the embedding-backward form, ``dW[idx[b, c], d]
    += v[b, c, d]`` (the first axis at the values of one index array read at the leading
    indices, whole, the other axes the values' trailing axes, whole), which then adds rows
    without evaluating positions: None for any other scatter."""
    first, rest = g.scatter[0], g.scatter[1:]
    indices = g.spec.output_indices
    lead, trailing = indices[:len(indices) - len(rest)], indices[len(indices) - len(rest):]
    if options.get("bounds", "check") not in ("check", "promise") or \
            first.terms or first.constant or first.quasi or len(first.gathers) != 1:
        return None
    access, coefficient = first.gathers[0]
    index = values.get(access.tensor)
    if coefficient != 1 or type(index) is not np.ndarray or index.dtype.kind not in "iu" or \
            tuple(sub.plain_index for sub in access.indices) != lead or \
            tuple(sub.plain_index for sub in rest) != trailing or \
            any(options["ranges"][name] != range(0, n) for name, n in zip(lead, index.shape)):
        return None
    return access.tensor


def _add_rows(total: np.ndarray, part: np.ndarray, index: np.ndarray,
              routes: Optional[Dict[Tuple, object]] = None) -> bool:
    """``total[index[...]] += part[...]`` row by row where every index value is in
    bounds (True: a value check, not a route); False leaves the general scatter to find
    and name the one that is not.  The row add runs the route of
    schedule/scatter_kernels.prepared_rows_route, kept in ``routes`` per layout."""
    where = index.reshape(-1).astype(np.int64, copy=False)
    if where.size:
        # one test for both ends: a negative value is a large unsigned one
        if where.view(np.uint64).max() >= total.shape[0]:
            return False
        if part.size == 0:                 # rows of width 0: nothing to add
            return True
        rows = part.reshape(where.size, -1)
        target = total.reshape(total.shape[0], -1)
        key = (target.dtype, target.flags.c_contiguous, rows.size)
        route = routes.get(key) if routes is not None else None
        if route is None:
            route = prepared_rows_route(target.dtype, rows.size, target.flags.c_contiguous)
            if routes is not None:
                if len(routes) >= LAYOUTS_KEPT:
                    routes.clear()
                routes[key] = route
        if route.route is ScatterRoute.ADD_AT:
            np.add.at(target, where, rows)
        else:
            scatter_rows(target, rows, where, route=route)
    return True


def _gradient(steps: Tuple[PreparedStep, ...], values, shape, dtype):
    """``compute`` for one gradient: one run decides whether its result can go to
    torch as it is (the input's shape and dtype, memory of its own), and a single gather
    statement is called without the loop."""
    first = np.asarray(_run_steps(steps, values, shape))
    direct = first.shape == shape and \
        torch.from_numpy(np.empty(0, first.dtype)).dtype == dtype and \
        not any(np.may_share_memory(first, value) for value in values.values()
                if type(value) is np.ndarray)
    from_numpy = torch.from_numpy
    if direct and len(steps) == 1 and steps[0].scatter is None:
        run, inputs = steps[0].run, steps[0].inputs
        if steps[0].by_name:
            return lambda values: from_numpy(run(values))
        return lambda values: from_numpy(run({name: values[name] for name in inputs}))
    if direct:
        return lambda values: from_numpy(_run_steps(steps, values, shape))
    return lambda values: torch.as_tensor(_run_steps(steps, values, shape)).to(dtype) \
        .reshape(shape)


def _copied(g, values) -> Optional[str]:
    """The name of the array a scatter's values statement copies as it is
    (``dW_at[b, d] := dE[b, d]``, all of it), else None."""
    spec = g.spec
    rhs = spec.rhs
    if not isinstance(rhs, Access) or spec.assign != ":=" or \
            tuple(sub.plain_index for sub in rhs.indices) != spec.output_indices or \
            g.options.get("pad") is not None:
        return None
    source = values.get(rhs.tensor)
    ranges = resolve_options(g, values)["ranges"]
    if type(source) is not np.ndarray or any(
            ranges[name] != range(0, n) for name, n in zip(spec.output_indices, source.shape)):
        return None
    return rhs.tensor


def _step(g, kernel, inputs, values) -> PreparedStep:
    """Gradient statement ``g``'s kernel (reading ``inputs``) for arrays like these: the
    kernel is called once (which prepares its fast path, runtime/repeat.py) and the
    runner taken from it, so that later backwards skip even the signature lookup."""
    named = {name: values[name] for name in inputs}
    kernel(arrays=named)
    signature = signature_of(named)
    runner = kernel._repeat.get(signature) if signature is not None else None
    by_name = runner in BY_NAME
    if runner is not None:
        # (a scatter's values statement is a product too: a strided convolution's input
        # gradient dx_at = dy W, added in at its windows afterwards)
        on_torch = _on_torch_blas(kernel, named)
        if on_torch is not None:
            runner, by_name = on_torch, True
    scatter = None
    if g.kind != "gather":
        options = resolve_options(g, values)
        scatter = (g, options, _rows_by(g, options, values))
        copied = _copied(g, values)
        if copied is not None:     # the values are dOUT itself, only read: no kernel
            return PreparedStep(lambda arrays: arrays[copied], inputs, True, scatter)
    if runner is None:
        return PreparedStep(lambda arrays: np.asarray(kernel(arrays=dict(arrays))), inputs,
                            False, scatter)
    return PreparedStep(runner, inputs, by_name, scatter)


def _on_torch_blas(kernel, named) -> Optional[Callable]:
    """A gradient statement (or a scatter's values statement) that BLAS computes
    (dx = dy W^T, dW = x^T dy), run on
    torch's BLAS where it is large enough, as the forward of a call on torch tensors
    is (backends/c/blas.py says why); None for any other statement."""
    from ..backends.c.repeat import blas_runner
    call = kernel.bind(arrays=named)
    # (the route is the schedule's: schedule/prepared_steps.py, from the kernel's
    # schedule for this signature, schedule/choose.py)
    decision = prepared_step_route(kernel.schedule(call, signature_of(named)))
    if decision.route is not StepRoute.TORCH_BLAS:
        return None
    prepared = blas_runner(call, decision.blas, True)
    run, result = prepared.run, call.dtypes.result
    if prepared.dtype == result:
        return run
    return lambda arrays: run(arrays).astype(result, copy=False)


class PreparedFunction(torch.autograd.Function):
    """The autograd node of a prepared call.  The tensors passed are the recorded inputs
    and then the other tensors the gradients read, all saved, so that torch's version
    check refuses a backward after any of them was modified in place."""

    @staticmethod
    def forward(ctx, state, *tensors):
        # state: (the PreparedAutograd, this call's arrays by name: NumPy views of the
        # tensors, and the floats), one argument (torch.func's wrapper check walks every
        # argument of apply)
        ctx.state = state
        if state[0].keeps_packs:
            # (kept inside this node alone: its saved tensors' version check refuses a
            # backward after an in-place change, and the memo goes with the backward)
            ctx.packs = memo = PackMemo()
            previous = set_memo(memo)
            try:
                result = torch.from_numpy(state[0].run_forward(state[1]))
            finally:
                set_memo(previous)
        else:
            ctx.packs = None
            result = torch.from_numpy(state[0].run_forward(state[1]))
        save_tensors(ctx, (*tensors, *([result] if state[0].keeps_output else [])))
        return result

    @staticmethod
    def backward(ctx, grad_output):
        saved = saved_tensors(ctx)       # (the version check)
        prepared, arrays = ctx.state
        memo, ctx.packs = ctx.packs, None       # (a second backward packs again)
        names = prepared.recorded
        output = None
        if prepared.keeps_output:      # (saved last)
            output, saved = saved[-1], saved[:-1]
        extra = (None,) * (len(saved) - len(names))
        if torch.is_grad_enabled():
            # create_graph=True: the gradient statements run on the tensors that carry
            # the graph, so that torch records them in turn (runtime/torch_autograd.py)
            values = dict(arrays)       # (the floats)
            values.update(zip(prepared.saved, saved))
            found = gradients.compute_gradients(prepared.statement, prepared.options,
                                                values, grad_output, names)
            return (None,) + input_gradients(found, names, saved) + extra
        if output is not None:
            output = output.detach().numpy()
        if memo is None:
            return (None,) + prepared.gradients(arrays, grad_output, output) + extra
        previous = set_memo(memo)
        try:
            return (None,) + prepared.gradients(arrays, grad_output, output) + extra
        finally:
            set_memo(previous)


def repeat_runner(kernel, call, runner):
    """The fast path of a repeated call on CPU tensors (see runtime/repeat.py): the
    result as a tensor, recorded by autograd where grad mode is on and an input requires
    a gradient."""
    tensors = tuple(name for name, value in call.sources.items()
                    if isinstance(value, torch.Tensor))
    floats = tuple(name for name, value in call.sources.items() if type(value) is float)

    def views(named):
        return numpy_views(named, tensors)

    if floats:
        def arrays_of(named):
            arrays = views(named)
            for name in floats:
                arrays[name] = named[name]
            return arrays
    else:
        arrays_of = views

    run_forward = runner      # (of the result's dtype)
    recorded = tuple(differentiable_names(call))
    if not recorded:
        def repeat(named):
            return torch.from_numpy(run_forward(arrays_of(named)))
        return repeat
    saved = recorded + tuple(name for name in tensors if name not in recorded)
    shapes = {name: (tuple(call.sources[name].shape), call.sources[name].dtype)
              for name in recorded}
    prepared = PreparedAutograd(kernel, call.options, recorded, saved, run_forward, shapes)
    prepared.keeps_packs = KEEP_FORWARD_PACKS and _packs_patches(kernel, call, recorded)
    # (inside inference_mode, enable_grad() records nothing either: recording)
    apply, grad_enabled = PreparedFunction.apply, recording
    transforms_active = torch._C._are_functorch_transforms_active
    # torch's own apply, without the Python wrapper that only torch.func's transforms need
    # (the tensors of a prepared call are never torch.func's wrappers: signature_of)
    apply_directly = _direct_apply()

    def repeat(named):
        arrays = arrays_of(named)
        if grad_enabled():
            if apply_directly is not None and not transforms_active():
                return apply_directly((prepared, arrays), *[named[name] for name in saved])
            refuse_in_transform(recorded)
            return apply((prepared, arrays), *[named[name] for name in saved])
        return torch.from_numpy(run_forward(arrays))
    return repeat


def _packs_patches(kernel, call, recorded) -> bool:
    """Whether the statement's forward is a windowed contraction (it packs patches of
    the operand read through windows) and a recorded input is the other operand, read
    plainly, whose gradient (a conv's weight gradient) packs the same patches."""
    from ..schedule.schedule import Route
    schedule = kernel.schedule(call)
    if schedule.backend != "c" or schedule.route is not Route.BLAS_WINDOWED:
        return False
    operands = schedule.blas.operands
    plain = [all(sub.plain for sub in operand.subscripts) for operand in operands]
    return any(is_plain and not other_plain and operand.tensor in recorded
               for operand, is_plain, other_plain in zip(operands, plain, plain[::-1]))


def _direct_apply():
    """``PreparedFunction.apply`` as torch's C implementation, which the Python
    ``Function.apply`` calls after checking for torch.func transforms; None where this
    torch has no such entry."""
    base = getattr(torch._C, "_FunctionBase", None)
    method = base.__dict__.get("apply") if base is not None else None
    return method.__get__(None, PreparedFunction) if hasattr(method, "__get__") else None
