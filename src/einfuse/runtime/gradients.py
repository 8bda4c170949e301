"""Running a statement's gradients for the framework adapters (PyTorch, JAX): derive
each wanted gradient once (cached per statement, input and options) and run its
statements on the chosen backend."""

from __future__ import annotations

import functools
import warnings
from typing import Dict, Iterable, Mapping, Tuple

import numpy as np

from ..analysis.options import Options
from ..autodiff import derive, run_reference
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


def compute_gradients(statement: str, options: Options, output: str,
                      arrays: Mapping[str, object], output_grad,
                      wanted: Iterable[str]) -> Dict[str, object]:
    """{name: gradient} for each wanted input; ``arrays`` are the forward's inputs and
    ``output_grad`` the gradient of its output: NumPy arrays and scalars (gradients come
    back as NumPy arrays), or torch tensors or JAX arrays (the gradients come back as such,
    computed where they are by the chosen backend)."""
    values = dict(arrays)
    values["d" + output] = output_grad
    key = options_key(options)
    result = {}
    for name in wanted:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = run_reference(gradient_statements(statement, name, key), values,
                                  backend=options.backend)
        value = found["d" + name]   # a torch/JAX gradient stays in its framework
        result[name] = np.asarray(value) if framework_of(value) == NUMPY else value
    return result
