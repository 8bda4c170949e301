"""The fast path for a repeated call (issue 11): a Kernel remembers, per call signature,
a prepared runner (backends/c/repeat.py), so that a call it has seen before is a
dictionary lookup and the kernel call.  Only ':=' statements on the C backend (or the
Triton backend: backends/triton/repeat.py) whose arguments cannot depend on the data; a statement in its hoisted form goes straight to
its kernels, each on its own fast path (as do a program's statements, which pass their
arrays in ``arrays=``)."""

from __future__ import annotations

import unicodedata
from typing import Tuple

from ..backends import get_backend
from ..errors import EinfuseError, attach_statement
from ..analysis.frameworks import NUMPY, TORCH, torch_recording
from ..analysis.result_size import check_result_size, too_large
from ..schedule.schedule import Route
from .signatures import BY_NAME, signature_of

# Prepared signatures kept per kernel (a new one past this replaces the oldest).
SIGNATURES_KEPT = 32

def prepare(kernel, call, kwargs) -> None:
    """Remember in ``kernel._repeat`` a runner for calls with this call's signature, or
    None where the full path must run (so the question is asked once)."""
    signature = signature_of(kwargs)
    cache = kernel._repeat
    if signature is None or signature in cache:
        return
    if len(cache) >= SIGNATURES_KEPT:
        try:     # another thread may drop the same oldest one between these steps
            cache.pop(next(iter(cache)), None)
        except (StopIteration, RuntimeError):
            pass
    cache[signature] = None        # until proven preparable: the full path
    if not all(name.isascii() for name in kwargs) and any(
            unicodedata.normalize("NFKC", name) != name for name in kwargs):
        return      # the runners look arguments up by the statement's (NFKC) names
    if any(type(value) is float and name not in kernel.spec.params
           for name, value in kwargs.items()):
        return      # a float for a 0-d tensor (x[]): the runners take arrays there
    schedule = kernel.schedule(call, signature)     # (schedule/choose.py)
    backend = schedule.backend
    if call.framework not in (NUMPY, TORCH) or kernel.spec.assign != ":=" or \
            backend not in ("c", "triton") or call.bfloat16 and backend == "c":
        return
    if schedule.route is Route.LIBRARY:
        return      # whether it runs fused depends on the data (a finite V): full path
    if backend == "triton":
        if schedule.route is Route.HOISTED:   # its kernels, fused by rows (row_groups.py)
            cache[signature] = _hoisted_runner(kernel, kernel.hoisted_form, call)
        elif kernel.hoisted_form is None:
            cache[signature] = _triton_runner(kernel, call) or _recorded_triton_runner(
                kernel, kwargs)
        return
    if any(getattr(value, "is_cuda", False) for value in kwargs.values()):
        return      # C on CUDA tensors copies them: the full path
    if schedule.route is Route.HOISTED:
        cache[signature] = _hoisted_runner(kernel, kernel.hoisted_form, call)
        return
    if schedule.route is Route.BLAS_THEN_EPILOGUE:    # (its kernels: BLAS, then a pass)
        cache[signature] = _epilogue_runner(kernel, kernel.epilogue_form, call, kwargs)
        return
    from ..backends.c.repeat import GatherFlagged, repeat_runner
    prepared = repeat_runner(call, schedule.as_written())
    if prepared is None:
        return
    runner, result_dtype = prepared.run, call.dtypes.result
    if prepared.dtype != result_dtype:
        def runner(named, run=runner):
            return run(named).astype(result_dtype, copy=False)
    if any(t.as_index for t in kernel.spec.tensors):
        def runner(named, run=runner):
            try:
                return run(named)
            except GatherFlagged:   # an index value out of bounds: the full path names it
                return kernel.run(kernel.bind(arrays={
                    name: named[name] for name in kernel.spec.arg_order if name in named}))
    if call.framework == TORCH:     # autograd's part prepared too (runtime/torch_prepared.py)
        from .torch_prepared import repeat_runner as torch_runner
        repeat = torch_runner(kernel, call, runner)
    else:
        # a prepared backward (runtime/torch_prepared.py) calls it with more arrays
        repeat = runner
        BY_NAME.add(repeat)
    cache[signature] = repeat


