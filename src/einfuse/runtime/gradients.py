"""Running a statement's gradients for the framework adapters (PyTorch, JAX): derive
each wanted gradient (and, for JAX's forward mode, each tangent statement) once, cached
per statement, inputs and options, and run its statements on the chosen backend."""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Dict, Iterable, Mapping, Optional, Tuple

import numpy as np

from ..analysis.options import Options
from ..autodiff import derive
from .gradient_reference import run_reference
from .side_by_side import side_by_side
from ..autodiff.attribution import gradient_errors
from ..autodiff.forward import tangent
from ..analysis.frameworks import NUMPY, framework_of
from ..analysis.spec import spec_of
from .gradient_reference import resolve_options


def options_key(options: Options) -> Tuple:
    """The forward options that shape its gradients, as a hashable key."""
    key = []
    if options.ranges:
        key.append(("ranges", options.ranges))
    if options.pad is not None:
        key.append(("pad", options.pad))
    key += [("bounds", options.bounds), ("fill", options.fill)]
    # 0.0 == -0.0 in a key, yet pad/fill=-0.0 give other values (1 / fill): keyed apart
    key.append(("negative_zeros", options.negative_zeros))
    return tuple(key)


def _forward_options(key: Tuple) -> Dict[str, object]:
    options = dict(key)
    del options["negative_zeros"]
    if "ranges" in options:
        options["ranges"] = {name: range(lo, hi) for name, (lo, hi) in options["ranges"]}
    return options


