"""Running a statement's gradients for the framework adapters (PyTorch, JAX): derive
each wanted gradient (and, for JAX's forward mode, each tangent statement) once, cached
per statement, inputs and options, and run its statements on the chosen backend."""

from __future__ import annotations

import functools
import warnings
from typing import Dict, Iterable, Mapping, Tuple

import numpy as np

from ..analysis.options import Options
from ..autodiff import derive, run_reference
from ..autodiff.forward import tangent
from .frameworks import NUMPY, framework_of


def options_key(options: Options) -> Tuple:
    """The forward options that shape its gradients, as a hashable key."""
    key = []
    if options.ranges:
        key.append(("ranges", options.ranges))
    if options.pad is not None:
        key.append(("pad", options.pad))
    key += [("bounds", options.bounds), ("fill", options.fill)]
    return tuple(key)


def _forward_options(key: Tuple) -> Dict[str, object]:
    options = dict(key)
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


def compute_gradients(statement: str, options: Options, arrays: Mapping[str, object],
                      output_grad, wanted: Iterable[str]) -> Dict[str, object]:
    """{name: gradient} for each wanted input; ``arrays`` are the forward's inputs and
    ``output_grad`` the gradient of its output: NumPy arrays and scalars (gradients come
    back as NumPy arrays), or torch tensors or JAX arrays (the gradients come back as such,
    computed where they are by the chosen backend)."""
    key = options_key(options)
    result = {}
    for name in wanted:
        grads = gradient_statements(statement, name, key)
        # derive names dOUT and the gradient d<name> unless the statement already uses
        # those names (a gradient statement's output is itself d<name>): ask it
        values = dict(arrays)
        values[grads[0].output_grad] = output_grad
        found = run_reference(grads, values, backend=options.backend)
        value = found[grads[0].target]   # a torch/JAX gradient stays in its framework
        result[name] = np.asarray(value) if framework_of(value) == NUMPY else value
    return result