def run_first(kernel, call, kwargs, backend: str) -> Tuple[bool, object]:
    """(True, result) of a call whose checks have passed, by the runner that
    :func:`prepare` makes for its signature, made first: the first call of a signature
    then runs as every repeat will -- the same kernels (a small gather's kernel tests
    each index value itself, a large one's does not), the same BLAS (torch's for torch
    tensors), the same backward (torch_prepared.py) -- so that its results are theirs
    to the bit, as torch.autograd.gradcheck's reentrancy check asks.  (False, None)
    where there is no runner (the full path runs, on every call), and on the Triton
    backend, whose runner takes over the launch the full path makes (the same kernel).
    ``backend``: the backend the call runs on."""
    if get_backend(backend).name != "c":
        return False, None
    try:
        check_result_size(call)       # (the full path's checks that a repeat never needs)
        prepare(kernel, call, kwargs)
        runner = kernel._repeat.get(signature_of(kwargs))
        if runner is None:
            return False, None
        try:
            return True, runner(kwargs)
        except EinfuseError:
            raise
        except MemoryError:
            raise too_large(call, "could not be allocated") from None
    except EinfuseError as error:
        raise attach_statement(error, kernel.statement) from None


def _triton_runner(kernel, call):
    """The Triton backend's prepared runner (backends/triton/repeat.py), or None; it
    hands back what ``Kernel.run`` would: the result dtype, bfloat16 for bfloat16 inputs.
    A call it declines (an index value out of the prepared kernel's range: nothing was
    allocated or launched) runs the full path, which raises the statement's bounds error."""
    import torch
    from ..backends.triton.repeat import GatherOutOfRange, repeat_runner
    final = torch.bfloat16 if call.bfloat16 else getattr(torch, call.dtypes.result.name)
    prepared = repeat_runner(call, final)
    if prepared is None:
        return None

    def run(named):
        try:
            return prepared(named)
        except GatherOutOfRange:
            bound = kernel.bind(arrays=named)
            return kernel.deliver(bound, kernel.run(bound))
    return run


def _recorded_triton_runner(kernel, kwargs):
    """A recorded Triton statement's node (runtime/triton_statement_autograd.py), once
    its first call made one; the statement's full run where it declines (grad mode
    off: nothing is recorded; a differentiable backward: the statement's own node)."""
    from .triton_statement_autograd import repeat_runner

    def full_path(named):
        bound = kernel.bind(arrays=named)
        from . import torch_autograd
        if torch_recording() and torch_autograd.differentiable_names(bound):
            return torch_autograd.apply(kernel, bound, lambda: kernel.run(bound), "triton")
        return kernel.deliver(bound, kernel.run(bound))
    return repeat_runner(kernel, kwargs, full_path)


def _epilogue_runner(kernel, form, call, kwargs):
    """The hoisted runner of a BLAS-then-epilogue statement, with a torch call autograd
    does not record taking the form's kernels chained by their prepared runners
    (runtime/epilogue_chain.py)."""
    from .epilogue_chain import epilogue_chain
    generic = _hoisted_runner(kernel, form, call)
    # (a NumPy caller's form runs each kernel on its own fast path already, with the
    # BLAS the chain would take: only a torch caller's run gains)
    chain = epilogue_chain(form, call, kwargs, generic) if call.framework == TORCH \
        else None
    return generic if chain is None else chain


def _hoisted_runner(kernel, form, call):
    """A repeated call of a statement that runs in its hoisted form: straight to its
    kernels (each on its own fast path), skipping the statement's binding, which this
    signature passed before."""
    from ..schedule.route import backend_name
    kernels = form.kernels(call.dtypes)
    framework = call.framework
    # under torch autograd: the program's prepared call (program/autograd.py), once
    # the first call has made it
    recorded = []

    def repeat(named):
        try:
            # (inside the try: the prepared call runs the hoisted form too, whose error
            # -- an index its temporary reads that the statement never does -- is not
            # the statement's; the statement as written then reports or succeeds)
            if recorded:
                result = recorded[0].apply(named)
                if result is not None:
                    return result[0]
            result = form.run(kernels, named, framework)
            if framework == TORCH and not recorded:
                recorded.extend(form.recorded_calls(kernels, named))
            return result
        except EinfuseError:
            # as the full path does: the statement runs as written, and says why not
            bound = kernel.bind(arrays=named)
            if framework == TORCH:     # recorded by autograd, as the full path records it
                from . import torch_autograd
                if torch_recording() and \
                        torch_autograd.differentiable_names(bound):
                    return torch_autograd.apply(kernel, bound, lambda: kernel.run(bound),
                                                backend_name(kernel.options.backend, bound))
            return kernel.deliver(bound, kernel.run(bound))
    return repeat
