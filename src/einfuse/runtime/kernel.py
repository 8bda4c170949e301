"""The public entry points: ``ein``, ``compile`` and the reusable Kernel."""

from __future__ import annotations

import functools
from typing import Optional

import numpy as np

from ..analysis.options import Options, make_options
from ..analysis.spec import Spec, analyse
from ..backends import get_backend
from ..errors import (EinfuseError, EinfuseSyntaxError, EinfuseTypeError, attach_statement,
                      warn)
from ..lang import parse
from ..lang.printer import format_statement
from .binding import BoundCall, bind_call, bind_names
from .frameworks import JAX, NUMPY, TORCH, common_framework, contiguous, framework_of, from_numpy


@functools.lru_cache(maxsize=512)
def _spec_for(statement: str) -> Spec:
    """The shape-independent stage, cached by the statement's text."""
    try:
        return analyse(parse(statement))
    except RecursionError:
        raise EinfuseSyntaxError("the statement nests too deeply to analyse",
                                 span=(0, len(statement))) from None


class Kernel:
    """A compiled statement, reusable for any shapes and dtypes.

    Call it with the statement's tensors and scalars by keyword (or positionally
    in order of first appearance on the right side).
    """

    def __init__(self, statement: str, options: Options):
        self.statement = statement
        self.options = options
        try:
            self.spec = _spec_for(statement)
        except EinfuseError as error:
            raise attach_statement(error, statement) from None
        for message, span in self.spec.warnings:
            warn(message, source=statement, span=span)

    @property
    def inputs(self):
        return self.spec.arg_order

    def __repr__(self) -> str:
        text = format_statement(self.spec.statement)
        takes = ", ".join(self.spec.arg_order) or "no inputs"
        if self.spec.assign != ":=":
            takes += f"; writes into {self.spec.output}"
        return f"<einfuse.Kernel {text!s} | takes {takes} | backend={self.options.backend}>"

    def bind(self, *args, **kwargs) -> BoundCall:
        try:
            return bind_call(self.spec, self.options, args, kwargs)
        except EinfuseError as error:
            raise attach_statement(error, self.statement) from None

    def __call__(self, *args, **kwargs):
        if _has_jax_value(args, kwargs):
            from . import jax_adapter
            try:
                named = bind_names(self.spec, args, kwargs)
                if common_framework(named) == JAX:
                    return jax_adapter.call(self, named)
            except EinfuseError as error:
                raise attach_statement(error, self.statement) from None
        call = self.bind(*args, **kwargs)
        if call.framework == TORCH and self.spec.assign == ":=":
            from . import torch_autograd
            if torch_autograd.torch.is_grad_enabled() and \
                    torch_autograd.differentiable_names(call):
                return torch_autograd.apply(self, call, lambda: self.run(call),
                                            _backend_name(self.options.backend, call))
        return self.deliver(call, self.run(call))

    def run(self, call: BoundCall) -> np.ndarray:
        """The result as a NumPy array in the result dtype."""
        try:
            backend = get_backend(_backend_name(self.options.backend, call))
            result = backend.run(call)
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


def _backend_name(requested: str, call: BoundCall) -> str:
    """``auto`` means Triton for CUDA tensors (when Triton is there), else C or NumPy."""
    if requested == "auto" and call.framework == TORCH and any(
            getattr(value, "is_cuda", False) for value in (call.sources or {}).values()):
        from ..backends.triton_backend import available
        if available():
            return "triton"
    return requested


def _has_jax_value(args, kwargs) -> bool:
    return any(framework_of(v) == JAX for v in (*args, *kwargs.values()))


def compile(statement: str, *, ranges=None, pad=None, bounds="check", fill=0.0, dtype=None,
            backend="auto", threads: Optional[int] = None,
            memory_limit: Optional[int] = None) -> Kernel:
    """Compile ``statement`` into a reusable :class:`Kernel`."""
    if not isinstance(statement, str):
        raise EinfuseSyntaxError(f"a statement must be a string, not "
                                 f"{type(statement).__name__}")
    try:
        options = make_options(ranges, pad, bounds, fill, dtype, backend, threads,
                               memory_limit)
    except EinfuseError as error:
        raise attach_statement(error, statement) from None
    return Kernel(statement, options)


def ein(statement: str, *args, ranges=None, pad=None, bounds="check", fill=0.0, dtype=None,
        backend="auto", threads: Optional[int] = None, memory_limit: Optional[int] = None,
        **arrays):
    """Evaluate ``statement`` once on the given arrays and scalars."""
    kernel = compile(statement, ranges=ranges, pad=pad, bounds=bounds, fill=fill,
                     dtype=dtype, backend=backend, threads=threads,
                     memory_limit=memory_limit)
    return kernel(*args, **arrays)


__all__ = ["Kernel", "compile", "ein"]