@functools.lru_cache(maxsize=256)
def gradient_statements(statement: str, wrt: str, key: Tuple):
    """The gradient statements of ``statement`` w.r.t. ``wrt``, derived once."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return derive(statement, wrt, options=_forward_options(key))


@functools.lru_cache(maxsize=256)
def tangent_statement(statement: str, wrt: Tuple[str, ...], key: Tuple):
    """The tangent statement of ``statement`` for changes in ``wrt`` (forward mode),
    derived once; None when the result does not change with them."""
    return tangent(statement, wrt, _forward_options(key))


@functools.lru_cache(maxsize=256)
def _reads_output(statement: str, key: Tuple, names: Tuple[str, ...]) -> bool:
    from ..autodiff.reuse import with_output
    try:
        return any(with_output(g, statement) is not None for name in names
                   for g in gradient_statements(statement, name, key))
    except Exception:      # (derive's own error is raised by the backward that needs it)
        return False


def reads_output(statement: str, options: Options, names: Iterable[str]) -> bool:
    """Whether a gradient of ``statement`` for one of ``names`` can read the forward's
    result instead of recomputing it (autodiff/reuse.py): then the forward keeps it."""
    return _reads_output(statement, options_key(options), tuple(names))


def step_kernel(g, values: Mapping[str, object], backend: str, forward: str,
                output: Optional[str]):
    """(kernel, its input names) for gather statement ``g`` on ``values``: where
    ``output`` names the forward's result in ``values``, the statement rewritten to read
    it (autodiff/reuse.py) if that is exact for these arrays."""
    from .gradient_reference import gradient_kernel, text_kernel
    # (a statement derived for an output that starts elsewhere than 0 reads dOUT at
    # positions, not at index values: the forward's result is not read in its place)
    if output is not None and not g.starts:
        from ..autodiff.reuse import applies, options_for, with_output
        read = with_output(g, forward)
        if read is not None and read.output == output:
            options = resolve_options(g, values)
            if applies(read, options, values.get(output), values, g.inputs):
                kernel = text_kernel(read.text, options_for(read, options), backend)
                return kernel, kernel.spec.arg_order
    return gradient_kernel(g, values, backend), g.inputs


def compute_gradients(statement: str, options: Options, arrays: Mapping[str, object],
                      output_grad, wanted: Iterable[str], output=None) -> Dict[str, object]:
    """{name: gradient} for each wanted input; ``arrays`` are the forward's inputs and
    ``output_grad`` the gradient of its output: NumPy arrays and scalars (gradients come
    back as NumPy arrays), or torch tensors or JAX arrays (the gradients come back as such,
    computed where they are by the chosen backend).  ``output``: the forward's result
    (a NumPy array), which gradients that recompute it read instead."""
    key = options_key(options)
    wanted = list(wanted)
    if len(wanted) > 1 and _first_on_host(statement, key, wanted, arrays, output_grad):
        return _side_by_side(statement, options, arrays, output_grad, wanted, output)
    result = {}
    for name in wanted:
        grads = gradient_statements(statement, name, key)
        # derive names dOUT and the gradient d<name> unless the statement already uses
        # those names (a gradient statement's output is itself d<name>): ask it
        values = dict(arrays)
        values[grads[0].output_grad] = output_grad
        forward_output = None
        if output is not None and grads:
            forward_output = _spec_output(statement)
            if forward_output in values or forward_output == grads[0].target:
                forward_output = None
            else:
                values[forward_output] = output
        prepared = _prepared(grads, values, options.backend, statement, forward_output)
        if prepared is not None:
            result[name] = prepared(values)
            continue
        if forward_output is not None:
            del values[forward_output]
        found = run_reference(grads, values, backend=options.backend)
        value = found[grads[0].target]   # a torch/JAX gradient stays in its framework
        result[name] = np.asarray(value) if framework_of(value) == NUMPY else value
    return result


# Signatures whose gradients have been computed once (their kernels compiled then).
_SEEN_SIGNATURES: Dict[Tuple, bool] = {}
_SEEN_KEPT = 4096


def _first_on_host(statement: str, key, wanted, arrays, output_grad) -> bool:
    """Whether this is the first computation of these gradients for arrays of these
    shapes and dtypes, all of them NumPy arrays or numbers (host kernels: no framework
    whose tracing or recording is per thread)."""
    signature = [statement, key, tuple(wanted)]
    for name, value in sorted(arrays.items()) + [("", output_grad)]:
        if type(value) is np.ndarray:
            signature.append((name, value.shape, value.dtype, value.strides))
        elif type(value) in (int, float, bool) or isinstance(value, np.generic):
            signature.append((name, type(value)))
        else:
            return False
    signature = tuple(signature)
    if signature in _SEEN_SIGNATURES:
        return False
    if len(_SEEN_SIGNATURES) >= _SEEN_KEPT:
        _SEEN_SIGNATURES.clear()
    _SEEN_SIGNATURES[signature] = True
    return True


def _side_by_side(statement: str, options: Options, arrays, output_grad, wanted,
                  output) -> Dict[str, object]:
    """The gradients of a first call, each wanted input's in its own thread: their
    kernels are independent, so a first backward compiles them side by side and waits
    for the slowest compile rather than the sum (issue 32).  The values are those of
    the one-by-one loop (each gradient is computed as it would be alone, from the same
    read-only arrays); an error is the one the loop would raise first."""
    def one(name):
        return compute_gradients(statement, options, arrays, output_grad, [name], output)

    result = {}
    for outcome in side_by_side(one, wanted):  # in the order asked: the loop's first error
        if isinstance(outcome, Exception):
            raise outcome
        result.update(outcome)
    return result


# Gradients whose statements are all plain gathers, prepared per signature of the
# arrays: their options resolved and kernels found once, so that a training loop's
# backward is, per gradient statement, a kernel's fast path (issue 11).
_PREPARED: Dict[Tuple, Tuple[object, object]] = {}
_PREPARED_KEPT = 512


def _spec_output(statement: str) -> str:
    return spec_of(statement).output


def _prepared(grads, values, backend: str, forward: str, output: Optional[str]):
    if not grads:
        return None
    signature = [id(grads), backend, output]
    # every array's shape and dtype: forward ranges, coverage and options follow them
    for name in sorted(values):
        value = values[name]
        if type(value) is np.ndarray:
            signature.append((name, value.shape, value.dtype))
        elif type(value) is float:
            signature.append((name, float))
        else:     # torch/JAX values, ints: run_reference's general path
            return None
    key = tuple(signature)
    found = _PREPARED.get(key)
    if found is None:
        from .gradient_reference import statements_to_run
        todo = statements_to_run(grads, values)
        run = None       # scatters: run_reference's general path, every time
        if all(g.kind == "gather" for g in todo):
            steps = []
            for g in todo:
                with gradient_errors(g):
                    steps.append(step_kernel(g, values, backend, forward, output) + (g,))

            def run(values):
                total = None
                for kernel, inputs, g in steps:
                    with gradient_errors(g):
                        part = np.asarray(kernel(arrays={n: values[n] for n in inputs}))
                    total = part if total is None else total + part
                return total
        if len(_PREPARED) >= _PREPARED_KEPT:
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                _PREPARED.pop(next(iter(_PREPARED)))   # another thread may evict it too
        found = _PREPARED[key] = (grads, run)     # grads kept: its id stays its own
    return found[1]
